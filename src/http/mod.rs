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
//! `write.rs` (create, append, close, delete), `read.rs` (catch-up, long-poll, HEAD), `sse.rs`
//! (with `fanout.rs`, the frames a stream's subscribers share, and `seat.rs`, the per-stream
//! writer of their live tail), `snapshot.rs` (snapshots and retention), `bootstrap.rs`. `body.rs` reads request bodies and
//! shapes read bodies; `cursor.rs` computes live-read cursors; `socket.rs` is the connection's IO
//! (`sendfile(2)` of mapped slices). The edge facing the internet: `tls.rs` (certificates for
//! TLS with HTTP/2 by ALPN, reloadable), `auth.rs` (access control: who may do what on which
//! streams), `limits.rs` (caps on connections and live readers, and the counters of refusals).

mod admin;
mod auth;
mod body;
mod bootstrap;
mod budget;
mod cursor;
#[cfg(feature = "fuzzing")]
pub(crate) mod differential;
mod error;
mod fanout;
mod h1;
mod if_match;
mod keys;
mod limits;
mod names;
mod read;
mod reply;
mod request;
mod route;
mod seat;
mod snapshot;
mod socket;
mod sse;
mod subscriptions;
#[cfg(test)]
mod tests;
mod tls;
mod webhook;
mod write;

pub use auth::{AccessControl, JwtAlgorithm, JwtKey, check_token_line, token_hash};
pub use if_match::AppendIfMatch;
pub use tls::Tls;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::{Incarnation, Store, StreamName};

pub use admin::serve_starting;
use admin::{Metrics, RouteKind};

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
    /// Immutable catch-up chunks (see docs/http.md, "Caching") are cacheable `private` (per
    /// user) instead of `public` (shared) when true. Default false.
    pub private_cache: bool,
    /// The `max-age` of an immutable catch-up chunk: how long a cache may serve it without
    /// asking. Bounds how long a cache can hand out chunks of a stream that was deleted (or
    /// deleted and created again under the same name). Default one year.
    pub immutable_max_age: Duration,
    /// Refuse to create streams that could not move to a server with Ursula's naming rules
    /// (`bucket/stream`, see docs/http.md) and forks (400 `NAME_NOT_PORTABLE`,
    /// `FORK_NOT_PORTABLE`). Default false.
    pub portable_names: bool,
    /// What `If-Match` on an append means (docs/http.md, "If-Match on appends"). Default
    /// [`AppendIfMatch::Ignored`], as Ursula does, so every 412 keeps the seed's meaning ("the
    /// stream you knew is gone").
    pub append_if_match: AppendIfMatch,
    /// The base URL clients reach this server at (for the absolute `Location` of a 201), e.g.
    /// `https://streams.example.com`. Default: `http://` and the request's `Host`.
    pub public_url: Option<String>,
    /// How long a request body may deliver no bytes before the request is refused with `408`
    /// (a stalled upload holds what it sent so far). Default 30 s.
    pub body_read_timeout: Duration,
    /// The least a request body must average, in bytes per second, once
    /// [`body_min_rate_grace`](Self::body_min_rate_grace) has passed since it began: a body
    /// that falls behind (a slowloris upload) is refused with 408 `BODY_TOO_SLOW` and its
    /// connection closed. 0 turns the check off. Default 4096 (4 KiB/s).
    pub body_min_rate: u64,
    /// How long a request body may take before [`body_min_rate`](Self::body_min_rate) applies.
    /// Default 10 s.
    pub body_min_rate_grace: Duration,
    /// The server's memory budget, in bytes: request bodies being read, response bytes queued
    /// for slow readers and connections' read buffers, together (see docs/operations.md,
    /// "Memory"). Work that would take the server past it is refused with 503
    /// `MEMORY_BUDGET` and `Retry-After`, before its bytes are read. Default: an eighth of the
    /// machine's memory, between 32 MiB and 192 MiB.
    pub max_memory: u64,
    /// How long a connection's writes may make no progress (the peer reads nothing) before the
    /// connection is closed. Default 60 s.
    pub write_stall_timeout: Duration,
    /// How long shutdown waits for open requests after it stopped accepting; connections still
    /// open then are dropped. Default 10 s.
    pub shutdown_grace: Duration,
    /// How long a webhook receiver has to answer one delivery (connect to the last byte of
    /// the response) before the attempt counts as failed and is retried. Default 10 s.
    pub webhook_timeout: Duration,
    /// Address ranges webhooks may reach although the address policy refuses them (loopback,
    /// private, link-local, unique-local, ...: docs/http.md, "Webhook URLs and the address
    /// policy"), e.g. `127.0.0.0/8` for a receiver on this machine or `10.0.0.0/8` inside the
    /// operator's network; `"127.0.0.0/8".parse()` makes one. Checked on every connect.
    /// Default empty: public addresses only.
    pub webhook_allow: Vec<ipnet::IpNet>,
    /// Serve TLS with this certificate instead of plain HTTP/1.1: ALPN picks HTTP/2 or
    /// HTTP/1.1 per connection. Default `None` (plain HTTP/1.1).
    pub tls: Option<Tls>,
    /// How long a client may take to send a request's headers (HTTP/1.1) or to finish the TLS
    /// handshake before its connection is closed: bounds what a slow client (slowloris) holds.
    /// Default 30 s.
    pub header_read_timeout: Duration,
    /// Who may read, write and administer which streams (bearer tokens from a file or JWTs;
    /// see [`AccessControl`]). Default `None`: everyone may do everything.
    pub access: Option<Arc<AccessControl>>,
    /// Connections open at once; one more is answered 503 `TOO_MANY_CONNECTIONS` (with
    /// `Retry-After`) and closed. Default 10 000 (keep it below the process's file-descriptor
    /// limit, `ulimit -n`).
    pub max_connections: usize,
    /// Live readers (SSE connections, long-polls waiting at the tail) at once, over all streams;
    /// one more is answered 503 `TOO_MANY_LIVE_READERS`. Default 10 000.
    pub max_live_readers: usize,
    /// Live readers of one stream at once; one more is answered 503 `TOO_MANY_LIVE_READERS`.
    /// Default `None` (only `max_live_readers` applies).
    pub max_live_readers_per_stream: Option<usize>,
    /// Serve every plain HTTP/1.1 request with hyper's connection loop instead of brook's own
    /// (which serves the common requests and hands a connection to hyper at the first request
    /// it does not frame itself: see `h1.rs`). For comparing the two; default false.
    pub hyper_http1: bool,
}

impl Default for ServerConfig {
    /// 30 s long-polls, 60 s SSE connections with 15 s keep-alives, `public` caching (a year for
    /// immutable chunks), URLs from `Host`, 30 s body reads at 4 KiB/s after 10 s, a memory
    /// budget of an eighth of the machine (32 to 192 MiB), 60 s write stalls, 10 s of shutdown
    /// grace, plain HTTP/1.1, 30 s to send headers, no access control, 10 000 connections and
    /// 10 000 live readers; webhooks to public addresses only.
    fn default() -> Self {
        ServerConfig {
            long_poll_timeout: Duration::from_secs(30),
            sse_max_duration: Duration::from_mins(1),
            sse_keepalive: Duration::from_secs(15),
            private_cache: false,
            immutable_max_age: Duration::from_hours(365 * 24),
            portable_names: false,
            append_if_match: AppendIfMatch::Ignored,
            public_url: None,
            body_read_timeout: Duration::from_secs(30),
            body_min_rate: 4096,
            body_min_rate_grace: Duration::from_secs(10),
            max_memory: budget::default_limit(budget::physical_memory()),
            write_stall_timeout: Duration::from_mins(1),
            shutdown_grace: Duration::from_secs(10),
            webhook_timeout: Duration::from_secs(10),
            webhook_allow: Vec::new(),
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            access: None,
            max_connections: 10_000,
            max_live_readers: 10_000,
            max_live_readers_per_stream: None,
            hyper_http1: false,
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
    /// Notified (every waiter) right after `shutdown` turns `true`: what
    /// [`AppState::shutting_down`] waits on, a waiter list cheaper to join and leave than the
    /// watch channel's (a long-poll joins and leaves it once per request).
    shutdown_notify: Arc<tokio::sync::Notify>,
    /// Connections open on [`serve`]'s listener (see `write::append`: in Buffered mode an
    /// append on the only connection that is not a live reader commits at once; one among
    /// several first lets the others' appends join its batch).
    pub(crate) connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The webhook signing key and token secret (`keys.rs`), or why they could not be loaded.
    pub(crate) keys: Arc<Result<keys::Keys, String>>,
    /// What the edge refused (connections, live readers, tokens), for metrics.
    pub(crate) edge: Arc<limits::EdgeCounters>,
    /// The live readers per stream, for `max_live_readers_per_stream`.
    pub(crate) live: Arc<limits::LiveReaders>,
    /// The frames last rendered for each stream with SSE subscribers, shared among them.
    pub(crate) tails: Arc<fanout::Tails>,
    /// Whether a `debug` line is logged per request: the level is checked once, when the state
    /// is made, so a server without debug logging formats nothing per request.
    log_requests: bool,
    /// The `Cache-Control` of an immutable catch-up chunk, made once from the configuration.
    pub(crate) immutable_cache: HeaderValue,
    /// The server's request counters and live-reader gauges (`GET /__brook/metrics`).
    pub(crate) metrics: Arc<Metrics>,
    /// The memory budget every request body, queued response and connection buffer draws on.
    pub(crate) budget: Arc<budget::Budget>,
}

impl AppState {
    /// Admits one more live reader of `name` (SSE, or a long-poll about to wait), or refuses it
    /// with 503 when a live-reader cap is reached; the slot frees its place when dropped.
    pub(crate) fn live_reader(&self, name: &StreamName) -> Result<limits::LiveSlot, ApiError> {
        limits::admit_live_reader(&self.config, &self.edge, &self.live, name)
    }

    /// How request bodies must arrive (idle limit, minimum rate, memory budget).
    pub(crate) fn body_rules(&self) -> body::BodyRules {
        body::BodyRules {
            idle: self.config.body_read_timeout,
            min_rate: self.config.body_min_rate,
            grace: self.config.body_min_rate_grace,
            budget: self.budget.clone(),
        }
    }

    /// Resolves once the server is shutting down; never, for a router without [`serve`].
    pub(crate) async fn shutting_down(&self) {
        // Made before the look at the flag: a `notify_waiters` after that look (the flag turns
        // true first) wakes it though it was not polled yet.
        let notified = self.shutdown_notify.notified();
        if *self.shutdown.borrow() {
            return;
        }
        notified.await;
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
        async move { handle(&app, req, false).await }
    })
}

/// The shared state over `store`; `tx` is kept so that `rx` never reports a closed channel.
fn app_state(
    store: Store,
    config: ServerConfig,
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
) -> AppState {
    let store_root = &store.dir().to_path_buf();
    let immutable_cache = read::immutable_cache_control(&config);
    let budget = budget::Budget::new(config.max_memory);
    AppState {
        store,
        config: Arc::new(config),
        shutdown: rx,
        _shutdown_tx: Arc::new(tx),
        shutdown_notify: Arc::default(),
        connections: Arc::default(),
        keys: Arc::new(keys::Keys::load_or_create(store_root).map_err(|e| e.to_string())),
        edge: Arc::default(),
        live: Arc::default(),
        tails: Arc::default(),
        log_requests: tracing::enabled!(tracing::Level::DEBUG),
        immutable_cache,
        metrics: Arc::default(),
        budget,
    }
}

/// Serves the protocol on `listener` until `shutdown` resolves, then ends live readers, lets
/// in-flight requests finish and returns. The caller shuts the store down afterwards.
///
/// Each connection is served by hyper's HTTP/1.1 connection loop straight into the handler
/// (no router or middleware stack per request: the path is parsed once, by `route::parse_route`).
/// With [`ServerConfig::tls`], each connection first completes a TLS handshake (within
/// [`ServerConfig::header_read_timeout`]) and is then served as HTTP/2 or HTTP/1.1, as ALPN
/// chose; the certificate files are checked for changes every [`RELOAD_CHECK_EVERY`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Store,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_admin(listener, None, store, config, shutdown).await
}

/// [`serve`], also answering brook's operations routes (`/__brook/...`: metrics, health,
/// listing), and only those, on `admin` when given (a port kept off the public network).
pub async fn serve_with_admin(
    listener: tokio::net::TcpListener,
    admin: Option<tokio::net::TcpListener>,
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
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        .max_buf_size(HYPER_MAX_BUF)
        .header_read_timeout(app.config.header_read_timeout);
    let tls = app.config.tls.as_ref().map(|t| {
        tokio::spawn(tls::watch(t.clone(), RELOAD_CHECK_EVERY, (*app).clone()));
        tls_builders(t, &builder)
    });
    if let Some(access) = &app.config.access {
        tokio::spawn(auth::watch(
            access.clone(),
            RELOAD_CHECK_EVERY,
            (*app).clone(),
        ));
    }
    // brook's own HTTP/1.1 loop (h1.rs) hands connections it does not serve to hyper with
    // these settings; every connection it serves holds a receiver of `alive` until it ends.
    let fallback = Arc::new(builder.clone());
    let (alive_tx, alive) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => (accepted, false),
            accepted = accept_on(admin.as_ref()) => (accepted, true),
        };
        let (accepted, admin_only) = accepted;
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
        let acceptor = || tls.as_ref().map(|t| t.acceptor.clone());
        if app.connections.load(Ordering::Relaxed) >= app.config.max_connections {
            app.edge.connections_refused.fetch_add(1, Ordering::Relaxed);
            let refusal = || limits::too_many_connections();
            tokio::spawn(refuse_connection(app.clone(), stream, acceptor(), refusal));
            continue;
        }
        // A connection hyper serves (TLS, the admin listener, `hyper_http1`) holds its
        // buffers' share of the memory budget from the start; brook's own loop leases its read
        // buffer as it grows.
        let by_hyper = admin_only || tls.is_some() || app.config.hyper_http1;
        let held = if by_hyper {
            if let Ok(held) = app
                .budget
                .lease(budget::Use::Buffers, HYPER_CONNECTION_HELD)
            {
                Some(held)
            } else {
                let limit = app.budget.limit();
                let refusal =
                    move || budget::over_budget(budget::Use::Buffers, limit).into_response();
                tokio::spawn(refuse_connection(app.clone(), stream, acceptor(), refusal));
                continue;
            }
        } else {
            None
        };
        let open = Open::count(app.connections.clone(), held);
        // The admin listener is plain HTTP/1.1 (a private address), whatever the main one is.
        if let Some(tls) = tls.as_ref().filter(|_| !admin_only) {
            tokio::spawn(serve_tls(
                app.clone(),
                tls.clone(),
                stream,
                graceful.watcher(),
                open,
                alive.clone(),
            ));
            continue;
        }
        let socket = socket::Socket::new(stream, sendfile, app.config.write_stall_timeout);
        if !admin_only && !app.config.hyper_http1 {
            let fallback = h1::Fallback {
                builder: fallback.clone(),
                watcher: graceful.watcher(),
            };
            tokio::spawn(h1::serve(
                app.clone(),
                socket,
                fallback,
                open,
                alive.clone(),
            ));
            continue;
        }
        let service = http1_service(app.clone(), admin_only);
        let conn = builder.serve_connection(TokioIo::new(socket), service);
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
    app.shutdown_notify.notify_waiters();
    drop(alive);
    let drained = async {
        graceful.shutdown().await;
        alive_tx.closed().await;
    };
    if tokio::time::timeout(app.config.shutdown_grace, drained)
        .await
        .is_err()
    {
        tracing::warn!(
            grace = ?app.config.shutdown_grace,
            "connections still open after the shutdown grace period are dropped"
        );
    }
    Ok(())
}

/// What a connection served by hyper's HTTP/1.1 loop (handed over by brook's, or on TLS) is
/// counted to hold of the memory budget: hyper's read buffer at its largest
/// ([`HYPER_MAX_BUF`]), its write buffer and, on TLS, rustls' record buffers.
pub(crate) const HYPER_CONNECTION_HELD: u64 = HYPER_MAX_BUF as u64 + (64 << 10);

/// The largest read buffer hyper's HTTP/1.1 loop may grow for a connection: room for the
/// largest head brook serves ([`h1::MAX_HEAD`]) and some of what follows it.
const HYPER_MAX_BUF: usize = h1::MAX_HEAD + (16 << 10);

/// How often [`serve`] checks whether the TLS certificate or key file, or the access-token
/// file, changed (by modification time and length) and reloads it.
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(2);

/// The service of an HTTP/1.1 connection: [`handle`] (only `/__brook/` routes when
/// `admin_only`), and `Connection: close` on a response to a request whose body was not read to
/// its end.
fn http1_service(
    app: Arc<AppState>,
    admin_only: bool,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone {
    let ends = Arc::new(body::Ends::default());
    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let ends = ends.clone();
        async move {
            // A request with a body its handler did not read to the end (a refusal decided
            // from the headers) leaves the connection unusable: say so, or the client may send
            // its next request on a connection hyper is closing.
            let tracked = (!http_body::Body::is_end_stream(req.body())).then(|| ends.issue());
            let req = match tracked {
                Some(n) => req.map(|b| Body::new(body::Tracked::new(b, ends.clone(), n))),
                None => req.map(Body::new),
            };
            let mut res = handle(&app, req, admin_only).await;
            if tracked.is_some_and(|n| !ends.ended(n)) {
                res.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(res)
        }
    })
}

/// What a TLS connection is served with: the acceptor and both protocols' connection builders.
#[derive(Clone)]
struct TlsServing {
    /// The TLS handshake.
    acceptor: tokio_rustls::TlsAcceptor,
    /// HTTP/1.1 after `http/1.1` (or no) ALPN, for what brook's own loop hands over (or
    /// everything, with `hyper_http1`).
    http1: Arc<hyper::server::conn::http1::Builder>,
    /// HTTP/2 after `h2` ALPN.
    http2: hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
}

/// The TLS serving state for `tls`, HTTP/1.1 configured as `http1`.
fn tls_builders(tls: &Tls, http1: &hyper::server::conn::http1::Builder) -> TlsServing {
    let mut http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    http2
        .timer(hyper_util::rt::TokioTimer::new())
        // Pings find dead peers of long-lived streams (SSE) that TCP alone notices late.
        .keep_alive_interval(Duration::from_secs(30))
        .max_concurrent_streams(256);
    TlsServing {
        acceptor: tls.acceptor(),
        http1: Arc::new(http1.clone()),
        http2,
    }
}

/// One TLS connection: the handshake (bounded by `header_read_timeout`), then HTTP/2 or
/// HTTP/1.1 by ALPN until the connection ends or the server's graceful shutdown ends it.
/// Large bodies are encrypted, so no `sendfile` here; a peer that stops reading is cut off
/// after the write stall limit, as on plain connections.
async fn serve_tls(
    app: Arc<AppState>,
    tls: TlsServing,
    tcp: tokio::net::TcpStream,
    watcher: hyper_util::server::graceful::Watcher,
    open: Open,
    alive: watch::Receiver<()>,
) {
    use hyper_util::rt::TokioIo;
    // TLS runs over the same socket type as plain connections, for its write-stall guard (a
    // peer that stops reading is cut off); encrypted bodies cannot go by sendfile.
    let socket = socket::Socket::new(tcp, false, app.config.write_stall_timeout);
    let handshake =
        tokio::time::timeout(app.config.header_read_timeout, tls.acceptor.accept(socket));
    let stream = match handshake.await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            app.edge
                .tls_handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            app.edge
                .tls_handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(tls::ALPN_H2);
    let io = TokioIo::new(stream);
    // A connection's error (reset, malformed request) concerns that connection only.
    if h2 {
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(handle(&app, req.map(Body::new), false).await)
                }
            });
        let _ = watcher.watch(tls.http2.serve_connection(io, service)).await;
    } else if app.config.hyper_http1 {
        let service = http1_service(app, false);
        let _ = watcher.watch(tls.http1.serve_connection(io, service)).await;
    } else {
        let fallback = h1::Fallback {
            builder: tls.http1.clone(),
            watcher,
        };
        h1::serve(app, io.into_inner(), fallback, open, alive).await;
        return;
    }
    drop((open, alive));
}

/// Answers a connection the server cannot take (over `max_connections`, or past the memory
/// budget) with `refusal` (after the TLS handshake, on a TLS listener) and closes it after at
/// most [`limits::REFUSAL_GRACE`]. Liveness and readiness (`/__brook/live`, `/__brook/ready`,
/// `/__brook/health`) keep this way in: they are answered as on any connection, so a full
/// server still tells its orchestrator how it is.
async fn refuse_connection<F>(
    app: Arc<AppState>,
    tcp: tokio::net::TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    refusal: F,
) where
    F: Fn() -> Response + Clone + Send + Sync + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let refuse = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let refusal = refusal.clone();
        async move {
            let probe = matches!(
                req.uri().path(),
                "/__brook/live" | "/__brook/ready" | "/__brook/health"
            ) && (req.method() == Method::GET || req.method() == Method::HEAD);
            let mut res = if probe {
                handle(&app, req.map(Body::new), true).await
            } else {
                refusal()
            };
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let serve = async move {
        let Some(acceptor) = acceptor else {
            let mut h1 = hyper::server::conn::http1::Builder::new();
            h1.keep_alive(false);
            let _ = h1.serve_connection(TokioIo::new(tcp), refuse).await;
            return;
        };
        let Ok(stream) = acceptor.accept(tcp).await else {
            return;
        };
        if stream.get_ref().1.alpn_protocol() == Some(tls::ALPN_H2) {
            let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            let _ = h2.serve_connection(TokioIo::new(stream), refuse).await;
        } else {
            let mut h1 = hyper::server::conn::http1::Builder::new();
            h1.keep_alive(false);
            let _ = h1.serve_connection(TokioIo::new(stream), refuse).await;
        }
    };
    let _ = tokio::time::timeout(limits::REFUSAL_GRACE, serve).await;
}

/// The next connection on `listener`; never resolves without one.
pub(crate) async fn accept_on(
    listener: Option<&tokio::net::TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Counts one open connection in [`AppState::connections`] until dropped, with the share of
/// the memory budget its buffers hold when hyper serves it.
struct Open {
    /// The server's count of open connections.
    connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The connection's buffers' share of the memory budget, when hyper serves it.
    _held: Option<budget::Lease>,
}

impl Open {
    /// Counts a connection in.
    fn count(
        connections: Arc<std::sync::atomic::AtomicUsize>,
        held: Option<budget::Lease>,
    ) -> Open {
        connections.fetch_add(1, Ordering::Relaxed);
        Open {
            connections,
            _held: held,
        }
    }
}

impl Drop for Open {
    /// Counts the connection out.
    fn drop(&mut self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request, start to finish: CORS preflight (never behind access control), admission when
/// access control is on, the route's handler, then the headers every response carries; counted
/// in the metrics (and logged at debug). On the admin listener (`admin_only`) only `/__brook/`
/// routes are served.
async fn handle(app: &AppState, req: Request, admin_only: bool) -> Response {
    let (answer, cors, _) = respond(app, req, admin_only).await;
    let mut res = answer.into_response();
    reply::common_headers(res.headers_mut(), cors);
    res
}

/// What admission decided from a request's head alone, before any of its body is read.
pub(crate) enum Admission {
    /// A CORS preflight (answered without access control).
    Preflight,
    /// No access control: every request goes to its route.
    Open,
    /// Access control let it in, this way.
    Admitted(auth::Admitted),
    /// Refused: the answer, to be sent without reading the body.
    Refused(reply::Answer),
}

/// Decides from the head whether the request may proceed: a preflight, or access control's
/// verdict (which notes the credential's expiry in `parts`' extensions). Reads no body byte.
pub(crate) fn admit(app: &AppState, parts: &mut axum::http::request::Parts) -> Admission {
    if parts.method == Method::OPTIONS {
        return Admission::Preflight;
    }
    let Some(access) = &app.config.access else {
        return Admission::Open;
    };
    match access.admit(parts) {
        Ok(admitted) => Admission::Admitted(admitted),
        Err(refusal) => Admission::Refused(refusal.into_response(&app.edge).into()),
    }
}

/// [`handle`] without the headers every response carries: the answer (on the hot routes a
/// typed head that brook's HTTP/1.1 loop writes without a `HeaderMap`, `reply.rs`), and whether
/// it is to carry the CORS headers too. That loop writes those as constant bytes (`h1.rs`)
/// instead of inserting them into every response's map. The request's header map comes back
/// too, for that loop to reuse for its next request (its allocations, not its entries).
async fn respond(
    app: &AppState,
    req: Request,
    admin_only: bool,
) -> (reply::Answer, bool, HeaderMap) {
    let (mut parts, body) = req.into_parts();
    let admission = admit(app, &mut parts);
    respond_admitted(app, parts, body, admission, admin_only).await
}

/// [`respond`] for a request whose head was admitted already ([`admit`]): brook's HTTP/1.1
/// loop admits a head before it reads the body.
pub(crate) async fn respond_admitted(
    app: &AppState,
    mut parts: axum::http::request::Parts,
    body: Body,
    admission: Admission,
    admin_only: bool,
) -> (reply::Answer, bool, HeaderMap) {
    let started = Instant::now();
    // Only a server logging at debug copies the method and path for its request line.
    let logged = app
        .log_requests
        .then(|| (parts.method.clone(), parts.uri.path().to_owned()));
    // A look at the few names a request has costs less than a hashed lookup.
    let cors = parts.method == Method::GET || parts.headers.keys().any(|k| k == header::ORIGIN);
    let mut kind = RouteKind::Other;
    let res = match admission {
        Admission::Preflight => {
            kind = RouteKind::Preflight;
            reply::preflight(&parts.headers).into()
        }
        Admission::Refused(answer) => answer,
        Admission::Open | Admission::Admitted(_) => {
            let dispatched = route::dispatch(app, &mut parts, body, &mut kind, admin_only);
            let mut res = match dispatched.await {
                Ok(res) => res,
                Err(e) => {
                    app.metrics.error(e.code());
                    e.into_response().into()
                }
            };
            if let Admission::Admitted(admitted) = admission {
                auth::private_if_token(&mut res, admitted);
            }
            res
        }
    };
    app.metrics.request_since(kind, res.status(), started);
    if let Some((method, path)) = logged {
        log_request(&method, &path, &res, started.elapsed());
    }
    (res, cors, parts.headers)
}

/// The request's `debug` line: method, path, status, body bytes (`-` when the body streams
/// with no known length: SSE, bootstrap) and the time to the response head.
fn log_request(method: &Method, path: &str, res: &reply::Answer, took: Duration) {
    let bytes = http_body::Body::size_hint(res.body()).exact();
    tracing::debug!(
        %method,
        path,
        status = res.status().as_u16(),
        bytes = bytes.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        micros = took.as_micros() as u64,
        "request"
    );
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
