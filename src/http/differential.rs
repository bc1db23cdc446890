//! The differential check of brook's HTTP/1.1 loop (`transport/h1/`) against hyper's (feature
//! `fuzzing`, exposed as `brook::fuzzing::Http1Check`).
//!
//! One connection's bytes are served twice over an in-memory duplex: once by brook's loop (which
//! hands the connection to hyper where it would on a real socket) and once by hyper's
//! `http1::Builder` alone, both with the server's settings. Every request either path frames is
//! answered by a recording handler, which notes its method, target, version, headers and body
//! and answers a fixed `200`. The two records must be equal, and so must the statuses the
//! client reads (less `1xx`, which hyper sends for every `Expect: 100-continue` and the loop only
//! when the body has not arrived yet). A difference means the two loops frame the same bytes
//! differently: a request one sees and the other does not is what request smuggling is made of.
//!
//! The records compare what a handler can read: the loop leaves headers no handler reads out of
//! the handler's map (`h1::unread`) and `Content-Length` (the body's exact size says it), so both
//! records leave them out.
//!
//! The client sends the bytes and then closes its write side: that end of input is the end of
//! the connection. Both paths are told to serve what came before it (`half_close`), as the loop
//! does (hyper by default drops a request whose client closed its side before the answer).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

use super::reply::Answer;
use super::service::Handler;
use super::transport::{Open, h1};
use super::{AppState, ServerConfig};
use crate::Store;

/// How long one connection may take before the check reports a hang.
const HANG: Duration = Duration::from_secs(20);

/// One request as its handler saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target, as `http::Uri` prints it.
    pub target: String,
    /// The HTTP version.
    pub version: String,
    /// The headers a handler reads, in the map's order: name (lowercase) and value, its bytes
    /// escaped (`escape_ascii`).
    pub headers: Vec<(String, String)>,
    /// The body, its bytes escaped.
    pub body: String,
}

/// What one path made of a connection's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Every request the handler was called for, in order.
    pub seen: Vec<Seen>,
    /// The status of every response the client read, in order, less `1xx` (and the answer to
    /// a body that failed).
    pub statuses: Vec<u16>,
}

/// The recording handler: what it saw, shared with the check.
#[derive(Clone, Default)]
struct Recorder(Arc<parking_lot::Mutex<Vec<Seen>>>);

impl Recorder {
    /// Records `parts` and `body`.
    fn record(&self, parts: &axum::http::request::Parts, body: &[u8]) {
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| {
                **name != header::CONTENT_LENGTH && !h1::unread(name.as_str().as_bytes())
            })
            .map(|(name, value)| {
                let value = value.as_bytes().escape_ascii().to_string();
                (name.as_str().to_owned(), value)
            })
            .collect();
        self.0.lock().push(Seen {
            method: parts.method.to_string(),
            target: parts.uri.to_string(),
            version: format!("{:?}", parts.version),
            headers,
            body: body.escape_ascii().to_string(),
        });
    }

    /// Reads the body whole and records the request: the fixed answer, or `None` when the body
    /// failed (the connection ended inside it).
    async fn answer<B>(&self, req: Request<B>) -> (Option<Response>, HeaderMap)
    where
        B: http_body::Body<Data = Bytes>,
    {
        let (mut parts, body) = req.into_parts();
        let Ok(body) = body.collect().await else {
            return (None, HeaderMap::new());
        };
        self.record(&parts, &body.to_bytes());
        let headers = std::mem::take(&mut parts.headers);
        (Some((StatusCode::OK, "ok\n").into_response()), headers)
    }
}

/// The status of the answer to a request whose body failed (the client closed its side inside
/// it), which hyper sends and brook's loop, which reads the body before the handler runs, does
/// not: the connection ends either way, so the statuses compared leave it out.
const BODY_FAILED: u16 = 599;

/// The answer when the body failed.
fn failed() -> Response {
    StatusCode::from_u16(BODY_FAILED)
        .expect("599 is a valid status code")
        .into_response()
}

impl Handler for Recorder {
    /// Every request is admitted: the check compares framing, not access.
    type Admission = ();

    fn admit(
        &self,
        _parts: &mut axum::http::request::Parts,
        _unread: Option<usize>,
    ) -> Result<(), (Answer, bool)> {
        Ok(())
    }

    async fn respond(
        &self,
        parts: axum::http::request::Parts,
        body: Body,
        (): (),
    ) -> (Answer, bool, HeaderMap) {
        let (res, headers) = self.answer(Request::from_parts(parts, body)).await;
        (Answer::Built(res.unwrap_or_else(failed)), false, headers)
    }

    async fn handle(&self, req: Request<Body>, _admin_only: bool) -> Response {
        let (res, _) = self.answer(req).await;
        res.unwrap_or_else(failed)
    }

    /// The loop's own refusals are compared by status, not counted.
    fn refused(&self, _status: StatusCode, _code: Option<&'static str>) {}
}

impl h1::Io for DuplexStream {
    /// None: not a socket.
    fn peer(&self) -> Option<std::net::IpAddr> {
        None
    }

    /// None: not a socket.
    fn tcp(&self) -> Option<std::net::TcpStream> {
        None
    }
}

/// The check: a runtime, the server state brook's loop reads its settings from, and hyper's
/// builder with the server's settings.
pub struct Http1Check {
    /// Runs each connection.
    rt: tokio::runtime::Runtime,
    /// The loop's settings, shutdown signal and metrics.
    app: Arc<AppState>,
    /// hyper's HTTP/1.1 settings, as `serve` makes them.
    builder: Arc<hyper::server::conn::http1::Builder>,
}

impl Http1Check {
    /// A check over `store` (only its directory is used, for the state the server keeps there).
    pub fn new(store: Store) -> Http1Check {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        let (tx, rx) = watch::channel(false);
        let app = Arc::new(super::app_state(store, ServerConfig::default(), tx, rx));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .keep_alive(true)
            .half_close(true)
            .header_read_timeout(app.config.header_read_timeout);
        Http1Check {
            rt,
            app,
            builder: Arc::new(builder),
        }
    }

    /// What brook's loop and hyper's make of `input`, in that order.
    pub fn run(&self, input: &[u8]) -> (Outcome, Outcome) {
        self.rt.block_on(async {
            let brook = tokio::time::timeout(HANG, self.brook(input));
            let hyper = tokio::time::timeout(HANG, self.hyper(input));
            let brook = brook.await.expect("brook's loop ends every connection");
            let hyper = hyper.await.expect("hyper ends every connection");
            (brook, hyper)
        })
    }

    /// Panics, with both outcomes, when the two loops make different things of `input`.
    pub fn check(&self, input: &[u8]) {
        let (brook, hyper) = self.run(input);
        assert!(
            brook == hyper,
            "brook's HTTP/1.1 loop and hyper's differ on {:?}:\nbrook: {brook:#?}\nhyper: {hyper:#?}",
            String::from_utf8_lossy(input)
        );
    }

    /// `input` served by brook's loop.
    async fn brook(&self, input: &[u8]) -> Outcome {
        let recorder = Recorder::default();
        let (client, server) = tokio::io::duplex(input.len() + (1 << 20));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let (_alive_tx, alive) = watch::channel(());
        let fallback = h1::Fallback {
            builder: self.builder.clone(),
            watcher: graceful.watcher(),
        };
        let open = Open::count(&self.app, None, None);
        let serve = h1::serve_with(
            self.app.clone(),
            recorder.clone(),
            server,
            fallback,
            open,
            alive,
        );
        let ((), out) = tokio::join!(serve, client_side(client, input));
        let seen = std::mem::take(&mut *recorder.0.lock());
        Outcome {
            seen,
            statuses: statuses(&out),
        }
    }

    /// `input` served by hyper alone.
    async fn hyper(&self, input: &[u8]) -> Outcome {
        let recorder = Recorder::default();
        let (client, server) = tokio::io::duplex(input.len() + (1 << 20));
        let conn = self.builder.serve_connection(
            TokioIo::new(server),
            super::transport::http1_service(recorder.clone(), false, None),
        );
        let serve = async move {
            // A connection's error (a malformed request) is what the client reads.
            let _ = conn.await;
        };
        let ((), out) = tokio::join!(serve, client_side(client, input));
        let seen = std::mem::take(&mut *recorder.0.lock());
        Outcome {
            seen,
            statuses: statuses(&out),
        }
    }
}

/// Sends `input`, closes the write side and reads everything the server sends until it closes.
async fn client_side(mut client: DuplexStream, input: &[u8]) -> Vec<u8> {
    // A server that closed early makes the write fail: what it sent is still read.
    let _ = client.write_all(input).await;
    let _ = client.shutdown().await;
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out).await;
    out
}

/// The statuses of the responses in `out`, less `1xx` and [`BODY_FAILED`]: every line that is a status line (the
/// fixed answer's body ends with a newline, and a refusal's body is the last thing sent).
fn statuses(out: &[u8]) -> Vec<u16> {
    out.split(|&b| b == b'\n')
        .filter(|line| line.len() >= 12 && line.starts_with(b"HTTP/1.") && line[8] == b' ')
        .filter_map(|line| std::str::from_utf8(&line[9..12]).ok()?.parse().ok())
        .filter(|status| !(100..200).contains(status) && *status != BODY_FAILED)
        .collect()
}
