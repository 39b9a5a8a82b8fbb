//! The run's report: a Markdown page and an SVG chart comparing the
//! routing policies (hit ratio, TTFT p50 and p99). Pure string building.

use std::fmt::Write as _;

use crate::fleet::PolicyResult;

/// Chart geometry in pixels: one row per policy, its name on the left,
/// then the hit-ratio panel, then the TTFT panel.
const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 300.0;
const PANEL_GAP: f64 = 56.0;
const HIT_W: f64 = 250.0;
const TOP: f64 = 64.0;
const ROW_H: f64 = 30.0;
const BOTTOM: f64 = 36.0;
/// Hit-ratio bar, TTFT p50 and p99 bars (colour-blind safe palette).
const HIT_COLOUR: &str = "#0072B2";
const P50_COLOUR: &str = "#D55E00";
const P99_COLOUR: &str = "#E69F00";
/// The oracle's hit bar: a ceiling to read against, not a contender.
const CEILING_COLOUR: &str = "#9a9a9a";

/// Whether `p` is the single-cache oracle (a ceiling no routing reaches:
/// never starred, so the star marks the best real routing).
fn is_ceiling(p: &PolicyResult) -> bool {
    p.policy.starts_with("oracle")
}

/// Escapes text for XML content and attributes.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A duration for a bar's end: ms below 1 s, else seconds.
fn ms_label(ms: f64) -> String {
    if ms >= 10_000.0 {
        format!("{:.0} s", ms / 1000.0)
    } else if ms >= 1_000.0 {
        // Two decimals: a p99 of 1.87 s against 1.91 s is the comparison.
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// A grid label for a decade: 10 ms, 100 ms, 1 s, 10 s...
fn decade_label(ms: f64) -> String {
    if ms >= 1_000.0 {
        format!("{:.0} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// An SVG bar chart comparing the policies at a glance: per policy (one
/// row each, named on the left, so the legend is the rows), its prefix hit
/// ratio (0–100 %) and its simulated TTFT p50 and p99 on a log scale (a
/// collapsed policy's minutes next to the oracle's milliseconds). The best
/// value of each column is marked with a star.
pub fn svg_chart(policies: &[PolicyResult]) -> String {
    let height = TOP + ROW_H * policies.len().max(1) as f64 + BOTTOM;
    let hit_x = LABEL_W;
    let ttft_x = LABEL_W + HIT_W + PANEL_GAP;
    let ttft_w = WIDTH - ttft_x - 70.0;
    let ttfts = policies
        .iter()
        .flat_map(|p| [p.ttft_p50_ms, p.ttft_p99_ms])
        .filter(|v| *v > 0.0);
    let max_ms = ttfts.clone().fold(1.0, f64::max);
    let min_ms = ttfts.fold(max_ms, f64::min);
    // Decades from below the fastest to above the slowest.
    let lo = min_ms.max(1.0).log10().floor();
    let hi = max_ms.log10().ceil().max(lo + 1.0);
    let tx = |ms: f64| ttft_x + ((ms.max(1.0).log10() - lo) / (hi - lo)).clamp(0.0, 1.0) * ttft_w;
    let best_hit = policies
        .iter()
        .filter(|p| !is_ceiling(p))
        .map(PolicyResult::hit_ratio)
        .fold(0.0, f64::max);
    let best = |v: f64, of: fn(&PolicyResult) -> f64| {
        let m = policies
            .iter()
            .filter(|p| !is_ceiling(p))
            .map(of)
            .filter(|v| *v > 0.0)
            .fold(f64::MAX, f64::min);
        v > 0.0 && v <= m
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{hit_x}" y="22" font-weight="bold">prefix hit ratio (higher is better)</text>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{ttft_x}" y="22" font-weight="bold">time to first token, log scale (lower is better)</text>"#
    );
    // The TTFT legend, inside the picture, under its title.
    let _ = writeln!(
        out,
        r##"<rect x="{ttft_x}" y="32" width="14" height="10" fill="{P50_COLOUR}"/><text x="{:.1}" y="41">p50</text><rect x="{:.1}" y="32" width="14" height="10" fill="{P99_COLOUR}"/><text x="{:.1}" y="41">p99</text><text x="{:.1}" y="41" fill="#555">★ best routing</text><rect x="{hit_x}" y="32" width="14" height="10" fill="{CEILING_COLOUR}"/><text x="{:.1}" y="41" fill="#555">oracle: the ceiling, never starred</text>"##,
        ttft_x + 18.0,
        ttft_x + 56.0,
        ttft_x + 74.0,
        ttft_x + 112.0,
        hit_x + 18.0
    );
    let rows_bottom = TOP + ROW_H * policies.len() as f64;
    // Grid: every 20 % and every decade.
    for pct in (0..=100).step_by(20) {
        let gx = hit_x + f64::from(pct) / 100.0 * HIT_W;
        let _ = writeln!(
            out,
            r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{rows_bottom:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{pct}%</text>"##,
            TOP - 6.0,
            rows_bottom + 16.0
        );
    }
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let ms = 10f64.powf(decade);
        let gx = tx(ms);
        let _ = writeln!(
            out,
            r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{rows_bottom:.1}" stroke="#ddd"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
            TOP - 6.0,
            rows_bottom + 16.0,
            decade_label(ms)
        );
        decade += 1.0;
    }
    for (i, p) in policies.iter().enumerate() {
        let top = TOP + ROW_H * i as f64;
        if i % 2 == 1 {
            let _ = writeln!(
                out,
                r##"<rect x="4" y="{top:.1}" width="{:.1}" height="{ROW_H}" fill="#f4f4f4"/>"##,
                WIDTH - 8.0
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LABEL_W - 10.0,
            top + ROW_H / 2.0 + 5.0,
            xml(&p.policy)
        );
        let ratio = p.hit_ratio();
        let ceiling = is_ceiling(p);
        let star = |yes: bool| if yes && !ceiling { " ★" } else { "" };
        let _ = writeln!(
            out,
            r#"<rect x="{hit_x}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="12">{:.1}%{}</text>"#,
            top + 6.0,
            ratio.clamp(0.0, 1.0) * HIT_W,
            ROW_H - 12.0,
            if ceiling { CEILING_COLOUR } else { HIT_COLOUR },
            hit_x + ratio.clamp(0.0, 1.0) * HIT_W + 4.0,
            top + ROW_H / 2.0 + 4.0,
            ratio * 100.0,
            star(ratio > 0.0 && ratio >= best_hit)
        );
        for (k, (ms, colour, of)) in [
            (
                p.ttft_p50_ms,
                P50_COLOUR,
                (|p: &PolicyResult| p.ttft_p50_ms) as fn(&PolicyResult) -> f64,
            ),
            (p.ttft_p99_ms, P99_COLOUR, |p: &PolicyResult| p.ttft_p99_ms),
        ]
        .into_iter()
        .enumerate()
        {
            let bar_y = top + 4.0 + k as f64 * 11.0;
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="10" points="{ttft_x:.1},{:.1} {:.1},{:.1}"/><text x="{:.1}" y="{:.1}" font-size="10">{}{}</text>"#,
                bar_y + 5.0,
                tx(ms),
                bar_y + 5.0,
                tx(ms) + 4.0,
                bar_y + 9.0,
                ms_label(ms),
                star(best(ms, of))
            );
        }
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
    let _ = writeln!(out, "\n![hit ratio and TTFT per routing policy]({chart})\n");
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
    fn chart_has_one_row_per_policy_and_marks_the_best() {
        let mut a = policy("lookup-route", &[]);
        a.hit_blocks = 50;
        a.prompt_blocks = 100;
        a.ttft_p50_ms = 40.0;
        a.ttft_p99_ms = 900.0;
        let mut b = policy("random <x>", &[]);
        b.hit_blocks = 10;
        b.prompt_blocks = 100;
        b.ttft_p50_ms = 400.0;
        b.ttft_p99_ms = 600_000.0;
        let svg = svg_chart(&[a, b]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // Two TTFT bars per policy.
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("random &lt;x&gt;"), "names are escaped");
        assert!(svg.contains("50.0% ★"), "{svg}");
        assert!(svg.contains("10.0%<"), "{svg}");
        assert!(svg.contains("40 ms ★"), "{svg}");
        assert!(svg.contains("600 s<"), "{svg}");
        assert!(svg.contains(">1 s</text>"), "{svg}");
        // The hit bar is to scale: 50 % of the panel.
        assert!(
            svg.contains(&format!(r#"width="{:.1}""#, 0.5 * HIT_W)),
            "{svg}"
        );
    }

    #[test]
    fn the_oracle_is_drawn_as_the_ceiling_and_never_starred() {
        let mut a = policy("lookup-route", &[]);
        a.hit_blocks = 50;
        a.prompt_blocks = 100;
        a.ttft_p50_ms = 40.0;
        a.ttft_p99_ms = 900.0;
        let mut o = policy("oracle (one unbounded cache)", &[]);
        o.hit_blocks = 90;
        o.prompt_blocks = 100;
        o.ttft_p50_ms = 20.0;
        o.ttft_p99_ms = 30.0;
        let svg = svg_chart(&[a, o]);
        assert!(svg.contains("50.0% ★"), "the best real routing: {svg}");
        assert!(svg.contains("90.0%<"), "{svg}");
        assert!(svg.contains("40 ms ★") && svg.contains("900 ms ★"), "{svg}");
        assert!(svg.contains(CEILING_COLOUR), "{svg}");
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
        assert!(md.contains("![hit ratio and TTFT per routing policy](hit-ratio.svg)"));
        assert!(md.contains("matches every engine's cache: yes"));
        assert!(md.contains("20 entries in 3.5 MiB of index memory"), "{md}");
    }
}
