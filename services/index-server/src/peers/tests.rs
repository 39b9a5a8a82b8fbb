use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    peers: PeerFlags,
}

fn settings(args: &[&str]) -> anyhow::Result<PeerSettings> {
    let mut all = vec!["x"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all)?.peers.settings(None)
}

impl Exchange {
    fn put(
        &self,
        instance: u64,
        endpoints: Vec<(String, PeerPicks)>,
        now_ms: i64,
        partial: bool,
    ) -> Result<(), Status> {
        let mut received = self.received.lock();
        self.receive(&mut received, instance, endpoints, now_ms, partial)
    }

    fn sum_of<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
        now_ms: i64,
    ) -> Vec<(&'a str, PeerPicks)> {
        let received = self.received.lock();
        ids.into_iter()
            .map(|id| (id, received.sum_of(id, now_ms, self.settings.ttl_ms)))
            .collect()
    }

    fn sum(&self, now_ms: i64) -> (BTreeMap<String, PeerPicks>, usize) {
        let received = self.received.lock();
        let ttl = self.settings.ttl_ms;
        let fresh: Vec<&Report> = received
            .reports
            .values()
            .filter(|r| now_ms.saturating_sub(r.at_ms) <= ttl)
            .collect();
        let mut sum = BTreeMap::new();
        for id in fresh.iter().flat_map(|r| r.endpoints.keys()) {
            sum.insert(id.clone(), received.sum_of(id, now_ms, ttl));
        }
        (sum, fresh.len())
    }
}

#[test]
fn flags_parse_and_bad_urls_name_the_flag() {
    let s = settings(&[
        "--peer",
        "http://a:9090,http://b:9090",
        "--peer",
        "http://a:9090",
    ])
    .unwrap();
    assert_eq!(s.urls, ["http://a:9090", "http://b:9090"]);
    let e = settings(&["--peer", "ftp://a"]).unwrap_err().to_string();
    assert!(e.contains("--peer"), "{e}");
    let e = settings(&["--peer", "https://a:9090"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--peer"), "{e}");
    assert!(settings(&["--peer-share-interval-ms", "1"]).is_err());
}

#[test]
fn reports_are_checked_and_cut() {
    let e = |replica_id: &str, in_flight: f64| pb::EndpointPicks {
        replica_id: replica_id.into(),
        in_flight,
        recent_picks: 1.0,
        queued_ms: 0.0,
    };
    let (ok, cut) = decode(vec![e("a", 1.0), e("b", 2.0), e("c", 3.0)], 2).unwrap();
    assert_eq!((ok.len(), cut), (2, 1));
    let bad = decode(vec![e("a", 1.0), e("b", f64::NAN)], 8).unwrap_err();
    assert!(bad.message().contains("endpoints[1].in_flight"), "{bad:?}");
    let bad = decode(vec![e("", 1.0)], 8).unwrap_err();
    assert!(bad.message().contains("endpoints[0].replica_id"), "{bad:?}");
}

#[test]
fn fresh_reports_are_summed_and_peers_are_bounded() {
    let registry = MetricsRegistry::new("inferencecache", "test");
    let mut s = settings(&["--peer-max", "2", "--peer-ttl-ms", "100"]).unwrap();
    s.max_peers = 2;
    let x = Exchange::new(s, &registry);
    let p = |n: f64| PeerPicks {
        in_flight: n,
        recent: n,
        queued_ms: n,
    };
    x.put(1, vec![("a".into(), p(1.0))], 0, false).unwrap();
    x.put(
        2,
        vec![("a".into(), p(2.0)), ("b".into(), p(1.0))],
        50,
        false,
    )
    .unwrap();
    let refused = x.put(3, vec![], 60, true).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    let (sum, live) = x.sum(60);
    assert_eq!(live, 2);
    assert_eq!(sum["a"], p(3.0));
    // Peer 1 is silent past the TTL: it no longer counts, and makes
    // room for another.
    let (sum, live) = x.sum(101);
    assert_eq!((live, sum["a"]), (1, p(2.0)));
    x.put(3, vec![], 101, false).unwrap();
    assert!(registry.encode().contains("index_peers_shares_total"));
}

#[test]
fn a_pushed_report_updates_the_engines_it_names_and_keeps_the_rest() {
    let registry = MetricsRegistry::new("inferencecache", "test");
    let x = Exchange::new(settings(&["--peer-ttl-ms", "100"]).unwrap(), &registry);
    let p = |n: f64| PeerPicks {
        in_flight: n,
        recent: n,
        queued_ms: n,
    };
    x.put(
        1,
        vec![("a".into(), p(1.0)), ("b".into(), p(1.0))],
        0,
        false,
    )
    .unwrap();
    x.put(2, vec![("a".into(), p(2.0))], 0, false).unwrap();
    // Peer 1 picked b again, and c: a push names only those.
    x.put(
        1,
        vec![("b".into(), p(5.0)), ("c".into(), p(1.0))],
        10,
        true,
    )
    .unwrap();
    let sum = x.sum_of(["a", "b", "c", "d"], 10);
    assert_eq!(
        sum,
        [("a", p(3.0)), ("b", p(5.0)), ("c", p(1.0)), ("d", p(0.0))]
    );
    // A full report replaces the peer's: b and c are gone.
    x.put(1, vec![("a".into(), p(4.0))], 110, false).unwrap();
    assert_eq!(x.sum(110).0.keys().collect::<Vec<_>>(), ["a"]);
    // A push from a peer never heard of starts its report.
    x.put(3, vec![("e".into(), p(1.0))], 110, true).unwrap();
    assert_eq!(x.sum_of(["e"], 110), [("e", p(1.0))]);
}

fn p(n: f64) -> PeerPicks {
    PeerPicks {
        in_flight: n,
        recent: 0.0,
        queued_ms: 0.0,
    }
}

fn board() -> LoadBoard {
    LoadBoard::new(ic_index::load::LoadSettings::default())
}

#[test]
fn a_push_is_capped_and_does_not_keep_the_full_report_alive() {
    let registry = MetricsRegistry::new("inferencecache", "test");
    let s = settings(&["--peer-ttl-ms", "100", "--peer-max-endpoints", "2"]).unwrap();
    let x = Exchange::new(s, &registry);
    x.put(
        1,
        vec![("a".into(), p(1.0)), ("b".into(), p(1.0))],
        0,
        false,
    )
    .unwrap();
    // c is a third engine: cut, counted; a and b are updated.
    x.put(
        1,
        vec![("a".into(), p(2.0)), ("c".into(), p(1.0))],
        90,
        true,
    )
    .unwrap();
    let (sum, live) = x.sum(90);
    assert_eq!(live, 1);
    assert_eq!(sum.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(sum["a"], p(2.0));
    let metrics = registry.encode();
    assert!(
        metrics.contains("index_peers_endpoints_cut_total 1\n"),
        "{metrics}"
    );
    // The push at 90 did not refresh the report of 0: past the TTL
    // the peer counts no more, b's figure included.
    let (sum, live) = x.sum(150);
    assert_eq!((sum.len(), live), (0, 0));
    // A full report refreshes it.
    x.put(1, vec![("a".into(), p(3.0))], 150, false).unwrap();
    assert_eq!(x.sum(240).1, 1);
}

#[test]
fn an_engine_only_a_push_put_on_the_board_is_reset_by_the_next_sum() {
    let registry = MetricsRegistry::new("inferencecache", "test");
    let x = Exchange::new(settings(&["--peer-ttl-ms", "1000"]).unwrap(), &registry);
    let board = board();
    let requests = |id: &str, now_ms: i64| board.load(id, now_ms).requests;
    x.take(1, vec![("a".into(), p(1.0))], 0, false, &board)
        .unwrap();
    x.apply_once(&board, 0);
    x.take(1, vec![("c".into(), p(2.0))], 10, true, &board)
        .unwrap();
    assert_eq!(requests("c", 10), 2.0);
    // The next full report, before any sum, no longer names c.
    x.take(1, vec![("a".into(), p(1.0))], 20, false, &board)
        .unwrap();
    x.apply_once(&board, 20);
    assert_eq!((requests("a", 20), requests("c", 20)), (1.0, 0.0));
}

#[test]
fn a_sum_never_overwrites_a_later_push() {
    // The upkeep sums on one thread while pushes of ever larger
    // figures land on another: once a push is taken, the board never
    // shows less (a sum computed before it, written after it, would).
    let registry = MetricsRegistry::new("inferencecache", "test");
    let x = Exchange::new(settings(&["--peer-ttl-ms", "1000"]).unwrap(), &registry);
    let board = board();
    x.take(1, vec![("a".into(), p(0.0))], 0, false, &board)
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut stale = 0u32;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                x.apply_once(&board, 0);
            }
        });
        for n in 1..=50_000u32 {
            let n = f64::from(n);
            x.take(1, vec![("a".into(), p(n))], 0, true, &board)
                .unwrap();
            if board.load("a", 0).requests < n {
                stale += 1;
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(stale, 0, "the board showed an older sum after a push");
}

#[test]
fn push_is_on_by_default_and_can_be_turned_off() {
    assert!(settings(&[]).unwrap().push);
    assert!(!settings(&["--peer-push", "false"]).unwrap().push);
}
