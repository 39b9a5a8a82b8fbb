//! A connection task that wakes itself while it is being polled is polled
//! again at once, instead of being requeued as a yield.
//!
//! hyper's HTTP/1 server wakes its own connection task while a handler
//! reads the request body (its body channel signals the reading side), and
//! tokio's multi-threaded scheduler takes a task woken during its own poll
//! for a yield: back of the queue, and an idle worker unparked to steal it
//! — a futex wake and a context switch a request on an idle server
//! (found with strace: `git show 81cafa9c:docs/benchmarks.md`, "The lookup
//! path on one thread" and "The lookup's own work and the self-wake"; the
//! effect now in docs/benchmarks.md, "What the request path does, and what
//! was tried"). [`Repoll`] keeps work stealing for everything else: only a
//! wake that arrives while the task is inside its own poll is absorbed, and
//! at most [`MAX_REPOLLS`] times a poll, so a deliberate yield (hyper's
//! after 16 loops, tokio's cooperative budget) still yields.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Polls again in one go at most this many times.
pub const MAX_REPOLLS: usize = 2;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

/// See the module docs.
pub struct Repoll<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    waker: Waker,
}

struct Flag {
    state: AtomicU8,
    task: AtomicWaker,
}

impl<F> std::fmt::Debug for Repoll<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repoll").finish_non_exhaustive()
    }
}

impl<F: Future> Repoll<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(flag.clone()),
            flag,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.flag.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..=MAX_REPOLLS {
            this.flag.state.store(POLLING, Ordering::SeqCst);
            if let Poll::Ready(out) = this.inner.as_mut().poll(&mut inner_cx) {
                this.flag.state.store(IDLE, Ordering::SeqCst);
                return Poll::Ready(out);
            }
            let polling =
                this.flag
                    .state
                    .compare_exchange(POLLING, IDLE, Ordering::SeqCst, Ordering::SeqCst);
            if polling.is_ok() {
                return Poll::Pending;
            }
        }
        // Woken every time: a real yield.
        this.flag.state.store(IDLE, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Inside the poll: the poller sees WOKEN and polls again. Outside
        // it: wake the task as usual.
        let inside =
            self.state
                .compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst);
        match inside {
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often the outer task is woken.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future that wakes itself `n` times inside its poll, then is ready.
    struct SelfWaking(usize, usize);

    impl Future for SelfWaking {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.1 += 1;
            if self.0 == 0 {
                return Poll::Ready(self.1);
            }
            self.0 -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn poll_once<F: Future>(f: &mut Repoll<F>, count: &Arc<Count>) -> Poll<F::Output> {
        let waker = Waker::from(count.clone());
        Pin::new(f).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_inside_the_poll_is_a_repoll_not_a_task_wake() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = Repoll::new(SelfWaking(1, 0));
        assert_eq!(poll_once(&mut f, &count), Poll::Ready(2));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_task_that_keeps_waking_itself_still_yields() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = Repoll::new(SelfWaking(10, 0));
        assert!(poll_once(&mut f, &count).is_pending());
        // Polled 1 + MAX_REPOLLS times, then woken for the scheduler.
        assert_eq!(f.inner.1, 1 + MAX_REPOLLS);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_wake_from_outside_the_poll_wakes_the_task() {
        struct Parked(Option<Waker>);
        impl Future for Parked {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.0.is_some() {
                    return Poll::Ready(());
                }
                self.0 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = Repoll::new(Parked(None));
        assert!(poll_once(&mut f, &count).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        f.inner.0.as_ref().map(Waker::wake_by_ref);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll_once(&mut f, &count), Poll::Ready(()));
    }

    /// Wakes the polling thread: counted, and a flag so that only a real
    /// wake (never a spurious unpark) polls again.
    struct Unpark {
        woken: std::sync::Mutex<bool>,
        cv: std::sync::Condvar,
        count: AtomicUsize,
    }

    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.count.fetch_add(1, Ordering::SeqCst);
            *self
                .woken
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
            self.cv.notify_one();
        }
    }

    #[test]
    fn a_wake_racing_the_poll_from_another_thread_is_never_lost() {
        // The other thread wakes the inner waker WAKES times, each as
        // soon as the poll has seen the one before (so most land inside
        // that poll's work, some just after it); the future is ready once
        // a poll has seen them all. One lost wake leaves the task parked
        // and the other thread waiting for ever: the deadline below
        // catches that (it bounds a hang, it times nothing).
        const WAKES: usize = 5_000;
        struct ReadyOnLastWake {
            seen: Arc<AtomicUsize>,
            observed: Arc<AtomicUsize>,
            slot: Arc<std::sync::Mutex<Option<Waker>>>,
        }
        impl Future for ReadyOnLastWake {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                let mut slot = self
                    .slot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if slot.is_none() {
                    *slot = Some(cx.waker().clone());
                }
                drop(slot);
                let seen = self.seen.load(Ordering::SeqCst);
                self.observed.store(seen, Ordering::SeqCst);
                // Some work, so that the next wake lands inside the poll.
                for _ in 0..2_000 {
                    std::hint::spin_loop();
                }
                if seen >= WAKES {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let observed = Arc::new(AtomicUsize::new(0));
        let slot = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let unpark = Arc::new(Unpark {
            woken: std::sync::Mutex::new(false),
            cv: std::sync::Condvar::new(),
            count: AtomicUsize::new(0),
        });
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let executor = {
            let (seen, observed, slot, unpark) =
                (seen.clone(), observed.clone(), slot.clone(), unpark.clone());
            std::thread::spawn(move || {
                let mut f = Repoll::new(ReadyOnLastWake {
                    seen,
                    observed,
                    slot,
                });
                let waker = Waker::from(unpark.clone());
                let mut polls = 0usize;
                loop {
                    polls += 1;
                    if Pin::new(&mut f)
                        .poll(&mut Context::from_waker(&waker))
                        .is_ready()
                    {
                        break;
                    }
                    let mut woken = unpark
                        .woken
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    while !*woken {
                        woken = unpark
                            .cv
                            .wait(woken)
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                    }
                    *woken = false;
                }
                let _ = done_tx.send(polls);
            })
        };
        let hammer = std::thread::spawn(move || {
            let waker = loop {
                if let Some(w) = slot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
                {
                    break w;
                }
                std::thread::yield_now();
            };
            for i in 1..=WAKES {
                // Counted before the wake: a poll after this wake sees it.
                seen.store(i, Ordering::SeqCst);
                waker.wake_by_ref();
                while observed.load(Ordering::SeqCst) < i {
                    std::hint::spin_loop();
                }
            }
        });
        let polls = done_rx.recv_timeout(std::time::Duration::from_secs(120));
        assert!(
            polls.is_ok(),
            "the task never completed: a wake was lost ({} outer wakes)",
            unpark.count.load(Ordering::SeqCst)
        );
        hammer
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        executor
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        // Every poll but the first was asked for by a wake.
        assert!(polls.unwrap_or(0) <= 1 + unpark.count.load(Ordering::SeqCst));
    }
}
