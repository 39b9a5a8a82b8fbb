//! A connection task that wakes itself while it is being polled is polled
//! again at once, instead of being requeued as a yield.
//!
//! hyper's HTTP/1 server wakes its own connection task while a handler
//! reads the request body (its body channel signals the reading side), and
//! tokio's multi-threaded scheduler takes a task woken during its own poll
//! for a yield: back of the queue, and an idle worker unparked to steal it
//! — a futex wake and a context switch a request on an idle server
//! (docs/benchmarks.md, "The lookup path on one thread"). [`Repoll`] keeps
//! work stealing for everything else: only a wake that arrives while the
//! task is inside its own poll is absorbed, and at most [`MAX_REPOLLS`]
//! times a poll, so a deliberate yield (hyper's after 16 loops, tokio's
//! cooperative budget) still yields.

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
}
