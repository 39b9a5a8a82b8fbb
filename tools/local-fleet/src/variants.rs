//! The routed variants: each a way of running the real index (its scoring
//! flags, LookupRoute or the endpoint picker).

/// One way of running the real index: a name, its scoring flags, and
/// whether the gateway asks the endpoint picker instead of LookupRoute.
pub struct Variant {
    pub name: &'static str,
    pub flags: &'static [&'static str],
    pub epp: bool,
    /// Ranks by prefix alone (no load in the score, no bound): replicas
    /// must then name the same `best` for a prompt with one longest holder.
    pub prefix_decides: bool,
    /// Tells the server the engines' prefill rate and overhead (the fleet's
    /// timing model, on the replay's compressed clock) for its TTFT score;
    /// otherwise the server assumes its default rate (100,000 tokens/s; at
    /// the default `--speed` the engines prefill 93,750 index tokens/s).
    pub ttft: bool,
}

/// Turns the TTFT score off: the server then scores by the weights (the
/// default before TTFT scoring was).
const BY_THE_WEIGHTS: &str = "--ttft-prefill-tokens-per-second=0";

/// The scoring variants; the default scoring through LookupRoute is last
/// (its services are the ones `--keep-running` keeps).
pub const VARIANTS: [Variant; 7] = [
    Variant {
        name: "lookup-route, prefix only",
        flags: &[
            BY_THE_WEIGHTS,
            "--score-load-weight=0",
            "--score-kv-usage-weight=0",
            "--load-bound=0",
            "--score-t2-credit=1",
            "--speculative-ttl-ms=0",
        ],
        epp: false,
        prefix_decides: true,
        ttft: false,
    },
    Variant {
        name: "lookup-route, by the weights",
        flags: &[BY_THE_WEIGHTS],
        epp: false,
        prefix_decides: false,
        ttft: false,
    },
    Variant {
        name: "endpoint picker, by the weights",
        flags: &[BY_THE_WEIGHTS],
        epp: true,
        prefix_decides: false,
        ttft: false,
    },
    Variant {
        name: "lookup-route, TTFT told the rate",
        flags: &[],
        epp: false,
        prefix_decides: false,
        ttft: true,
    },
    Variant {
        name: "endpoint picker, TTFT told the rate",
        flags: &[],
        epp: true,
        prefix_decides: false,
        ttft: true,
    },
    Variant {
        name: "endpoint picker (default)",
        flags: &[],
        epp: true,
        prefix_decides: false,
        ttft: false,
    },
    Variant {
        name: "lookup-route (default)",
        flags: &[],
        epp: false,
        prefix_decides: false,
        ttft: false,
    },
];
