//! The Durable Streams protocol over HTTP, with Ursula's snapshot, retention and bootstrap
//! routes (feature `http`): a thin adapter over [`Store`].
//!
//! A stream's name is the whole URL path at any depth (`/v1/stream/chat-42` names
//! `v1/stream/chat-42`). On every stream path `{s}`:
//!
//! | route | methods | does |
//! |---|---|---|
//! | `{s}` | `PUT` `POST` `GET` `HEAD` `DELETE` | create or fork; append or close; read (catch-up, `live=long-poll`, `live=sse`); metadata; delete |
//! | `{s}/snapshot/{offset}` | `PUT` `GET` `DELETE` | publish a snapshot; read it; (always refused) delete it |
//! | `{s}/snapshot` | `GET` | the latest snapshot (404 when none) |
//! | `{s}/retention/{offset}` | `PUT` | advance the earliest readable offset |
//! | `{s}/bootstrap` | `GET` | `multipart/mixed`: the latest snapshot, then every message after it |
//!
//! Those route shapes are reserved: a name ending in `snapshot`, `retention` or `bootstrap` (or
//! with `snapshot`/`retention` second to last) is no stream, and creating one is a 400. Large
//! bodies stream both ways: a snapshot upload is pumped to the engine's temporary file, a
//! snapshot read is a mapped view of its file, and bootstrap reads the stream a bounded chunk at
//! a time as the socket takes it. Once retention trimmed the start, `offset=-1` answers 410 (the
//! engine's [`ReadFrom::Start`](crate::ReadFrom::Start)). User-facing documentation with curl
//! examples: `docs/http.md`.
//!
//! Every path answers `OPTIONS` (CORS preflight). Every refusal is an RFC 9457
//! `application/problem+json` body whose `code` names the error (see `error.rs` for the one
//! error-to-status mapping). Every response carries the browser security headers of PROTOCOL.md
//! 12.7; GET responses and responses to requests with `Origin` also carry CORS headers exposing
//! the protocol's response headers.
//!
//! Concurrency: appends to open streams and reads of open, verified ranges run the engine's
//! non-blocking paths on the async worker (in Buffered mode an append's wait also commits its
//! batch there: two page-cache writes, no sync); every other engine call, which may read files
//! or sync, runs in `spawn_blocking`. An append's durability is awaited outside it
//! ([`Pending::wait_async`](crate::Pending::wait_async)), so waiting for an fsync holds no thread.
//! Long-poll and SSE readers sleep in [`Store::wait`] (woken by the engine on append, close,
//! delete or expiry), raced against their deadline and the server's shutdown signal: nothing polls.

mod body;
mod cursor;
mod error;
mod ext;
mod read;
mod socket;
#[cfg(test)]
mod tests;
mod write;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::headers::{InvalidHeader, STREAM_INCARNATION};
use crate::{Incarnation, Store, StreamName};

use error::{ApiError, Op};

/// How the server behaves beyond what the store's [`Options`](crate::Options) set.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How long a `live=long-poll` read waits for data before answering 204. Default 30 s.
    pub long_poll_timeout: Duration,
    /// How long an SSE connection stays open before the server ends it (the client reconnects
    /// from its last offset; PROTOCOL.md 10.2 asks for about 60 s). Default 60 s.
    pub sse_max_duration: Duration,
    /// How often an idle SSE connection gets a comment line, so proxies keep it open.
    /// Default 15 s.
    pub sse_keepalive: Duration,
    /// Catch-up and long-poll `200`s are cacheable `private` (per user) instead of `public`
    /// (shared) when true. Default false.
    pub private_cache: bool,
    /// The base URL clients reach this server at (for the absolute `Location` of a 201), e.g.
    /// `https://streams.example.com`. Default: `http://` and the request's `Host`.
    pub public_url: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            long_poll_timeout: Duration::from_secs(30),
            sse_max_duration: Duration::from_secs(60),
            sse_keepalive: Duration::from_secs(15),
            private_cache: false,
            public_url: None,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) store: Store,
    pub(crate) config: Arc<ServerConfig>,
    /// Turns `true` when the server shuts down: live readers end at once.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Keeps the shutdown channel open for routers built without [`serve`].
    _shutdown_tx: Arc<watch::Sender<bool>>,
}

impl AppState {
    /// Resolves once the server is shutting down; never, for a router without [`serve`].
    pub(crate) async fn shutting_down(&self) {
        let mut rx = self.shutdown.clone();
        // `wait_for` fails only when the sender is gone, which this state keeps alive.
        let _ = rx.wait_for(|down| *down).await;
    }
}

/// The protocol's routes over `store`, as an axum [`Router`] (for tests, or to nest in a larger
/// application). Live readers of this router end only at their own deadlines; [`serve`] also
/// ends them on shutdown.
pub fn router(store: Store, config: ServerConfig) -> Router {
    let (tx, rx) = watch::channel(false);
    let state = Arc::new(app_state(store, config, tx, rx));
    Router::new().fallback(move |req: Request| {
        let app = state.clone();
        async move { handle(&app, req).await }
    })
}

fn app_state(
    store: Store,
    config: ServerConfig,
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
) -> AppState {
    AppState {
        store,
        config: Arc::new(config),
        shutdown: rx,
        _shutdown_tx: Arc::new(tx),
    }
}

/// Serves the protocol on `listener` until `shutdown` resolves, then ends live readers, lets
/// in-flight requests finish and returns. The caller shuts the store down afterwards.
///
/// Each connection is served by hyper's HTTP/1.1 connection loop straight into the handler
/// (no router or middleware stack per request: the path is parsed once, by `parse_route`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Store,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};

    let (tx, rx) = watch::channel(false);
    let signal = tx.clone();
    let app = Arc::new(app_state(store, config, tx, rx));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Large mapped body slices leave by sendfile(2) (see socket.rs), which has no MSG_NOSIGNAL:
    // only where a peer that went away cannot end the process with SIGPIPE.
    let sendfile = crate::fs::sigpipe_is_handled();
    if !sendfile {
        tracing::info!(
            "SIGPIPE has its default action: read bodies are copied to sockets, not sent with sendfile"
        );
    }
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of descriptors or a connection that died in the backlog: keep serving
                // the connections already open, and try again shortly.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // A response head leaves in one `writev` (with the body when it is small or not mapped);
        // it must not wait for Nagle's timer.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(
            move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&app, req.map(Body::new)).await) }
            },
        );
        let conn =
            builder.serve_connection(TokioIo::new(socket::Socket::new(stream, sendfile)), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection's error (reset, malformed request) concerns that connection only.
            let _ = conn.await;
        });
    }
    drop(listener);
    // Live readers watch this and answer (204, end of SSE) at once.
    let _ = signal.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// One request, start to finish: CORS preflight or the route's handler, then the headers every
/// response carries.
async fn handle(app: &AppState, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let cors = parts.method == Method::GET || parts.headers.contains_key(header::ORIGIN);
    let mut res = if parts.method == Method::OPTIONS {
        preflight(&parts.headers)
    } else {
        match route(app, parts, body).await {
            Ok(res) => res,
            Err(e) => e.into_response(),
        }
    };
    common_headers(res.headers_mut(), cors);
    res
}

/// Response headers that every response carries: PROTOCOL.md 12.7 and CORS.
const EXPOSED_HEADERS: &str = "Stream-Next-Offset, Stream-Up-To-Date, Stream-Closed, Stream-Cursor, \
    Stream-Last-Seq, Stream-Incarnation, Stream-TTL, Stream-Expires-At, Stream-Earliest-Offset, \
    Stream-Snapshot-Offset, Stream-Snapshot-Digest, Stream-SSE-Data-Encoding, Producer-Epoch, \
    Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type";

/// Request headers a browser may send (the preflight's `Access-Control-Allow-Headers`).
const ALLOWED_HEADERS: &str = "Content-Type, If-None-Match, Authorization, Stream-Seq, Stream-TTL, \
    Stream-Expires-At, Stream-Closed, Stream-Incarnation, Stream-Forked-From, Stream-Fork-Offset, \
    Stream-Fork-Sub-Offset, Stream-Snapshot-Match, Producer-Id, Producer-Epoch, Producer-Seq";

const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";

///
/// The CORS headers go on responses to requests that carry `Origin` (every cross-origin browser
/// request does, and every browser POST, PUT and DELETE) and on every GET response, since a
/// shared cache may hand a GET response to a browser that asked with `Origin`. Other responses
/// (a server-side client's append, say) go without them: `Access-Control-Expose-Headers` alone
/// is 400 bytes, more than the rest of an append's response.
fn common_headers(h: &mut HeaderMap, cors: bool) {
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("cross-origin"),
    );
    if !cors {
        return;
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED_HEADERS),
    );
}

/// A CORS preflight: every method and protocol header is allowed, plus whatever the browser
/// asks for.
fn preflight(headers: &HeaderMap) -> Response {
    let mut allow = ALLOWED_HEADERS.to_owned();
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|v| v.to_str().ok());
    if let Some(asked) = asked.filter(|a| !a.trim().is_empty()) {
        allow.push_str(", ");
        allow.push_str(asked);
    }
    let mut r = Reply::new(StatusCode::NO_CONTENT)
        .header(header::ACCESS_CONTROL_ALLOW_METHODS, ALLOWED_METHODS)
        .header(header::ACCESS_CONTROL_MAX_AGE, "86400")
        .header(header::ALLOW, ALLOWED_METHODS);
    r = r.header(header::ACCESS_CONTROL_ALLOW_HEADERS, &allow);
    r.empty()
}

/// What a request path addresses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `{s}`.
    Stream(StreamName),
    /// `{s}/snapshot`.
    SnapshotLatest(StreamName),
    /// `{s}/snapshot/{offset}`.
    SnapshotAt(StreamName, String),
    /// `{s}/retention/{offset}`.
    Retention(StreamName, String),
    /// `{s}/bootstrap`.
    Bootstrap(StreamName),
}

fn stream_name(path: Option<&str>) -> Result<StreamName, ApiError> {
    let path = path.unwrap_or("");
    StreamName::new(path).map_err(|e| {
        let detail = match e {
            crate::Error::InvalidArgument(d) | crate::Error::TooLarge(d) => d,
            other => other.to_string(),
        };
        ApiError::bad_request("INVALID_STREAM_NAME", detail)
    })
}

/// Splits a request path into the stream it names and the extension route after it, by its last
/// segments (which [`StreamName`] reserves for exactly this).
pub(crate) fn parse_route(path: &str) -> Result<Route, ApiError> {
    let p = path.strip_prefix('/').unwrap_or(path);
    let (head, last) = match p.rsplit_once('/') {
        Some((h, l)) => (Some(h), l),
        None => (None, p),
    };
    match last {
        "bootstrap" => return stream_name(head).map(Route::Bootstrap),
        "snapshot" => return stream_name(head).map(Route::SnapshotLatest),
        "retention" => {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "retention needs an offset: PUT {stream}/retention/{offset}",
            ));
        }
        _ => {}
    }
    if let Some(head) = head {
        let (stream, mid) = match head.rsplit_once('/') {
            Some((s, m)) => (Some(s), m),
            None => (None, head),
        };
        match mid {
            "snapshot" => return Ok(Route::SnapshotAt(stream_name(stream)?, last.to_owned())),
            "retention" => return Ok(Route::Retention(stream_name(stream)?, last.to_owned())),
            _ => {}
        }
    }
    stream_name(Some(p)).map(Route::Stream)
}

async fn route(app: &AppState, parts: Parts, body: Body) -> Result<Response, ApiError> {
    const STREAM_METHODS: &str = "GET, HEAD, PUT, POST, DELETE, OPTIONS";
    let route = parse_route(parts.uri.path())?;
    let m = &parts.method;
    match route {
        Route::Stream(name) => match *m {
            Method::GET => read::get(app, name, &parts).await,
            Method::HEAD => read::head(app, name, &parts).await,
            Method::PUT => write::create(app, name, &parts, body).await,
            Method::POST => write::append(app, name, &parts, body).await,
            Method::DELETE => write::delete(app, name, &parts).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: STREAM_METHODS,
            }),
        },
        // Creating or appending to `{s}/snapshot` or `{s}/bootstrap` would address a stream
        // whose name collides with a route: refuse it as the invalid stream name it is.
        // (The names reserve exactly the shapes `parse_route` takes for routes, so the name
        // check always fails here.)
        Route::SnapshotLatest(_) | Route::Bootstrap(_)
            if matches!(*m, Method::PUT | Method::POST) =>
        {
            Err(stream_name(Some(parts.uri.path()))
                .err()
                .unwrap_or_else(|| ApiError::internal("a reserved route parsed as a stream name")))
        }
        Route::SnapshotLatest(name) => match *m {
            Method::GET => ext::snapshot_latest(app, name, &parts).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, OPTIONS",
            }),
        },
        Route::SnapshotAt(name, offset) => match *m {
            Method::GET => ext::snapshot_at(app, name, &offset, &parts).await,
            Method::PUT => ext::publish_snapshot(app, name, &offset, &parts, body).await,
            Method::DELETE => ext::delete_snapshot(app, name, &offset, &parts).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, PUT, DELETE, OPTIONS",
            }),
        },
        Route::Retention(name, offset) => match *m {
            Method::PUT => ext::retention(app, name, &offset, &parts).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: "PUT, OPTIONS",
            }),
        },
        Route::Bootstrap(name) => match *m {
            Method::GET => ext::bootstrap(app, name, &parts).await,
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, OPTIONS",
            }),
        },
    }
}

/// Runs a blocking engine call on the blocking pool; `op` says how its error maps to a status.
pub(crate) async fn blocking<T, F>(op: Op, f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> crate::Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ApiError::Store(e, op)),
        Err(_) => Err(ApiError::internal(
            "a blocking engine call panicked or was cancelled",
        )),
    }
}

/// Sets a header from a string, skipping values that are not valid header values (never the
/// case for the offsets, numbers and tokens brook writes).
pub(crate) fn set_header(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// A response under construction.
pub(crate) struct Reply {
    status: StatusCode,
    headers: HeaderMap,
}

impl Reply {
    pub(crate) fn new(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::with_capacity(16),
        }
    }

    /// Adds a header; `name` is a [`HeaderName`] or one of the lower-case constants of
    /// [`crate::headers`].
    pub(crate) fn header(mut self, name: impl IntoHeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.insert(name.into_header_name(), v);
        }
        self
    }

    /// Adds `name: true` when `flag` is set.
    pub(crate) fn flag(self, name: &'static str, flag: bool) -> Self {
        if flag {
            self.header(name, "true")
        } else {
            self
        }
    }

    pub(crate) fn body(self, body: Body) -> Response {
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }

    pub(crate) fn empty(self) -> Response {
        self.body(Body::empty())
    }
}

/// A header name given as a typed name or a lower-case static string.
pub(crate) trait IntoHeaderName {
    fn into_header_name(self) -> HeaderName;
}

impl IntoHeaderName for HeaderName {
    fn into_header_name(self) -> HeaderName {
        self
    }
}

impl IntoHeaderName for &'static str {
    fn into_header_name(self) -> HeaderName {
        // Invariant: only the lower-case constants of `crate::headers` and literals like
        // "x-content-type-options" reach here; `headers_are_valid_names` tests them all.
        HeaderName::from_static(self)
    }
}

/// A request header's raw bytes.
pub(crate) fn raw<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers.get(name).map(HeaderValue::as_bytes)
}

/// A request header as text, `None` when absent or not visible ASCII.
pub(crate) fn text(
    headers: &HeaderMap,
    name: impl axum::http::header::AsHeaderName,
) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The request's `Stream-Incarnation`, if any.
pub(crate) fn expected_incarnation(headers: &HeaderMap) -> Result<Option<Incarnation>, ApiError> {
    match headers.get(STREAM_INCARNATION) {
        None => Ok(None),
        Some(v) => {
            let bad = || InvalidHeader {
                name: "Stream-Incarnation",
                reason: "not a token this server issued",
            };
            let s = v.to_str().map_err(|_| bad())?;
            Ok(Some(Incarnation::new(s.trim()).map_err(|_| bad())?))
        }
    }
}

/// The request's query parameters, percent-decoded, in order.
pub(crate) fn query_params(parts: &Parts) -> Vec<(String, String)> {
    let Some(q) = parts.uri.query() else {
        return Vec::new();
    };
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// The one value of a query parameter; an error when it is given more than once.
pub(crate) fn single<'a>(
    params: &'a [(String, String)],
    name: &'static str,
) -> Result<Option<&'a str>, ApiError> {
    let mut found = params
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str());
    let first = found.next();
    if found.next().is_some() {
        return Err(ApiError::bad_request(
            if name == "offset" {
                "INVALID_OFFSET"
            } else {
                "INVALID_ARGUMENT"
            },
            format!("the query parameter {name} is given more than once"),
        ));
    }
    Ok(first)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The absolute URL of the request's path, for `Location`.
pub(crate) fn absolute_url(app: &AppState, parts: &Parts) -> String {
    let path = parts.uri.path();
    if let Some(base) = &app.config.public_url {
        return format!("{}{}", base.trim_end_matches('/'), path);
    }
    let host = text(&parts.headers, header::HOST)
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(std::string::ToString::to_string))
        .unwrap_or_else(|| "localhost".to_owned());
    let scheme = parts.uri.scheme_str().unwrap_or("http");
    format!("{scheme}://{host}{path}")
}
