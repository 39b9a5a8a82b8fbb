//! tonic's view of a served connection: the shared listener
//! ([`ic_telemetry::serving`]) does TLS and idle limits; tonic needs to be
//! told each connection's addresses, which `request.remote_addr()` (the
//! per-client stream cap) reads. With `--busy-poll-us`, each read that
//! brings bytes tells the busy poller ([`crate::runtime::BusyPoll`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use ic_telemetry::serving::{ServedConn, ServingListener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::runtime::BusyPoll;

/// A [`ServedConn`] that tonic can serve.
#[derive(Debug)]
pub struct GrpcConn {
    conn: ServedConn,
    busy_poll: Option<Arc<BusyPoll>>,
}

/// The listener's connections, for `serve_with_incoming_shutdown`; each
/// read tells `busy_poll`, if any.
pub fn incoming(
    listener: ServingListener,
    busy_poll: Option<Arc<BusyPoll>>,
) -> impl Stream<Item = io::Result<GrpcConn>> {
    listener.into_stream().map(move |c| {
        c.map(|conn| GrpcConn {
            conn,
            busy_poll: busy_poll.clone(),
        })
    })
}

impl Connected for GrpcConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo {
            local_addr: Some(self.conn.local_addr()),
            remote_addr: Some(self.conn.remote_addr()),
        }
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.conn).poll_read(cx, buf);
        if let Some(busy_poll) = &self.busy_poll
            && buf.filled().len() > before
        {
            busy_poll.read();
        }
        read
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use futures::StreamExt as _;
    use ic_telemetry::serving::ServeOptions;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::runtime::RuntimeFlags;

    #[test]
    fn bytes_read_from_a_connection_start_the_busy_poll() {
        let flags = RuntimeFlags {
            worker_threads: 1,
            busy_poll_us: 2_000,
        };
        let runtime = flags.build().unwrap();
        let spun = Counter::default();
        let poller = flags.busy_poll(spun.clone()).unwrap();
        let shutdown = CancellationToken::new();
        runtime.block_on(async {
            tokio::spawn(poller.clone().run(shutdown.clone()));
            let listener =
                ServingListener::bind("127.0.0.1:0".parse().unwrap(), ServeOptions::plain())
                    .await
                    .unwrap();
            let addr = listener.local_addr();
            let mut conns = Box::pin(incoming(listener, Some(poller)));
            let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut served = conns.next().await.unwrap().unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            // Accepting read nothing: still asleep.
            assert_eq!(spun.get(), 0.0);
            client.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 4];
            served.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"ping");
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert!(spun.get() >= 0.002, "polled {} s", spun.get());
            shutdown.cancel();
        });
    }
}
