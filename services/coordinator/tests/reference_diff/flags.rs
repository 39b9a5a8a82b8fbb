//! The command line against the reference's: every flag and abbreviation
//! `lmcache coordinator` takes, what the flags do seen from outside, and a
//! restart from the reference's own checkpoint and metadata files.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    Proc, Req, batch, j, key, lmcache, pair, raw, send, start_ours, start_reference, wait_ready,
};

/// Every flag of `lmcache coordinator` (and the output flags every LMCache
/// subcommand takes) is accepted by `ic-coordinator coordinator`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_command_line_starts_ours() {
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let meta = dir.path().join("m.json");
    let out = dir.path().join("out.json");
    let port = ic_e2e::free_port();
    let args = [
        "--instance-timeout",
        "15",
        "--health-check-interval",
        "2",
        "--eviction-check-interval",
        "3",
        "--eviction-ratio",
        "0.5",
        "--trigger-watermark",
        "0.9",
        "--chunk-size",
        "16",
        "--hash-algorithm",
        "blake3",
        "--blend-probe-stride",
        "1",
        "--checkpoint-path",
        ckpt.to_str().unwrap(),
        "--checkpoint-interval",
        "30",
        "--metadata-path",
        meta.to_str().unwrap(),
        "--timeout-keep-alive",
        "5",
        "--extra-config",
        "{}",
        "--event-transport",
        "http",
        "--kafka-topic",
        "t",
        "--kafka-group-id",
        "g",
        "--format",
        "json",
        "--output",
        out.to_str().unwrap(),
        "-q",
    ];
    let mut ours = start_ours(port, &args);
    wait_ready(&http, port, &mut ours).await;
    drop(ours);
    // The bare form (no subcommand) keeps working.
    let port = ic_e2e::free_port();
    let mut bare = Proc(
        Command::new(env!("CARGO_BIN_EXE_ic-coordinator"))
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--quiet",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&http, port, &mut bare).await;
    // Unambiguous prefixes, as argparse takes them; both start.
    let abbreviated = [
        "--chunk",
        "16",
        "--health",
        "0",
        "--instance",
        "15",
        "--eviction-r",
        "0.5",
    ];
    let (rp, port) = (ic_e2e::free_port(), ic_e2e::free_port());
    let mut reference = start_reference(rp, &abbreviated);
    let mut ours = start_ours(port, &abbreviated);
    wait_ready(&http, rp, &mut reference).await;
    wait_ready(&http, port, &mut ours).await;
    drop((reference, ours));
    // Refusals are clear and name the flag.
    for (flag, value) in [
        ("--hash-algorithm", "sha256_cbor"),
        ("--hash-algorithm", ""),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ic-coordinator"))
            .args([
                "coordinator",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                flag,
                value,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} was accepted");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

/// What the reference's own parser (argparse, from the venv) makes of every
/// abbreviation of every long flag of `lmcache coordinator`: `(argument,
/// the flag it names or None when refused as ambiguous)`. The argument is
/// the abbreviation alone, or with `=x` for a flag that takes no value, so
/// that argparse refuses it naming the flag it resolved to.
fn reference_abbreviations() -> Vec<(String, Option<String>)> {
    let script = r#"
import argparse, contextlib, io, json, re
from lmcache.cli.commands import register_commands
p = argparse.ArgumentParser(prog="lmcache")
register_commands(p.add_subparsers(dest="command"), ["coordinator"])
coord = p._subparsers._group_actions[0].choices["coordinator"]
def named(token):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            p.parse_args(["coordinator", token])
    except SystemExit:
        pass
    m = re.search(r"argument (\S+): (expected one argument|ignored explicit argument)", err.getvalue())
    if m:
        return [f for f in m.group(1).split("/") if f.startswith("--")][0]
    if "ambiguous option" in err.getvalue():
        return "ambiguous"
    return None
out = {}
for a in coord._actions:
    for flag in (s for s in a.option_strings if s.startswith("--")):
        for n in range(3, len(flag) + 1):
            prefix = flag[:n]
            if prefix in out:
                continue
            got = named(prefix)
            if got is None:
                got, prefix = named(prefix + "=x"), prefix + "=x"
            assert got is not None, prefix
            out[prefix] = None if got == "ambiguous" else got
print(json.dumps(sorted(out.items())))
"#;
    let out = Command::new(ic_e2e::conformance::venv().join("bin/python3"))
        .args(["-c", script])
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("LMCACHE_TRACK_USAGE", "false")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "the reference's parser failed");
    let line = String::from_utf8_lossy(&out.stdout);
    let line = line.lines().last().unwrap();
    serde_json::from_str(line).unwrap()
}

/// Our coordinator subcommand on a free loopback port with `argument`.
fn ours_with(argument: &str) -> Command {
    let mut ours = Command::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    ours.args([
        "coordinator",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        argument,
    ]);
    ours
}

/// The flag our binary names when it refuses `argument` (clap names the
/// flag it resolved an abbreviation to: "a value is required for
/// '--chunk-size <CHUNK_SIZE>'", "unexpected value 'x' for
/// '--disable-metrics'"); None for an argument refused as unknown or
/// ambiguous.
fn our_reading(argument: &str) -> Option<String> {
    let ours = ours_with(argument);
    // Every argument here is refused while parsing; one that was not would
    // start a server, which `refusal` stops rather than wait on.
    let (accepted, err) = refusal(ours);
    assert!(!accepted, "{argument} was accepted");
    let at = err.find(" for '--")? + " for '".len();
    let flag: String = err[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    Some(flag)
}

/// Every abbreviation argparse takes for a flag of `lmcache coordinator`
/// names the same flag here, also where a house flag shares its prefix
/// (`--eve` is `--event-transport` though `--events-require-auth` begins
/// with it too), and every abbreviation it refuses as ambiguous is refused.
#[test]
fn every_abbreviation_of_the_references_flags_names_the_same_flag() {
    let cases = reference_abbreviations();
    assert!(cases.len() > 300, "{} abbreviations", cases.len());
    let mut wrong = Vec::new();
    for (argument, theirs) in &cases {
        let ours = our_reading(argument);
        if ours != *theirs {
            wrong.push(format!("{argument}: reference {theirs:?}, ours {ours:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} abbreviations read differently:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// Runs a server command that should refuse to start: its exit status and
/// stderr (a server that starts anyway is stopped and reported).
fn refusal(mut cmd: Command) -> (bool, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("{cmd:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Stops a server as an orchestrator does (SIGTERM) and waits for it.
fn terminate(mut proc: Proc) {
    let pid = proc.0.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success(), "kill -TERM {pid}");
    let _ = proc.0.wait();
}

/// The same requests, in order, to both: the answers that differ.
async fn differences(http: &reqwest::Client, rp: u16, op: u16, reqs: &[Req]) -> Vec<String> {
    let mut out = Vec::new();
    for r in reqs {
        let (want, got) = (send(http, rp, r).await, send(http, op, r).await);
        if want != got {
            out.push(format!("{} {}: reference {want:?}, ours {got:?}", r.0, r.1));
        }
    }
    out
}

/// `/metrics` is 404 on both (`flag` moves it away).
async fn no_metrics(http: &reqwest::Client, rp: u16, op: u16, flag: &str, wrong: &mut Vec<String>) {
    let reqs = [raw("GET", "/metrics", None, "")];
    let found = differences(http, rp, op, &reqs).await;
    wrong.extend(found.into_iter().map(|d| format!("{flag}: {d}")));
    assert_eq!(send(http, op, &reqs[0]).await.status, 404, "{flag}");
}

/// The reference's flags mean the same here, seen from outside: chunking
/// and hashing (`--chunk-size`, `--hash-algorithm blake3`: the same keys
/// for the same tokens), `--disable-metrics` and `--otlp-endpoint` (no
/// `/metrics`), `--instance-timeout` with `--health-check-interval` (a
/// silent instance leaves), `--timeout-keep-alive` (an idle connection is
/// closed), `--event-transport kafka` without `--kafka-bootstrap-servers`
/// (refused at start) and `--enable-blend-lookup` (the reference starts;
/// refused here, naming the flag: not built, docs/coordinator.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_flags_act_the_same_here() {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut wrong = Vec::new();
    // Chunking and hashing: 40 tokens are two 16-token chunks, each a key
    // per rank; the pins list them with their blake3 hashes.
    let tokens: Vec<u32> = (1..=40).collect();
    let ((rp, r), (op, o)) = pair(
        &http,
        &[
            "--chunk-size",
            "16",
            "--hash-algorithm",
            "blake3",
            "--disable-metrics",
            "--health-check-interval",
            "0",
            "--eviction-check-interval",
            "0",
        ],
    )
    .await;
    let reqs = [
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": 2, "token_ids": tokens, "cache_salt": "s"}),
        ),
        raw("GET", "/cache/pins", None, ""),
        j(
            "POST",
            "/directory/lookup",
            json!({"model_name": "m", "world_size": 2, "token_ids": tokens, "cache_salt": "s"}),
        ),
    ];
    wrong.extend(differences(&http, rp, op, &reqs).await);
    let pins = send(&http, op, &raw("GET", "/cache/pins", None, "")).await;
    assert_eq!(pins.body["total"], json!(4), "{:?}", pins.body);
    no_metrics(&http, rp, op, "--disable-metrics", &mut wrong).await;
    drop((r, o));
    // A silent instance is dropped after --instance-timeout by the sweep.
    let ((rp, r), (op, o)) = pair(
        &http,
        &[
            "--instance-timeout",
            "1",
            "--health-check-interval",
            "1",
            "--timeout-keep-alive",
            "1",
            "--otlp-endpoint",
            "http://127.0.0.1:1",
        ],
    )
    .await;
    no_metrics(&http, rp, op, "--otlp-endpoint", &mut wrong).await;
    let register = j(
        "POST",
        "/instances",
        json!({"instance_id": "quiet", "ip": "h", "http_port": 1}),
    );
    for port in [rp, op] {
        assert_eq!(send(&http, port, &register).await.status, 200);
    }
    // Within 8 s: the defaults (30 s, swept every 10 s) would take 30-40.
    let swept_by = std::time::Instant::now() + Duration::from_secs(8);
    for port in [rp, op] {
        let list = raw("GET", "/instances", None, "");
        while send(&http, port, &list).await.body != json!({"instances": []}) {
            assert!(
                std::time::Instant::now() < swept_by,
                "server on {port} kept a silent instance past 8 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // An idle keep-alive connection is closed after --timeout-keep-alive
    // (1 s): not at once, and well before the default's 10 s (5 s here).
    for port in [rp, op] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        let asked = std::time::Instant::now();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "server on {port} kept the connection 5 s");
        let open_for = asked.elapsed();
        assert!(
            open_for >= Duration::from_millis(500),
            "server on {port} closed the connection after {open_for:?}, not after 1 s idle"
        );
        assert!(
            seen.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&seen)
        );
    }
    drop((r, o));
    // Kafka without servers: neither starts.
    let kafka = ["--event-transport", "kafka"];
    let mut theirs = Command::new(lmcache());
    theirs
        .args(["coordinator", "--host", "127.0.0.1", "--port", "0"])
        .args(kafka)
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("LMCACHE_TRACK_USAGE", "false");
    let mut ours = Command::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    ours.args(["coordinator", "--host", "127.0.0.1", "--port", "0"])
        .args(kafka);
    let (ok, err) = refusal(theirs);
    assert!(!ok && err.contains("bootstrap servers"), "reference: {err}");
    let (ok, err) = refusal(ours);
    assert!(
        !ok && err.contains("--kafka-bootstrap-servers"),
        "ours: {err}"
    );
    // Blend lookup: the reference starts with it, this build refuses.
    let rp = ic_e2e::free_port();
    let mut r = start_reference(rp, &["--enable-blend-lookup"]);
    wait_ready(&http, rp, &mut r).await;
    drop(r);
    let ours = ours_with("--enable-blend-lookup");
    let (ok, err) = refusal(ours);
    assert!(!ok && err.contains("--enable-blend-lookup"), "ours: {err}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A coordinator switched from the reference restarts warm from the
/// reference's own files: its checkpoint (`--checkpoint-path`,
/// `--checkpoint-interval`, written at its clean stop) and metadata
/// (`--metadata-path`: quotas and pins). Ours, started on them, answers the
/// listings as the reference did before it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_restarts_warm_from_the_references_checkpoint_and_metadata() {
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let meta = dir.path().join("m.json");
    let flags = [
        "--checkpoint-path",
        ckpt.to_str().unwrap(),
        "--checkpoint-interval",
        "30",
        "--metadata-path",
        meta.to_str().unwrap(),
        "--chunk-size",
        "16",
        "--health-check-interval",
        "0",
        "--eviction-check-interval",
        "0",
    ];
    let rp = ic_e2e::free_port();
    let mut reference = start_reference(rp, &flags);
    wait_ready(&http, rp, &mut reference).await;
    let tokens: Vec<u32> = (1..=32).collect();
    let setup = [
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(1), json!({"entries": [
                {"key": key("ab"), "size_bytes": 100, "token_ids": [1, 2]},
                {"key": key("cd"), "size_bytes": 200}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"tier": "l1", "backend": "cpu",
                "entries": [{"key": key("ef"), "size_bytes": 5}]}))]}),
        ),
        j("PUT", "/quota/t1", json!({"limit_gb": 2.5})),
        j("PUT", "/quota/config", json!({"default_limit_gb": 7})),
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "token_ids": tokens}),
        ),
    ];
    for r in &setup {
        let a = send(&http, rp, r).await;
        assert_eq!(a.status, 200, "{} {}: {a:?}", r.0, r.1);
    }
    let reads = [
        raw("GET", "/directory/keys", None, ""),
        raw("GET", "/directory/stats", None, ""),
        raw("GET", "/instances/usage", None, ""),
        raw("GET", "/quota", None, ""),
        raw("GET", "/quota/config", None, ""),
        raw("GET", "/cache/pins", None, ""),
        j(
            "POST",
            "/directory/lookup",
            json!({"keys": [key("ab"), key("ef")]}),
        ),
    ];
    let mut before = Vec::new();
    for r in &reads {
        before.push(send(&http, rp, r).await);
    }
    terminate(reference);
    assert!(
        ckpt.exists() && meta.exists(),
        "the reference wrote no files"
    );
    let op = ic_e2e::free_port();
    let mut ours = start_ours(op, &flags);
    wait_ready(&http, op, &mut ours).await;
    let mut wrong = Vec::new();
    for (r, want) in reads.iter().zip(&before) {
        let got = send(&http, op, r).await;
        if got != *want {
            wrong.push(format!("{} {}: reference {want:?}, ours {got:?}", r.0, r.1));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
