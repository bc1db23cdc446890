//! brook's own HTTP/1.1 connection loop for plain (not TLS) connections.
//!
//! hyper's HTTP/1.1 loop is general: a dispatcher state machine, a channel-backed request body,
//! a queue of response buffers. For this protocol's common requests (an append of a few
//! kilobytes, a catch-up read, a HEAD) that generality cost more instructions than the engine's
//! whole append (docs/benchmarks/history.md, "The third pass"). This loop serves the requests it
//! knows how to frame and hands the connection to hyper for everything else, so hyper stays the
//! answer to every corner of HTTP/1.1 it handles today:
//!
//! * **Served here:** HTTP/1.1 requests with no body or a `Content-Length` body of at most
//!   [`INLINE_BODY_MAX`] bytes, with at most [`MAX_HEADERS`] header lines in at most
//!   [`MAX_HEAD`] bytes, without `Transfer-Encoding`, `Upgrade` or an `Expect` other than
//!   `100-continue`. The body is read whole before the handler runs (so the handler's
//!   [`read_body`](super::body::read_body) finds it in one frame); a body that delivers
//!   nothing for [`ServerConfig::body_read_timeout`](super::ServerConfig::body_read_timeout)
//!   is answered 408 `REQUEST_TIMEOUT` and the connection closed, as on hyper's path.
//! * **Refused here:** a head that is not well-formed HTTP/1.1 (400 `MALFORMED_REQUEST`, which
//!   includes two `Content-Length`s that disagree), more than [`MAX_HEADERS`] lines or
//!   [`MAX_HEAD`] bytes (431 `REQUEST_HEADER_FIELDS_TOO_LARGE`): problem+json bodies, then the
//!   connection closes (nothing after a bad head can be framed).
//! * **Handed to hyper:** the first request that is anything else (HTTP/1.0, a chunked or larger
//!   upload, an upgrade, an `Expect` other than `100-continue`), together with every byte read
//!   after it: hyper serves the rest of that connection (see [`Rewind`]).
//!
//! The loop serves plain connections and HTTP/1.1 over TLS alike (HTTP/2 is hyper's).
//!
//! The handler's request is the `http::Request` hyper would have built, less the request headers
//! no handler reads (`User-Agent`, `Accept`, `Accept-Encoding`, `Accept-Language`, `Cookie`,
//! `Referer`, `Connection`, fetch metadata: see [`unread`]) and `Content-Length` (the body's
//! exact size says it); header values and the body are views of the read buffer, and the header
//! map is the connection's, emptied and reused from one request to the next.
//!
//! A hot route's answer is a typed head ([`Answer::Typed`], `reply.rs`), whose lines are written
//! straight into the output buffer; any other answer is a `Response`, framed from its map.
//! Responses are framed as hyper frames them (the handlers are the same): a body of known length
//! gets `Content-Length` (none on `HEAD`, `1xx`, `204`, `304`), a streaming one (SSE, bootstrap)
//! is chunked and each frame leaves as it comes; `Date` is added from a per-thread cache that
//! changes once a second. A response head and the pieces of a small body leave in one `writev`;
//! large mapped pieces leave by `sendfile` (the [`Socket`] decides). Pipelined requests are
//! served in order from the read buffer.
//!
//! An SSE body on plain TCP carries a seat at its stream's writer (`seat.rs`): once the body
//! waits at the tail and what it sent has left, the loop parks the seat and sleeps, the writer
//! writes the live frames straight to the socket, and any wake-up of the task takes the seat
//! back before the loop writes or polls the body again.
//!
//! Timeouts are hyper's: waiting for a request's head (an idle keep-alive connection included)
//! is bounded by [`ServerConfig::header_read_timeout`](super::ServerConfig::header_read_timeout),
//! measured by one timer per connection that is re-armed only when it fires (no timer per
//! request). Shutdown closes idle connections at once and the others after their response.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use axum::response::IntoResponse;
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::admin::RouteKind;
use super::body::due;
use super::budget::{Budget, Lease, Use};
use super::error::ApiError;
use super::reply::Answer;
use super::seat::{Seat, SeatHandle};
use super::socket::Socket;
use super::{Admission, AppState, Open, reply};

/// The largest request head (request line and headers) this loop reads; a longer one is
/// answered `431` problem+json (as are heads over the handler's 64 KiB of header bytes).
pub(crate) const MAX_HEAD: usize = 80 << 10;

/// The longest request target served (the longest `http` and hyper accept); a longer one is
/// answered `414` problem+json.
pub(crate) const MAX_TARGET: usize = (u16::MAX - 1) as usize;

/// The most header lines a request may have (hyper's limit too); one with more is answered
/// `431` problem+json.
pub(crate) const MAX_HEADERS: usize = 100;

/// The largest request body read whole before its handler runs; a larger one goes to hyper,
/// which streams it to the handler (snapshot uploads, large appends).
pub(crate) const INLINE_BODY_MAX: usize = 256 << 10;

/// The most header entries the map kept from one request to the next has room for (a head with
/// more gets a map of its own, so one large head does not hold memory for the connection's
/// life).
const SPARE_HEADERS: usize = 32;

/// What a connection's read buffer starts with (a request head and a small body).
const READ_BUF: usize = 8 << 10;

/// What the loop needs from the server to hand a connection to hyper.
pub(crate) struct Fallback {
    /// hyper's HTTP/1.1 connection settings.
    pub(crate) builder: Arc<hyper::server::conn::http1::Builder>,
    /// The server's graceful shutdown, which a handed-off connection joins.
    pub(crate) watcher: hyper_util::server::graceful::Watcher,
}

/// One request head, parsed: positions in the read buffer, so the buffer can be frozen and
/// sliced without copying.
struct Head {
    /// The method.
    method: Method,
    /// The request target's bytes.
    target: (usize, usize),
    /// Bytes of the head, up to and including the empty line.
    len: usize,
    /// The `Content-Length` (0 without one).
    body_len: usize,
    /// `Expect: 100-continue` was sent.
    expects_continue: bool,
    /// `Connection: close` was sent.
    close: bool,
}

/// Why a head is not served here.
enum NotHere {
    /// Hand the connection to hyper from this request on.
    Handoff,
    /// Refuse it (a malformed or oversized head): answered with this status, problem `code`
    /// and detail, and the connection closed, since what follows it cannot be framed.
    Refuse(StatusCode, &'static str, String),
    /// Refuse it with this error (the memory budget cannot spare the connection's buffer),
    /// and close the connection.
    Over(ApiError),
}

/// The IO this loop serves: a plain [`Socket`](super::socket::Socket) (which sends large mapped
/// pieces by `sendfile`) or a TLS stream over one.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// A second descriptor of the TCP socket, when what is written to it is what the peer
    /// reads (plain TCP): an SSE connection's stream writer may then write to it while the
    /// connection is parked (`seat.rs`).
    fn tcp(&self) -> Option<TcpStream>;
}

impl Io for Socket {
    fn tcp(&self) -> Option<TcpStream> {
        self.share().ok()
    }
}

impl Io for tokio_rustls::server::TlsStream<Socket> {
    /// None: every byte is encrypted on the connection's own task.
    fn tcp(&self) -> Option<TcpStream> {
        None
    }
}

/// What the loop answers requests with: the server's handlers (`Arc<AppState>`), or the
/// recording handler of the differential check (`differential.rs`, feature `fuzzing`).
pub(crate) trait Handler: Send + Sync + Sized + 'static {
    /// What admission decided about a request, carried to [`Handler::respond`].
    type Admission: Send;

    /// Decides from the head alone, before a body byte is read: access control, and for a body
    /// of `unread` bytes not yet read, the route's size limit. `Err` is the answer to send
    /// without reading the body (the connection then closes) and whether it carries the CORS
    /// headers. With the body at hand (`unread` is `None`) a refusal may also come back inside
    /// the admission, for [`Handler::respond`] to answer on a connection that stays open.
    fn admit(
        &self,
        parts: &mut Parts,
        unread: Option<usize>,
    ) -> Result<Self::Admission, (Answer, bool)>;

    /// The answer to an admitted request, whether it carries the CORS headers, and the request's
    /// header map back (for its room).
    fn respond(
        &self,
        parts: Parts,
        body: Body,
        admission: Self::Admission,
    ) -> impl Future<Output = (Answer, bool, HeaderMap)> + Send;

    /// hyper's service for the rest of a connection handed to it.
    fn into_service(
        self,
    ) -> impl hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send,
    > + Send;
}

impl Handler for Arc<AppState> {
    type Admission = Admission;

    fn admit(&self, parts: &mut Parts, unread: Option<usize>) -> Result<Admission, (Answer, bool)> {
        let admission = super::admit(self, parts);
        let Some(len) = unread else {
            return Ok(admission);
        };
        if let Admission::Refused(answer) = admission {
            return Err((answer, cors_wanted(parts)));
        }
        if let Some(limit) = super::route::body_limit(self, parts)
            && len as u64 > limit
        {
            let e = ApiError::too_large(limit);
            self.metrics.error(e.code());
            return Err((e.into_response().into(), cors_wanted(parts)));
        }
        Ok(admission)
    }

    /// The route's handler, as on hyper's path.
    fn respond(
        &self,
        parts: Parts,
        body: Body,
        admission: Admission,
    ) -> impl Future<Output = (Answer, bool, HeaderMap)> + Send {
        super::respond_admitted(self, parts, body, admission, false)
    }

    fn into_service(
        self,
    ) -> impl hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send,
    > + Send {
        super::http1_service(self, false)
    }
}

/// Whether the answer to this request carries the CORS headers: a `GET`, or any request that
/// names an `Origin`.
fn cors_wanted(parts: &Parts) -> bool {
    parts.method == Method::GET || parts.headers.contains_key(header::ORIGIN)
}

/// Serves `socket` until the peer closes it, a timeout ends it, the server shuts down, or a
/// request hands it to hyper. `open` counts the connection until this returns; `alive` tells
/// shutdown that it has not returned yet.
pub(crate) async fn serve<S: Io>(
    app: Arc<AppState>,
    socket: S,
    fallback: Fallback,
    open: Open,
    alive: watch::Receiver<()>,
) {
    serve_with(app.clone(), app, socket, fallback, open, alive).await;
}

/// [`serve`], each request answered by `handler` (`app` gives the timeouts, the shutdown signal
/// and the metrics of the loop's own refusals).
pub(crate) async fn serve_with<S: Io, H: Handler>(
    app: Arc<AppState>,
    handler: H,
    mut socket: S,
    fallback: Fallback,
    open: Open,
    alive: watch::Receiver<()>,
) {
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut out = Vec::with_capacity(512);
    let header_timeout = app.config.header_read_timeout;
    // One timer for the connection: it fires at most once per `header_timeout`, and then checks
    // how long the current head has been awaited (see `read_head`).
    let mut timer = Box::pin(tokio::time::sleep(header_timeout));
    let mut rx = app.shutdown.clone();
    let mut shutting_down = std::pin::pin!(async move {
        // `wait_for` fails only when the sender is gone, which the app state keeps alive.
        let _ = rx.wait_for(|down| *down).await;
    });
    // The header lines' positions of the request being served, and the map of its headers,
    // both kept (emptied) for the next.
    let mut lines = Vec::with_capacity(16);
    let mut spare = HeaderMap::new();
    // The read buffer's room, held of the memory budget while the connection is open.
    let mut room = Lease::empty(&app.budget, Use::Buffers);
    loop {
        let head = match read_head(
            &mut socket,
            &mut buf,
            &mut lines,
            &mut room,
            header_timeout,
            timer.as_mut(),
            shutting_down.as_mut(),
        )
        .await
        {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(NotHere::Handoff) => {
                let Ok(held) = app.budget.lease(Use::Buffers, super::HYPER_CONNECTION_HELD) else {
                    let e = super::budget::over_budget(Use::Buffers, app.budget.limit());
                    return refuse(&app, &mut socket, &mut out, e).await;
                };
                drop(room);
                return handoff(handler, socket, buf, fallback, (open, held), alive).await;
            }
            Err(NotHere::Refuse(status, code, detail)) => {
                let e = ApiError::Http {
                    status,
                    code,
                    detail,
                };
                return refuse(&app, &mut socket, &mut out, e).await;
            }
            Err(NotHere::Over(e)) => return refuse(&app, &mut socket, &mut out, e).await,
        };
        let head_bytes = buf.split_to(head.len).freeze();
        let is_head = head.method == Method::HEAD;
        let mut close = head.close;
        let Some(req) = request(&head_bytes, &head, &lines, std::mem::take(&mut spare)) else {
            return refuse(&app, &mut socket, &mut out, unparsable()).await;
        };
        drop(head_bytes);
        let (mut parts, ()) = req.into_parts();
        // Admission before reading: the handler decides from the head (rights, and for a body
        // still to come the route's size limit), then the memory budget, so a refused request
        // costs no body bytes.
        let unread = (head.body_len > buf.len()).then_some(head.body_len);
        let admission = match handler.admit(&mut parts, unread) {
            Ok(admission) => admission,
            Err((answer, cors)) => {
                return refuse_unread(&app, &mut socket, &mut out, answer, cors).await;
            }
        };
        let mut body = Body::empty();
        if head.body_len > 0 {
            if let Some(len) = unread {
                let lease = match app.budget.lease(Use::Bodies, len as u64) {
                    Ok(lease) => lease,
                    Err(e) => {
                        app.metrics.error(e.code());
                        let cors = cors_wanted(&parts);
                        let answer = e.into_response().into();
                        return refuse_unread(&app, &mut socket, &mut out, answer, cors).await;
                    }
                };
                match read_body(&mut socket, &mut buf, &head, &app).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => return refuse(&app, &mut socket, &mut out, e).await,
                }
                // The handler holds the body's bytes of the budget from here.
                drop(lease);
            }
            body = Body::from(buf.split_to(head.body_len).freeze());
        }
        let (res, cors, mut headers) = handler.respond(parts, body, admission).await;
        // Its values are views of this request's bytes: let them go now, keep the room unless a
        // large head left more than the common request needs.
        headers.clear();
        if headers.capacity() <= SPARE_HEADERS {
            spare = headers;
        }
        close |= *app.shutdown.borrow();
        match respond(
            &mut socket,
            &mut out,
            &app.budget,
            res,
            is_head,
            cors,
            close,
        )
        .await
        {
            Ok(closes) if !closes => {}
            _ => return,
        }
    }
}

/// Reads until `buf` holds a whole request head and parses it. `Ok(None)`: the peer closed the
/// connection, the head took longer than `limit`, or the server is shutting down while this
/// connection waits for a request.
async fn read_head<S: Io>(
    socket: &mut S,
    buf: &mut BytesMut,
    lines: &mut Lines,
    room: &mut Lease,
    limit: Duration,
    mut timer: Pin<&mut tokio::time::Sleep>,
    mut shutting_down: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Head>, NotHere> {
    let since = Instant::now();
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse(buf, lines)? {
                return Ok(Some(head));
            }
            if buf.len() >= MAX_HEAD {
                // A request line that has not ended yet is a target too long to serve.
                if !buf[..MAX_HEAD].contains(&b'\n') {
                    return Err(uri_too_long());
                }
                return Err(NotHere::Refuse(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "REQUEST_HEADER_FIELDS_TOO_LARGE",
                    format!("a request head may be at most {MAX_HEAD} bytes"),
                ));
            }
        }
        // An empty buffer with less than half its room left takes back its whole allocation
        // (copying nothing, once the previous request's views of it are gone), so a head and a
        // body of a few KiB arrive in one read rather than in two with the first part moved to
        // the front between them.
        if buf.capacity() - buf.len() < 1024 || (buf.is_empty() && buf.capacity() < READ_BUF / 2) {
            buf.reserve(READ_BUF);
        }
        if room.bytes() != buf.capacity() as u64 {
            room.resize(buf.capacity() as u64).map_err(NotHere::Over)?;
        }
        tokio::select! {
            biased;
            read = socket.read_buf(buf) => match read {
                Ok(0) | Err(_) => return Ok(None),
                Ok(_) => {}
            },
            () = &mut timer => {
                if since.elapsed() >= limit {
                    tracing::debug!("a request head did not arrive within the header read timeout");
                    return Ok(None);
                }
                let at = since + limit;
                timer.as_mut().reset(at);
            }
            () = &mut shutting_down, if buf.is_empty() => return Ok(None),
        }
    }
}

/// Reads the rest of `head`'s body into `buf`, which holds what followed the head (after a
/// `100 Continue` if the client waits for one). `Ok(false)`: the peer closed the connection;
/// `Err`: the body came too slowly (408 `REQUEST_TIMEOUT` after the idle limit, 408
/// `BODY_TOO_SLOW` below the minimum rate: see [`due`]).
async fn read_body<S: Io>(
    socket: &mut S,
    buf: &mut BytesMut,
    head: &Head,
    app: &AppState,
) -> Result<bool, ApiError> {
    let need = head.body_len;
    if head.expects_continue
        && socket
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .is_err()
    {
        return Ok(false);
    }
    buf.reserve(need - buf.len());
    let rules = app.body_rules();
    let began = Instant::now();
    while buf.len() < need {
        let (at, refusal) = due(&rules, began, buf.len() as u64);
        match tokio::time::timeout_at(at, socket.read_buf(buf)).await {
            Ok(Ok(0) | Err(_)) => return Ok(false),
            Ok(Ok(_)) => {}
            Err(_) => return Err(refusal),
        }
    }
    Ok(true)
}

/// The positions of a head's header lines in the read buffer: name and value, each as start
/// and length.
type Lines = Vec<((usize, usize), (usize, usize))>;

/// Parses the head at the start of `buf`, its header lines' positions into `lines`: `None` when
/// it is not complete yet.
fn parse(buf: &[u8], lines: &mut Lines) -> Result<Option<Head>, NotHere> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(NotHere::Refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "REQUEST_HEADER_FIELDS_TOO_LARGE",
                format!("requests may carry at most {MAX_HEADERS} header lines"),
            ));
        }
        Err(e) => {
            return Err(malformed(&format!(
                "the request head is not HTTP/1.1 ({e})"
            )));
        }
    };
    // HTTP/1.0 (other keep-alive rules, no chunked responses) is hyper's.
    if req.version != Some(1) {
        return Err(NotHere::Handoff);
    }
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Err(malformed("the request line is incomplete"));
    };
    if path.len() > MAX_TARGET {
        return Err(uri_too_long());
    }
    let method = match method {
        "GET" => Method::GET,
        "POST" => Method::POST,
        "PUT" => Method::PUT,
        "HEAD" => Method::HEAD,
        "DELETE" => Method::DELETE,
        "OPTIONS" => Method::OPTIONS,
        // hyper ends HTTP on a connection whose CONNECT was answered 2xx (a tunnel follows):
        // framing this loop does not do.
        "CONNECT" => return Err(NotHere::Handoff),
        // Any other token: the handler answers 405 with the methods the route allows.
        other => Method::from_bytes(other.as_bytes())
            .map_err(|_| malformed("the method is not a token"))?,
    };
    let at = |s: &[u8]| (s.as_ptr() as usize - buf.as_ptr() as usize, s.len());
    let mut head = Head {
        method,
        target: at(path.as_bytes()),
        len,
        body_len: 0,
        expects_continue: false,
        close: false,
    };
    let mut length: Option<usize> = None;
    let mut total = 0;
    lines.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        // Whether the handler's map gets this line.
        let mut kept = true;
        // The names this loop acts on, told apart by length first (most lines match none).
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        match name.len() {
            14 if is(b"content-length") => {
                let n = parse_length(h.value)
                    .ok_or_else(|| malformed("the Content-Length is not a decimal number"))?;
                // Two lengths that disagree: no framing can be trusted (request smuggling).
                if length.is_some_and(|m| m as u64 != n) {
                    return Err(malformed("the Content-Length is given twice, differently"));
                }
                // A larger body streams, on hyper's path (which refuses one past its limit).
                let Some(n) = usize::try_from(n).ok().filter(|&n| n <= INLINE_BODY_MAX) else {
                    return Err(NotHere::Handoff);
                };
                length = Some(n);
                // The body's exact length says it to the handler (see `unread`).
                kept = false;
            }
            17 if is(b"transfer-encoding") => return Err(NotHere::Handoff),
            7 if is(b"upgrade") => return Err(NotHere::Handoff),
            6 if is(b"expect") => {
                if !h.value.eq_ignore_ascii_case(b"100-continue") {
                    return Err(NotHere::Handoff);
                }
                head.expects_continue = true;
            }
            10 if is(b"connection") => {
                // hyper reads no token of a value that is not ASCII (not even `close`): such a
                // connection is hyper's.
                if !h.value.is_ascii() {
                    return Err(NotHere::Handoff);
                }
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        head.close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return Err(NotHere::Handoff);
                    }
                }
            }
            _ => {}
        }
        total += name.len() + h.value.len();
        if kept && !unread(name) {
            lines.push((at(name), at(h.value)));
        }
    }
    if total > super::request::MAX_HEADER_BYTES {
        // Keep every line, so that the handler's check refuses the head with its 431 as it
        // counts it on hyper's path.
        lines.clear();
        lines.extend(
            req.headers
                .iter()
                .map(|h| (at(h.name.as_bytes()), at(h.value))),
        );
    }
    head.body_len = length.unwrap_or(0);
    // Without a body to wait for, a `100 Continue` would only confuse the client.
    head.expects_continue &= head.body_len > 0 && buf.len() < len + head.body_len;
    Ok(Some(head))
}

/// Whether no handler reads request header `name`: the headers clients and browsers send for
/// content negotiation, caching and fetch metadata, which this protocol has no use for. They
/// are framing-checked by httparse and counted toward the header-size limit, but left out of
/// the handler's `HeaderMap` (`Connection` is read here, by the loop). Building and dropping
/// that map is most of a small request's parse cost. `Content-Length` is left out too (by
/// [`parse`], which reads it): the loop reads the body whole, and handlers take a body's
/// declared length from its exact size hint, which hyper sets from the header on its path.
pub(super) fn unread(name: &[u8]) -> bool {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    match name.len() {
        2 => is(b"te"),
        3 => is(b"dnt"),
        6 => is(b"accept") || is(b"pragma") || is(b"cookie"),
        7 => is(b"referer"),
        8 => is(b"priority"),
        10 => is(b"user-agent") || is(b"connection") || is(b"keep-alive"),
        14 => {
            name[..10].eq_ignore_ascii_case(b"sec-fetch-")
                && (is(b"sec-fetch-dest")
                    || is(b"sec-fetch-mode")
                    || is(b"sec-fetch-site")
                    || is(b"sec-fetch-user"))
        }
        15 => is(b"accept-encoding") || is(b"accept-language"),
        25 => is(b"upgrade-insecure-requests"),
        _ => name.len() > 9 && name[..9].eq_ignore_ascii_case(b"sec-ch-ua"),
    }
}

/// Answers a request the loop refuses itself (a bad head, a stalled body) with `e`'s
/// problem+json, counted in the metrics like a handler's refusal, then closes the connection.
async fn refuse<S: Io>(app: &AppState, socket: &mut S, out: &mut Vec<u8>, e: ApiError) {
    app.metrics.error(e.code());
    let res = e.into_response();
    app.metrics
        .request(RouteKind::Other, res.status(), std::time::Duration::ZERO);
    if respond(socket, out, &app.budget, res.into(), false, false, true)
        .await
        .is_ok()
    {
        close_gently(socket).await;
    }
}

/// Answers a request refused from its head (access control, its size, the memory budget)
/// without reading its body, then closes the connection: what follows the unread body cannot
/// be framed.
async fn refuse_unread<S: Io>(
    app: &AppState,
    socket: &mut S,
    out: &mut Vec<u8>,
    answer: Answer,
    cors: bool,
) {
    app.metrics
        .request(RouteKind::Other, answer.status(), std::time::Duration::ZERO);
    if respond(socket, out, &app.budget, answer, false, cors, true)
        .await
        .is_ok()
    {
        close_gently(socket).await;
    }
}

/// Ends a connection whose peer may still be sending (a refused head): the write side is shut
/// (the response is followed by FIN), then what the peer still sends is read and dropped for up
/// to a second (at most 1 MiB), so that closing with unread bytes does not send a reset that
/// could destroy the response before the peer read it.
async fn close_gently<S: Io>(socket: &mut S) {
    let _ = socket.shutdown().await;
    drain(socket).await;
}

/// Reads and drops what the peer still sends on a connection whose write side is shut, for up
/// to a second and at most 1 MiB (see [`close_gently`]).
async fn drain<S: AsyncRead + Unpin>(socket: &mut S) {
    let mut sink = vec![0u8; 16 << 10];
    let mut left = 1usize << 20;
    let until = Instant::now() + Duration::from_secs(1);
    while left > 0 {
        match tokio::time::timeout_at(until, socket.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
}

/// The refusal of a request target over [`MAX_TARGET`] bytes: 414 `URI_TOO_LONG`.
fn uri_too_long() -> NotHere {
    NotHere::Refuse(
        StatusCode::URI_TOO_LONG,
        "URI_TOO_LONG",
        format!("a request target may be at most {MAX_TARGET} bytes"),
    )
}

/// The refusal of a target or header value that `http` does not accept, though httparse did:
/// 400 `MALFORMED_REQUEST`.
fn unparsable() -> ApiError {
    ApiError::Http {
        status: StatusCode::BAD_REQUEST,
        code: "MALFORMED_REQUEST",
        detail: "the request target or a header value is not valid".to_owned(),
    }
}

/// The refusal of a head that is not well-formed HTTP/1.1: 400 `MALFORMED_REQUEST`.
fn malformed(detail: &str) -> NotHere {
    NotHere::Refuse(
        StatusCode::BAD_REQUEST,
        "MALFORMED_REQUEST",
        detail.to_owned(),
    )
}

/// A `Content-Length` value: decimal digits only, any number of them (leading zeros too) while
/// the value fits in a `u64`, as hyper takes it (without a sign, spaces or a list).
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        let digit = char::from(b).to_digit(10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The handler's request head: its target and headers as views of `message` (the head's bytes,
/// frozen), the headers in `headers` (an empty map, reused for its room).
/// `None` if the target or a header is not one `http` accepts.
fn request(
    message: &Bytes,
    head: &Head,
    lines: &Lines,
    mut headers: HeaderMap,
) -> Option<Request<()>> {
    let slice = |(at, len): (usize, usize)| message.slice(at..at + len);
    let uri = Uri::from_maybe_shared(slice(head.target)).ok()?;
    headers.reserve(lines.len());
    for &(name, value) in lines {
        let name = header_name(&message[name.0..name.0 + name.1])?;
        let value = HeaderValue::from_maybe_shared(slice(value)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(());
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Some(req)
}

/// The protocol's own header names, so the common requests' names cost no allocation (`http`
/// allocates a custom name it parses).
const KNOWN: [HeaderName; 9] = [
    HeaderName::from_static("producer-id"),
    HeaderName::from_static("producer-epoch"),
    HeaderName::from_static("producer-seq"),
    HeaderName::from_static("stream-seq"),
    HeaderName::from_static("stream-incarnation"),
    HeaderName::from_static("stream-closed"),
    HeaderName::from_static("stream-ttl"),
    HeaderName::from_static("stream-expires-at"),
    HeaderName::from_static("stream-forked-from"),
];

/// `name` as a header name: a standard one or one of [`KNOWN`] without allocating, and the
/// commonest request headers without `http`'s general parse.
fn header_name(name: &[u8]) -> Option<HeaderName> {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    let common = match name.len() {
        4 if is(b"host") => Some(header::HOST),
        6 if is(b"origin") => Some(header::ORIGIN),
        12 if is(b"content-type") => Some(header::CONTENT_TYPE),
        13 if is(b"authorization") => Some(header::AUTHORIZATION),
        13 if is(b"if-none-match") => Some(header::IF_NONE_MATCH),
        14 if is(b"content-length") => Some(header::CONTENT_LENGTH),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    let ours = name.len() > 9 && name[..7].eq_ignore_ascii_case(b"stream-")
        || name.len() > 10 && name[..9].eq_ignore_ascii_case(b"producer-");
    if ours
        && let Some(known) = KNOWN
            .iter()
            .find(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
    {
        return Some(known.clone());
    }
    HeaderName::from_bytes(name).ok()
}

/// Writes `answer` (no body for a `HEAD` request) with the headers every response carries (and
/// the CORS ones when `cors`: see [`reply::common_headers`]), and `Connection: close` when
/// `close`. A typed head ([`Answer::Typed`]) is written straight from its fields; a built
/// response's from its map. Returns whether the connection is to be closed after it (asked, or
/// the response said so).
async fn respond<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    budget: &Arc<Budget>,
    answer: Answer,
    is_head: bool,
    cors: bool,
    mut close: bool,
) -> io::Result<bool> {
    out.clear();
    // Whether the handler set `Content-Length` or `Date` itself (a typed head never does), and
    // an SSE body's seat at its stream's writer.
    let (status, mut body, declared, dated, seat) = match answer {
        Answer::Typed(reply, body) => {
            status_line(out, reply.status());
            reply.write_lines(out);
            (reply.status(), body, false, false, None)
        }
        Answer::Built(res) => {
            let (mut parts, body) = res.into_parts();
            status_line(out, parts.status);
            let (declared, dated) = map_lines(out, parts.status, &parts.headers, &mut close);
            let seat = parts.extensions.remove::<SeatHandle>();
            (parts.status, body, declared, dated, seat)
        }
    };
    let may_have_body = !is_head && !bodiless(status);
    let exact = http_body::Body::size_hint(&body).exact();
    out.extend_from_slice(reply::COMMON_LINES);
    if cors {
        out.extend_from_slice(reply::CORS_LINES);
    }
    let chunked = may_have_body && !declared && exact.is_none();
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    } else if !declared
        && !bodiless(status)
        && let Some(n) = exact
        && (n > 0 || !is_head)
    {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        date::extend(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !may_have_body {
        socket.write_all(out).await?;
        return Ok(close);
    }
    // An SSE body's writes are given up at the connection's end, however full the socket is.
    let deadline = seat
        .as_ref()
        .map(|SeatHandle(s)| s.deadline() + WRITE_GRACE);
    // The stream's writer may write an SSE body's live frames on plain TCP (chunked framing).
    let seat = seat
        .filter(|_| chunked)
        .and_then(|SeatHandle(seat)| Some((socket.tcp()?, seat)))
        .map(|(tcp, seat)| {
            seat.enable(tcp);
            Lent(seat)
        });
    let queue = Queue {
        lease: Lease::empty(budget, Use::Queued),
        deadline,
    };
    let seat = seat.as_ref().map(|l| &l.0);
    send_body(socket, out, &mut body, chunked, seat, queue).await?;
    Ok(close)
}

/// A seat lent the connection's socket, taken back when the response ends, however it ends.
struct Lent(Arc<Seat>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Appends the status line to `out` (the commonest ones as constants).
fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    let common: &[u8] = match status.as_u16() {
        200 => b"HTTP/1.1 200 OK\r\n",
        204 => b"HTTP/1.1 204 No Content\r\n",
        _ => b"",
    };
    if !common.is_empty() {
        out.extend_from_slice(common);
        return;
    }
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a built response's header lines to `out`, less the framing the loop writes itself
/// (`Transfer-Encoding`; `Content-Length` on a bodiless status, or a second one; `Connection:
/// close`, which sets `close`). Returns whether it declared a `Content-Length` and whether it
/// carried a `Date`.
fn map_lines(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    close: &mut bool,
) -> (bool, bool) {
    let mut declared = false;
    let mut dated = false;
    for (name, value) in headers {
        if *name == header::CONTENT_LENGTH {
            if declared || bodiless(status) {
                continue;
            }
            declared = true;
        } else if *name == header::TRANSFER_ENCODING {
            continue;
        } else if *name == header::CONNECTION {
            *close |= value.as_bytes().eq_ignore_ascii_case(b"close");
            if *close {
                continue;
            }
        } else if *name == header::DATE {
            dated = true;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    (declared, dated)
}

/// Whether `status` never has a body (`1xx`, `204`, `304`).
fn bodiless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// One piece of what a write sends: bytes of the head buffer, a chunk's framing, or a frame.
enum Piece {
    /// `out[from..to]`.
    Out(usize, usize),
    /// A frame's bytes.
    Data(Bytes),
}

/// The most bytes a connection renders ahead of its socket: past it, what is ready is written
/// before the body is polled again, so a reader that does not read holds at most this much
/// (and one frame) however far behind it is.
const QUEUE_MAX: usize = 256 << 10;

/// What a streaming body may queue before its bytes are held of the memory budget: an SSE
/// connection's live events, which nearly always leave at once, cost no budget traffic.
const QUEUE_FREE: usize = 4 << 10;

/// The steps in which a streaming body's queued bytes are leased.
const QUEUE_STEP: u64 = 64 << 10;

/// How long after an SSE connection's end a write still waiting for the peer is given.
const WRITE_GRACE: Duration = Duration::from_millis(250);

/// What a response's queued bytes are held against: the budget's lease, and the moment a
/// write still waiting for the peer is given up (an SSE connection's end).
struct Queue {
    /// The bytes of a streaming body queued beyond [`QUEUE_FREE`].
    lease: Lease,
    /// Writes still waiting then fail the connection.
    deadline: Option<Instant>,
}

impl Queue {
    /// Whether `queued` bytes ready to write must be written now: past [`QUEUE_MAX`], or past
    /// what the budget spares a streaming (`chunked`) body.
    fn full(&mut self, queued: usize, chunked: bool) -> bool {
        if queued >= QUEUE_MAX {
            return true;
        }
        if !chunked || queued <= QUEUE_FREE {
            return false;
        }
        let over = (queued - QUEUE_FREE) as u64;
        if over <= self.lease.bytes() {
            return false;
        }
        let step = (over - self.lease.bytes()).div_ceil(QUEUE_STEP) * QUEUE_STEP;
        self.lease.grow(step).is_err()
    }

    /// Writes `pieces`, failing with `TimedOut` if they are still waiting for the peer at the
    /// deadline; then nothing is queued.
    async fn write<S: Io>(
        &mut self,
        socket: &mut S,
        out: &[u8],
        pieces: &[Piece],
    ) -> io::Result<()> {
        let wrote = match self.deadline {
            None => write_pieces(socket, out, pieces).await,
            Some(at) => tokio::time::timeout_at(at, write_pieces(socket, out, pieces))
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
        };
        if self.lease.bytes() > 0 {
            // Shrinking is never refused.
            let _ = self.lease.resize(0);
        }
        wrote
    }
}

/// Sends the head in `out` and then `body`: every frame that is ready goes in the same write,
/// up to [`QUEUE_MAX`] bytes (or what the memory budget spares); when the body has to wait for
/// its next frame (SSE), what is ready leaves first. Chunked framing when `chunked`. With a
/// `seat` (an SSE body on plain TCP), a body that asked to park is parked once what was ready
/// has left, and taken back at the task's next wake-up, before anything else is written
/// (`seat.rs`). Writes still waiting at `queue`'s deadline end the connection.
async fn send_body<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    body: &mut Body,
    chunked: bool,
    seat: Option<&Arc<Seat>>,
    mut queue: Queue,
) -> io::Result<()> {
    let mut pieces: Vec<Piece> = Vec::with_capacity(4);
    pieces.push(Piece::Out(0, out.len()));
    let mut queued = 0usize;
    let mut ended = false;
    while !ended {
        if queue.full(queued, chunked) {
            queue.write(socket, out, &pieces).await?;
            pieces.clear();
            out.clear();
            queued = 0;
        }
        let next = match std::future::poll_fn(|cx| {
            Poll::Ready(http_body::Body::poll_frame(Pin::new(&mut *body), cx))
        })
        .await
        {
            Poll::Ready(next) => next,
            Poll::Pending => {
                let (wrote, yielded) = unyielding(queue.write(socket, out, &pieces)).await;
                wrote?;
                pieces.clear();
                out.clear();
                queued = 0;
                if let Some(seat) = seat {
                    // A seated body is polled once per wake-up, and every time it is pending
                    // again it comes back here: one that asked to park must be parked, or
                    // nothing would wake it for its stream.
                    if !yielded {
                        if seat.park() {
                            // The stream's writer writes the body's live frames until the
                            // task wakes; then the task takes them over, the rest of an
                            // unfinished chunk first.
                            woken().await;
                            let rest = seat.reclaim();
                            if !rest.is_empty() {
                                let rest = [Piece::Data(rest)];
                                queue.write(socket, &[], &rest).await?;
                            }
                        } else {
                            woken().await;
                        }
                    }
                    // After a write that had to wait, at once: a wake-up may be spent.
                    continue;
                }
                if yielded {
                    // The task was polled meanwhile: a wake-up the body sent may be spent.
                    std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut *body), cx))
                        .await
                } else {
                    after_wake(body).await
                }
            }
        };
        match next {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                queued += data.len();
                if chunked {
                    let from = out.len();
                    extend_hex(out, data.len());
                    out.extend_from_slice(b"\r\n");
                    pieces.push(Piece::Out(from, out.len()));
                    pieces.push(Piece::Data(data));
                    let from = out.len();
                    out.extend_from_slice(b"\r\n");
                    pieces.push(Piece::Out(from, out.len()));
                } else {
                    pieces.push(Piece::Data(data));
                }
            }
            Some(Err(e)) => {
                // The body failed mid-way: the response cannot be completed, so the connection
                // ends (the client sees a truncated body, never a wrong one).
                queue.write(socket, out, &pieces).await?;
                return Err(io::Error::other(e));
            }
            None => ended = true,
        }
    }
    if chunked {
        let from = out.len();
        out.extend_from_slice(b"0\r\n\r\n");
        pieces.push(Piece::Out(from, out.len()));
    }
    queue.write(socket, out, &pieces).await
}

/// Runs `f` to its end; with its output, whether it ever returned `Pending` (the task was then
/// polled again before it ended).
async fn unyielding<F: Future>(f: F) -> (F::Output, bool) {
    let mut f = std::pin::pin!(f);
    let mut yielded = false;
    let out = std::future::poll_fn(|cx| {
        let r = f.as_mut().poll(cx);
        yielded |= r.is_pending();
        r
    })
    .await;
    (out, yielded)
}

/// The body's next frame, polled only once the task is woken. Right after a poll that found
/// the body pending, made with this task's waker, and no other poll of the task since: the body
/// wakes the task when it has a frame (a wake-up during the current poll makes the task run
/// again), and polling again at once would only register every wait of the body anew (for an
/// SSE connection: its stream, its timer, the server's shutdown).
async fn after_wake(body: &mut Body) -> Option<Result<http_body::Frame<Bytes>, axum::Error>> {
    let mut first = true;
    std::future::poll_fn(|cx| {
        if std::mem::take(&mut first) {
            return Poll::Pending;
        }
        http_body::Body::poll_frame(Pin::new(&mut *body), cx)
    })
    .await
}

/// Resolves at the task's next wake-up (pending once, when first polled).
async fn woken() {
    let mut first = true;
    std::future::poll_fn(|_| {
        if std::mem::take(&mut first) {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}

/// Appends `n` in lowercase hexadecimal (a chunk's size line).
pub(crate) fn extend_hex(out: &mut Vec<u8>, n: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(DIGITS[(n >> (4 * i)) & 0xf]);
    }
}

/// Writes every piece, in order, with as few `writev` (or `sendfile`) calls as the socket takes.
async fn write_pieces<S: Io>(socket: &mut S, out: &[u8], pieces: &[Piece]) -> io::Result<()> {
    const BATCH: usize = 32;
    for group in pieces.chunks(BATCH) {
        let mut slices: [IoSlice<'_>; BATCH] = [IoSlice::new(&[]); BATCH];
        for (slot, piece) in slices.iter_mut().zip(group) {
            *slot = IoSlice::new(match piece {
                Piece::Out(from, to) => &out[*from..*to],
                Piece::Data(data) => data,
            });
        }
        let mut left = &mut slices[..group.len()];
        while !left.is_empty() {
            let n = socket.write_vectored(left).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut left, n);
        }
    }
    Ok(())
}

/// Hands the connection to hyper: `read` (bytes read but not served: the request that is not
/// served here and whatever followed it) is read again before the socket.
async fn handoff<S: Io, H: Handler>(
    handler: H,
    socket: S,
    read: BytesMut,
    fallback: Fallback,
    open: (Open, Lease),
    alive: watch::Receiver<()>,
) {
    let io = hyper_util::rt::TokioIo::new(Rewind {
        read: read.freeze(),
        socket: Some(socket),
        shut: false,
    });
    let conn = fallback
        .builder
        .serve_connection(io, handler.into_service());
    // A connection's error (reset, malformed request) concerns that connection only.
    let _ = fallback.watcher.watch(conn).await;
    drop((open, alive));
}

/// A socket with bytes already read from it put back in front.
struct Rewind<S: Io> {
    /// Bytes to be read before the socket's.
    read: Bytes,
    /// The connection (`None` only once dropped).
    socket: Option<S>,
    /// hyper shut the write side: it is closing the connection, perhaps with a request body
    /// left unread (a refusal before the body).
    shut: bool,
}

impl<S: Io> Rewind<S> {
    /// The connection.
    fn socket(&mut self) -> Pin<&mut S> {
        Pin::new(self.socket.as_mut().expect("present until dropped"))
    }
}

impl<S: Io> Drop for Rewind<S> {
    /// A connection hyper closes is drained as [`close_gently`] does, on a task of its own:
    /// closing it with the peer's unread bytes would send a reset, which can destroy the
    /// response before the peer read it (a client still sending a refused body).
    fn drop(&mut self) {
        if let (true, Some(mut socket)) = (self.shut, self.socket.take())
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { drain(&mut socket).await });
        }
    }
}

impl<S: Io> AsyncRead for Rewind<S> {
    /// The bytes put back first, then the socket's.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return this.socket().poll_read(cx, buf);
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read[..n]);
        this.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: Io> AsyncWrite for Rewind<S> {
    /// The socket's write.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().socket().poll_write(cx, buf)
    }

    /// The socket's vectored write (`sendfile` for large mapped slices).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().socket().poll_write_vectored(cx, bufs)
    }

    /// As the socket's (true for a plain socket, which then gets hyper's body pieces as they
    /// are, for `sendfile`).
    fn is_write_vectored(&self) -> bool {
        self.socket
            .as_ref()
            .is_some_and(AsyncWrite::is_write_vectored)
    }

    /// The socket's flush.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().socket().poll_flush(cx)
    }

    /// The socket's shutdown; the socket is drained when dropped (see `Drop`).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.shut = true;
        this.socket().poll_shutdown(cx)
    }
}

/// The `Date` header's value, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    /// The second the cached value is for, and the value (IMF-fixdate, 29 bytes).
    struct Cached {
        /// Seconds since the epoch.
        second: u64,
        /// `Sun, 06 Nov 1994 08:49:37 GMT`.
        text: String,
    }

    thread_local! {
        static CACHED: RefCell<Cached> = const {
            RefCell::new(Cached { second: u64::MAX, text: String::new() })
        };
    }

    /// Appends the current date to `out`.
    pub(super) fn extend(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with_borrow_mut(|c| {
            if c.second != second {
                c.second = second;
                c.text = httpdate::fmt_http_date(now);
            }
            out.extend_from_slice(c.text.as_bytes());
        });
    }
}
