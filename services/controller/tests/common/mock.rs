//! kube-rs tower-test mock scenarios: the test lists the exact requests a
//! single pass must make (method, path, query, body) with the answers the
//! API server gives, and the scenario task fails the test on any deviation.

use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;
use tokio::task::JoinHandle;

/// One expected request and its answer.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: &'static str,
    /// Path plus query exactly as sent, e.g.
    /// `/apis/g/v/namespaces/ns/plural/name/status?&force=true&fieldManager=m`.
    pub uri: String,
    /// Expected JSON body (compared exactly), if checked.
    pub body: Option<Value>,
    /// Expected content type, if checked.
    pub content_type: Option<&'static str>,
    pub status: u16,
    pub response: Value,
}

impl Exchange {
    pub fn new(method: &'static str, uri: impl Into<String>, status: u16, response: Value) -> Self {
        Self {
            method,
            uri: uri.into(),
            body: None,
            content_type: None,
            status,
            response,
        }
    }

    pub fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    pub fn content_type(mut self, ct: &'static str) -> Self {
        self.content_type = Some(ct);
        self
    }
}

/// A client whose API server answers exactly `exchanges`, in order. Await
/// the handle to assert every exchange happened.
pub fn scenario(exchanges: Vec<Exchange>) -> (kube::Client, JoinHandle<()>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let task = tokio::spawn(async move {
        for (i, ex) in exchanges.into_iter().enumerate() {
            let (request, send) = handle.next_request().await.unwrap_or_else(|| {
                panic!(
                    "exchange {i}: no request (expected {} {})",
                    ex.method, ex.uri
                )
            });
            assert_eq!(
                request.method().as_str(),
                ex.method,
                "exchange {i}: {}",
                request.uri()
            );
            assert_eq!(request.uri().to_string(), ex.uri, "exchange {i}");
            if let Some(ct) = ex.content_type {
                assert_eq!(
                    request
                        .headers()
                        .get("content-type")
                        .map(|v| v.to_str().unwrap()),
                    Some(ct),
                    "exchange {i}"
                );
            }
            let bytes = request.into_body().collect_bytes().await.unwrap();
            if let Some(expected) = &ex.body {
                let got: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(&got, expected, "exchange {i}: body");
            }
            send.send_response(
                Response::builder()
                    .status(ex.status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&ex.response).unwrap()))
                    .unwrap(),
            );
        }
    });
    (kube::Client::new(service, "default"), task)
}
