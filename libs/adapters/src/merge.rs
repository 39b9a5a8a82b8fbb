//! Merge primitives for container args, env, mounts, containers and volumes.
//! Every one converges on the desired value instead of appending a
//! duplicate, which is what makes re-admitting an injected pod a no-op.
//!
//! Args are read as a sequence of items: a flag (`--x`, `--x=v`, or `--x v`
//! where `v` does not start with `-`) or a positional token. Only `args` is
//! inspected; an engine that puts its flags in `command` is not parsed.

use k8s_openapi::api::core::v1::{Container, EnvVar, Volume, VolumeMount};

/// One parsed argument item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgItem {
    /// Leading flag name (`--x`), `None` for a positional token.
    pub flag: Option<String>,
    /// Index of the first token in `args`.
    pub start: usize,
    /// Number of tokens the item spans (1 or 2).
    pub len: usize,
    /// The value: inline (`--x=v`) or the following token.
    pub value: Option<String>,
    /// Whether the value was written inline with `=`.
    pub inline: bool,
}

/// The leading flag token of one argument (`--x=v` → `--x`).
pub fn flag_token(arg: &str) -> Option<&str> {
    if arg.starts_with('-') && arg.len() > 1 {
        Some(arg.split_once('=').map_or(arg, |(f, _)| f))
    } else {
        None
    }
}

fn looks_like_value(token: &str) -> bool {
    !token.starts_with('-') || token.parse::<f64>().is_ok()
}

/// Splits `args` into items.
pub fn parse_args(args: &[String]) -> Vec<ArgItem> {
    let mut items = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        match flag_token(arg) {
            Some(flag) => {
                if let Some((_, v)) = arg.split_once('=') {
                    items.push(ArgItem {
                        flag: Some(flag.to_owned()),
                        start: i,
                        len: 1,
                        value: Some(v.to_owned()),
                        inline: true,
                    });
                    i += 1;
                } else if let Some(next) = args.get(i + 1).filter(|n| looks_like_value(n)) {
                    items.push(ArgItem {
                        flag: Some(flag.to_owned()),
                        start: i,
                        len: 2,
                        value: Some(next.clone()),
                        inline: false,
                    });
                    i += 2;
                } else {
                    items.push(ArgItem {
                        flag: Some(flag.to_owned()),
                        start: i,
                        len: 1,
                        value: None,
                        inline: false,
                    });
                    i += 1;
                }
            }
            None => {
                items.push(ArgItem {
                    flag: None,
                    start: i,
                    len: 1,
                    value: None,
                    inline: false,
                });
                i += 1;
            }
        }
    }
    items
}

/// The items of `flag`, in order.
pub fn flag_items(args: &[String], flag: &str) -> Vec<ArgItem> {
    parse_args(args)
        .into_iter()
        .filter(|it| it.flag.as_deref() == Some(flag))
        .collect()
}

/// The tokens of every item of `flag`, in order (for diffing).
pub fn flag_tokens(args: &[String], flag: &str) -> Vec<String> {
    flag_items(args, flag)
        .iter()
        .flat_map(|it| args[it.start..it.start + it.len].iter().cloned())
        .collect()
}

/// Replaces every item of `flag` with `tokens`, placed where the first item
/// was (appended when there was none). Empty `tokens` removes the flag.
pub fn replace_flag(args: &mut Vec<String>, flag: &str, tokens: &[String]) {
    let items = flag_items(args, flag);
    let Some(first) = items.first().map(|it| it.start) else {
        args.extend(tokens.iter().cloned());
        return;
    };
    for it in items.iter().rev() {
        args.drain(it.start..it.start + it.len);
    }
    let at = first.min(args.len());
    args.splice(at..at, tokens.iter().cloned());
}

/// Ensures `flag value` is present once: an existing item keeps its style
/// (`--x=v` or `--x v`) with the value converged; later duplicates go.
pub fn upsert_arg_pair(args: &mut Vec<String>, flag: &str, value: &str) {
    let items = flag_items(args, flag);
    let tokens = match items.first() {
        Some(it) if it.inline => vec![format!("{flag}={value}")],
        _ => vec![flag.to_owned(), value.to_owned()],
    };
    replace_flag(args, flag, &tokens);
}

/// Ensures the boolean `flag` is present once, bare.
pub fn upsert_flag(args: &mut Vec<String>, flag: &str) {
    let items = flag_items(args, flag);
    // A bare flag followed by a positional token parses as a pair; keep the
    // positional token where it was.
    let tokens: Vec<String> = match items.as_slice() {
        [it] if it.len == 2 => args[it.start..it.start + 2].to_vec(),
        _ => vec![flag.to_owned()],
    };
    replace_flag(args, flag, &tokens);
}

/// Ensures exactly one `var.name` entry equal to `var`, keeping the
/// position of the first existing one.
pub fn upsert_env(container: &mut Container, var: EnvVar) {
    let env = container.env.get_or_insert_with(Vec::new);
    match env.iter().position(|e| e.name == var.name) {
        Some(i) => {
            let name = var.name.clone();
            env[i] = var;
            let mut seen = false;
            env.retain(|e| {
                if e.name != name {
                    return true;
                }
                let keep = !seen;
                seen = true;
                keep
            });
        }
        None => env.push(var),
    }
}

/// Adds `var` only when no entry of that name exists (user values win).
pub fn set_env_if_absent(container: &mut Container, var: EnvVar) {
    let env = container.env.get_or_insert_with(Vec::new);
    if env.iter().all(|e| e.name != var.name) {
        env.push(var);
    }
}

/// Removes every entry named `name`; drops an emptied list.
pub fn remove_env(container: &mut Container, name: &str) {
    if let Some(env) = container.env.as_mut() {
        env.retain(|e| e.name != name);
        if env.is_empty() {
            container.env = None;
        }
    }
}

/// A plain name=value env entry.
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Ensures one mount of volume `mount.name`, converged to `mount`.
pub fn upsert_mount_by_name(container: &mut Container, mount: VolumeMount) {
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    match mounts.iter().position(|m| m.name == mount.name) {
        Some(i) => mounts[i] = mount,
        None => mounts.push(mount),
    }
}

/// Ensures one container named `desired.name` in `list`, replaced in place
/// when present (the caller decided it may adopt it), appended otherwise.
pub fn upsert_container(list: &mut Vec<Container>, desired: Container) {
    match list.iter().position(|c| c.name == desired.name) {
        Some(i) => list[i] = desired,
        None => list.push(desired),
    }
}

/// Ensures one volume named `desired.name`, replaced in place or appended.
pub fn upsert_volume(list: &mut Vec<Volume>, desired: Volume) {
    match list.iter().position(|v| v.name == desired.name) {
        Some(i) => list[i] = desired,
        None => list.push(desired),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn parses_pairs_inline_bare_and_positionals() {
        let args = v(&["serve", "m", "--a", "1", "--b=2", "--c", "--d", "-5"]);
        let items = parse_args(&args);
        let flags: Vec<_> = items
            .iter()
            .map(|i| (i.flag.clone(), i.value.clone()))
            .collect();
        assert_eq!(
            flags,
            vec![
                (None, None),
                (None, None),
                (Some("--a".into()), Some("1".into())),
                (Some("--b".into()), Some("2".into())),
                (Some("--c".into()), None),
                (Some("--d".into()), Some("-5".into())),
            ]
        );
    }

    #[test]
    fn upsert_pair_converges_and_dedups() {
        let mut args = v(&["--x", "1", "--y", "--x=2"]);
        upsert_arg_pair(&mut args, "--x", "3");
        assert_eq!(args, v(&["--x", "3", "--y"]));
        let mut inline = v(&["--x=1"]);
        upsert_arg_pair(&mut inline, "--x", "3");
        assert_eq!(inline, v(&["--x=3"]));
        let mut absent = v(&["serve"]);
        upsert_arg_pair(&mut absent, "--x", "3");
        upsert_arg_pair(&mut absent, "--x", "3");
        assert_eq!(absent, v(&["serve", "--x", "3"]));
    }

    #[test]
    fn upsert_flag_is_idempotent() {
        let mut args = v(&["--a"]);
        upsert_flag(&mut args, "--b");
        upsert_flag(&mut args, "--b");
        assert_eq!(args, v(&["--a", "--b"]));
        let mut dup = v(&["--b", "--b"]);
        upsert_flag(&mut dup, "--b");
        assert_eq!(dup, v(&["--b"]));
    }

    #[test]
    fn env_primitives_converge() {
        let mut c = Container::default();
        upsert_env(&mut c, env("A", "1"));
        set_env_if_absent(&mut c, env("B", "1"));
        set_env_if_absent(&mut c, env("B", "2"));
        upsert_env(&mut c, env("A", "3"));
        assert_eq!(c.env, Some(vec![env("A", "3"), env("B", "1")]));
        remove_env(&mut c, "A");
        remove_env(&mut c, "B");
        assert_eq!(c.env, None);
    }
}
