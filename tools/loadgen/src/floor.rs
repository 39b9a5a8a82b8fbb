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

/// Connections to the echo threads: a request takes an idle one, so no two
/// requests share a connection (TCP has no streams to multiplex). A
/// connection that fails is dropped and the next request that finds none
/// idle opens another, paying the connect in its latency: one failed ping
/// is one error, not every later one at full concurrency.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    /// Connections at most, idle or in use.
    max: usize,
    conns: Mutex<Conns>,
}

#[derive(Debug)]
struct Conns {
    idle: Vec<TcpStream>,
    /// Idle plus in use (and being connected).
    open: usize,
}

impl Pool {
    /// `n` connections to `addr`; at most `n` requests may be in flight.
    pub async fn connect(addr: SocketAddr, n: usize) -> io::Result<Arc<Self>> {
        let mut idle = Vec::with_capacity(n);
        for _ in 0..n {
            idle.push(open(addr).await?);
        }
        let conns = Mutex::new(Conns { idle, open: n });
        Ok(Arc::new(Self {
            addr,
            max: n,
            conns,
        }))
    }

    /// One round trip on an idle connection, or on a new one where a
    /// failed connection left room.
    pub async fn ping(&self) -> io::Result<()> {
        let mut lease = self.lease()?;
        let stream = match &mut lease.stream {
            Some(stream) => stream,
            None => lease.stream.insert(open(self.addr).await?),
        };
        let mut buf = [7u8; MESSAGE];
        stream.write_all(&buf).await?;
        stream.read_exact(&mut buf).await?;
        if let Some(stream) = lease.stream.take() {
            lease.returned = true;
            self.lock().idle.push(stream);
        }
        Ok(())
    }

    fn lease(&self) -> io::Result<Lease<'_>> {
        let mut conns = self.lock();
        let stream = match conns.idle.pop() {
            Some(stream) => Some(stream),
            None if conns.open < self.max => {
                conns.open += 1;
                None
            }
            None => {
                return Err(io::Error::other(
                    "more requests in flight than the floor's connections",
                ));
            }
        };
        Ok(Lease {
            pool: self,
            stream,
            returned: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection slot taken by one request: unless the request gives the
/// connection back, its slot is freed (failed, or the request dropped).
struct Lease<'a> {
    pool: &'a Pool,
    stream: Option<TcpStream>,
    returned: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.returned {
            self.pool.lock().open -= 1;
        }
    }
}

async fn open(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
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
        let taken = (pool.lease().unwrap(), pool.lease().unwrap());
        let e = pool.ping().await.unwrap_err();
        assert!(e.to_string().contains("in flight"), "{e}");
        drop(taken);
        pool.ping().await.unwrap();
    }

    /// An echo that answers each connection's first message, then closes it.
    fn start_one_answer_echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; MESSAGE];
                    if stream.read_exact(&mut buf).is_ok() {
                        let _ = stream.write_all(&buf);
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_failed_connection_is_replaced_so_only_its_own_ping_fails() {
        let pool = Pool::connect(start_one_answer_echo(), 2).await.unwrap();
        // Each connection: its first ping answered, its second failed.
        for round in 0..3 {
            for conn in 0..2 {
                pool.ping().await.unwrap();
                let e = pool.ping().await.unwrap_err();
                assert!(!e.to_string().contains("in flight"), "{round}/{conn}: {e}");
            }
            // Both connections failed: the pool opens new ones, two at once.
            assert_eq!(pool.lock().open, 0, "round {round}");
        }
        let (a, b) = tokio::join!(pool.ping(), pool.ping());
        a.unwrap();
        b.unwrap();
        assert_eq!(pool.lock().open, 2);
    }

    #[tokio::test]
    async fn a_failed_connect_frees_its_slot() {
        // Nothing listens on a port just released.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let pool = Pool {
            addr,
            max: 1,
            conns: Mutex::new(Conns {
                idle: Vec::new(),
                open: 0,
            }),
        };
        for _ in 0..3 {
            let e = pool.ping().await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        }
        assert_eq!(pool.lock().open, 0);
    }
}
