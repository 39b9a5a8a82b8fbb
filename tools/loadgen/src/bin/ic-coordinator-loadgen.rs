//! `ic-coordinator-loadgen`: drives a real coordinator over its REST API on
//! loopback — event ingest (`POST /events`, one store batch per request) and
//! directory lookups (`POST /directory/lookup`, keys form) — and reports
//! batches/s, entries/s, qps and latency percentiles.
//!
//! `--compare LMCACHE_BIN` runs the side-by-side: for each round and each
//! of `--compare-concurrency`, a fresh `ic-coordinator` and a fresh
//! `lmcache coordinator` (alternating which goes first), the same load
//! against each, then the medians and ratios as one table.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ic_loadgen::http1::Conn;
use ic_loadgen::{PhaseStats, summarize};
use ic_sim::ServiceProcess;
use serde::Serialize;
use serde_json::{Value, json};

/// Load generator for the coordinator.
#[derive(Debug, Parser)]
#[command(name = "ic-coordinator-loadgen", version)]
struct Args {
    /// Coordinator base URL. Without it one is started on loopback from
    /// --bin-dir.
    #[arg(long)]
    target: Option<String>,
    /// Directory holding ic-coordinator (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// MP server instances emitting events.
    #[arg(long, default_value_t = 16)]
    instances: usize,
    /// Entries (stored chunks) per batch.
    #[arg(long, default_value_t = 256)]
    entries_per_batch: usize,
    /// Keys per directory lookup.
    #[arg(long, default_value_t = 16)]
    lookup_keys: usize,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 10.0)]
    duration_secs: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Side-by-side against LMCache's coordinator: the `lmcache` executable
    /// (e.g. `$IC_CONFORMANCE_VENV/bin/lmcache`).
    #[arg(long, value_name = "LMCACHE_BIN")]
    compare: Option<PathBuf>,
    /// Rounds of the side-by-side (each runs both servers at every
    /// concurrency).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Concurrencies of the side-by-side.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    compare_concurrency: Vec<usize>,
    /// Threads of the client's runtime; 1 runs every connection on one
    /// thread (no cross-thread wake-up per request: the client shares the
    /// cores with the server under test).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    target: String,
    instances: usize,
    entries_per_batch: usize,
    concurrency: usize,
    ingest: PhaseStats,
    ingest_entries_per_second: f64,
    lookup_keys: usize,
    lookup: PhaseStats,
    lookup_hit_ratio: f64,
}

const MODEL: &str = "loadgen-model";

/// The chunk hash of entry `n` of instance `i` (16 bytes of hex).
fn chunk_hex(instance: usize, n: u64) -> String {
    format!("{instance:016x}{n:016x}")
}

/// The part of a `/directory/lookup` answer the load generator reads.
#[derive(serde::Deserialize)]
struct LookupAnswer {
    results: Vec<LookupResult>,
}

#[derive(serde::Deserialize)]
struct LookupResult {
    placements: Vec<serde::de::IgnoredAny>,
}

/// A lookup's answer checked: status 200 and a lookup body; (keys asked,
/// keys found).
fn lookup_hits(status: u16, body: &[u8]) -> anyhow::Result<(u64, u64)> {
    if status != 200 {
        bail!(
            "POST /directory/lookup: HTTP {status}: {}",
            String::from_utf8_lossy(body)
        );
    }
    if let Some(hits) = count_hits(body) {
        return Ok(hits);
    }
    let answer: LookupAnswer = serde_json::from_slice(body)?;
    let found = answer
        .results
        .iter()
        .filter(|r| !r.placements.is_empty())
        .count();
    Ok((answer.results.len() as u64, found as u64))
}

/// The part of a `POST /events` answer the load generator reads.
#[derive(Debug, serde::Deserialize)]
struct EventsAnswer {
    applied: u64,
    #[serde(default)]
    duplicates: u64,
}

impl EventsAnswer {
    /// Whether the worker moves on to the instance's next seq: applied, or
    /// a duplicate — the server applied it already and its answer was lost
    /// (a broken connection); sent again it would be a duplicate forever.
    fn moves_on(&self) -> bool {
        self.applied == 1 || self.duplicates == 1
    }
}

/// The wait after `failures` failed connects in a row: 10 ms doubling to
/// 1 s, so a server that is down is not dialled in a hot loop.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(10u64 << failures.min(7)).min(Duration::from_secs(1))
}

/// Opens a broken connection again; after a failed connect, waits
/// ([`backoff`], never past `end`) before the caller's next request.
async fn reopen(base: &str, conn: &mut Conn, failures: &mut u32, end: Instant) {
    match Conn::open(base).await {
        Ok(c) => {
            *conn = c;
            *failures = 0;
        }
        Err(_) => {
            let left = end.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff(*failures).min(left)).await;
            *failures = failures.saturating_add(1);
        }
    }
}

/// An events answer checked: status 200 and the counts.
fn events_answer(status: u16, body: &[u8]) -> anyhow::Result<EventsAnswer> {
    if status != 200 {
        bail!(
            "POST /events: HTTP {status}: {}",
            String::from_utf8_lossy(body)
        );
    }
    Ok(serde_json::from_slice::<EventsAnswer>(body)?)
}

/// One store batch of `entries` new chunks for `instance`, written straight
/// to JSON text: the load generator shares the cores with the server, so
/// building a `Value` tree per batch would cap what it can measure.
#[cfg(test)]
fn batch(instance: usize, seq: u64, first: u64, entries: usize) -> String {
    let mut out = Vec::new();
    write_batch(&mut out, instance, seq, first, entries);
    String::from_utf8(out).unwrap_or_default()
}

/// [`batch`] into `out` (cleared first), which a worker keeps. The
/// client's cost of a batch is in every request's time at one in flight:
/// written a `char` at a time it was some 300 k instructions a batch, a
/// third of what our server spends on it.
fn write_batch(out: &mut Vec<u8>, instance: usize, seq: u64, first: u64, entries: usize) {
    use std::io::Write;
    out.clear();
    // One entry, its counter's 16 digits zeros: every entry is these
    // bytes with those digits written over.
    const PREFIX: &[u8] = br#"{"key":{"chunk_hash_hex":""#;
    let mut entry = Vec::with_capacity(128);
    entry.extend_from_slice(PREFIX);
    entry.extend_from_slice(&hex16(instance as u64));
    entry.extend_from_slice(&[b'0'; 16]);
    entry.extend_from_slice(br#"","model_name":""#);
    entry.extend_from_slice(MODEL.as_bytes());
    entry.extend_from_slice(br#"","kv_rank":0},"size_bytes":65536}"#);
    out.reserve(160 + entries * (entry.len() + 1));
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        r#"{{"batches":[{{"instance_id":"mp-{instance}","incarnation":1,"seq":{seq},"event_type":"store","tier":"l2","backend":"fs","entries":["#
    );
    let digits = PREFIX.len() + 16..PREFIX.len() + 32;
    for k in 0..entries as u64 {
        if k > 0 {
            out.push(b',');
        }
        entry[digits.clone()].copy_from_slice(&hex16(first + k));
        out.extend_from_slice(&entry);
    }
    out.extend_from_slice(b"]}]}");
}

/// `{n:016x}`, two digits a table read.
fn hex16(n: u64) -> [u8; 16] {
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [DIGITS[i >> 4], DIGITS[i & 0xF]];
            i += 1;
        }
        t
    };
    let mut out = [0u8; 16];
    for (pair, byte) in out.as_chunks_mut::<2>().0.iter_mut().zip(n.to_be_bytes()) {
        *pair = PAIRS[usize::from(byte)];
    }
    out
}

/// Results of a lookup answer, and how many have a placement: by finding
/// each `"placements":[` of the compact JSON both servers write (cheaper
/// than decoding the answer; the same work for either server). `None` when
/// the answer holds none, so the caller decodes it.
fn count_hits(answer: &[u8]) -> Option<(u64, u64)> {
    const MARK: &[u8] = br#""placements":"#;
    let (mut asked, mut found) = (0, 0);
    // Every list opens with `[`; few do, so look at what precedes each.
    for (i, _) in answer.iter().enumerate().filter(|(_, b)| **b == b'[') {
        if answer[..i].ends_with(MARK) {
            asked += 1;
            found += u64::from(answer.get(i + 1) != Some(&b']'));
        }
    }
    (asked > 0).then_some((asked, found))
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Value> {
    let response = client.post(url).json(body).send().await?;
    let status = response.status();
    let value: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("POST {url}: HTTP {status}: {value}");
    }
    Ok(value)
}

/// Which server a run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Server {
    Ours,
    Lmcache,
}

/// A server started for one run (stopped and cleaned up on drop).
struct Started {
    base: String,
    process: Option<ServiceProcess>,
    child: Option<std::process::Child>,
    dir: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(p) = &mut self.process {
            p.stop();
        }
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch_dir(tag: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ic-coordinator-loadgen-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn start_ours(bin_dir: Option<&std::path::Path>) -> anyhow::Result<Started> {
    let bin = ic_loadgen::service_binary(bin_dir, "ic-coordinator").map_err(anyhow::Error::msg)?;
    let dir = scratch_dir("ours")?;
    let checkpoint = dir.join("checkpoint");
    let metadata = dir.join("metadata.json");
    let mut p = ServiceProcess::start(
        &bin,
        &[
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--checkpoint-path",
            checkpoint.to_str().unwrap_or_default(),
            "--metadata-path",
            metadata.to_str().unwrap_or_default(),
        ],
    );
    let addr = p.admin_addr();
    Ok(Started {
        base: format!("http://{addr}"),
        process: Some(p),
        child: None,
        dir,
    })
}

/// LMCache's coordinator with the same flags; ready once `/healthz` answers.
async fn start_lmcache(bin: &std::path::Path) -> anyhow::Result<Started> {
    let dir = scratch_dir("lmcache")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = std::process::Command::new(bin)
        .args([
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .arg("--checkpoint-path")
        .arg(dir.join("checkpoint"))
        .arg("--metadata-path")
        .arg(dir.join("metadata.json"))
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("LMCACHE_TRACK_USAGE", "false")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let started = Started {
        base: format!("http://127.0.0.1:{port}"),
        process: None,
        child: Some(child),
        dir,
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = client.get(format!("{}/healthz", started.base)).send().await
            && r.status().is_success()
        {
            return Ok(started);
        }
        if Instant::now() > deadline {
            bail!("{} never became ready on port {port}", bin.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async_main(args))
}

async fn async_main(args: Args) -> anyhow::Result<()> {
    if args.instances == 0
        || args.concurrency == 0
        || args.entries_per_batch == 0
        || args.lookup_keys == 0
        || args.compare_concurrency.contains(&0)
    {
        bail!(
            "--instances, --concurrency, --compare-concurrency, --entries-per-batch and --lookup-keys must be at least 1"
        );
    }
    if let Some(lmcache) = &args.compare {
        return compare(&args, lmcache).await;
    }
    let started = match &args.target {
        Some(_) => None,
        None => Some(start_ours(args.bin_dir.as_deref())?),
    };
    let base = args
        .target
        .as_deref()
        .map(|t| t.trim_end_matches('/').to_owned())
        .or_else(|| started.as_ref().map(|s| s.base.clone()))
        .context("no coordinator to drive")?;
    let report = run(&args, &base, args.concurrency).await?;
    drop(started);
    print_report(&args, &report)
}

/// The side-by-side: fresh servers, alternating, every concurrency.
async fn compare(args: &Args, lmcache: &std::path::Path) -> anyhow::Result<()> {
    let mut rows: Vec<(Server, usize, Report)> = Vec::new();
    for round in 0..args.rounds.max(1) {
        for &c in &args.compare_concurrency {
            let order = if round % 2 == 0 {
                [Server::Lmcache, Server::Ours]
            } else {
                [Server::Ours, Server::Lmcache]
            };
            for server in order {
                let started = match server {
                    Server::Ours => start_ours(args.bin_dir.as_deref())?,
                    Server::Lmcache => start_lmcache(lmcache).await?,
                };
                eprintln!("round {} · {server:?} · {c} in flight", round + 1);
                let report = run(args, &started.base, c).await?;
                drop(started);
                // A failed request (a wrong status, an answer that does
                // not check) is not timed; the table must not hide it.
                if report.ingest.errors > 0 || report.lookup.errors > 0 {
                    println!(
                        "round {} · {server:?} · {c} in flight: {} /events and {} /directory/lookup requests failed",
                        round + 1,
                        report.ingest.errors,
                        report.lookup.errors
                    );
                }
                rows.push((server, c, report));
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let version = std::process::Command::new(lmcache.with_file_name("python3"))
        .args(["-c", "import lmcache; print(lmcache.__version__)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "side by side: ic-coordinator {} vs LMCache {version} coordinator; {} rounds, fresh server per run, alternating; {} instances, {} entries/batch, {} keys/lookup, {} s per phase (medians)",
        env!("CARGO_PKG_VERSION"),
        args.rounds.max(1),
        args.instances,
        args.entries_per_batch,
        args.lookup_keys,
        args.duration_secs
    );
    println!(
        "| in flight | server | ingest batches/s | entries/s | /events p50 / p99 | lookups/s | /directory/lookup p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for &c in &args.compare_concurrency {
        let med = |server: Server, f: fn(&Report) -> f64| {
            let mut v: Vec<f64> = rows
                .iter()
                .filter(|(s, cc, _)| *s == server && *cc == c)
                .map(|(_, _, r)| f(r))
                .collect();
            median(&mut v)
        };
        let mut stats = Vec::new();
        for server in [Server::Lmcache, Server::Ours] {
            let s = [
                med(server, |r| r.ingest.qps),
                med(server, |r| r.ingest_entries_per_second),
                med(server, |r| r.ingest.p50_us),
                med(server, |r| r.ingest.p99_us),
                med(server, |r| r.lookup.qps),
                med(server, |r| r.lookup.p50_us),
                med(server, |r| r.lookup.p99_us),
            ];
            println!(
                "| {c} | {} | {:.0} | {:.0} | {:.2} ms / {:.2} ms | {:.0} | {:.0} µs / {:.0} µs |",
                if server == Server::Ours {
                    "ic-coordinator"
                } else {
                    "LMCache"
                },
                s[0],
                s[1],
                s[2] / 1000.0,
                s[3] / 1000.0,
                s[4],
                s[5],
                s[6]
            );
            stats.push(s);
        }
        summary.push(format!(
            "{c} in flight: ingest {:.1}× the batches/s, lookup p99 {:.3} of the reference's, /events p99 {:.3} of it",
            stats[1][0] / stats[0][0],
            stats[1][6] / stats[0][6],
            stats[1][3] / stats[0][3]
        ));
    }
    for line in summary {
        println!("{line}");
    }
    if args.json {
        let json: Vec<Value> = rows
            .iter()
            .map(|(s, c, r)| json!({"server": s, "concurrency": c, "report": r}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}

/// One run: registration, the ingest phase, the lookup phase.
async fn run(args: &Args, base: &str, concurrency: usize) -> anyhow::Result<Report> {
    let base = base.to_owned();
    let client = reqwest::Client::new();
    for i in 0..args.instances {
        post(
            &client,
            &format!("{base}/instances"),
            &json!({"instance_id": format!("mp-{i}"), "ip": "127.0.0.1", "http_port": 1}),
        )
        .await
        .context("registering instances")?;
    }
    // On stderr even with --json: a profiler watching the run splits the
    // phases on these lines.
    let say = |m: &str| eprintln!("{m}");
    let duration = Duration::from_secs_f64(args.duration_secs);

    say("measuring event ingest (POST /events)…");
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut conn = Conn::open(&base).await?;
        let entries = args.entries_per_batch;
        // Worker w owns instances w, w + C, …: sequence numbers stay in order.
        let owned: Vec<usize> = (w..args.instances).step_by(concurrency).collect();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut produced = vec![0u64; owned.len()];
            if owned.is_empty() {
                return (latencies, errors, owned, produced);
            }
            let (mut turn, mut failures) = (0usize, 0u32);
            let (mut body, mut request) = (Vec::new(), Vec::new());
            while Instant::now() < end {
                let k = turn % owned.len();
                turn += 1;
                let seq = produced[k] / entries as u64 + 1;
                write_batch(&mut body, owned[k], seq, produced[k], entries);
                conn.encode(&mut request, "/events", &body);
                // A connection the server closed is opened again before
                // the clock starts.
                if conn.ready().await.is_err() {
                    errors += 1;
                    reopen(&base, &mut conn, &mut failures, end).await;
                    continue;
                }
                // From the first byte written to the last byte read.
                let t0 = Instant::now();
                let answer = match conn.exchange(&request).await {
                    Ok(a) => events_answer(a.status, conn.body(&a)).map(|e| (e, a.done)),
                    Err(e) => Err(e),
                };
                match answer {
                    Ok((a, done)) if a.applied == 1 => {
                        latencies.push(done - t0);
                        produced[k] += entries as u64;
                    }
                    // Applied before its answer was lost (counted then).
                    Ok((a, _)) if a.moves_on() => produced[k] += entries as u64,
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        // A broken connection is opened again.
                        reopen(&base, &mut conn, &mut failures, end).await;
                    }
                }
            }
            (latencies, errors, owned, produced)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut stored: Vec<(usize, u64)> = Vec::new();
    for t in tasks {
        let (l, e, owned, produced) = t.await?;
        latencies.extend(l);
        errors += e;
        stored.extend(owned.into_iter().zip(produced));
    }
    let ingest = summarize(latencies, errors, started.elapsed());
    let stored = Arc::new(stored.into_iter().filter(|s| s.1 > 0).collect::<Vec<_>>());
    if stored.is_empty() {
        bail!("no batch was applied");
    }

    say("measuring directory lookups (POST /directory/lookup)…");
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut conn = Conn::open(&base).await?;
        let base = base.clone();
        let stored = stored.clone();
        let n = args.lookup_keys;
        tasks.push(tokio::spawn(async move {
            use std::fmt::Write;
            let mut latencies = Vec::new();
            let (mut errors, mut found, mut asked) = (0u64, 0u64, 0u64);
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
            let mut failures = 0u32;
            let (mut body, mut request) = (String::with_capacity(32 + n * 100), Vec::new());
            while Instant::now() < end {
                // Written as text before the clock starts; the answer is
                // checked after it stops.
                body.clear();
                body.push_str(r#"{"keys":["#);
                for i in 0..n {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (instance, count) = stored[(x % stored.len() as u64) as usize];
                    if i > 0 {
                        body.push(',');
                    }
                    let _ = write!(
                        body,
                        r#"{{"chunk_hash_hex":"{}","model_name":"{MODEL}","kv_rank":0}}"#,
                        chunk_hex(instance, (x >> 20) % count)
                    );
                }
                body.push_str("]}");
                conn.encode(&mut request, "/directory/lookup", body.as_bytes());
                if conn.ready().await.is_err() {
                    errors += 1;
                    reopen(&base, &mut conn, &mut failures, end).await;
                    continue;
                }
                let t0 = Instant::now();
                let answer = match conn.exchange(&request).await {
                    Ok(a) => lookup_hits(a.status, conn.body(&a)).map(|h| (h, a.done)),
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(((a, f), done)) => {
                        latencies.push(done - t0);
                        asked += a;
                        found += f;
                    }
                    Err(_) => {
                        errors += 1;
                        reopen(&base, &mut conn, &mut failures, end).await;
                    }
                }
            }
            (latencies, errors, found, asked)
        }));
    }
    let mut latencies = Vec::new();
    let (mut errors, mut found, mut asked) = (0, 0, 0);
    for t in tasks {
        let (l, e, f, a) = t.await?;
        latencies.extend(l);
        errors += e;
        found += f;
        asked += a;
    }
    let lookup = summarize(latencies, errors, started.elapsed());

    Ok(Report {
        target: base,
        instances: args.instances,
        entries_per_batch: args.entries_per_batch,
        concurrency,
        ingest_entries_per_second: ingest.qps * args.entries_per_batch as f64,
        ingest,
        lookup_keys: args.lookup_keys,
        lookup_hit_ratio: found as f64 / asked.max(1) as f64,
        lookup,
    })
}

fn print_report(args: &Args, report: &Report) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!(
            "coordinator {}: {} instances, {} in flight",
            report.target, report.instances, report.concurrency
        );
        println!(
            "{:<40} {:>10} {:>10} {:>10} {:>8}",
            "phase", "req/s", "p50 µs", "p99 µs", "errors"
        );
        for (name, s) in [
            (
                format!("POST /events ({} entries/batch)", report.entries_per_batch),
                &report.ingest,
            ),
            (
                format!("POST /directory/lookup ({} keys)", report.lookup_keys),
                &report.lookup,
            ),
        ] {
            println!(
                "{name:<40} {:>10.0} {:>10.0} {:>10.0} {:>8}",
                s.qps, s.p50_us, s.p99_us, s.errors
            );
        }
        println!(
            "ingest: {:.0} batches/s = {:.0} entries/s; lookups found {:.1}% of keys",
            report.ingest.qps,
            report.ingest_entries_per_second,
            report.lookup_hit_ratio * 100.0
        );
    }
    if report.ingest.errors > 0 || report.lookup.errors > 0 {
        bail!("some requests failed");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_json_it_was_written_as_with_fmt() {
        let body: Value = serde_json::from_str(&batch(3, 2, 0x1f, 2)).unwrap();
        let entries = body["batches"][0]["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0]["key"]["chunk_hash_hex"], chunk_hex(3, 0x1f));
        assert_eq!(entries[1]["key"]["chunk_hash_hex"], chunk_hex(3, 0x20));
        assert_eq!(entries[1]["key"]["kv_rank"], 0);
        assert_eq!(entries[1]["size_bytes"], 65536);
        assert_eq!(entries[1]["key"]["model_name"], MODEL);
        assert_eq!(body["batches"][0]["seq"], 2);
    }

    #[test]
    fn hash_digits_are_fmt_s_lowercase_hex() {
        for n in [0, 1, 0xab, 0x0123_4567_89ab_cdef, u64::MAX] {
            assert_eq!(hex16(n).as_slice(), format!("{n:016x}").as_bytes());
        }
        let body = batch(usize::MAX, 1, u64::MAX - 1, 2);
        assert!(body.contains(&chunk_hex(usize::MAX, u64::MAX)));
    }

    #[test]
    fn a_duplicate_answer_moves_the_instance_on() {
        let answer = |b: &str| serde_json::from_str::<EventsAnswer>(b).unwrap();
        assert!(answer(r#"{"applied": 1, "duplicates": 0, "stale": 0}"#).moves_on());
        // Its answer was lost after the server applied it: sent again.
        assert!(answer(r#"{"applied": 0, "duplicates": 1, "stale": 0}"#).moves_on());
        assert!(!answer(r#"{"applied": 0, "duplicates": 0, "stale": 1}"#).moves_on());
        assert!(!answer(r#"{"applied": 0}"#).moves_on());
    }

    #[test]
    fn failed_connects_back_off_up_to_a_second() {
        assert_eq!(backoff(0), Duration::from_millis(10));
        assert_eq!(backoff(1), Duration::from_millis(20));
        assert_eq!(backoff(6), Duration::from_millis(640));
        assert_eq!(backoff(7), Duration::from_secs(1));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn a_lookup_answer_is_checked() {
        let ok = br#"{"chunks":1,"results":[{"placements":[{"tier":"l2"}]}]}"#;
        assert_eq!(lookup_hits(200, ok).unwrap(), (1, 1));
        let error = lookup_hits(422, br#"{"detail":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("HTTP 422"), "{error}");
        assert!(lookup_hits(200, b"not json").is_err());
        assert!(events_answer(500, b"{}").is_err());
        assert_eq!(events_answer(200, br#"{"applied":1}"#).unwrap().applied, 1);
    }

    #[test]
    fn hits_are_counted_as_the_decoded_answer_counts_them() {
        let answer = json!({"chunks": 3, "results": [
            {"access_count": 0, "key": {"chunk_hash_hex": "00"}, "placements": [{"tier": "l2"}], "token_ids": []},
            {"access_count": 0, "key": {"chunk_hash_hex": "01"}, "placements": [], "token_ids": []},
            {"access_count": 0, "key": {"chunk_hash_hex": "02"}, "placements": [{"tier": "l1"}, {"tier": "l2"}], "token_ids": [1]}
        ]});
        assert_eq!(count_hits(answer.to_string().as_bytes()), Some((3, 2)));
        assert_eq!(count_hits(br#"{"chunks":0,"results":[]}"#), None);
    }
}
