//! The run's report: a Markdown page and an SVG chart of hit ratio over the
//! replay, one line per routing policy. Pure string building.

use std::fmt::Write as _;

use crate::fleet::PolicyResult;

/// Chart size in pixels.
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 360.0;
const MARGIN_LEFT: f64 = 56.0;
const MARGIN_RIGHT: f64 = 200.0;
const MARGIN_Y: f64 = 32.0;
/// Line colours, one per policy in order (colour-blind safe palette).
const COLOURS: [&str; 6] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
];

/// Escapes text for XML content and attributes.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG line chart of each policy's windowed hit ratio (0–100 %) against
/// requests replayed.
pub fn svg_chart(policies: &[PolicyResult]) -> String {
    let max_x = policies
        .iter()
        .flat_map(|p| p.timeline.last().map(|t| t.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - 2.0 * MARGIN_Y;
    let x = |v: f64| MARGIN_LEFT + v / max_x * plot_w;
    let y = |ratio: f64| MARGIN_Y + (1.0 - ratio.clamp(0.0, 1.0)) * plot_h;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Grid and y labels every 20 %.
    for pct in (0..=100).step_by(20) {
        let gy = y(f64::from(pct) / 100.0);
        let _ = writeln!(
            out,
            r##"<line x1="{MARGIN_LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{pct}%</text>"##,
            MARGIN_LEFT + plot_w,
            MARGIN_LEFT - 6.0,
            gy + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">requests replayed (of {max_x:.0})</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        HEIGHT - 6.0
    );
    let _ = writeln!(
        out,
        r#"<text x="{MARGIN_LEFT}" y="18" font-weight="bold">prefix hit ratio per window</text>"#
    );
    for (i, p) in policies.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = p
            .timeline
            .iter()
            .map(|&(n, r)| format!("{:.1},{:.1}", x(n as f64), y(r)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let ly = MARGIN_Y + 10.0 + i as f64 * 20.0;
        let lx = MARGIN_LEFT + plot_w + 12.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{} ({:.1}%)</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            xml(&p.policy),
            p.hit_ratio() * 100.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// What the Markdown page states besides the policies.
#[derive(Clone, Debug)]
pub struct RunFacts {
    /// The command that produced the run.
    pub command: String,
    /// Trace description.
    pub workload: String,
    /// Engines and their HBM budget.
    pub engines: usize,
    /// Blocks per engine.
    pub capacity_blocks: usize,
    /// Index-server replicas the gateways spread their requests over.
    pub index_replicas: usize,
    /// LookupRoute round-trip percentiles, µs.
    pub lookup_p50_us: u128,
    /// LookupRoute round-trip percentiles, µs.
    pub lookup_p99_us: u128,
    /// Index entries at the end.
    pub index_entries: u64,
    /// Heap bytes the index held at the end.
    pub index_memory_bytes: f64,
    /// Whether the index matched every engine.
    pub index_agrees: bool,
    /// Wall time.
    pub wall_seconds: f64,
    /// The timing model's per-token cost, in words.
    pub timing: String,
    /// The timing model's per-request cost, ms.
    pub overhead_ms: f64,
}

/// The Markdown report; `chart` is the SVG's file name, relative to it.
pub fn markdown(facts: &RunFacts, policies: &[PolicyResult], chart: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Local fleet run\n");
    let _ = writeln!(out, "```\n{}\n```\n", facts.command);
    let _ = writeln!(
        out,
        "{} on {} simulated engines × {} KV blocks each, {} index-server replica(s).\n",
        facts.workload, facts.engines, facts.capacity_blocks, facts.index_replicas
    );
    let _ = writeln!(
        out,
        "| routing | requests | prefix hit ratio | prefill tokens saved | TTFT p50 | TTFT p99 |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for p in policies {
        let saved = if p.prompt_tokens == 0 {
            0.0
        } else {
            100.0 * p.prefill_tokens_saved as f64 / p.prompt_tokens as f64
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1}% | {} ({saved:.1}%) | {:.0} ms | {:.0} ms |",
            p.policy,
            p.requests,
            100.0 * p.hit_ratio(),
            p.prefill_tokens_saved,
            p.ttft_p50_ms,
            p.ttft_p99_ms,
        );
    }
    let _ = writeln!(
        out,
        "\nTTFT is simulated: each engine prefills one request at a time, {} per uncached \
         prompt token plus {} ms per request, first come first served.",
        facts.timing, facts.overhead_ms
    );
    let _ = writeln!(out, "\n![hit ratio over the replay]({chart})\n");
    let _ = writeln!(
        out,
        "* LookupRoute round trip: p50 {} µs, p99 {} µs",
        facts.lookup_p50_us, facts.lookup_p99_us
    );
    let _ = writeln!(
        out,
        "* index at the end: {} entries in {:.1} MiB of index memory; matches every engine's cache: {}",
        facts.index_entries,
        facts.index_memory_bytes / (1024.0 * 1024.0),
        if facts.index_agrees { "yes" } else { "NO" }
    );
    let _ = writeln!(out, "* wall time: {:.1} s", facts.wall_seconds);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, points: &[(u64, f64)]) -> PolicyResult {
        let mut p = PolicyResult::new(name, 100);
        p.timeline = points.to_vec();
        p
    }

    #[test]
    fn chart_has_one_line_and_legend_entry_per_policy() {
        let svg = svg_chart(&[
            policy("lookup-route", &[(10, 0.2), (20, 0.5)]),
            policy("random <x>", &[(10, 0.1), (20, 0.1)]),
        ]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("random &lt;x&gt;"), "names are escaped");
        // Last point of the first line sits at the right edge, 50 % high.
        let right = MARGIN_LEFT + (WIDTH - MARGIN_LEFT - MARGIN_RIGHT);
        let mid = MARGIN_Y + 0.5 * (HEIGHT - 2.0 * MARGIN_Y);
        assert!(svg.contains(&format!("{right:.1},{mid:.1}")), "{svg}");
    }

    #[test]
    fn empty_runs_still_render() {
        let svg = svg_chart(&[]);
        assert!(svg.contains("</svg>"));
    }

    #[test]
    fn markdown_states_the_command_and_every_policy() {
        let facts = RunFacts {
            command: "ic-local-fleet --engines 2".into(),
            workload: "trace x".into(),
            engines: 2,
            capacity_blocks: 10,
            index_replicas: 3,
            lookup_p50_us: 100,
            lookup_p99_us: 900,
            index_entries: 20,
            index_memory_bytes: 3.5 * 1024.0 * 1024.0,
            index_agrees: true,
            wall_seconds: 1.5,
            timing: "1/30000 s".into(),
            overhead_ms: 20.0,
        };
        let md = markdown(&facts, &[policy("lookup-route", &[])], "hit-ratio.svg");
        assert!(md.contains("ic-local-fleet --engines 2"));
        assert!(
            md.contains("× 10 KV blocks each, 3 index-server replica(s)."),
            "{md}"
        );
        assert!(md.contains("| lookup-route | 0 | 0.0% |"));
        assert!(md.contains("| 0 ms | 0 ms |"), "{md}");
        assert!(md.contains("![hit ratio over the replay](hit-ratio.svg)"));
        assert!(md.contains("matches every engine's cache: yes"));
        assert!(md.contains("20 entries in 3.5 MiB of index memory"), "{md}");
    }
}
