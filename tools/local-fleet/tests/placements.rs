//! `--placements DIR`: a short replay writes one CSV per routed variant,
//! named by the variant's place in the list and its name, with the
//! documented columns and one row per request in trace order.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const REQUESTS: usize = 60;
const ENGINES: usize = 2;

#[test]
fn a_short_replay_writes_one_csv_per_variant_with_a_row_per_request() {
    let index_server = ic_e2e::workspace_binary("ic-index-server");
    let dir = tempfile::tempdir().unwrap();
    let placements = dir.path().join("placements");
    let out = Command::new(env!("CARGO_BIN_EXE_ic-local-fleet"))
        .arg("--report")
        .arg(dir.path().join("run.md"))
        .args(["--workload", "chat", "--speed", "400", "--json"])
        .args(["--requests", &REQUESTS.to_string()])
        .args(["--engines", &ENGINES.to_string()])
        // The two default variants: one through LookupRoute, one through
        // the endpoint picker.
        .args(["--only", "default"])
        .arg("--placements")
        .arg(&placements)
        .arg("--bin-dir")
        .arg(index_server.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "local fleet failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let mut files: Vec<String> = std::fs::read_dir(&placements)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "5-endpoint-picker--default-.csv",
            "6-lookup-route--default-.csv"
        ]
    );
    for file in &files {
        let text = std::fs::read_to_string(placements.join(file)).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("request,replica,engine,how,hit_blocks,prompt_blocks,best_blocks,ttft_ms"),
            "{file}"
        );
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), REQUESTS, "{file}:\n{text}");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), 8, "{file} row {i}: {row:?}");
            let n = |c: usize| row[c].parse::<usize>().unwrap();
            assert_eq!(n(0), i, "{file}: rows in trace order");
            assert_eq!(n(1), 0, "{file} row {i}: one index replica asked");
            assert!(n(2) < ENGINES, "{file} row {i}: {row:?}");
            assert!(
                ["prefix", "load", "fallback", "picker"].contains(&row[3]),
                "{file} row {i}: {row:?}"
            );
            let (hit, prompt, best) = (n(4), n(5), n(6));
            assert!(
                hit <= best && best <= prompt && prompt > 0,
                "{file} row {i}: {row:?}"
            );
            assert!(
                row[7].parse::<f64>().unwrap() > 0.0,
                "{file} row {i}: {row:?}"
            );
        }
    }
}
