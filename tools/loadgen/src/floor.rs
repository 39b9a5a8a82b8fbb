//! The host's floor (`--floor`): the simplest loopback request and answer,
//! sent on the same open-loop schedule as the gRPC phases, so a latency
//! target can be told apart from what this machine gives any process pair.
//!
//! The echo side is plain blocking threads (one per connection, on
//! `--server-cpus` when set): a 64-byte message read and written back,
//! no runtime, no HTTP/2. The sending side is the load generator's own
//! (schedule thread, tokio runtime), so the floor includes the client's
//! share exactly as the gRPC phases pay it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::placement::Cpus;

/// Bytes each way: about an empty gRPC call's HTTP/2 frames.
const MESSAGE: usize = 64;

/// Starts the echo threads on 127.0.0.1 (an OS-chosen port); they end with
/// the process, and a connection's thread when its client closes it.
pub fn start_echo(cpus: Option<Cpus>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("ic-loadgen-echo".into())
        .spawn(move || {
            if let Some(cpus) = &cpus {
                // Connection threads inherit it.
                let _ = cpus.pin_this_thread();
            }
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_nodelay(true);
                let _ = std::thread::Builder::new()
                    .name("ic-loadgen-echo-conn".into())
                    .spawn(move || {
                        let mut buf = [0u8; MESSAGE];
                        while stream.read_exact(&mut buf).is_ok() {
                            if stream.write_all(&buf).is_err() {
                                break;
                            }
                        }
                    });
            }
        })?;
    Ok(addr)
}

/// Idle connections to the echo threads: a request takes one, so no two
/// requests share a connection (TCP has no streams to multiplex).
#[derive(Debug)]
pub struct Pool(Mutex<Vec<TcpStream>>);

impl Pool {
    /// `n` connections to `addr`; at most `n` requests may be in flight.
    pub async fn connect(addr: SocketAddr, n: usize) -> io::Result<Arc<Self>> {
        let mut streams = Vec::with_capacity(n);
        for _ in 0..n {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            streams.push(s);
        }
        Ok(Arc::new(Self(Mutex::new(streams))))
    }

    /// One round trip on an idle connection.
    pub async fn ping(&self) -> io::Result<()> {
        let taken = self.0.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut stream = taken.ok_or_else(|| {
            io::Error::other("more requests in flight than the floor's connections")
        })?;
        let mut buf = [7u8; MESSAGE];
        let result = async {
            stream.write_all(&buf).await?;
            stream.read_exact(&mut buf).await?;
            Ok(())
        }
        .await;
        if result.is_ok() {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(stream);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_echo_answers_every_ping_and_a_pool_bounds_the_requests() {
        let addr = start_echo(None).unwrap();
        let pool = Pool::connect(addr, 2).await.unwrap();
        for _ in 0..100 {
            pool.ping().await.unwrap();
        }
        // Two connections: two pings at once, not three.
        let (a, b) = tokio::join!(pool.ping(), pool.ping());
        a.unwrap();
        b.unwrap();
        let taken = pool.0.lock().unwrap().pop().unwrap();
        let other = pool.0.lock().unwrap().pop().unwrap();
        let e = pool.ping().await.unwrap_err();
        assert!(e.to_string().contains("in flight"), "{e}");
        drop((taken, other));
    }
}
