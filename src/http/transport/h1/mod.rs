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
//! waits at the tail and what it sent has left, the loop parks the seat and its task ends,
//! leaving the connection to the response's slot (`park.rs`); the writer writes the live frames
//! straight to the socket, and the slot's first wake-up spawns a task that takes the seat back
//! before it writes or polls the body again, then serves the connection on.
//!
//! Timeouts are hyper's: waiting for a request's head (an idle keep-alive connection included)
//! is bounded by [`ServerConfig::header_read_timeout`](super::ServerConfig::header_read_timeout),
//! measured by one timer per connection that is re-armed only when it fires (no timer per
//! request). Shutdown closes idle connections at once and the others after their response.

mod handoff;
mod head;
mod park;
mod send;
mod spare;

use std::net::TcpStream;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Open;
use super::socket::Socket;
use crate::http::AppState;
use crate::http::body::grown;
use crate::http::budget::{self, Budget, Lease, Owner, Use};
use crate::http::error::ApiError;
use crate::http::pace::Pace;
use crate::http::reply::{Answer, cors_wanted};
use crate::http::service::Handler;

use handoff::handoff;
#[cfg(feature = "fuzzing")]
pub(crate) use head::unread;
use head::{Lines, parse, request, unparsable, uri_too_long};
pub(crate) use send::extend_hex;
use send::{Answered, ParkedBody, respond};

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

/// What a connection's read buffer starts with (a request head and a small body). It is taken
/// when the socket becomes readable and given back once a request is read whole, so only
/// connections in the middle of reading a request hold one.
const READ_BUF: usize = 8 << 10;

/// The smallest body handed to the handler as a view of the read buffer (the buffer's
/// allocation then goes with it); a smaller one is copied out, so the buffer can go back.
const MOVE_BODY_AT: usize = 4 << 10;

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
    /// The address of the peer, if it can be read (for the memory budget's share per peer).
    fn peer(&self) -> Option<std::net::IpAddr>;

    /// A second descriptor of the TCP socket, when what is written to it is what the peer
    /// reads (plain TCP): an SSE connection's stream writer may then write to it while the
    /// connection is parked (`seat.rs`).
    fn tcp(&self) -> Option<TcpStream>;

    /// Whether [`Io::poll_read_ready`] tells when bytes may have come (not for TLS, whose
    /// session may hold decrypted bytes already): a connection between requests then holds no
    /// read buffer until they come.
    const READINESS: bool = false;

    /// Ready when a read may find bytes (or the peer's end), if [`Io::READINESS`]; else ready
    /// at once.
    fn poll_read_ready(
        &self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl Io for Socket {
    const READINESS: bool = true;

    fn peer(&self) -> Option<std::net::IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }

    fn tcp(&self) -> Option<TcpStream> {
        self.share().ok()
    }

    fn poll_read_ready(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.read_ready(cx)
    }
}

impl Io for tokio_rustls::server::TlsStream<Socket> {
    fn peer(&self) -> Option<std::net::IpAddr> {
        self.get_ref().0.peer()
    }

    /// None: every byte is encrypted on the connection's own task.
    fn tcp(&self) -> Option<TcpStream> {
        None
    }
}

/// Serves `socket` until the peer closes it, a timeout ends it, the server shuts down, or a
/// request hands it to hyper. `open` counts the connection until this returns; `alive` tells
/// shutdown that it has not returned yet.
pub(crate) fn serve<S: Io>(
    app: Arc<AppState>,
    socket: S,
    fallback: Fallback,
    open: Open,
    alive: watch::Receiver<()>,
) -> impl Future<Output = ()> + Send {
    // Not an `async fn` of its own: its future would keep a second copy of the arguments.
    serve_with(app.clone(), app, socket, fallback, open, alive)
}

/// [`serve`], each request answered by `handler` (`app` gives the timeouts, the shutdown signal
/// and the metrics of the loop's own refusals).
pub(crate) fn serve_with<S: Io, H: Handler>(
    app: Arc<AppState>,
    handler: H,
    socket: S,
    fallback: Fallback,
    open: Open,
    alive: watch::Receiver<()>,
) -> impl Future<Output = ()> + Send {
    let held = Held {
        buf: BytesMut::new(),
        lines: Vec::new(),
        spare: HeaderMap::new(),
        room: Lease::empty(&app.budget, Use::Buffers),
    };
    let conn = Conn {
        app,
        handler,
        socket,
        fallback,
        open,
        alive,
        held,
    };
    serve_from(conn, None)
}

/// A connection served by this loop: what it is made of between two requests, and while its
/// SSE response is parked without a task (`park.rs`).
struct Conn<S, H> {
    /// The server.
    app: Arc<AppState>,
    /// What answers its requests.
    handler: H,
    /// The connection's IO.
    socket: S,
    /// What hands it to hyper.
    fallback: Fallback,
    /// Counts the connection while it lives.
    open: Open,
    /// Tells shutdown the connection still lives.
    alive: watch::Receiver<()>,
    /// Its buffers and header map.
    held: Held,
}

/// Ends the connection's task with its SSE response parked: the first wake-up of the
/// response's slot spawns a task that resumes it ([`serve_from`]).
fn park<S: Io, H: Handler>(conn: Conn<S, H>, parked: ParkedBody) {
    let slot = parked.slot.clone();
    // One allocation while parked (the closure holds the connection and the response); the
    // response is boxed for the resumed task only.
    slot.park(Box::new(move |runtime| {
        runtime.spawn(serve_from(conn, Some(Box::new(parked))));
    }));
}

/// Serves `conn`, first finishing its `parked` response if it has one, until the peer closes
/// it, a timeout ends it, the server shuts down, a request hands it to hyper, or its SSE
/// response parks without a task.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn's future keeps its arguments twice (as captures and as locals)"
)]
fn serve_from<S: Io, H: Handler>(
    mut conn: Conn<S, H>,
    parked: Option<Box<ParkedBody>>,
) -> impl Future<Output = ()> + Send {
    // An `async` block, not an `async fn`: the arguments are kept once, not also as locals
    // (and the connection's parts are used in place, not moved into locals of their own).
    async move {
        // Taken when a response is written (see `respond`).
        let mut out = Vec::new();
        if let Some(parked) = parked {
            // Boxed: a resumed response's state need not be part of every connection's future.
            match Box::pin(send::resume(&mut conn.socket, &mut out, *parked)).await {
                Ok(Answered::Sent(false)) => {}
                Ok(Answered::Parked(parked)) => return park(conn, parked),
                _ => return,
            }
            if conn.held.buf.capacity() == 0 {
                spare::give_out(std::mem::take(&mut out));
            }
        }
        // One timer for the connection: it fires at most once per `header_read_timeout`, and
        // then checks how long the current head has been awaited (see `read_head`).
        let mut timer = Box::pin(tokio::time::sleep(conn.app.config.header_read_timeout));
        let mut rx = conn.app.shutdown.clone();
        let mut shutting_down = std::pin::pin!(async move {
            // `wait_for` fails only when the sender is gone, which the app state keeps alive.
            let _ = rx.wait_for(|down| *down).await;
        });
        loop {
            // The request is read and answered by the handler in a future of its own, so its
            // locals and the response writer's share their room in this one.
            let next = take_request(
                &conn.app,
                &conn.handler,
                &mut conn.socket,
                &mut conn.held,
                timer.as_mut(),
                shutting_down.as_mut(),
            )
            .await;
            match next {
                Next::Answer(res, is_head, cors, close) => {
                    let sent = respond(
                        &mut conn.socket,
                        &mut out,
                        &conn.app.budget,
                        res,
                        is_head,
                        cors,
                        close,
                    );
                    match sent.await {
                        Ok(Answered::Sent(false)) => {}
                        Ok(Answered::Parked(parked)) => return park(conn, parked),
                        _ => return,
                    }
                }
                Next::End => return,
                Next::Handoff => {
                    let budget = &conn.app.budget;
                    // Charged to the peer, as a connection hyper serves from the start is.
                    let owner = conn.socket.peer().map_or(Owner::NONE, |ip| budget.peer(ip));
                    let held = budget.lease_for(Use::Buffers, super::HYPER_CONNECTION_HELD, owner);
                    let lease = match held {
                        Ok(lease) => lease,
                        Err(e) => {
                            let (handler, socket) = (&conn.handler, &mut conn.socket);
                            return Box::pin(refuse(handler, budget, socket, &mut out, e)).await;
                        }
                    };
                    let Conn {
                        handler,
                        socket,
                        fallback,
                        open,
                        alive,
                        held,
                        ..
                    } = conn;
                    let Held { buf, room, .. } = held;
                    drop(room);
                    let open = (open, lease);
                    return Box::pin(handoff(handler, socket, buf, fallback, open, alive)).await;
                }
                Next::Refuse(e) => {
                    let (handler, budget) = (&conn.handler, &conn.app.budget);
                    let socket = &mut conn.socket;
                    return Box::pin(refuse(handler, budget, socket, &mut out, e)).await;
                }
                Next::RefuseUnread(refused) => {
                    let (handler, budget) = (&conn.handler, &conn.app.budget);
                    let (socket, out) = (&mut conn.socket, &mut out);
                    return Box::pin(refuse_unread(handler, budget, socket, out, refused)).await;
                }
            }
            // Between requests the connection holds no buffers: the output buffer goes back too
            // unless pipelined bytes wait.
            if conn.held.buf.capacity() == 0 {
                spare::give_out(std::mem::take(&mut out));
            }
        }
    }
}

/// What a connection keeps from one request to the next.
struct Held {
    /// The read buffer: empty (no allocation) between requests unless pipelined bytes wait.
    buf: BytesMut,
    /// The header lines' positions of the request being read, kept (emptied) for the next.
    lines: Lines,
    /// The header map of the last request, kept (emptied) for the next.
    spare: HeaderMap,
    /// The read buffer's room, held of the memory budget.
    room: Lease,
}

/// What became of a request [`take_request`] read.
enum Next {
    /// Answer it: the answer, whether the request was `HEAD`, whether the CORS headers go, and
    /// whether the connection closes after it.
    Answer(Answer, bool, bool, bool),
    /// The connection is done (the peer closed it, a timeout, the server's shutdown).
    End,
    /// Hand the connection to hyper from this request on.
    Handoff,
    /// Refuse it with this error, then close.
    Refuse(ApiError),
    /// Refuse it from its head without reading its body (the answer, whether the CORS headers
    /// go, the problem code to count), then close.
    RefuseUnread((Answer, bool, Option<&'static str>)),
}

/// Reads the next request on `socket`, has `handler` answer it and says what to send.
async fn take_request<S: Io, H: Handler>(
    app: &AppState,
    handler: &H,
    socket: &mut S,
    held: &mut Held,
    timer: Pin<&mut tokio::time::Sleep>,
    shutting_down: Pin<&mut impl Future<Output = ()>>,
) -> Next {
    let Held {
        buf,
        lines,
        spare,
        room,
    } = held;
    let limit = app.config.header_read_timeout;
    let head = match read_head(socket, buf, lines, room, limit, timer, shutting_down).await {
        Ok(Some(head)) => head,
        Ok(None) => return Next::End,
        Err(NotHere::Handoff) => return Next::Handoff,
        Err(NotHere::Refuse(status, code, detail)) => {
            return Next::Refuse(ApiError::Http {
                status,
                code,
                detail,
            });
        }
        Err(NotHere::Over(e)) => return Next::Refuse(e),
    };
    // The head (and a small body) is copied out of the read buffer, so that nothing the
    // handler holds keeps the buffer's allocation: with no pipelined bytes after the request
    // the buffer goes back before the handler runs, and a connection waiting for its append's
    // commit, streaming a response or idle between requests holds none. A small body that came
    // with its head is copied with it, into one allocation.
    let with_body =
        head.body_len > 0 && head.body_len < MOVE_BODY_AT && buf.len() - head.len >= head.body_len;
    let taken = if with_body {
        head.len + head.body_len
    } else {
        head.len
    };
    let mut head_bytes = spare::copy(&buf[..taken]);
    buf.advance(taken);
    let came = with_body.then(|| head_bytes.split_off(head.len));
    let is_head = head.method == Method::HEAD;
    let Some(req) = request(&head_bytes, &head, lines, std::mem::take(spare)) else {
        return Next::Refuse(unparsable());
    };
    drop(head_bytes);
    let (mut parts, ()) = req.into_parts();
    // Admission before reading: the handler decides from the head (rights, and for a body still
    // to come the route's size limit), then the memory budget, so a refused request costs no
    // body bytes.
    let unread = (!with_body && head.body_len > buf.len()).then_some(head.body_len);
    let admission = match handler.admit(&mut parts, unread) {
        Ok(admission) => admission,
        Err((answer, cors)) => return Next::RefuseUnread((answer, cors, None)),
    };
    let mut body = Body::empty();
    if head.body_len > 0 {
        // A body that may be large carries its peer to the handler, whose lease of it is then
        // charged to the peer's share (a small one carries nothing: no allocation).
        if head.body_len as u64 > budget::SMALL
            && let Some(ip) = socket.peer()
        {
            parts.extensions.insert(crate::http::Peer(ip));
        }
        if unread.is_some() {
            // Leased as it arrives, not from the head: a head that announces 256 KiB and sends
            // nothing holds no more than its read buffer.
            let owner = app.owner_of(&parts);
            let base = room.bytes();
            match Box::pin(read_body(socket, buf, &head, app, owner, base)).await {
                Ok(true) => {}
                Ok(false) => return Next::End,
                Err(e) => {
                    let code = e.code();
                    let refused = (e.into_response().into(), cors_wanted(&parts), Some(code));
                    return Next::RefuseUnread(refused);
                }
            }
            // The handler holds the body's bytes of the budget from here.
        }
        body = Body::from(if let Some(bytes) = came {
            bytes
        } else if head.body_len < MOVE_BODY_AT {
            let bytes = Bytes::copy_from_slice(&buf[..head.body_len]);
            buf.advance(head.body_len);
            bytes
        } else {
            buf.split_to(head.body_len).freeze()
        });
    }
    if buf.is_empty() {
        spare::give_read(std::mem::take(buf));
        room.resize(0)
            .expect("a lease shrinks without asking the budget");
    }
    let (res, cors, mut headers) = Box::pin(handler.respond(parts, body, admission)).await;
    // Its values are views of this request's head: let them go now, keep the room unless a
    // large head left more than the common request needs.
    headers.clear();
    if headers.capacity() <= SPARE_HEADERS {
        *spare = headers;
    }
    // A body that streams (SSE, bootstrap) can keep the connection for minutes: the header
    // lines' positions and the spare header map go back now (the next request makes new ones),
    // as the read buffer did above.
    if http_body::Body::size_hint(res.body()).exact().is_none() {
        *lines = Vec::new();
        *spare = HeaderMap::new();
    }
    let close = head.close || *app.shutdown.borrow();
    Next::Answer(res, is_head, cors, close)
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
        // A connection between requests has no buffer: it takes one when bytes arrive.
        let waiting = buf.capacity() == 0;
        // An empty buffer with less than half its room left takes back its whole allocation
        // (copying nothing, once the previous request's views of it are gone), so a head and a
        // body of a few KiB arrive in one read rather than in two with the first part moved to
        // the front between them.
        if !waiting
            && (buf.capacity() - buf.len() < 1024
                || (buf.is_empty() && buf.capacity() < READ_BUF / 2))
        {
            buf.reserve(READ_BUF);
        }
        if room.bytes() != buf.capacity() as u64 {
            room.resize(buf.capacity() as u64).map_err(NotHere::Over)?;
        }
        let empty = buf.is_empty();
        // `Err(None)`: the connection failed; `Err(Some(_))`: the budget cannot spare a buffer.
        let read = async {
            if !waiting {
                return socket.read_buf(buf).await.map_err(|_| None);
            }
            loop {
                {
                    // Held as `&mut`: a shared borrow across the wait would ask `S: Sync`.
                    let socket = &mut *socket;
                    std::future::poll_fn(move |cx| socket.poll_read_ready(cx))
                        .await
                        .map_err(|_| None)?;
                }
                // Readiness can be stale (a new connection is reported readable before its
                // first bytes): the buffer is tried once and goes back if nothing came.
                room.resize(READ_BUF as u64).map_err(Some)?;
                let mut fresh = spare::read_buf();
                if !S::READINESS {
                    *buf = fresh;
                    return socket.read_buf(buf).await.map_err(|_| None);
                }
                if let Some(read) = socket.read_buf(&mut fresh).now_or_never() {
                    *buf = fresh;
                    return read.map_err(|_| None);
                }
                spare::give_read(fresh);
                room.resize(0).map_err(Some)?;
            }
        };
        tokio::select! {
            biased;
            read = read => match read {
                Ok(0) | Err(None) => return Ok(None),
                Err(Some(e)) => return Err(NotHere::Over(e)),
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
            () = &mut shutting_down, if empty => return Ok(None),
        }
    }
}

/// Reads the rest of `head`'s body into `buf`, which holds what followed the head (after a
/// `100 Continue` if the client waits for one) in a capacity of `base` bytes that the
/// connection's room holds of the budget. `Ok(false)`: the peer closed the connection; `Err`:
/// the body came too slowly (408 `REQUEST_TIMEOUT` after the idle limit, 408 `BODY_TOO_SLOW`
/// below the minimum rate over the last window, 408 `BODY_DEADLINE` past the deadline: see
/// [`Pace::due`]) or the budget could not spare its bytes (503 `MEMORY_BUDGET`).
///
/// The buffer grows as the bytes arrive (by [`grown`], toward the body's length), each size
/// leased before it is allocated, for `owner` (charged to its shares once past
/// [`budget::SMALL`]); the lease ends here, the handler taking its own of the whole body.
async fn read_body<S: Io>(
    socket: &mut S,
    buf: &mut BytesMut,
    head: &Head,
    app: &AppState,
    owner: Owner,
    base: u64,
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
    let rules = app.body_rules();
    let mut pace = Pace::new();
    let mut lease = Lease::empty_for(&app.budget, Use::Bodies, owner);
    while buf.len() < need {
        if buf.len() == buf.capacity() {
            // Full: a buffer about twice as large, the old one held too while its bytes move.
            let cap = grown(buf.len(), 1, need);
            let both = (buf.capacity() + cap) as u64;
            lease.resize(both.saturating_sub(base))?;
            let mut next = BytesMut::with_capacity(cap);
            next.extend_from_slice(buf);
            *buf = next;
            lease
                .resize((cap as u64).saturating_sub(base))
                .expect("a lease shrinks without asking the budget");
        }
        pace.note(buf.len() as u64, rules.window());
        let (at, refusal) = pace.due(&rules, buf.len() as u64);
        match tokio::time::timeout_at(at, socket.read_buf(buf)).await {
            Ok(Ok(0) | Err(_)) => return Ok(false),
            Ok(Ok(_)) => {}
            Err(_) => return Err(refusal),
        }
    }
    Ok(true)
}

/// Answers a request the loop refuses itself (a bad head, a stalled body) with `e`'s
/// problem+json, counted in the metrics like a handler's refusal, then closes the connection.
async fn refuse<S: Io, H: Handler>(
    handler: &H,
    budget: &Arc<Budget>,
    socket: &mut S,
    out: &mut Vec<u8>,
    e: ApiError,
) {
    let code = e.code();
    let refused = (e.into_response().into(), false, Some(code));
    refuse_unread(handler, budget, socket, out, refused).await;
}

/// Answers a request refused from its head (access control, its size, the memory budget)
/// without reading its body, then closes the connection: what follows the unread body cannot
/// be framed. `refused` is the answer, whether it carries the CORS headers, and the problem
/// code to count when the handler did not count it already.
async fn refuse_unread<S: Io, H: Handler>(
    handler: &H,
    budget: &Arc<Budget>,
    socket: &mut S,
    out: &mut Vec<u8>,
    refused: (Answer, bool, Option<&'static str>),
) {
    let (answer, cors, code) = refused;
    handler.refused(answer.status(), code);
    if respond(socket, out, budget, answer, false, cors, true)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what an `async fn` taking five arguments returns.
    fn future_size<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// A plain connection's task holds this loop's future for the connection's whole life (an
    /// SSE subscriber's minutes, an idle keep-alive's wait): its size is paid per connection.
    /// The handler's future and the cold branches (refusals, the handoff, a body still to
    /// read) are boxed, a request is read in a future of its own (which shares its room with
    /// the response's writer), and the arguments are kept once, so what is left is the loop's
    /// own state and the response's writer: 1,832 bytes (debug build), against 4.6 KiB with all
    /// of them inline and 3.1 KiB with the request's locals and the arguments twice.
    #[test]
    fn the_connection_future_is_small() {
        let size = future_size(serve::<Socket>);
        println!("serve::<Socket> future: {size} bytes");
        assert!(size <= 1920, "the connection's future is {size} bytes");
    }
}
