//! The server's unit tests, one file per subject: every status and header the protocol, the seed
//! and Ursula's routes name. Requests go through [`router`] and `oneshot` (no sockets), with the
//! harness below; `serve.rs` alone talks to [`serve`](super::serve) over a real socket.

mod admin;
mod append;
mod cors;
mod create;
mod delete;
mod errors;
mod incarnation;
mod read;
mod routes;
mod serve;
mod snapshot;
mod sse;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::route::{Route, parse_route};
use super::{ServerConfig, router};
use crate::headers::{self, StreamSeqConflict};
use crate::{Options, Store, StreamName};

/// What a test returns: `?` on any setup failure fails the test.
type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A router over a store in a temporary directory, which lives as long as the harness.
struct Harness {
    app: Router,
    _dir: tempfile::TempDir,
}

/// A response, collected whole.
struct Res {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Res {
    /// A response header as text.
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as (lossy) UTF-8.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The problem+json `code`, if the body is one.
    fn code(&self) -> Option<String> {
        headers::problem_code(&self.body)
    }

    /// The Stream-Seq refusal this response is, as the client parses it.
    fn seq_conflict(&self) -> Option<StreamSeqConflict> {
        StreamSeqConflict::from_response(
            self.status.as_u16(),
            |n| self.h(n).map(str::to_owned),
            &self.body,
        )
    }
}

/// A harness with the given store options and server configuration.
fn harness_with(
    options: Options,
    config: ServerConfig,
) -> Result<Harness, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options)?;
    Ok(Harness {
        app: router(store, config),
        _dir: dir,
    })
}

/// A harness with default options and a 200 ms long-poll timeout.
fn harness() -> Result<Harness, Box<dyn std::error::Error>> {
    let config = ServerConfig {
        long_poll_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    harness_with(Options::default(), config)
}

impl Harness {
    /// Sends one request (with `Host: brook.test`) and collects the response.
    async fn send(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> Res {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(uri);
        req = req.header("host", "brook.test");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = self
            .app
            .clone()
            .oneshot(req.body(body.into()).expect("request"))
            .await
            .expect("infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        Res {
            status,
            headers,
            body,
        }
    }

    /// `PUT uri` with a static body.
    async fn put(&self, uri: &str, headers: &[(&str, &str)], body: &'static str) -> Res {
        self.send("PUT", uri, headers, body).await
    }

    /// `POST uri` with a static body.
    async fn post(&self, uri: &str, headers: &[(&str, &str)], body: &'static str) -> Res {
        self.send("POST", uri, headers, body).await
    }

    /// `GET uri`.
    async fn get(&self, uri: &str, headers: &[(&str, &str)]) -> Res {
        self.send("GET", uri, headers, Body::empty()).await
    }

    /// `HEAD uri`.
    async fn head(&self, uri: &str, headers: &[(&str, &str)]) -> Res {
        self.send("HEAD", uri, headers, Body::empty()).await
    }

    /// Creates a `text/plain` stream at `uri` holding `body`; asserts the 201.
    async fn text_stream(&self, uri: &str, body: &'static str) -> Res {
        let r = self.put(uri, &[("content-type", "text/plain")], body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r
    }
}

/// `Content-Type: text/plain`.
const CT_TEXT: (&str, &str) = ("content-type", "text/plain");
/// `Content-Type: application/json`.
const CT_JSON: (&str, &str) = ("content-type", "application/json");

/// Asserts an RFC 9457 problem+json response with `status` and `code`.
fn assert_problem(r: &Res, status: StatusCode, code: &str) {
    assert_eq!(r.status, status, "body: {}", r.text());
    assert_eq!(r.h("content-type"), Some("application/problem+json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("problem+json body");
    assert_eq!(v["status"], status.as_u16());
    assert_eq!(v["code"], code, "{v}");
    assert!(
        v["type"].is_string() && v["title"].is_string() && v["detail"].is_string(),
        "{v}"
    );
}
