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
//! | `{s}/snapshot/{offset}/parts`, `{s}/snapshot/parts` | `POST`, `DELETE` | stage a snapshot part (committed by a `PUT {s}/snapshot/{offset}` with `Stream-Snapshot-Parts`); discard the unused ones |
//! | `{s}/incarnation/{token}/chunk/{offset}`, `.../snapshot/{offset}` | `GET` `HEAD` | immutable reads of one incarnation (Ursula 0.11) |
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
//! Where things are: this file holds the configuration, the server's state, [`serve`] (which
//! assembles the server and starts the transport) and [`router`]. Two halves meet through one
//! interface (`service/`: `Handler`, and the seat and feed of a live response). The transport
//! (`transport/`: the accept loop, TLS, brook's HTTP/1.1 loop in `h1/`, hyper's loops, the
//! sockets and the writer of parked live connections) frames requests and responses and knows
//! nothing of streams. The handlers: `handle.rs` (admission, the route, common headers),
//! `route.rs` (a path to a `Route` and its handler), `request.rs` (headers and the query),
//! `write.rs` (create, append, close, delete), `read.rs` (catch-up, long-poll, HEAD), `sse/`
//! (with `fanout.rs`, the frames a stream's subscribers share), `snapshot.rs` (snapshots and
//! retention), `bootstrap.rs`, `subscriptions.rs` and `webhook/`, `auth/` (access control),
//! `admin.rs` (the operations routes and the metrics). Shared by both: `reply.rs` (responses,
//! problem+json, CORS), `error.rs` (every refusal's status), `budget.rs` (the memory budget),
//! `body.rs` (request bodies and their rules), `limits.rs` (caps on connections and live readers,
//! and the counters of refusals), `names.rs`, `cursor.rs`.

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
mod handle;
mod if_match;
mod immutable;
mod keys;
mod limits;
mod names;
mod pace;
mod ranges;
mod read;
mod read_span;
mod reply;
mod request;
mod retention;
mod route;
mod service;
mod snapshot;
mod snapshot_parts;
mod sse;
mod subscriptions;
#[cfg(test)]
mod tests;
mod transport;
mod webhook;
mod write;

pub use auth::{AccessControl, JwtAlgorithm, JwtKey, check_token_line, token_hash};
pub use if_match::AppendIfMatch;
pub use transport::tls::Tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue};
use tokio::sync::watch;

use crate::{Incarnation, Store, StreamName};

use admin::Metrics;
pub use transport::starting::serve_starting;

use error::{ApiError, Op};
use request::expected_incarnation;

/// How the server behaves beyond what the store's [`Options`](crate::Options) set.
#[derive(Clone, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches of the server, each documented with its default"
)]
pub struct ServerConfig {
    /// How long a `live=long-poll` read waits for data before answering 204. Default 30 s.
    pub long_poll_timeout: Duration,
    /// How long an SSE connection stays open before the server ends it (the client reconnects
    /// from its last offset; PROTOCOL.md 10.2 asks for about 60 s). Default 60 s.
    pub sse_max_duration: Duration,
    /// How often an idle SSE connection gets a comment line, so proxies keep it open.
    /// Default 15 s.
    pub sse_keepalive: Duration,
    /// Cacheable reads (catch-up chunks and long-poll `200`s, see docs/http.md, "Caching") are
    /// cacheable `private` (per user) instead of `public` (shared) when true. A read a token
    /// admitted is `private` either way. Default false.
    pub private_cache: bool,
    /// The `max-age` of an immutable catch-up chunk: how long a cache may serve it without
    /// asking. Bounds how long a cache can hand out chunks of a stream that was deleted (or
    /// deleted and created again under the same name). Default one year.
    pub immutable_max_age: Duration,
    /// The `max-age` of a catch-up chunk with data that is not final (the tail chunk, a read from
    /// `-1`) and of a long-poll's `200` (PROTOCOL.md 10.1): how long a cache may serve it without
    /// asking, so how late a reader through a cache may learn of newer data. Whole seconds.
    /// Default 60 s.
    pub cache_max_age: Duration,
    /// The `stale-while-revalidate` of the same reads: how long past `cache_max_age` a cache may
    /// still serve one while it asks brook again. Whole seconds; zero leaves it out. Default
    /// 300 s.
    pub cache_stale_while_revalidate: Duration,
    /// Keep caches off the open tail, as brook did before PROTOCOL.md 10.1's caching: a catch-up
    /// read that reaches an open tail or starts at `-1` is `no-cache` (revalidated on every use)
    /// and every long-poll `no-store`. Default false.
    pub cache_revalidate_tail: bool,
    /// The most bytes one catch-up read of a byte stream returns when the client sets no
    /// `max_bytes`: the server joins consecutive engine reads (each at most the store's
    /// `max_read_bytes`) up to it, without copying (the body is views of the segment maps, sent
    /// by `sendfile` on plain HTTP/1.1). At or under `max_read_bytes` a read is one engine read.
    /// JSON streams always get one. Default 64 MiB.
    pub catch_up_read_bytes: u64,
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
    /// The least rate a request body must keep, in bytes per second, over every window of
    /// [`body_min_rate_grace`](Self::body_min_rate_grace) (at least 1 s) once that grace period
    /// has passed since it began: a body whose last window brought less (a slowloris upload,
    /// or a burst followed by a trickle) is refused with 408 `BODY_TOO_SLOW` and its connection
    /// closed. 0 turns the check off. Default 4096 (4 KiB/s).
    pub body_min_rate: u64,
    /// How long a request body may take before [`body_min_rate`](Self::body_min_rate) applies,
    /// and the window it is measured over (at least 1 s). Default 10 s.
    pub body_min_rate_grace: Duration,
    /// The longest a request body may take from its first byte being awaited to its last: one
    /// still arriving then is refused with 408 `BODY_DEADLINE` and its connection closed.
    /// Zero turns it off. Default 10 min: a 64 MiB append (the largest by default) at 1 Mbit/s
    /// takes 9 min, so an honest slow uploader fits while a body trickled at the minimum rate
    /// holds at most 2.4 MiB (4 KiB/s × 600 s) before it is cut.
    pub body_deadline: Duration,
    /// The server's memory budget, in bytes: request bodies being read, response bytes queued
    /// for slow readers and connections' read buffers, together (see docs/operations.md,
    /// "Memory"). Work that would take the server past it is refused with 503
    /// `MEMORY_BUDGET` and `Retry-After`, before its bytes are read. Default: an eighth of the
    /// machine's memory, between 32 MiB and 192 MiB.
    pub max_memory: u64,
    /// The part of [`max_memory`](Self::max_memory) kept for small work: request bodies and
    /// read buffers of at most 64 KiB and the first 64 KiB of a slow reader's queue. Larger
    /// uploads and hyper's connection buffers are refused (503 `MEMORY_BUDGET`) once only the
    /// reserve is left, so they cannot keep small appends and reads out. Default `None`: an
    /// eighth of the budget (24 MiB of 192: some 2,700 appends of 1 KiB in flight, each with
    /// its 8 KiB read buffer).
    pub memory_reserve: Option<u64>,
    /// The most of the budget one peer address (an IPv6 peer's /64) may hold in large request
    /// bodies and hyper connection buffers; more is refused with 503 `MEMORY_BUDGET`. Default
    /// `None`: a quarter of the budget, or if more what one largest append needs at its peak
    /// (1.5 × `max_append_bytes` + 1 MiB, so one client can always send one), at most what
    /// lies outside the reserve.
    pub max_memory_per_peer: Option<u64>,
    /// The same for one bearer token (with access control on), so one tenant's token cannot
    /// hold what other tenants' uploads need. Default `None`: as
    /// [`max_memory_per_peer`](Self::max_memory_per_peer).
    pub max_memory_per_token: Option<u64>,
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
    /// Give the store's streams the descriptors connections leave: the streams' segment files
    /// may hold the open-file limit less a reserve of 256 and less the sockets open now
    /// (connections, and those being refused; rounded up to 256) and 1024 more, at least 128;
    /// the budget follows the sockets as they open and close, and a failed accept for want of
    /// descriptors puts 512 streams' files at rest at once
    /// ([`Store::set_max_stream_files`](crate::Store::set_max_stream_files)). Default false:
    /// the store keeps the `max_stream_files` it was opened with. `brook serve` turns it on
    /// unless `--max-stream-files` is given.
    pub lend_descriptors: bool,
    /// Live readers (SSE connections, long-polls waiting at the tail) at once, over all streams;
    /// one more is answered 503 `TOO_MANY_LIVE_READERS`. Default 10 000.
    pub max_live_readers: usize,
    /// Live readers of one stream at once; one more is answered 503 `TOO_MANY_LIVE_READERS`.
    /// Default `None` (only `max_live_readers` applies).
    pub max_live_readers_per_stream: Option<usize>,
    /// Serve every plain HTTP/1.1 request with hyper's connection loop instead of brook's own
    /// (which serves the common requests and hands a connection to hyper at the first request
    /// it does not frame itself: see `transport/h1/`). For comparing the two; default false.
    pub hyper_http1: bool,
    /// Send large catch-up bodies on plain HTTP/1.1 from the segment files with `sendfile(2)`
    /// (no copy through brook's memory, about 60% of the server CPU per byte), or write them
    /// from the maps when false. On loopback, where the kernel's work for the receiver falls on
    /// the sending side's choice, a client on the same machine (a proxy or cache in front, a
    /// benchmark) can read somewhat faster with writes: ds-bench's catch-up reads at 32 readers,
    /// 2.8-2.9 GiB/s with `sendfile` against 3.3-3.5 with writes, at 0.42-0.46 against 0.73
    /// server cores (docs/benchmarks/ds-bench.md, sixth run). Default true.
    pub sendfile: bool,
    /// How each accepted connection's kernel send buffer is sized (`--send-buffer`). Default
    /// [`SendBuffer::Auto`].
    pub send_buffer: SendBuffer,
}

/// How the server sizes each accepted connection's kernel send buffer (`SO_SNDBUF`), which
/// bounds the bytes the kernel holds for the connection: sent and not yet acknowledged, and
/// queued to send.
///
/// Left to itself, Linux grows a connection's send buffer up to `net.ipv4.tcp_wmem`'s maximum
/// (4 MiB by default) as it sends. That is what a peer across the internet needs to be read at
/// full speed, but for a peer on the same machine or rack, whose round trip is microseconds,
/// megabytes queued per connection are memory that buys no speed and make many connections
/// read by one busy client (a proxy, a cache, a benchmark) take turns unfairly: ds-bench's
/// catch-up reads over loopback with 32 readers had a p99 six times their median
/// (docs/benchmarks/ds-bench.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendBuffer {
    /// A connection whose handshake took under a few milliseconds gets a fixed buffer of its
    /// bandwidth-delay product at 10 Gbit/s (the handshake's round trip times 1.25 GB/s), at
    /// least [`SendBuffer::AUTO_MIN`]; one further away, or whose round trip the kernel did not
    /// measure, keeps the kernel's growth. "A few" is where the product passes what the kernel
    /// would grow the buffer to (`net.core.wmem_max` and `net.ipv4.tcp_wmem`'s maximum, the
    /// smaller): 3.3 ms with 4 MiB; with stock Linux's 208 KiB `wmem_max`, only peers under 0.17
    /// ms (loopback and a quiet rack) get a fixed buffer.
    #[default]
    Auto,
    /// The kernel's own sizing for every connection.
    Os,
    /// This many bytes for every connection (at least [`SendBuffer::MIN`]; the kernel caps it at
    /// `net.core.wmem_max`).
    Bytes(usize),
}

impl SendBuffer {
    /// The smallest buffer [`SendBuffer::Auto`] gives: 128 KiB, which the kernel doubles to
    /// room for four 64 KiB loopback segments.
    pub const AUTO_MIN: usize = 128 << 10;
    /// The smallest buffer [`SendBuffer::Bytes`] sets: 64 KiB. Below it, over loopback (whose
    /// segments are up to 64 KiB), the buffer holds a single segment and every send waits for
    /// the receiver's delayed acknowledgement: a 32 KiB buffer read 16 MiB bodies at 30 MB/s.
    pub const MIN: usize = 64 << 10;
}

impl Default for ServerConfig {
    /// 30 s long-polls, 60 s SSE connections with 15 s keep-alives, `public` caching (a year for
    /// immutable chunks, 60 s and 300 s stale for the tail and long-polls), URLs from `Host`, 30 s body reads at 4 KiB/s after 10 s, a memory
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
            cache_max_age: Duration::from_mins(1),
            cache_stale_while_revalidate: Duration::from_mins(5),
            cache_revalidate_tail: false,
            catch_up_read_bytes: 64 << 20,
            portable_names: false,
            append_if_match: AppendIfMatch::Ignored,
            public_url: None,
            body_read_timeout: Duration::from_secs(30),
            body_min_rate: 4096,
            body_min_rate_grace: Duration::from_secs(10),
            body_deadline: Duration::from_mins(10),
            max_memory: budget::default_limit(budget::physical_memory()),
            memory_reserve: None,
            max_memory_per_peer: None,
            max_memory_per_token: None,
            write_stall_timeout: Duration::from_mins(1),
            shutdown_grace: Duration::from_secs(10),
            webhook_timeout: Duration::from_secs(10),
            webhook_allow: Vec::new(),
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            access: None,
            max_connections: 10_000,
            lend_descriptors: false,
            max_live_readers: 10_000,
            max_live_readers_per_stream: None,
            hyper_http1: false,
            sendfile: true,
            send_buffer: SendBuffer::Auto,
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
    /// The `Cache-Control` of a cacheable read that is not final (`read::shared_cache_control`).
    pub(crate) shared_cache: HeaderValue,
    /// The server's request counters and live-reader gauges (`GET /__brook/metrics`).
    pub(crate) metrics: Arc<Metrics>,
    /// The memory budget every request body, queued response and connection buffer draws on.
    pub(crate) budget: Arc<budget::Budget>,
    /// Lends the store's streams the descriptors connections leave
    /// ([`ServerConfig::lend_descriptors`]).
    pub(crate) lender: Option<Arc<limits::Lender>>,
}

impl AppState {
    /// Admits one more live reader of `name` (SSE, or a long-poll about to wait), or refuses it
    /// with 503 when a live-reader cap is reached; the slot frees its place when dropped.
    pub(crate) fn live_reader(&self, name: &StreamName) -> Result<limits::LiveSlot, ApiError> {
        limits::admit_live_reader(&self.config, &self.edge, &self.live, name)
    }

    /// How request bodies must arrive (idle limit, minimum rate, deadline, memory budget),
    /// their bytes charged to no one: for bodies of a few KiB at most.
    pub(crate) fn body_rules(&self) -> body::BodyRules {
        body::BodyRules {
            idle: self.config.body_read_timeout,
            min_rate: self.config.body_min_rate,
            grace: self.config.body_min_rate_grace,
            deadline: self.config.body_deadline,
            budget: self.budget.clone(),
            owner: budget::Owner::NONE,
        }
    }

    /// [`AppState::body_rules`] for the body of the request `parts`, whose declared length is
    /// `declared`: a body that may grow past [`budget::SMALL`] is charged to its peer's address
    /// and its bearer token (with access control on). One of a small declared length, the
    /// common append, is charged to no one and costs nothing here.
    pub(crate) fn body_rules_for(
        &self,
        parts: &axum::http::request::Parts,
        declared: Option<u64>,
    ) -> body::BodyRules {
        let mut rules = self.body_rules();
        if declared.is_none_or(|n| n > budget::SMALL) {
            rules.owner = self.owner_of(parts);
        }
        rules
    }

    /// Who the request `parts` is: its peer's address (when the transport noted it, see
    /// [`Peer`]) and, with access control on, its bearer token.
    pub(crate) fn owner_of(&self, parts: &axum::http::request::Parts) -> budget::Owner {
        let mut owner = parts
            .extensions
            .get::<Peer>()
            .map_or(budget::Owner::NONE, |p| self.budget.peer(p.0));
        if self.config.access.is_some()
            && let Some(token) = auth::bearer(parts)
        {
            owner = owner.with_token(self.budget.token(token.as_bytes()));
        }
        owner
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
        async move { service::Handler::handle(&app, req, false).await }
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
    let shared_cache = read::shared_cache_control(&config);
    let budget = budget::Budget::shaped(budget::shape(
        &config,
        store.options().max_append_bytes() as u64,
    ));
    let lender = config
        .lend_descriptors
        .then(|| limits::Lender::new(store.clone()))
        .flatten()
        .map(Arc::new);
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
        shared_cache,
        metrics: Arc::default(),
        budget,
        lender,
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
    let (tx, rx) = watch::channel(false);
    let signal = tx.clone();
    let app = Arc::new(app_state(store, config, tx, rx));
    if let Err(e) = app.keys.as_ref() {
        return Err(std::io::Error::other(format!(
            "the subscription keys could not be loaded: {e}"
        )));
    }
    webhook::spawn(&app);
    if let Some(access) = &app.config.access {
        tokio::spawn(auth::watch(
            access.clone(),
            RELOAD_CHECK_EVERY,
            (*app).clone(),
        ));
    }
    transport::run(app, listener, admin, signal, shutdown).await
}

/// The peer address of the connection a request came on, in its extensions: put there by the
/// transport only for a request whose body may be large (the common small request carries no
/// extension, so it allocates none), for the memory budget's share per peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer(pub(crate) std::net::IpAddr);

/// How often [`serve`] checks whether the TLS certificate or key file, or the access-token
/// file, changed (by modification time and length) and reloads it.
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(2);

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
