//! Where and how the picker decides: the pool narrowed, the body read,
//! the core asked, the fallbacks added, on the thread that received the
//! request whenever nothing blocks. A child module of `epp`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{EndpointPicker, InFlight, NoEndpoint, Pick};
use crate::epp_config::INLINE_READ_BYTES;
use crate::index_core::{Prompt, Purpose, RouteError, RouteRequest, Routed};
use crate::openai::{self, Prompt as BodyPrompt};

/// A request body as read, and how long reading it took.
struct Read {
    request: Option<openai::InferenceRequest>,
    took: Duration,
}

impl Read {
    /// Whether the prompt must be rendered or tokenized (CPU work of
    /// about a millisecond for 2,000 tokens: kept off the runtime's
    /// threads above `--epp-inline-tokenize-bytes`).
    fn needs_tokenizer(&self) -> bool {
        matches!(
            self.request.as_ref().and_then(|r| r.prompt.as_ref()),
            Some(BodyPrompt::Text(_) | BodyPrompt::Chat(_))
        )
    }
}

impl EndpointPicker {
    /// Decides where a request of `priority` goes, on the thread that
    /// received it whenever nothing blocks for long: a small body is read
    /// here, and a prompt needing no tokenizer (token ids, none at all), or
    /// one in a body up to `--epp-inline-tokenize-bytes`, is decided here
    /// too, as LookupRoute is, with no hand-over to a blocking thread and
    /// back (four context switches more a pick, five against one,
    /// docs/benchmarks.md). Rendering and tokenizing a larger prompt, or
    /// reading a large body, runs on a blocking thread, and the decision
    /// right after it there. (`block_in_place` instead kept the work on
    /// this thread, but handing the runtime's other tasks to a new thread
    /// cost more on two cores.)
    pub(super) async fn decide_placed(
        &self,
        path: &str,
        body: Option<Vec<u8>>,
        subset: Option<&[String]>,
        priority: i32,
    ) -> Result<Pick, NoEndpoint> {
        let arrived = Instant::now();
        // No endpoint: refused before the body is read (or counted unread).
        let eligible = self.eligible(subset)?;
        let size = body.as_ref().map_or(0, Vec::len);
        let read = if size <= INLINE_READ_BYTES {
            let read = self.read(path, body.as_deref());
            if !read.needs_tokenizer() {
                return self.decide_read(read, &eligible, priority, arrived);
            }
            if size <= self.pool.inline_tokenize_bytes {
                self.core.metrics().epp_tokenizing_on("runtime");
                return self.decide_read(read, &eligible, priority, arrived);
            }
            Some(read)
        } else {
            None
        };
        // The wait for a blocking thread is not the lookup's: its budget
        // and the decision's timer count the work done here and there; the
        // wait is counted apart.
        drop(eligible);
        let handed = Instant::now();
        let spent = handed.saturating_duration_since(arrived);
        let me = self.clone();
        // The path only for a body still to read.
        let path = read.is_none().then(|| path.to_owned());
        let subset = subset.map(<[String]>::to_vec);
        tokio::task::spawn_blocking(move || {
            let resumed = Instant::now();
            me.core
                .metrics()
                .epp_handoff_waited(resumed.saturating_duration_since(handed));
            let arrived = resumed.checked_sub(spent).unwrap_or(resumed);
            // Narrowed again: endpoints may have left the pool during the
            // wait (the pool's cache makes this a copy of an Arc when not).
            let eligible = me.eligible(subset.as_deref())?;
            let read =
                read.unwrap_or_else(|| me.read(path.as_deref().unwrap_or(""), body.as_deref()));
            if read.needs_tokenizer() {
                me.core.metrics().epp_tokenizing_on("blocking");
            }
            #[cfg(test)]
            tests::resumed(read.request.as_ref(), arrived, resumed);
            me.decide_read(read, &eligible, priority, arrived)
        })
        .await
        .unwrap_or_else(|e| Err(NoEndpoint::Empty(format!("pick task failed: {e}"))))
    }

    /// Decides where a request of `priority` goes, all on this thread (CPU
    /// work: off the I/O threads): read the body, then [`Self::decide_read`].
    #[cfg(test)]
    pub(super) fn decide(
        &self,
        path: &str,
        body: Option<&[u8]>,
        subset: Option<&[String]>,
        priority: i32,
    ) -> Result<Pick, NoEndpoint> {
        let arrived = Instant::now();
        let eligible = self.eligible(subset)?;
        let read = self.read(path, body);
        self.decide_read(read, &eligible, priority, arrived)
    }

    /// Reads the OpenAI body (`None` when it cannot be read: counted, and
    /// the request goes by load).
    fn read(&self, path: &str, body: Option<&[u8]>) -> Read {
        let reading = Instant::now();
        let request = body.and_then(|b| match openai::parse(path, b) {
            Ok(r) => Some(r),
            Err(error) => {
                tracing::debug!(%error, "request body not read; routing by load");
                self.core.metrics().epp_unread("body");
                None
            }
        });
        Read {
            request,
            took: reading.elapsed(),
        }
    }

    /// Asks the core (which renders and tokenizes the prompt when it
    /// must) to pick among the `eligible` endpoints, adds the fallbacks.
    /// The lookup's budget and the decision's timer run from `arrived`,
    /// before the pool was narrowed and the body read (less any wait for a
    /// blocking thread, which `epp_handoff_wait_seconds` counts).
    fn decide_read(
        &self,
        read: Read,
        eligible: &Arc<[String]>,
        priority: i32,
        arrived: Instant,
    ) -> Result<Pick, NoEndpoint> {
        // Reading is timed apart, as LookupRoute's timer starts with its
        // request decoded (docs/benchmarks.md).
        let Read {
            request,
            took: read_in,
        } = read;
        #[cfg(test)]
        tests::decided_here(request.as_ref());
        // The request's parts moved out, not copied.
        let (model, body_prompt, cache_salt) =
            request.map_or_else(Default::default, |r| (r.model, r.prompt, r.cache_salt));
        let scope = self.scope_of(model, eligible);
        let pool = self.scored_pool(&scope, eligible);
        let pool: &[(ic_index::ReplicaKey, String)] = &pool;
        let extras = (!cache_salt.is_empty()).then(|| ic_kvevents::PromptExtras {
            cache_salt,
            ..Default::default()
        });
        // An adapter shares its base `model`'s tokenizer (the scope's model).
        let prompt = match &body_prompt {
            Some(BodyPrompt::Tokens(ids)) => Prompt::Tokens(ids),
            Some(BodyPrompt::Text(text)) => Prompt::Text(text),
            Some(BodyPrompt::Chat(messages)) => Prompt::Chat(messages),
            None => Prompt::Unknown,
        };
        // Read into a local: a `policies()` guard left as a temporary in the
        // request below would live through `route`, which reads the policies
        // again, and parking_lot queues that second read behind a waiting
        // `set_policies` writer: the thread would hang for good.
        let shed_at_requests = self.pool.shedding_under(&self.core.policies()).at(priority);
        let routed = self.core.route(&RouteRequest {
            scope: &scope,
            prompt,
            candidates: None,
            extras: extras.as_ref(),
            received: arrived,
            purpose: Purpose::Endpoint {
                pool,
                shed_at_requests,
                fallbacks: self.pool.fallbacks,
            },
        });
        match routed {
            Ok(Routed::Endpoint {
                pick,
                by_prefix,
                tokenized_in,
                by_load,
            }) => {
                // The count `route` took, ended unless the stream takes it.
                let in_flight = InFlight::taken(&self.core, pick.replica.replica_id.clone());
                let mut endpoints = Vec::with_capacity(self.pool.fallbacks + 1);
                let mut replica_ids = Vec::with_capacity(self.pool.fallbacks + 1);
                endpoints.push(pick.address);
                replica_ids.push(pick.replica.replica_id);
                // Ranked by the core from the loads its decision read,
                // under the namespace's CachePolicy scoring over the flags.
                for (key, address) in by_load.into_iter().filter_map(|i| pool.get(i)) {
                    if endpoints.len() > self.pool.fallbacks {
                        break;
                    }
                    if !endpoints.contains(address) {
                        endpoints.push(address.clone());
                        replica_ids.push(key.replica_id.clone());
                    }
                }
                // Timed with the fallbacks: the whole decision the gateway waits for.
                self.core.metrics().epp_decided(
                    if by_prefix { "prefix" } else { "load" },
                    arrived.elapsed(),
                    tokenized_in,
                    read_in,
                );
                Ok(Pick {
                    endpoints,
                    replica_ids,
                    in_flight,
                })
            }
            Err(RouteError::Saturated(detail)) => Err(NoEndpoint::Saturated(detail)),
            Err(other) => Err(NoEndpoint::Empty(other.to_string())),
            Ok(_) => Err(NoEndpoint::Empty(
                "the core answered another purpose".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::mpsc;
    use std::task::Poll;
    use std::thread::{self, ThreadId};
    use std::time::Instant;

    use parking_lot::Mutex;

    use futures::{Stream as _, StreamExt as _};

    use super::super::scope::tests::{counted_picker, picker};
    use super::super::{EndpointPicker, Exchange, NoEndpoint};
    use super::INLINE_READ_BYTES;

    const A: &str = "10.0.0.1:8000";
    const B: &str = "10.0.0.2:8000";
    const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

    /// `p` with prompts tokenized on the runtime's thread up to `bytes`
    /// of body (0: every one handed over).
    fn inline_up_to(mut p: EndpointPicker, bytes: usize) -> EndpointPicker {
        let mut pool = (*p.pool).clone();
        pool.inline_tokenize_bytes = bytes;
        p.pool = std::sync::Arc::new(pool);
        p
    }

    fn ids(n: usize) -> Vec<u32> {
        (0..n).map(|i| 1000 + i as u32 % 30_000).collect()
    }

    fn token_ids(n: usize) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": ids(n)})).unwrap()
    }

    #[test]
    fn only_a_prompt_to_render_or_tokenize_leaves_the_runtime() {
        let p = picker(&[A]);
        let needs = |path: &str, body: Option<&[u8]>| p.read(path, body).needs_tokenizer();
        assert!(needs("/v1/chat/completions", Some(CHAT)));
        assert!(needs(
            "/v1/completions",
            Some(br#"{"model":"m","prompt":"hi"}"#)
        ));
        assert!(!needs("/v1/completions", Some(&token_ids(16))));
        // Unread (by load) and no body at all: nothing to tokenize.
        assert!(!needs("/v1/chat/completions", Some(b"{not json")));
        assert!(!needs("/v1/chat/completions", None));
    }

    /// The thread each decision ran on, by the request's model (tests run
    /// side by side: each names its own models).
    static DECIDED_ON: Mutex<Vec<(String, ThreadId)>> = Mutex::new(Vec::new());

    pub(super) fn decided_here(request: Option<&crate::openai::InferenceRequest>) {
        if let Some(r) = request {
            DECIDED_ON
                .lock()
                .push((r.model.clone(), thread::current().id()));
        }
    }

    fn decided_on(model: &str) -> Vec<ThreadId> {
        let decided = DECIDED_ON.lock();
        decided
            .iter()
            .filter(|(m, _)| m == model)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Each placement answers where it should: token ids, and a chat
    /// prompt in a body up to `--epp-inline-tokenize-bytes`, on the runtime
    /// thread that received them; a larger chat body and a body too large
    /// to read on the runtime on another thread (a blocking one).
    async fn every_placement_picks(runtime: &str) {
        let p = picker(&[A]);
        let with_model = |body: &[u8], model: &str| {
            let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
            v["model"] = model.into();
            serde_json::to_vec(&v).unwrap()
        };
        let large = token_ids(INLINE_READ_BYTES / 4);
        assert!(large.len() > INLINE_READ_BYTES);
        // A chat body as long as the bound, then one byte over it.
        for (path, body, case, over_bound, in_place) in [
            ("/v1/completions", token_ids(16), "token-ids", None, true),
            ("/v1/chat/completions", CHAT.to_vec(), "chat", Some(0), true),
            (
                "/v1/chat/completions",
                CHAT.to_vec(),
                "chat-over",
                Some(1),
                false,
            ),
            ("/v1/completions", large, "large", None, false),
        ] {
            let model = format!("{runtime}-{case}");
            let body = with_model(&body, &model);
            let p = match over_bound {
                Some(over) => inline_up_to(p.clone(), body.len() - over),
                None => p.clone(),
            };
            // No await between this and an in-place decision: the task is
            // still on this thread when it decides.
            let here = thread::current().id();
            let pick = p.decide_placed(path, Some(body), None, 0).await;
            assert_eq!(pick.expect("a pick").endpoints, [A], "{case}");
            let on = decided_on(&model);
            assert_eq!(on.len(), 1, "{case}: one decision");
            assert_eq!(
                on[0] == here,
                in_place,
                "{case}: decided in place: {in_place}"
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_one_thread_runtime_picks_in_place_and_handed_off() {
        every_placement_picks("one-thread").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multi_threaded_runtime_picks_in_place_and_handed_off() {
        // On a worker, as the server's picks run (the test's own body runs
        // on the thread that started the runtime).
        tokio::spawn(every_placement_picks("multi-thread"))
            .await
            .expect("the picks");
    }

    /// Picks with a prompt to tokenize are counted by the thread deciding
    /// them: a chat body within an 8 KiB bound on the runtime's, the same
    /// body under the default (0) on a blocking one; token ids in neither.
    #[tokio::test(flavor = "current_thread")]
    async fn picks_to_tokenize_are_counted_by_thread() {
        let (handing, registry) = counted_picker(&[A]);
        let p = inline_up_to(handing.clone(), 8 * 1024);
        let chat = || Some(CHAT.to_vec());
        for _ in 0..2 {
            let pick = p
                .decide_placed("/v1/chat/completions", chat(), None, 0)
                .await;
            assert_eq!(pick.expect("a pick").endpoints, [A]);
        }
        let pick = handing
            .decide_placed("/v1/chat/completions", chat(), None, 0)
            .await;
        assert_eq!(pick.expect("a pick").endpoints, [A]);
        let pick = p
            .decide_placed("/v1/completions", Some(token_ids(16)), None, 0)
            .await;
        assert_eq!(pick.expect("a pick").endpoints, [A]);
        let metrics = registry.encode();
        for counted in [
            r#"epp_tokenizing_total{thread="runtime"} 2"#,
            r#"epp_tokenizing_total{thread="blocking"} 1"#,
        ] {
            assert!(metrics.contains(counted), "{counted}: {metrics}");
        }
    }

    /// A pool (or subset) with no endpoint is refused before the body is
    /// read: an unreadable body is not counted as unread then.
    #[tokio::test(flavor = "current_thread")]
    async fn no_endpoint_is_refused_before_the_body_is_read() {
        let (p, registry) = counted_picker(&[A]);
        let unread = || {
            registry
                .encode()
                .contains(r#"epp_unread_total{reason="body"} 1"#)
        };
        let body = || Some(b"{not json".to_vec());
        let outside = ["10.0.0.99:8000".to_owned()];
        let refused = p
            .decide_placed("/v1/completions", body(), Some(&outside), 0)
            .await;
        assert!(matches!(refused, Err(NoEndpoint::Empty(_))));
        let (empty, _) = counted_picker(&[]);
        let refused = empty
            .decide_placed("/v1/completions", body(), None, 0)
            .await;
        assert!(matches!(refused, Err(NoEndpoint::Empty(_))));
        assert!(!unread(), "{}", registry.encode());
        // With an endpoint, the same body is read, and counted unread.
        let pick = p.decide_placed("/v1/completions", body(), None, 0).await;
        assert_eq!(pick.expect("a pick by load").endpoints, [A]);
        assert!(unread(), "{}", registry.encode());
    }

    /// A pick handed off chooses among the pool as it is when its blocking
    /// thread resumes, not as it was on arrival: an endpoint removed while
    /// the pick waited is neither the pick nor a fallback.
    /// A runtime with a single blocking thread, so a test can occupy it.
    fn one_blocking_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .expect("a runtime")
    }

    /// Occupies the runtime's one blocking thread until `release` is sent;
    /// returns once the thread is held.
    fn hold_the_blocking_thread() -> (mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
        let (release, held) = mpsc::channel::<()>();
        let (busy, holding) = mpsc::channel();
        let blocker = tokio::task::spawn_blocking(move || {
            busy.send(()).expect("the test waits");
            held.recv().ok();
        });
        holding.recv().expect("the blocking thread held");
        (release, blocker)
    }

    #[test]
    fn a_pick_handed_off_sees_the_pool_as_it_resumes() {
        let (p, registry) = counted_picker(&[A, B]);
        // A body too large to read on the runtime: handed off.
        let body = token_ids(INLINE_READ_BYTES / 4);
        assert!(body.len() > INLINE_READ_BYTES);
        let runtime = one_blocking_thread();
        runtime.block_on(async {
            let (release, blocker) = hold_the_blocking_thread();
            let mut pick = pin!(p.decide_placed("/v1/completions", Some(body), None, 0));
            std::future::poll_fn(|cx| {
                assert!(pick.as_mut().poll(cx).is_pending(), "waits for the thread");
                Poll::Ready(())
            })
            .await;
            // A leaves the pool while the pick waits.
            *p.pool.endpoints.write() = vec![B.to_owned()];
            release.send(()).expect("the blocker waits");
            blocker.await.expect("the blocker");
            let pick = pick.await.expect("a pick");
            assert_eq!(pick.endpoints, [B]);
        });
        let metrics = registry.encode();
        assert!(
            metrics.contains("epp_handoff_wait_seconds_count 1"),
            "{metrics}"
        );
    }

    /// A gateway that resets its stream while the stream's pick waits for
    /// a blocking thread leaves nothing in flight: the pick is made there
    /// after the stream is gone (the load board counts it started) and its
    /// count ends with it. The stream's replies are dropped as tonic drops
    /// them on a reset; the pick's task is known to be over when the one
    /// blocking thread runs the next task (an event, not a wait).
    #[test]
    fn a_stream_reset_while_its_pick_is_handed_off_leaves_nothing_in_flight() {
        let (p, registry) = counted_picker(&[A]);
        // Every chat body handed over (`--epp-inline-tokenize-bytes 0`).
        let p = inline_up_to(p, 0);
        let chat = br#"{"model":"reset-mid-pick","messages":[{"role":"user","content":"hi"}]}"#;
        let runtime = one_blocking_thread();
        runtime.block_on(async {
            let (release, blocker) = hold_the_blocking_thread();
            let (gateway, incoming) = tokio::sync::mpsc::unbounded_channel();
            for message in ic_e2e::ext_proc::buffered("/v1/chat/completions", chat) {
                gateway.send(Ok(message)).expect("the stream reads");
            }
            let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(incoming);
            let mut replies = Box::pin(p.clone().replies(Exchange::default(), incoming));
            // The headers are answered; the body's pick is handed off.
            let headers = replies.next().await.expect("a reply").expect("no error");
            assert_eq!(ic_e2e::ext_proc::destination(&headers), None);
            std::future::poll_fn(|cx| {
                assert!(
                    replies.as_mut().poll_next(cx).is_pending(),
                    "the pick waits for the thread"
                );
                Poll::Ready(())
            })
            .await;
            // The gateway resets the stream.
            drop(replies);
            drop(gateway);
            release.send(()).expect("the blocker waits");
            blocker.await.expect("the blocker");
            // Queued behind the pick's task on the one blocking thread.
            tokio::task::spawn_blocking(|| ())
                .await
                .expect("the next blocking task");
        });
        let metrics = registry.encode();
        // The pick was made after the reset, by load (no tokenizer here)...
        assert!(
            metrics.contains(r#"epp_picks_total{by="load"} 1"#),
            "{metrics}"
        );
        // ...and nothing is counted in flight on its replica, whose entry
        // the pick made (asked by id: `own_picks` leaves out idle entries).
        let replica = p.replica_of(A).expect("A is in the pool");
        let own = p
            .core
            .routing()
            .load_board()
            .own_picks_of([replica.as_str()], 0);
        assert_eq!(own.len(), 1, "A's replica is on the board: {own:?}");
        assert_eq!(own[0].1.in_flight, 0.0, "{own:?}");
    }

    /// A pick's Debug names the replica its in-flight count is on, not the
    /// shared core it holds (whose Debug is the whole index).
    #[test]
    fn a_pick_s_debug_names_its_replica_not_the_core() {
        let p = picker(&[A]);
        let pick = p.decide("/v1/chat/completions", Some(CHAT), None, 0);
        let shown = format!("{:?}", pick.expect("a pick"));
        assert!(
            shown.contains(&format!("InFlight {{ replica_id: Some({A:?}), .. }}")),
            "{shown}"
        );
        assert!(!shown.contains("IndexCore"), "{shown}");
    }

    /// The clock each handed-off decision ran from and when its blocking
    /// thread resumed, by the request's model.
    static HANDED_OFF: Mutex<Vec<(String, Instant, Instant)>> = Mutex::new(Vec::new());

    pub(super) fn resumed(
        request: Option<&crate::openai::InferenceRequest>,
        arrived: Instant,
        resumed: Instant,
    ) {
        if let Some(r) = request {
            HANDED_OFF.lock().push((r.model.clone(), arrived, resumed));
        }
    }

    /// A pick waiting for a blocking thread is not charged the wait: the
    /// clock its decision (its lookup's budget, its timers) runs from is
    /// carried over as the time spent on the receiving thread. The only
    /// blocking thread is held (by a channel) for longer than the first
    /// poll took; the bounds below hold by construction with the clock
    /// carried, and fail without it.
    #[test]
    fn the_wait_for_a_blocking_thread_is_not_the_lookup_s() {
        let p = picker(&[A]);
        // A body too large to read on the runtime: handed off.
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "carried-clock",
            "prompt": ids(INLINE_READ_BYTES / 4),
        }))
        .unwrap();
        assert!(body.len() > INLINE_READ_BYTES);
        let runtime = one_blocking_thread();
        let (before, polled, released) = runtime.block_on(async {
            let (release, blocker) = hold_the_blocking_thread();
            let before = Instant::now();
            let mut pick = pin!(p.decide_placed("/v1/completions", Some(body), None, 0));
            std::future::poll_fn(|cx| {
                assert!(pick.as_mut().poll(cx).is_pending(), "waits for the thread");
                Poll::Ready(())
            })
            .await;
            // Arrival and hand-off both fell within [before, polled].
            let polled = Instant::now();
            // Held until the wait exceeds the first poll (not a timed
            // assertion: a longer hold only widens the margin).
            let released = loop {
                let now = Instant::now();
                if now - polled > polled - before {
                    break now;
                }
                thread::sleep(polled - before);
            };
            release.send(()).expect("the blocker waits");
            blocker.await.expect("the blocker");
            assert_eq!(pick.await.expect("a pick").endpoints, [A]);
            (before, polled, released)
        });
        let handed: Vec<_> = HANDED_OFF
            .lock()
            .iter()
            .filter(|(m, ..)| m == "carried-clock")
            .map(|(_, a, r)| (*a, *r))
            .collect();
        let [(arrived, resumed)] = handed[..] else {
            panic!("one hand-off: {handed:?}");
        };
        // The clock moved on by at least the wait (resumed >= released,
        // handed off <= polled)...
        assert!(
            arrived >= before + (released - polled),
            "the decision's clock includes the wait: {:?} after the first poll began",
            arrived.saturating_duration_since(before)
        );
        // ...and from it to the thread resuming is only the receiving
        // thread's work, within the first poll.
        assert!(
            resumed - arrived <= polled - before,
            "charged {:?}, the first poll took {:?}",
            resumed - arrived,
            polled - before
        );
    }
}
