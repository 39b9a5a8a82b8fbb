//! `spec.integration.engineOverrides`: CR-driven amendments of what the
//! adapter injected into the engine container, never of what the pod
//! template owns.
//!
//! The adapter-owned set is computed by diffing the engine container's
//! args/env just before and just after the adapter's injection: a flag or
//! env name is adapter-owned when the adapter added it or changed it. Then:
//! * `args` / `env`: an adapter-owned entry is replaced; an entry the
//!   template does not have is appended; an entry the template owns (and
//!   the adapter left alone) is a silent no-op;
//! * `suppressArgs` / `suppressEnv`: an adapter-owned entry is reverted to
//!   the template's state (removed when the template had none); anything
//!   else is a silent no-op.
//!
//! Suppression runs after replacement, so it wins when both name an entry.
//! Reserved flags/env are skipped here as a second line of defence (the
//! validating webhook rejects them).
//!
//! Re-running on an already-wired container converges: the adapter changes
//! nothing there, so earlier override results read as template-owned and
//! stay as they are.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EnvVar};

use ic_api::cachebackend::EngineOverrides;

use crate::binding::Protocol;
use crate::merge::{flag_token, flag_tokens, parse_args, remove_env, replace_flag, upsert_env};
use crate::runtime::RuntimeAdapter;

/// What the adapter added or changed on the engine container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdapterOwned {
    /// Leading flags.
    pub args: BTreeSet<String>,
    /// Env names.
    pub env: BTreeSet<String>,
}

fn flags(args: &[String]) -> BTreeSet<String> {
    parse_args(args)
        .into_iter()
        .filter_map(|i| i.flag)
        .collect()
}

fn env_entries<'a>(c: &'a Container, name: &str) -> Vec<&'a EnvVar> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.name == name)
        .collect()
}

/// Diffs the engine container before and after injection.
pub fn adapter_owned(before: &Container, after: &Container) -> AdapterOwned {
    let b_args = before.args.as_deref().unwrap_or_default();
    let a_args = after.args.as_deref().unwrap_or_default();
    let args = flags(b_args)
        .union(&flags(a_args))
        .filter(|f| flag_tokens(b_args, f) != flag_tokens(a_args, f))
        .cloned()
        .collect();
    let names: BTreeSet<&str> = before
        .env
        .iter()
        .chain(after.env.iter())
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let env = names
        .into_iter()
        .filter(|n| env_entries(before, n) != env_entries(after, n))
        .map(str::to_owned)
        .collect();
    AdapterOwned { args, env }
}

/// An override entry as argv tokens: `--x=v` stays one token, `--x v` is
/// split at the first whitespace.
fn entry_tokens(entry: &str) -> Option<(String, Vec<String>)> {
    let entry = entry.trim();
    let first_ws = entry.find(char::is_whitespace);
    let first_eq = entry.find('=');
    let tokens = match (first_ws, first_eq) {
        (Some(ws), eq) if eq.is_none_or(|eq| ws < eq) => {
            vec![entry[..ws].to_owned(), entry[ws..].trim().to_owned()]
        }
        _ => vec![entry.to_owned()],
    };
    let flag = flag_token(&tokens[0])?.to_owned();
    Some((flag, tokens))
}

/// Applies `overrides` to `engine` (already injected), given the container
/// as it was before injection. Returns the adapter-owned set it used.
pub fn apply(
    before: &Container,
    engine: &mut Container,
    overrides: Option<&EngineOverrides>,
    adapter: &dyn RuntimeAdapter,
    protocol: Option<Protocol>,
) -> AdapterOwned {
    let owned = adapter_owned(before, engine);
    let Some(ov) = overrides else {
        return owned;
    };
    let before_args = before.args.clone().unwrap_or_default();
    let template_flags = flags(&before_args);
    let reserved_args = adapter.reserved_args();
    let reserved_env = adapter.reserved_env(protocol);

    let mut args = engine.args.take().unwrap_or_default();
    for entry in &ov.args {
        let Some((flag, tokens)) = entry_tokens(entry) else {
            continue;
        };
        if reserved_args.contains(&flag.as_str()) {
            continue;
        }
        if owned.args.contains(&flag) || !template_flags.contains(&flag) {
            replace_flag(&mut args, &flag, &tokens);
        }
    }
    for flag in &ov.suppress_args {
        let flag = flag.trim();
        if reserved_args.contains(&flag) || !owned.args.contains(flag) {
            continue;
        }
        replace_flag(&mut args, flag, &flag_tokens(&before_args, flag));
    }
    engine.args = if args.is_empty() && before.args.is_none() {
        None
    } else {
        Some(args)
    };

    for var in &ov.env {
        if reserved_env.contains(&var.name.as_str()) {
            continue;
        }
        if owned.env.contains(&var.name) || env_entries(before, &var.name).is_empty() {
            upsert_env(engine, var.clone());
        }
    }
    for name in &ov.suppress_env {
        if reserved_env.contains(&name.as_str()) || !owned.env.contains(name) {
            continue;
        }
        match env_entries(before, name).first() {
            Some(original) => upsert_env(engine, (*original).clone()),
            None => remove_env(engine, name),
        }
    }
    if engine.env.as_ref().is_some_and(Vec::is_empty) && before.env.is_none() {
        engine.env = None;
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::{env, upsert_arg_pair};
    use crate::runtime::InjectContext;
    use ic_api::cachebackend::{CacheType, Runtime};

    /// Converges `X` and `--x` (user values included) and reserves `--r`.
    #[derive(Debug)]
    struct Converging;

    impl RuntimeAdapter for Converging {
        fn id(&self) -> &'static str {
            "test"
        }
        fn display_name(&self) -> &'static str {
            "test"
        }
        fn pair(&self) -> (Runtime, CacheType) {
            (Runtime::Vllm, CacheType::LMCache)
        }
        fn reserved_args(&self) -> &'static [&'static str] {
            &["--r"]
        }
        fn reserved_env(&self, _: Option<Protocol>) -> Vec<&'static str> {
            vec!["R"]
        }
        fn supports_binding(&self, _: Option<Protocol>) -> bool {
            true
        }
        fn hash_scheme(&self) -> &'static str {
            "vllm"
        }
        fn default_engine_port(&self) -> i32 {
            8000
        }
        fn inject_engine_config(
            &self,
            _: &InjectContext<'_>,
            c: &mut Container,
        ) -> Result<(), String> {
            upsert_arg_pair(c.args.get_or_insert_with(Vec::new), "--x", "adapter");
            upsert_arg_pair(c.args.get_or_insert_with(Vec::new), "--r", "adapter");
            upsert_env(c, env("X", "adapter"));
            upsert_env(c, env("R", "adapter"));
            Ok(())
        }
    }

    fn container(args: &[&str], envs: &[(&str, &str)]) -> Container {
        Container {
            args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
            env: Some(envs.iter().map(|(n, v)| env(n, *v)).collect()),
            ..Container::default()
        }
    }

    fn injected(before: &Container) -> Container {
        let mut after = before.clone();
        after.args.get_or_insert_with(Vec::new);
        let backend: ic_api::CacheBackend = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b"}, "spec": {"runtime": "VLLM"}
        }))
        .unwrap();
        let ctx = InjectContext {
            backend: &backend,
            binding: None,
        };
        Converging.inject_engine_config(&ctx, &mut after).unwrap();
        after
    }

    #[test]
    fn owned_set_includes_modified_user_values() {
        let before = container(&["--x", "user", "--keep"], &[("X", "user"), ("K", "1")]);
        let owned = adapter_owned(&before, &injected(&before));
        assert_eq!(owned.args, BTreeSet::from(["--x".into(), "--r".into()]));
        assert_eq!(owned.env, BTreeSet::from(["X".into(), "R".into()]));
    }

    #[test]
    fn suppressing_a_modified_user_value_restores_it() {
        let before = container(&["--x", "user"], &[("X", "user")]);
        let mut after = injected(&before);
        let ov = EngineOverrides {
            suppress_args: vec!["--x".into(), "--r".into()],
            suppress_env: vec!["X".into(), "R".into()],
            ..EngineOverrides::default()
        };
        apply(&before, &mut after, Some(&ov), &Converging, None);
        // Reserved entries stay injected; the others revert to the template.
        assert_eq!(
            after.args.unwrap(),
            ["--x", "user", "--r", "adapter"].map(String::from)
        );
        assert_eq!(
            after.env.unwrap(),
            vec![env("X", "user"), env("R", "adapter")]
        );
    }

    #[test]
    fn replacing_an_adapter_owned_value_and_skipping_reserved() {
        let before = container(&[], &[]);
        let mut after = injected(&before);
        let ov = EngineOverrides {
            args: vec![
                "--x=override".into(),
                "--r override".into(),
                "--new 1".into(),
            ],
            env: vec![env("X", "override"), env("R", "override")],
            ..EngineOverrides::default()
        };
        apply(&before, &mut after, Some(&ov), &Converging, None);
        assert_eq!(
            after.args.unwrap(),
            ["--x=override", "--r", "adapter", "--new", "1"].map(String::from)
        );
        assert_eq!(
            after.env.unwrap(),
            vec![env("X", "override"), env("R", "adapter")]
        );
    }

    #[test]
    fn entry_tokens_split() {
        assert_eq!(
            entry_tokens("--max-model-len 4096"),
            Some((
                "--max-model-len".into(),
                vec!["--max-model-len".into(), "4096".into()]
            ))
        );
        assert_eq!(
            entry_tokens("--x=a b"),
            Some(("--x".into(), vec!["--x=a b".into()]))
        );
        assert_eq!(entry_tokens("positional"), None);
    }
}
