//! The conformance tier: every golden fixture's injected engine flags, env,
//! worker command and kernel check, and every rendered provider command, fed
//! to the real packages — LMCache 0.5.6's config loader, connector registry,
//! MP server and `lmcache_server`; vLLM 0.11.2's and 0.33.0's argument
//! parser and environment validation; SGLang 0.5.23's `ServerArgs`; a real
//! `redis-server`; a real `mooncake_master` and Mooncake client. The
//! packages come from the venv `e2e/conformance/setup.sh` builds (the test
//! fails if it cannot be built). Only ports, temp paths and cluster
//! addresses are moved to this machine's loopback; everything else is run
//! as rendered.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use ic_e2e::conformance::{Redis, expand_env, expect_ok, venv};
use ic_e2e::free_port;
use serde_json::{Value, json};

const VLLM_VERSIONS: [&str; 2] = ["0.11.2", "0.33.0"];

fn fixtures_dir() -> PathBuf {
    ic_e2e::chart::repo_root().join("libs/adapters/tests/fixtures")
}

/// `(name, admitted pod)` of every golden admission fixture.
fn golden_pods() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let fixture: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, fixture["pod"].clone()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        out.len() >= 15,
        "expected the golden fixtures, found {}",
        out.len()
    );
    out
}

/// The engine container, by the webhook's own rule.
fn engine(pod: &Value) -> (Value, bool) {
    let spec: k8s_openapi::api::core::v1::PodSpec =
        serde_json::from_value(pod["spec"].clone()).unwrap();
    let runtimes = [
        ic_api::cachebackend::Runtime::Vllm,
        ic_api::cachebackend::Runtime::SGLang,
    ];
    let i = ic_adapters::runtime::locate_engine_container(&spec, &runtimes).unwrap();
    let c = pod["spec"]["containers"][i].clone();
    let sglang = c["name"] == "sglang" || c["image"].as_str().unwrap_or("").contains("sglang");
    (c, sglang)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn init_container(pod: &Value, name: &str) -> Option<Value> {
    pod["spec"]["initContainers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

fn injected_by_us(pod: &Value) -> bool {
    pod["metadata"]["annotations"]["inferencecache.io/injected-by"].is_string()
}

fn engine_env(c: &Value) -> Vec<(String, String)> {
    expand_env(
        c["env"].as_array().map(Vec::as_slice).unwrap_or_default(),
        &[("status.podIP", "127.0.0.1")],
    )
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

// === vLLM ===

#[test]
fn vllm_parses_every_injected_command_line_and_env() {
    let mut cases = Vec::new();
    let mut names = Vec::new();
    for (name, pod) in golden_pods() {
        let (c, sglang) = engine(&pod);
        if sglang {
            continue;
        }
        let env: serde_json::Map<String, Value> = engine_env(&c)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        cases.push(json!({"args": strings(&c["args"]), "env": env}));
        names.push(name);
    }
    assert!(names.len() >= 10, "only {} vLLM fixtures", names.len());
    for version in VLLM_VERSIONS {
        // One interpreter per version: importing vLLM takes seconds.
        let target = venv().join(format!("vllm-{version}"));
        let r = expect_ok(
            &format!("vLLM {version}"),
            &json!({"kind": "vllm_args", "cases": cases}),
            Some(target.to_str().unwrap()),
        );
        assert_eq!(r["version"], version);
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), names.len());
        for ((name, case), result) in names.iter().zip(&cases).zip(results) {
            assert_eq!(
                result["ok"], true,
                "{name}: vLLM {version}: {}",
                result["error"]
            );
            let args = strings(&case["args"]);
            match flag_value(&args, "--kv-transfer-config") {
                Some(json_text) => {
                    let ktc: Value = serde_json::from_str(json_text).unwrap();
                    let parsed = &result["kv_transfer_config"];
                    assert_eq!(
                        parsed["kv_connector"], ktc["kv_connector"],
                        "{name} {version}"
                    );
                    assert_eq!(parsed["kv_role"], ktc["kv_role"], "{name} {version}");
                    assert_eq!(parsed["is_kv_transfer_instance"], true, "{name} {version}");
                }
                None => assert!(result["kv_transfer_config"].is_null(), "{name} {version}"),
            }
            if flag_value(&args, "--kv-events-config").is_some() {
                assert_eq!(
                    result["kv_events_config"]["enable_kv_cache_events"], true,
                    "{name} {version}: vLLM does not read the kv-events config the subscriber is wired to"
                );
            }
            if version == "0.33.0" {
                // --fail-on-environ-validation would refuse unknown VLLM_* env.
                assert_eq!(result["environ_validated"], true, "{name}");
            }
        }
    }
}

#[test]
fn lmcache_loads_every_injected_env_and_knows_every_remote() {
    let mut remotes = Vec::new();
    for (name, pod) in golden_pods() {
        let (c, sglang) = engine(&pod);
        let env = engine_env(&c);
        if sglang || env_value(&env, "LMCACHE_CHUNK_SIZE").is_none() {
            continue;
        }
        let lmcache: serde_json::Map<String, Value> = env
            .iter()
            .filter(|(k, _)| k.starts_with("LMCACHE_"))
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let r = expect_ok(
            &format!("{name}: LMCacheEngineConfig.from_env()"),
            &json!({"kind": "lmcache_env", "env": lmcache}),
            None,
        );
        assert_eq!(
            r["chunk_size"].as_i64().unwrap().to_string(),
            env_value(&env, "LMCACHE_CHUNK_SIZE").unwrap(),
            "{name}"
        );
        // Suppressed by an override, LMCache's own default (on) applies.
        let local_cpu =
            env_value(&env, "LMCACHE_LOCAL_CPU").is_none_or(|v| v.eq_ignore_ascii_case("true"));
        assert_eq!(r["local_cpu"], local_cpu, "{name}");
        let Some(url) = env_value(&env, "LMCACHE_REMOTE_URL") else {
            assert!(r["remote_url"].is_null(), "{name}");
            continue;
        };
        assert_eq!(r["remote_url"], url, "{name}");
        let scheme = url.split("://").next().unwrap();
        let adapter = r["connector_adapter"].as_str().unwrap().to_lowercase();
        let expected = match scheme {
            "lm" => "lm",
            "redis" => "redis",
            "mooncakestore" => "mooncake",
            other => panic!("{name}: unexpected scheme {other}"),
        };
        assert!(
            adapter.contains(expected),
            "{name}: {url} went to {adapter}"
        );
        if scheme == "mooncakestore" {
            // What reaches Mooncake's setup(): the master under the key its
            // dict API reads, the address peers reach this client at, tcp.
            let setup = &r["mooncake_setup"];
            let endpoint = url.trim_start_matches("mooncakestore://");
            assert_eq!(setup["master_server_addr"], endpoint, "{name}");
            assert_eq!(setup["local_hostname"], "127.0.0.1", "{name}");
            assert_eq!(setup["protocol"], "tcp", "{name}");
            let metadata = setup["metadata_server"].as_str().unwrap();
            assert!(
                metadata == "P2PHANDSHAKE" || metadata.ends_with(":8080/metadata"),
                "{name}: {metadata}"
            );
        }
        remotes.push(scheme.to_owned());
    }
    for scheme in ["lm", "redis", "mooncakestore"] {
        assert!(
            remotes.iter().any(|r| r == scheme),
            "no fixture binds {scheme}"
        );
    }
}

// === SGLang ===

#[test]
fn sglang_parses_every_injected_command_line() {
    let mut lmcache = 0;
    let mut metrics = 0;
    for (name, pod) in golden_pods() {
        let (c, sglang) = engine(&pod);
        if !sglang {
            continue;
        }
        let args = strings(&c["args"]);
        let r = expect_ok(
            &format!("{name}: SGLang ServerArgs"),
            &json!({"kind": "sglang_args", "args": args}),
            None,
        );
        assert_eq!(r["version"], "0.5.23");
        if args.iter().any(|a| a == "--enable-lmcache") {
            assert_eq!(r["enable_lmcache"], true, "{name}");
            assert_eq!(
                r["lmcache_config_file"], "/etc/lmcache/lmcache.yaml",
                "{name}"
            );
            lmcache += 1;
        }
        if args.iter().any(|a| a == "--enable-hierarchical-cache") {
            assert_eq!(r["enable_hierarchical_cache"], true, "{name}");
        }
        let url = pod["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == "kvevent-subscriber"))
            .and_then(|c| {
                strings(&c["args"])
                    .into_iter()
                    .find_map(|a| a.strip_prefix("--engine-metrics-url=").map(str::to_owned))
            });
        // SGLang serves /metrics only when told to: the subscriber is given a
        // metrics URL exactly when the parsed engine serves one, on its port.
        if r["enable_metrics"] == true {
            assert_eq!(
                url,
                Some(format!("http://127.0.0.1:{}/metrics", r["port"])),
                "{name}"
            );
            metrics += 1;
        } else {
            assert_eq!(url, None, "{name}: scrapes an engine without /metrics");
        }
    }
    assert!(metrics >= 3, "only {metrics} injected SGLang fixtures");
    assert!(
        lmcache >= 3,
        "only {lmcache} SGLang+LMCache fixtures parsed"
    );
}

/// The worker's shell script with its port, config dir and L2 address moved
/// to this machine, and L1 shrunk to 1 GB (the fixtures size it from the
/// backend: tens of GB this machine does not have). Returns the script, the
/// probe, the config file and whether it names a RESP L2.
fn localize_worker(
    worker: &Value,
    config_dir: &Path,
    port: u16,
    redis_port: u16,
) -> (String, Vec<String>, String, bool) {
    let command = strings(&worker["command"]);
    assert_eq!(command[..2], ["/bin/sh", "-c"]);
    let script = &command[2];
    let old_port = script
        .split("--port ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_owned();
    let mut local = script
        .replace("/etc/lmcache", config_dir.to_str().unwrap())
        .replace(&format!("--port {old_port}"), &format!("--port {port}"))
        .replace(&format!("mp_port: {old_port}"), &format!("mp_port: {port}"));
    let l1 = local
        .split("--l1-size-gb ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_owned();
    local = local.replace(&format!("--l1-size-gb {l1}"), "--l1-size-gb 1");
    let mut resp = false;
    if let Some(rest) = local.split("--l2-adapter '").nth(1) {
        let json_text = rest.split('\'').next().unwrap().to_owned();
        let mut adapter: Value = serde_json::from_str(&json_text).unwrap();
        assert_eq!(adapter["type"], "resp", "the MP path runs RESP only");
        adapter["host"] = json!("127.0.0.1");
        adapter["port"] = json!(redis_port);
        resp = true;
        local = local.replace(&json_text, &adapter.to_string());
    }
    let probe = strings(&worker["startupProbe"]["exec"]["command"])
        .into_iter()
        .map(|p| p.replace(&format!(", {old_port})"), &format!(", {port})")))
        .collect();
    let config_file = config_dir.join("lmcache.yaml");
    (local, probe, config_file.to_str().unwrap().to_owned(), resp)
}

#[test]
fn the_lmcache_mp_worker_starts_as_injected() {
    let mut started = 0;
    for (name, pod) in golden_pods() {
        if !injected_by_us(&pod) {
            continue;
        }
        let Some(worker) = init_container(&pod, "lmcache-mp-worker") else {
            continue;
        };
        let script = strings(&worker["command"])[2].clone();
        // The launch line as rendered goes through LMCache's own parser and
        // config builder, L1 size included.
        let line = script
            .lines()
            .find(|l| l.starts_with("exec python3 -m"))
            .unwrap();
        let argv =
            shell_words(line.trim_start_matches("exec python3 -m lmcache.v1.multiprocess.server"));
        let parsed = expect_ok(
            &format!("{name}: MP server parse_args"),
            &json!({"kind": "mp_args", "argv": argv}),
            None,
        );
        assert_eq!(
            parsed["l1_size_gb"].as_f64().unwrap().to_string(),
            flag_value(&argv, "--l1-size-gb").unwrap(),
            "{name}"
        );
        assert_eq!(parsed["eviction_policy"], "LRU", "{name}");

        // A Redis of its own, so only this worker's L2 can connect to it.
        let redis = Redis::start();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let (local, probe, config_file, resp) =
            localize_worker(&worker, dir.path(), port, redis.port);
        let r = expect_ok(
            &format!("{name}: MP worker"),
            &json!({"kind": "mp_worker", "script": local, "probe": probe,
                    "config_file": config_file, "redis_port": resp.then_some(redis.port)}),
            None,
        );
        assert_eq!(r["mp_host"], "127.0.0.1", "{name}");
        assert_eq!(r["mp_port"], port, "{name}");
        if resp {
            assert!(
                r["redis_clients"].as_u64().unwrap() >= 1,
                "{name}: the RESP L2 never connected"
            );
            assert_eq!(parsed["l2_adapters"], json!(["resp"]), "{name}");
        }
        started += 1;
    }
    assert!(started >= 3, "only {started} MP workers started");
}

/// Splits a shell line the way `sh` would for the quoting our renders use
/// (plain words and single-quoted ones).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut started = false;
    for ch in line.chars() {
        match ch {
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut current));
                    started = false;
                }
            }
            c => {
                current.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(current);
    }
    words
}

// === kernel check ===

/// `(what, PYTHONPATH dir or empty, extra env, expected in the message)`.
type FailureCase<'a> = (&'a str, &'a Path, &'a [(&'a str, &'a str)], &'a str);

fn kernel_check_case(check: &Value, log: &Path, extra_env: &[(&str, &str)]) -> Value {
    let script =
        strings(&check["command"])[2].replace("/dev/termination-log", log.to_str().unwrap());
    let mut env: serde_json::Map<String, Value> = expand_env(check["env"].as_array().unwrap(), &[])
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    for (k, v) in extra_env {
        env.insert((*k).to_owned(), json!(v));
    }
    json!({"kind": "kernel_check", "script": script, "env": env, "termination_log": log})
}

#[test]
fn the_kernel_check_loads_the_real_lmcache_extension() {
    let mut checked = 0;
    let mut remote_checked = 0;
    let mut strict_check = None;
    for (name, pod) in golden_pods() {
        let Some(check) = init_container(&pod, "lmcache-kernel-check") else {
            continue;
        };
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("termination-log");
        let r = expect_ok(&name, &kernel_check_case(&check, &log, &[]), None);
        let message = r["termination_message"].as_str().unwrap();
        assert_eq!(r["exit_code"], 0, "{name}: {r}");
        assert!(
            message.starts_with("LMCACHE_KERNELS=ok\n"),
            "{name}: {message}"
        );
        assert!(
            message.contains("lmcache 0.5.6: loaded") && message.contains("cuda_ops"),
            "{name}: {message}"
        );
        let wants_remote = check["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "LMCACHE_KERNEL_CHECK_REMOTE");
        if wants_remote {
            assert!(message.contains("LMCACHE_REMOTE=ok\n"), "{name}: {message}");
            remote_checked += 1;
        }
        if message.contains("LMCACHE_KERNELS=ok") && check["env"].to_string().contains("strict") {
            strict_check = Some(check.clone());
        }
        checked += 1;
    }
    assert!(
        checked >= 3 && remote_checked >= 1,
        "{checked} checks, {remote_checked} with a remote"
    );
    let check = strict_check.expect("a strict-mode fixture");

    // True failures, reported as such (and blocking in strict mode): a
    // broken extension, an LMCache without one, a missing Mooncake client.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(broken.join("lmcache")).unwrap();
    std::fs::write(broken.join("lmcache/__init__.py"), "").unwrap();
    std::fs::write(
        broken.join("lmcache/cuda_ops.cpython-311-x86_64-linux-gnu.so"),
        "not an ELF",
    )
    .unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("lmcache")).unwrap();
    std::fs::write(empty.join("lmcache/__init__.py"), "").unwrap();
    let no_mooncake = dir.path().join("no-mooncake");
    std::fs::create_dir_all(no_mooncake.join("mooncake")).unwrap();
    std::fs::write(
        no_mooncake.join("mooncake/__init__.py"),
        "raise ImportError('no mooncake here')",
    )
    .unwrap();
    // A torch that takes the loading process down: a crash (the ABI-mismatch
    // symptom) is a kernel failure; a SIGKILL (what an OOM kill looks like
    // from the parent) is inconclusive.
    let crash = dir.path().join("crash");
    std::fs::create_dir_all(crash.join("torch")).unwrap();
    std::fs::write(crash.join("torch/__init__.py"), "import os\nos.abort()\n").unwrap();
    let killed = dir.path().join("killed");
    std::fs::create_dir_all(killed.join("torch")).unwrap();
    std::fs::write(
        killed.join("torch/__init__.py"),
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    )
    .unwrap();
    let cases: [FailureCase<'_>; 6] = [
        (
            "broken",
            &broken,
            &[],
            "LMCACHE_KERNELS=failed\nImportError",
        ),
        ("empty", &empty, &[], "ships no compiled CUDA extension"),
        (
            "timeout",
            Path::new(""),
            &[("LMCACHE_KERNEL_CHECK_TIMEOUT_SECONDS", "0.01")],
            "LMCACHE_KERNELS=inconclusive\nthe check timed out",
        ),
        (
            "no-mooncake",
            &no_mooncake,
            &[("LMCACHE_KERNEL_CHECK_REMOTE", "mooncakestore")],
            "LMCACHE_REMOTE=failed\nthe Mooncake client",
        ),
        (
            "crash",
            &crash,
            &[],
            "LMCACHE_KERNELS=failed\nloading the extension crashed with signal 6",
        ),
        (
            "killed",
            &killed,
            &[],
            "LMCACHE_KERNELS=inconclusive\nthe check process was killed (SIGKILL",
        ),
    ];
    for (what, path, env, needle) in cases {
        let log = dir.path().join(format!("{what}.log"));
        let mut case = kernel_check_case(&check, &log, env);
        if !path.as_os_str().is_empty() {
            case["pythonpath"] = json!(path);
        }
        let r = expect_ok(what, &case, None);
        let message = r["termination_message"].as_str().unwrap();
        assert!(message.contains(needle), "{what}: {message}");
        assert_eq!(r["exit_code"], 1, "{what}: strict mode must block: {r}");
        // The controller reads the same message into the conditions.
        let status: k8s_openapi::api::core::v1::ContainerStatus = serde_json::from_value(json!({
            "name": "lmcache-kernel-check", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": message}}}))
        .unwrap();
        let verdict = ic_controller_core::observe::kernel_check_from_status(&status);
        let remote = ic_controller_core::observe::remote_client_from_status(&status);
        match what {
            "timeout" | "killed" => assert!(
                matches!(verdict, ic_controller_core::observe::KernelCheck::Error(_)),
                "{verdict:?}"
            ),
            "no-mooncake" => assert!(matches!(remote, Some(Err(_))), "{remote:?}"),
            _ => assert!(
                matches!(verdict, ic_controller_core::observe::KernelCheck::Failed(_)),
                "{verdict:?}"
            ),
        }
    }
}

// === providers ===

/// `(fixture, container)` of every managed provider workload the golden
/// provider fixtures render.
fn provider_containers() -> Vec<(String, Value)> {
    let dir = fixtures_dir().join("providers");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let fixture: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let containers =
            &fixture["expected"]["managed"]["workload"]["spec"]["template"]["spec"]["containers"];
        for c in containers.as_array().into_iter().flatten() {
            out.push((
                path.file_stem().unwrap().to_string_lossy().into_owned(),
                c.clone(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn redis_starts_with_every_rendered_provider_command() {
    let mut started = 0;
    for (name, c) in provider_containers()
        .into_iter()
        .filter(|(_, c)| c["name"] == "redis")
    {
        let mut args = strings(&c["args"]);
        let port = free_port();
        let i = args.iter().position(|a| a == "--port").unwrap();
        args[i + 1] = port.to_string();
        args.extend(["--bind".into(), "127.0.0.1".into()]);
        let r = expect_ok(
            &name,
            &json!({"kind": "redis_server", "args": args, "port": port}),
            None,
        );
        assert_eq!(r["get"], "1", "{name}");
        assert_eq!(r["maxmemory-policy"], "allkeys-lru", "{name}");
        assert_eq!(r["save"], "", "{name}");
        assert_eq!(r["appendonly"], "no", "{name}");
        if let Some(max) = flag_value(&args, "--maxmemory") {
            assert_eq!(r["maxmemory"], max, "{name}");
        }
        started += 1;
    }
    assert!(started >= 3, "only {started} redis renders ran");
}

#[test]
fn lmcache_server_starts_with_every_rendered_command_and_answers_a_client() {
    let mut started = 0;
    for (name, c) in provider_containers()
        .into_iter()
        .filter(|(_, c)| c["name"] == "lmcache-server")
    {
        let mut command = strings(&c["command"]);
        let port = free_port();
        // host, port[, storage device]: only the address moves.
        assert!(command.len() >= 3, "{name}: {command:?}");
        command[1] = "127.0.0.1".into();
        command[2] = port.to_string();
        let r = expect_ok(
            &name,
            &json!({"kind": "lmcache_server", "command": command, "port": port}),
            None,
        );
        assert_eq!(r["HEALTH"], 200, "{name}");
        assert_eq!(r["EXIST"], 400, "{name}: an empty server has no key");
        started += 1;
    }
    assert!(started >= 2, "only {started} lmcache_server renders ran");
}

#[test]
fn mooncake_master_and_a_real_client_with_the_injected_settings() {
    // The engine side of a managed Mooncake binding, as injected.
    let pods = golden_pods();
    let (_, pod) = pods
        .iter()
        .find(|(n, _)| n == "vllm_mooncakestore_hostnet")
        .expect("the managed Mooncake fixture");
    let env = engine_env(&engine(pod).0);
    let extra = env_value(&env, "LMCACHE_EXTRA_CONFIG").expect("LMCACHE_EXTRA_CONFIG");
    let url = env_value(&env, "LMCACHE_REMOTE_URL").unwrap();
    let master_host = url
        .trim_start_matches("mooncakestore://")
        .rsplit_once(':')
        .unwrap()
        .0
        .to_owned();
    let mut started = 0;
    for (name, c) in provider_containers()
        .into_iter()
        .filter(|(_, c)| c["name"] == "mooncake-master")
    {
        let (rpc, metrics, http) = (free_port(), free_port(), free_port());
        let command: Vec<String> = strings(&c["command"])
            .into_iter()
            .map(|a| match a.split_once('=') {
                Some(("--rpc_port", _)) => format!("--rpc_port={rpc}"),
                Some(("--metrics_port", _)) => format!("--metrics_port={metrics}"),
                Some(("--http_metadata_server_port", _)) => {
                    format!("--http_metadata_server_port={http}")
                }
                Some(("--http_metadata_server_host", _)) => {
                    "--http_metadata_server_host=127.0.0.1".into()
                }
                _ => a,
            })
            .collect();
        // Cluster DNS and the fixed ports become loopback; the sizes shrink
        // to what a test machine spares.
        let local = extra
            .replace(&format!("{master_host}:50051"), &format!("127.0.0.1:{rpc}"))
            .replace(&format!("{master_host}:8080"), &format!("127.0.0.1:{http}"))
            .replace("\"3355443200\"", "\"67108864\"")
            .replace("\"1073741824\"", "\"16777216\"");
        let r = expect_ok(
            &name,
            &json!({"kind": "mooncake", "command": command, "rpc_port": rpc, "http_metadata_port": http,
                    "env": {"LMCACHE_REMOTE_URL": url, "LMCACHE_EXTRA_CONFIG": local}}),
            None,
        );
        assert_eq!(r["put"], 0, "{name}: {r}");
        assert_eq!(r["get"], "kv-bytes", "{name}");
        assert_eq!(
            r["setup_config"]["master_server_addr"],
            format!("127.0.0.1:{rpc}")
        );
        started += 1;
    }
    assert!(started >= 2, "only {started} mooncake_master renders ran");
}
