//! A lean HTTP/1.1 client for the load generators: one keep-alive
//! connection per worker, requests encoded whole before the clock starts,
//! answers framed by `Content-Length` only.

use std::time::Instant;

use anyhow::{Context, bail};

/// One keep-alive HTTP/1.1 connection of one worker, spoken by hand (the
/// same client for both servers): each request is encoded whole before the
/// clock starts and sent with one write; the answer is read with a minimal
/// parser (status line, `Content-Length`, body) into a buffer kept for the
/// connection's life, and checked after the clock stops. Against hyper's
/// client (a connection task beside the worker's, a hand-off between the
/// two each way) this saved a few µs at p50 on a ~25-µs floor, the same for
/// both servers (`git show 81cafa9c:docs/benchmarks.md`, "A lean client and
/// the batch's names"; far less than the 35 µs of client CPU a lookup
/// measured before suggested).
#[derive(Debug)]
pub struct Conn {
    stream: tokio::net::TcpStream,
    host: String,
    /// The bytes of one answer: head, then body.
    buf: Vec<u8>,
    /// The server said `connection: close`: open a new one before the next.
    closing: bool,
}

/// One answer, read whole.
#[derive(Debug)]
pub struct Answer {
    /// Its status code.
    pub status: u16,
    /// Where the body lies in the connection's buffer ([`Conn::body`]).
    pub body: std::ops::Range<usize>,
    /// When its last byte was read.
    pub done: Instant,
}

/// What the head of an answer says.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Bytes up to and including the blank line.
    len: usize,
    content_length: usize,
    close: bool,
}

/// An answer head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;
/// An answer body larger than this is refused.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// The head at the start of `buf`: `None` until its blank line has
/// arrived; an error for anything this client does not read (chunked or
/// unframed bodies, interim answers, a malformed status line).
fn parse_head(buf: &[u8]) -> anyhow::Result<Option<Head>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            bail!("answer head longer than {MAX_HEAD} bytes");
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).context("answer head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .filter(|code| (200..600).contains(code))
        .with_context(|| format!("not an HTTP/1.x final status line: {status_line:?}"))?;
    let mut close = status_line.starts_with("HTTP/1.0 ");
    let mut content_length = None;
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .with_context(|| format!("malformed answer header line {line:?}"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .with_context(|| format!("content-length {value:?}"))?;
            if content_length.is_some_and(|m| m != n) {
                bail!("two different content-length headers");
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("transfer-encoding {value:?}: this client reads content-length answers only");
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    // 204 and 304 carry no body; every other answer here is framed by its length.
    let content_length = match (status, content_length) {
        (204 | 304, _) => 0,
        (_, Some(n)) if n <= MAX_BODY => n,
        (_, Some(n)) => bail!("content-length {n} over {MAX_BODY}"),
        (_, None) => bail!("HTTP {status} without content-length"),
    };
    Ok(Some(Head {
        status,
        len: end + 4,
        content_length,
        close,
    }))
}

impl Conn {
    /// A connection to `base` (`http://host:port`).
    pub async fn open(base: &str) -> anyhow::Result<Self> {
        let host = base
            .strip_prefix("http://")
            .with_context(|| format!("{base}: only http:// targets"))?
            .trim_end_matches('/')
            .to_owned();
        let stream = tokio::net::TcpStream::connect(&host)
            .await
            .with_context(|| format!("connecting to {host}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            host,
            buf: Vec::with_capacity(64 * 1024),
            closing: false,
        })
    }

    /// `POST path` with a JSON body, encoded whole into `out`.
    pub fn encode(&self, out: &mut Vec<u8>, path: &str, body: &[u8]) {
        use std::io::Write;
        out.clear();
        // Writing into a Vec cannot fail.
        let _ = write!(
            out,
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        out.extend_from_slice(body);
    }

    /// Opens a new connection if the server said it closes this one after
    /// its last answer. Called before a request's clock starts, so the
    /// connect is not counted in its latency.
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        if self.closing {
            *self = Self::open(&format!("http://{}", self.host)).await?;
        }
        Ok(())
    }

    /// The body of `answer`, the last one [`Conn::exchange`] read.
    pub fn body(&self, answer: &Answer) -> &[u8] {
        &self.buf[answer.body.clone()]
    }

    /// Sends an encoded request and reads its answer whole (reopening
    /// first, as [`Conn::ready`] does, if the caller did not).
    pub async fn exchange(&mut self, request: &[u8]) -> anyhow::Result<Answer> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.ready().await?;
        self.buf.clear();
        self.stream.write_all(request).await?;
        let head = loop {
            self.buf.reserve(16 * 1024);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection before answering");
            }
            if let Some(head) = parse_head(&self.buf)? {
                break head;
            }
        };
        let total = head.len + head.content_length;
        while self.buf.len() < total {
            self.buf.reserve(total - self.buf.len());
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection inside an answer");
            }
        }
        let done = Instant::now();
        if self.buf.len() > total {
            bail!(
                "{} bytes past the answer's content-length",
                self.buf.len() - total
            );
        }
        self.closing = head.close;
        Ok(Answer {
            status: head.status,
            body: head.len..total,
            done,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_head_is_read_as_hyper_and_uvicorn_write_it() {
        let hyper = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 42\r\ndate: Sun, 06 Dec 2026 03:00:00 GMT\r\n\r\n{";
        let head = parse_head(hyper).unwrap().unwrap();
        assert_eq!(
            head,
            Head {
                status: 200,
                len: hyper.len() - 1,
                content_length: 42,
                close: false
            }
        );
        let uvicorn = b"HTTP/1.1 422 Unprocessable Entity\r\ndate: x\r\nserver: uvicorn\r\nContent-Length: 7\r\ncontent-type: application/json\r\nConnection: close\r\n\r\n";
        let head = parse_head(uvicorn).unwrap().unwrap();
        assert_eq!(
            (head.status, head.content_length, head.close),
            (422, 7, true)
        );
        // Not all there yet.
        assert_eq!(parse_head(&hyper[..40]).unwrap(), None);
        let no_content = parse_head(b"HTTP/1.1 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(no_content.content_length, 0);
    }

    /// Reads one request (head and `content-length` body) from `stream`.
    async fn read_request(stream: &mut tokio::net::TcpStream) {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed before a whole request");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end])
                    .unwrap()
                    .to_ascii_lowercase();
                let length: usize = head
                    .split("\r\n")
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                if buf.len() >= end + 4 + length {
                    return;
                }
            }
        }
    }

    /// A real server: an answer in three pieces (the head split mid-line),
    /// an answer with bytes past its length (an error: this client does not
    /// pipeline, the connection is opened again), an answer saying
    /// `connection: close` then the socket closed (the next request goes on
    /// a new connection, opened by `ready` before the clock would start).
    #[tokio::test]
    async fn answers_are_read_from_a_real_socket_and_a_closed_connection_is_reopened() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            // Connection 1: an answer in three pieces, then one too long.
            let (mut s, _) = listener.accept().await.unwrap();
            s.set_nodelay(true).unwrap();
            read_request(&mut s).await;
            for piece in [
                &b"HTTP/1.1 200 OK\r\ncontent-le"[..],
                b"ngth: 6\r\n\r\n",
                b"conn 1",
            ] {
                s.write_all(piece).await.unwrap();
                s.flush().await.unwrap();
                // Each piece on its own read (not a timed assertion).
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA")
                .await
                .unwrap();
            // Connection 2: one answer, then closed.
            let (mut s, _) = listener.accept().await.unwrap();
            read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nconn 2")
                .await
                .unwrap();
            drop(s);
            // Connection 3.
            let (mut s, _) = listener.accept().await.unwrap();
            read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 6\r\n\r\nconn 3")
                .await
                .unwrap();
        });
        let mut conn = Conn::open(&base).await.unwrap();
        let mut request = Vec::new();
        conn.encode(&mut request, "/events", br#"{"a":1}"#);

        let a = conn.exchange(&request).await.unwrap();
        assert_eq!((a.status, conn.body(&a)), (200, &b"conn 1"[..]));
        assert!(!conn.closing);

        let error = conn.exchange(&request).await.unwrap_err().to_string();
        assert!(
            error.contains("past the answer's content-length"),
            "{error}"
        );
        // As the workers' `reopen` does.
        conn = Conn::open(&base).await.unwrap();

        let a = conn.exchange(&request).await.unwrap();
        assert_eq!((a.status, conn.body(&a)), (200, &b"conn 2"[..]));
        assert!(conn.closing);
        let before = conn.stream.local_addr().unwrap();
        conn.ready().await.unwrap();
        assert!(!conn.closing);
        assert_ne!(conn.stream.local_addr().unwrap(), before, "not reopened");

        let a = conn.exchange(&request).await.unwrap();
        assert_eq!((a.status, conn.body(&a)), (201, &b"conn 3"[..]));
        drop(conn);
        server.await.unwrap();
    }

    #[test]
    fn an_answer_this_client_cannot_frame_is_an_error() {
        for (head, says) in [
            (
                &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"[..],
                "transfer-encoding",
            ),
            (
                b"HTTP/1.1 200 OK\r\nserver: x\r\n\r\n",
                "without content-length",
            ),
            (b"HTTP/1.1 100 Continue\r\n\r\n", "status line"),
            (b"HTTP/2 200\r\n\r\n", "status line"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                "two different",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
                "content-length",
            ),
            (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed"),
        ] {
            let error = parse_head(head).unwrap_err().to_string();
            assert!(error.contains(says), "{error:?} for {head:?}");
        }
        assert!(parse_head(&vec![b'x'; MAX_HEAD + 1]).is_err());
    }
}
