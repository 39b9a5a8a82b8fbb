//! tonic's view of a served connection: the shared listener
//! ([`ic_telemetry::serving`]) does TLS and idle limits; tonic needs to be
//! told each connection's addresses, which `request.remote_addr()` (the
//! per-client stream cap) reads.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use ic_telemetry::serving::{ServedConn, ServingListener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A [`ServedConn`] that tonic can serve.
#[derive(Debug)]
pub struct GrpcConn(ServedConn);

/// The listener's connections, for `serve_with_incoming_shutdown`.
pub fn incoming(listener: ServingListener) -> impl Stream<Item = io::Result<GrpcConn>> {
    listener.into_stream().map(|c| c.map(GrpcConn))
}

impl Connected for GrpcConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo {
            local_addr: Some(self.0.local_addr()),
            remote_addr: Some(self.0.remote_addr()),
        }
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
