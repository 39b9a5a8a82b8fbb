//! A connection that ends itself after a stretch with no bytes either way.
//!
//! HTTP servers bound how long one request may take, but a client that
//! connects (or finishes a request) and then sends nothing holds a socket,
//! a TLS session and a task for as long as it likes — HTTP/2 keep-alive
//! pings only find dead peers, not idle ones. Wrapping the stream makes
//! any read or write after `idle` seconds of silence fail with
//! `TimedOut`, so the server drops the connection; a request in progress
//! always moves bytes, so only idle connections are cut.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner`, closed after `idle` without traffic; `closed` counts it.
pub struct IdleTimeout<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    closed: Option<Counter>,
}

impl<T> std::fmt::Debug for IdleTimeout<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleTimeout")
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<T> IdleTimeout<T> {
    /// Wraps `inner`; `closed` (if any) is incremented when the timeout
    /// ends the connection.
    pub fn new(inner: T, idle: Duration, closed: Option<Counter>) -> Self {
        // However large the flag, a deadline the clock can hold (a century
        // is never in practice).
        let idle = idle.min(Duration::from_secs(100 * 365 * 86_400));
        Self {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            closed,
        }
    }

    fn touched(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// `Ready(Err)` once the connection has been idle too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                if let Some(closed) = self.closed.take() {
                    closed.inc();
                }
                Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no traffic for {} s", self.idle.as_secs()),
                ))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.touched();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touched();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.expired(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn traffic_keeps_it_open_and_silence_closes_it() {
        let (a, mut b) = tokio::io::duplex(64);
        let closed = Counter::default();
        let mut idle = IdleTimeout::new(a, Duration::from_secs(1), Some(closed.clone()));
        let mut buf = [0u8; 8];
        // Four quiet spells of 0.3 s, 1.2 s in all: traffic resets the clock.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            b.write_all(b"x").await.unwrap();
            assert_eq!(idle.read(&mut buf).await.unwrap(), 1);
        }
        let error = idle.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(closed.get(), 1);
    }
}
