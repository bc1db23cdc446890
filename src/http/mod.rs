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
//! the protocol's response headers (`reply.rs`).
//!
//! Concurrency: appends to open streams and reads of open, verified ranges run the engine's
//! non-blocking paths on the async worker (in Buffered mode an append's wait also commits its
//! batch there: two page-cache writes, no sync); every other engine call, which may read files
//! or sync, runs in `spawn_blocking`. An append's durability is awaited outside it
//! ([`Pending::wait_async`](crate::Pending::wait_async)), so waiting for an fsync holds no thread.
//! Long-poll and SSE readers sleep in [`Store::wait`] (woken by the engine on append, close,
//! delete or expiry), raced against their deadline and the server's shutdown signal: nothing polls.

//!
//! Where things are: this file holds the configuration, [`serve`] (the accept and connection
//! loop) and [`router`]; `route.rs` turns a path into a `Route` and calls its handler;
//! `request.rs` reads headers and the query; `reply.rs` builds responses, problem+json bodies and
//! the CORS headers; `error.rs` maps every refusal to a status. The handlers:
//! `write.rs` (create, append, close, delete), `read.rs` (catch-up, long-poll, HEAD), `sse.rs`,
//! `snapshot.rs` (snapshots and retention), `bootstrap.rs`. `body.rs` reads request bodies and
//! shapes read bodies; `cursor.rs` computes live-read cursors; `socket.rs` is the connection's IO
//! (`sendfile(2)` of mapped slices).

mod body;
mod bootstrap;
mod cursor;
mod error;
mod keys;
mod names;
mod read;
mod reply;
mod request;
mod route;
mod snapshot;
mod socket;
mod sse;
mod subscriptions;
#[cfg(test)]
mod tests;
mod webhook;
mod write;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::{Incarnation, Store, StreamName};

use error::{ApiError, Op};
use request::expected_incarnation;

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
    /// How long a webhook receiver has to answer one delivery (connect to the last byte of
    /// the response) before the attempt counts as failed and is retried. Default 10 s.
    pub webhook_timeout: Duration,
}

impl Default for ServerConfig {
    /// 30 s long-polls, 60 s SSE connections with 15 s keep-alives, `public` caching, URLs from
    /// `Host`.
    fn default() -> Self {
        ServerConfig {
            long_poll_timeout: Duration::from_secs(30),
            sse_max_duration: Duration::from_mins(1),
            sse_keepalive: Duration::from_secs(15),
            private_cache: false,
            public_url: None,
            webhook_timeout: Duration::from_secs(10),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The store every route reads and writes.
    pub(crate) store: Store,
    /// The server's configuration.
    pub(crate) config: Arc<ServerConfig>,
    /// Turns `true` when the server shuts down: live readers end at once.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Keeps the shutdown channel open for routers built without [`serve`].
    _shutdown_tx: Arc<watch::Sender<bool>>,
    /// Connections open on [`serve`]'s listener (see `write::append`: in Buffered mode an
    /// append on the only connection commits at once; one among several first lets the others'
    /// appends join its batch).
    pub(crate) connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The webhook signing key and token secret (`keys.rs`), or why they could not be loaded.
    pub(crate) keys: Arc<Result<keys::Keys, String>>,
}

impl AppState {
    /// Resolves once the server is shutting down; never, for a router without [`serve`].
    pub(crate) async fn shutting_down(&self) {
        let mut rx = self.shutdown.clone();
        // `wait_for` fails only when the sender is gone, which this state keeps alive.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Runs one engine call on `name` on the blocking pool, with the store and the request's
    /// `Stream-Incarnation` (parsed first: a malformed one is 400 before anything runs). This is
    /// the whole opening of every handler that makes one blocking call on the stream it
    /// addresses; `op` says how the call's error maps to a status. Nothing here is boxed: `call`
    /// is moved into the blocking task as the closure it is, with the store's handle (one `Arc`).
    pub(crate) async fn blocking_on_stream<T, F>(
        &self,
        name: StreamName,
        headers: &HeaderMap,
        op: Op,
        call: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce(&Store, &StreamName, Option<&Incarnation>) -> crate::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let expect = expected_incarnation(headers)?;
        let store = self.store.clone();
        blocking(op, move || call(&store, &name, expect.as_ref())).await
    }
}

/// The protocol's routes over `store`, as an axum [`Router`] (for tests, or to nest in a larger
/// application). Live readers of this router end only at their own deadlines; [`serve`] also
/// ends them on shutdown.
pub fn router(store: Store, config: ServerConfig) -> Router {
    let (tx, rx) = watch::channel(false);
    let state = Arc::new(app_state(store, config, tx, rx));
    if tokio::runtime::Handle::try_current().is_ok() {
        webhook::spawn(&state);
    }
    Router::new().fallback(move |req: Request| {
        let app = state.clone();
        async move { handle(&app, req).await }
    })
}

/// The shared state over `store`; `tx` is kept so that `rx` never reports a closed channel.
fn app_state(
    store: Store,
    config: ServerConfig,
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
) -> AppState {
    let store_root = &store.root().to_path_buf();
    AppState {
        store,
        config: Arc::new(config),
        shutdown: rx,
        _shutdown_tx: Arc::new(tx),
        connections: Arc::default(),
        keys: Arc::new(keys::Keys::load_or_create(store_root).map_err(|e| e.to_string())),
    }
}

/// Serves the protocol on `listener` until `shutdown` resolves, then ends live readers, lets
/// in-flight requests finish and returns. The caller shuts the store down afterwards.
///
/// Each connection is served by hyper's HTTP/1.1 connection loop straight into the handler
/// (no router or middleware stack per request: the path is parsed once, by `route::parse_route`).
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
    if let Err(e) = app.keys.as_ref() {
        return Err(std::io::Error::other(format!(
            "the subscription keys could not be loaded: {e}"
        )));
    }
    webhook::spawn(&app);
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
        let open = Open::count(app.connections.clone());
        let app = app.clone();
        let ends = Arc::new(body::Ends::default());
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                let ends = ends.clone();
                async move {
                    // A request with a body its handler did not read to the end (a refusal
                    // decided from the headers) leaves the connection unusable: say so, or the
                    // client may send its next request on a connection hyper is closing.
                    let tracked =
                        (!http_body::Body::is_end_stream(req.body())).then(|| ends.issue());
                    let req = match tracked {
                        Some(n) => req.map(|b| Body::new(body::Tracked::new(b, ends.clone(), n))),
                        None => req.map(Body::new),
                    };
                    let mut res = handle(&app, req).await;
                    if tracked.is_some_and(|n| !ends.ended(n)) {
                        res.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, std::convert::Infallible>(res)
                }
            });
        let conn =
            builder.serve_connection(TokioIo::new(socket::Socket::new(stream, sendfile)), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection's error (reset, malformed request) concerns that connection only.
            let _ = conn.await;
            drop(open);
        });
    }
    drop(listener);
    // Live readers watch this and answer (204, end of SSE) at once.
    let _ = signal.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// Counts one open connection in [`AppState::connections`] until dropped.
struct Open(Arc<std::sync::atomic::AtomicUsize>);

impl Open {
    /// Counts a connection in.
    fn count(connections: Arc<std::sync::atomic::AtomicUsize>) -> Open {
        connections.fetch_add(1, Ordering::Relaxed);
        Open(connections)
    }
}

impl Drop for Open {
    /// Counts the connection out.
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request, start to finish: CORS preflight or the route's handler, then the headers every
/// response carries.
async fn handle(app: &AppState, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let cors = parts.method == Method::GET || parts.headers.contains_key(header::ORIGIN);
    let mut res = if parts.method == Method::OPTIONS {
        reply::preflight(&parts.headers)
    } else {
        match route::dispatch(app, parts, body).await {
            Ok(res) => res,
            Err(e) => e.into_response(),
        }
    };
    reply::common_headers(res.headers_mut(), cors);
    res
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
