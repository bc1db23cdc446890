//! The transport: the accept loop, connection counting and refusal, TLS handshakes, and the
//! choice of connection loop (brook's own HTTP/1.1 loop, `h1/`, or hyper's HTTP/1.1 and HTTP/2
//! loops), the sockets (`socket.rs`) and the writer of parked live connections (`writer.rs`).
//!
//! It knows nothing of streams: every request goes to the handlers through
//! [`Handler`](crate::http::service::Handler), the one interface between the two halves
//! (`service/`), and the only arrows between them point from here to there.

pub(crate) mod h1;
pub(crate) mod socket;
pub(crate) mod starting;
pub(crate) mod tls;
pub(crate) mod writer;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use super::service::Handler;
use super::{AppState, RELOAD_CHECK_EVERY, body, budget, limits};
use tls::Tls;

/// Serves the protocol on `listener` (and the operations routes alone on `admin`) until
/// `shutdown` resolves, then tells live readers (`signal`), lets in-flight requests finish for
/// at most the shutdown grace period and returns.
pub(crate) async fn run(
    app: Arc<AppState>,
    listener: tokio::net::TcpListener,
    admin: Option<tokio::net::TcpListener>,
    signal: watch::Sender<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Large mapped body slices leave by sendfile(2) (see socket.rs), which has no MSG_NOSIGNAL:
    // only where a peer that went away cannot end the process with SIGPIPE.
    let sendfile = app.config.sendfile && crate::fs::sigpipe_is_handled();
    if app.config.sendfile && !sendfile {
        tracing::info!(
            "SIGPIPE has its default action: read bodies are copied to sockets, not sent with sendfile"
        );
    }
    let send_buffers = socket::SendBuffers::new(app.config.send_buffer);
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
    // brook's own HTTP/1.1 loop (h1.rs) hands connections it does not serve to hyper with
    // these settings; every connection it serves holds a receiver of `alive` until it ends.
    let fallback = Arc::new(builder.clone());
    let (alive_tx, alive) = watch::channel(());
    let mut failed = AcceptFailures::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => (accepted, false),
            accepted = accept_on(admin.as_ref()) => (accepted, true),
        };
        let (accepted, admin_only) = accepted;
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip()),
            Err(e) => {
                // Out of descriptors or a connection that died in the backlog: keep serving
                // the connections already open, and try again shortly. Out of descriptors,
                // the store first puts idle streams' files at rest (a surge of connections
                // can outrun the lookups that keep the streams within a lowered budget).
                failed.note(&e);
                if crate::error::io_out_of_descriptors(&e) {
                    let store = app.store.clone();
                    let shed = move || store.shed_stream_files(limits::SHED_ON_EMFILE);
                    if tokio::task::spawn_blocking(shed).await.unwrap_or(0) > 0 {
                        continue;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // Every accepted socket is counted by the lender of descriptors, however it is served
        // (refused ones too): the guard goes with the connection.
        let lent = app.lender.as_ref().map(limits::Lender::socket);
        // A response head leaves in one `writev` (with the body when it is small or not mapped);
        // it must not wait for Nagle's timer.
        let _ = stream.set_nodelay(true);
        send_buffers.fit(&stream);
        let acceptor = || tls.as_ref().map(|t| t.acceptor.clone());
        if app.connections.load(Ordering::Relaxed) >= app.config.max_connections {
            app.edge.connections_refused.fetch_add(1, Ordering::Relaxed);
            let refusal = || limits::too_many_connections();
            let refused = refuse_connection(app.clone(), stream, acceptor(), refusal, lent);
            tokio::spawn(refused);
            continue;
        }
        // A connection hyper serves (TLS, the admin listener, `hyper_http1`) holds its
        // buffers' share of the memory budget from the start, charged to its peer (a large
        // lease: one address cannot hold more than its share in connections); brook's own loop
        // leases its read buffer as it grows.
        let by_hyper = admin_only || tls.is_some() || app.config.hyper_http1;
        let held = if by_hyper {
            let owner = app.budget.peer(peer);
            match app
                .budget
                .try_lease_for(budget::Use::Buffers, HYPER_CONNECTION_HELD, owner)
            {
                Ok(held) => Some(held),
                Err(cause) => {
                    let shape = app.budget.shape();
                    let refusal = move || {
                        budget::over_budget(budget::Use::Buffers, cause, &shape).into_response()
                    };
                    let refused = refuse_connection(app.clone(), stream, acceptor(), refusal, lent);
                    tokio::spawn(refused);
                    continue;
                }
            }
        } else {
            None
        };
        let open = Open::count(&app, held, lent);
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
        let service = http1_service(app.clone(), admin_only, Some(peer));
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

/// The service of an HTTP/1.1 connection from `peer`: [`handle`] (only `/__brook/` routes when
/// `admin_only`), and `Connection: close` on a response to a request whose body was not read to
/// its end.
pub(crate) fn http1_service<H: Handler>(
    app: H,
    admin_only: bool,
    peer: Option<std::net::IpAddr>,
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
            let mut req = req;
            note_peer(&mut req, peer);
            let req = match tracked {
                Some(n) => req.map(|b| Body::new(body::Tracked::new(b, ends.clone(), n))),
                None => req.map(Body::new),
            };
            let mut res = app.handle(req, admin_only).await;
            if tracked.is_some_and(|n| !ends.ended(n)) {
                res.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(res)
        }
    })
}

/// Notes the connection's `peer` in the extensions of a request whose body may be large (for
/// the memory budget's share per peer, see [`Peer`](super::Peer)); a request without a body or
/// with a small declared one gets nothing (an extension costs an allocation).
fn note_peer(req: &mut hyper::Request<hyper::body::Incoming>, peer: Option<std::net::IpAddr>) {
    let Some(peer) = peer else {
        return;
    };
    let body = req.body();
    if !http_body::Body::is_end_stream(body)
        && http_body::Body::size_hint(body)
            .exact()
            .is_none_or(|n| n > budget::SMALL)
    {
        req.extensions_mut().insert(super::Peer(peer));
    }
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
    let peer = tcp.peer_addr().ok().map(|a| a.ip());
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
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                note_peer(&mut req, peer);
                async move {
                    Ok::<_, std::convert::Infallible>(app.handle(req.map(Body::new), false).await)
                }
            });
        let _ = watcher.watch(tls.http2.serve_connection(io, service)).await;
    } else if app.config.hyper_http1 {
        let service = http1_service(app, false, peer);
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
/// most [`limits::REFUSAL_GRACE`], its descriptor counted by `_lent` until then. Liveness and readiness (`/__brook/live`, `/__brook/ready`,
/// `/__brook/health`) keep this way in: they are answered as on any connection, so a full
/// server still tells its orchestrator how it is.
async fn refuse_connection<F>(
    app: Arc<AppState>,
    tcp: tokio::net::TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    refusal: F,
    _lent: Option<limits::Socket>,
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
                app.handle(req.map(Body::new), true).await
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
/// the memory budget its buffers hold when hyper serves it; with
/// [`ServerConfig::lend_descriptors`](super::ServerConfig::lend_descriptors), the store's
/// stream-file budget follows the count.
pub(crate) struct Open {
    /// The server's count of open connections.
    connections: Arc<std::sync::atomic::AtomicUsize>,
    /// The socket, counted by the lender of descriptors, if the server lends them.
    _socket: Option<limits::Socket>,
    /// The connection's buffers' share of the memory budget, when hyper serves it.
    _held: Option<budget::Lease>,
}

impl Open {
    /// Counts a connection in, with its lender's count of its socket (`lent`).
    pub(crate) fn count(
        app: &AppState,
        held: Option<budget::Lease>,
        lent: Option<limits::Socket>,
    ) -> Open {
        app.connections.fetch_add(1, Ordering::Relaxed);
        Open {
            connections: app.connections.clone(),
            _socket: lent,
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

/// The log of failed accepts: the first failure, then at most one line a second saying how many
/// failed since (out of descriptors, the loop retries every 20 ms and would log 50 lines a
/// second for as long as it lasts).
#[derive(Default)]
struct AcceptFailures {
    /// When a failure was last logged.
    logged: Option<std::time::Instant>,
    /// Failures since then.
    since: u64,
}

impl AcceptFailures {
    /// Counts `e`, and logs it unless a failure was logged less than a second ago.
    fn note(&mut self, e: &std::io::Error) {
        let now = std::time::Instant::now();
        if self
            .logged
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1))
        {
            self.since += 1;
            return;
        }
        let before = std::mem::take(&mut self.since);
        tracing::warn!(error = %e, failed_since_last_logged = before, "accept failed");
        self.logged = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of failed accepts logs the first one and counts the rest for the next line.
    #[test]
    fn a_burst_of_failed_accepts_is_logged_once() {
        let mut failed = AcceptFailures::default();
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        for _ in 0..50 {
            failed.note(&e);
        }
        assert!(failed.logged.is_some());
        assert_eq!(failed.since, 49);
        // A second later the next failure is logged with the count, which starts again.
        failed.logged = failed
            .logged
            .and_then(|at| at.checked_sub(Duration::from_secs(2)));
        failed.note(&e);
        assert_eq!(failed.since, 0);
    }
}
