//! The fake over HTTP on loopback, for real binaries, and a kubeconfig that
//! points at it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A fake served on a socket; dropping it stops accepting connections.
#[derive(Debug)]
pub struct Served {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `handler` over plain HTTP/1.1 on `addr` (port 0 picks one).
pub(crate) async fn serve<F, Fut>(addr: SocketAddr, handler: F) -> std::io::Result<Served>
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ::http::Response<crate::body::Body>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(Served { addr, task })
}

/// Writes a kubeconfig for the fake at `addr` into `dir` (bearer `token`,
/// default namespace `namespace`) and returns its path.
///
/// # Errors
/// When the file cannot be written.
pub fn write_kubeconfig(
    dir: &Path,
    addr: SocketAddr,
    token: &str,
    namespace: &str,
) -> std::io::Result<PathBuf> {
    let path = dir.join(format!("kubeconfig-{}", addr.port()));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: fake\n  user:\n    token: {token}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\n"
        ),
    )?;
    Ok(path)
}
