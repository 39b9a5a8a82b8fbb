//! gRPC's own bound on one decoded message (`--grpc-max-message-bytes`).
//! tonic refuses a larger message with OUT_OF_RANGE before any handler
//! runs (a unary call), or as the stream's next item (IngestEvents, whose
//! handler then ends with that status before answering), so it is counted
//! here, from the answer's status, in `grpc_messages_refused_total`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// Default of `--grpc-max-message-bytes`: tonic's own default, 4 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// A gRPC service whose answers are checked for the refusal. Only an
/// answer with its status in the headers (a call that failed before any
/// reply) is read: a success carries no `grpc-status` header, so the
/// check is one header-map miss.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    refused: Counter,
}

impl<S> Counted<S> {
    /// `inner`, its oversized requests counted in `refused`.
    pub fn new(inner: S, refused: Counter) -> Self {
        Self { inner, refused }
    }
}

impl<S: NamedService> NamedService for Counted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, R, B> Service<http::Request<R>> for Counted<S>
where
    S: Service<http::Request<R>, Response = http::Response<B>>,
    S::Future: Unpin,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<R>) -> Self::Future {
        CountedFuture {
            inner: self.inner.call(request),
            refused: self.refused.clone(),
        }
    }
}

/// The answer of a [`Counted`] service (tonic's services answer with a
/// boxed future, so no pinning is needed here).
#[derive(Debug)]
pub struct CountedFuture<F> {
    inner: F,
    refused: Counter,
}

impl<F, B, E> Future for CountedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        if let Ok(response) = &answer
            && oversized(response.headers())
        {
            self.refused.inc();
        }
        Poll::Ready(answer)
    }
}

/// How tonic's refusal begins ("Error, decoded message length too large",
/// percent-encoded as the `grpc-message` header carries it); nothing else
/// answers with it.
const REFUSAL_ENCODED: &str = "Error,%20decoded%20message%20length%20too%20large";

fn oversized(headers: &http::HeaderMap) -> bool {
    // OUT_OF_RANGE is 11.
    headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .is_some_and(|m| m.as_bytes().starts_with(REFUSAL_ENCODED.as_bytes()))
}
