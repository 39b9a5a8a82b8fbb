//! The open loop's gRPC client (`--open-loop-client direct`, the default):
//! unary calls written straight on hyper's HTTP/2 client connection, owned
//! by the schedule thread's own runtime.
//!
//! Through tonic's `Channel` a request went from the schedule thread to a
//! runtime worker (a wake-up), then through a tower buffer task (an mpsc
//! hop) to the connection; the client's lateness (due time to the request
//! starting) was the largest piece of a 10,000/s p99. Here the thread that
//! keeps the schedule owns the connections: at the due time it hands the
//! request to hyper's dispatcher and the connection task, on the same
//! thread, writes it as soon as the schedule loop waits for the next send.
//! The request carries the bytes the generated client sends (a gRPC frame
//! of the same message) and the answer is checked as tonic checks it: HTTP
//! 200, `grpc-status` 0 (in the trailers, or the headers of a
//! trailers-only answer), one uncompressed frame, decoded by the caller.

use anyhow::{Context, anyhow, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::open_loop::{self, OpenLoop, ScheduleStats};
use ic_loadgen::PhaseStats;

/// A gRPC frame's prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// One HTTP/2 connection to a gRPC server; clones share it.
#[derive(Clone, Debug)]
pub struct Conn {
    send: http2::SendRequest<Full<Bytes>>,
    authority: hyper::http::uri::Authority,
}

impl Conn {
    /// Connects to `target` (`host:port`) with `TCP_NODELAY` (as tonic's
    /// channel does) and hyper's default HTTP/2 settings (which tonic's
    /// channel keeps); the connection runs as a task on the current runtime.
    pub async fn connect(target: &str) -> anyhow::Result<Self> {
        let authority: hyper::http::uri::Authority = target
            .parse()
            .with_context(|| format!("--target {target}: not host:port"))?;
        let tcp = TcpStream::connect(target)
            .await
            .with_context(|| format!("connecting to {target}"))?;
        tcp.set_nodelay(true)?;
        let (send, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(tcp))
            .await
            .with_context(|| format!("HTTP/2 handshake with {target}"))?;
        // Its end shows in the calls on it (their errors are counted).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { send, authority })
    }

    /// One unary call of `path` with `message` (an encoded protobuf); the
    /// answer's message, unframed.
    pub async fn unary(&self, path: &'static str, message: Bytes) -> anyhow::Result<Bytes> {
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            )
            .header(header::TE, HeaderValue::from_static("trailers"))
            .body(Full::new(frame(&message)))?;
        let response = self.send.clone().send_request(request).await?;
        let (head, body) = response.into_parts();
        if head.status != StatusCode::OK {
            bail!("HTTP status {}", head.status);
        }
        let collected = body.collect().await?;
        let trailers = collected.trailers().cloned();
        // A trailers-only answer (an error) carries its status in the headers.
        check_status(trailers.as_ref().unwrap_or(&head.headers))?;
        unframe(collected.to_bytes())
    }
}

/// One open-loop phase of unary calls over connections of its own.
#[derive(Clone, Debug)]
pub struct Phase {
    /// `host:port`.
    pub target: String,
    /// Connections, the calls round robin over them.
    pub connections: usize,
    /// The schedule.
    pub open: OpenLoop,
}

impl Phase {
    /// Calls `path` on the schedule, the `i`-th call with `message(i)`;
    /// `read` judges each answer's message (a hit or not, or an error).
    pub async fn run<M, R>(
        self,
        path: &'static str,
        message: M,
        read: R,
    ) -> anyhow::Result<(PhaseStats, u64, Option<ScheduleStats>)>
    where
        M: Fn(u64) -> Bytes + Send + 'static,
        R: Fn(Bytes) -> anyhow::Result<bool> + Copy + Send + 'static,
    {
        let Self {
            target,
            connections,
            open,
        } = self;
        let connect = move || async move {
            let mut conns = Vec::with_capacity(connections);
            for _ in 0..connections {
                conns.push(Conn::connect(&target).await?);
            }
            Ok(conns)
        };
        let call = move |conn: Conn, i| {
            let body = message(i);
            async move { read(conn.unary(path, body).await?) }
        };
        let (stats, hits, schedule) = open_loop::run_owned(&open, connect, call).await?;
        Ok((stats, hits, Some(schedule)))
    }
}

/// `message` as one uncompressed gRPC frame.
fn frame(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(PREFIX + message.len());
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    buf.put_slice(message);
    buf.freeze()
}

/// The message of the one uncompressed frame `body` holds.
fn unframe(mut body: Bytes) -> anyhow::Result<Bytes> {
    if body.len() < PREFIX {
        bail!("the answer holds {} bytes, no gRPC frame", body.len());
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        bail!("the answer is compressed (none was asked for)");
    }
    if body.len() != len {
        bail!(
            "the answer's frame says {len} bytes, the body holds {}",
            body.len()
        );
    }
    Ok(body)
}

/// `grpc-status` 0, or the error it names.
fn check_status(headers: &HeaderMap) -> anyhow::Result<()> {
    let status = headers
        .get("grpc-status")
        .ok_or_else(|| anyhow!("the answer has no grpc-status"))?;
    if status.as_bytes() == b"0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    bail!(
        "grpc-status {}: {message}",
        String::from_utf8_lossy(status.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_bad_frames_are_named() {
        let message = Bytes::from_static(b"\x08\x01hello");
        let framed = frame(&message);
        assert_eq!(&framed[..PREFIX], &[0, 0, 0, 0, 7]);
        assert_eq!(unframe(framed).unwrap(), message);
        assert_eq!(unframe(frame(b"")).unwrap(), Bytes::new());
        let e = unframe(Bytes::from_static(&[0, 0, 0])).unwrap_err();
        assert!(e.to_string().contains("no gRPC frame"), "{e}");
        let e = unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 1])).unwrap_err();
        assert!(e.to_string().contains("says 9 bytes"), "{e}");
        let e = unframe(Bytes::from_static(&[1, 0, 0, 0, 0])).unwrap_err();
        assert!(e.to_string().contains("compressed"), "{e}");
    }

    #[test]
    fn only_grpc_status_zero_is_success() {
        let mut h = HeaderMap::new();
        assert!(
            check_status(&h)
                .unwrap_err()
                .to_string()
                .contains("no grpc-status")
        );
        h.insert("grpc-status", HeaderValue::from_static("0"));
        check_status(&h).unwrap();
        h.insert("grpc-status", HeaderValue::from_static("5"));
        h.insert("grpc-message", HeaderValue::from_static("not found"));
        let e = check_status(&h).unwrap_err().to_string();
        assert!(e.contains("grpc-status 5: not found"), "{e}");
    }
}
