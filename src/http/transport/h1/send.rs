//! Responses: the head framed as hyper frames it, a body of known length or chunked, small
//! pieces in one `writev`, large mapped ones by `sendfile`, and the write-ahead queue that bounds
//! what a slow reader holds.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::Io;
use super::park::{Forward, Slot};
use crate::http::budget::{Budget, Lease, Use};
use crate::http::reply::{self, Answer};
use crate::http::service::seat::{Parking, Seat, SeatHandle};

/// What became of a response.
pub(super) enum Answered {
    /// Sent whole: whether the connection is to be closed after it.
    Sent(bool),
    /// An SSE body parked at its stream's writer, to be resumed by the first wake-up of its
    /// slot (`park.rs`).
    Parked(ParkedBody),
}

/// What is left of a parked SSE response: its body, its seat (lent the socket), its queue and
/// whether the connection closes after it, and the slot its wake-ups go to.
pub(super) struct ParkedBody {
    /// The body.
    body: Body,
    /// The seat at the stream's writer.
    seat: Lent,
    /// The write-ahead queue's lease and deadline.
    queue: Queue,
    /// The connection closes after the response.
    close: bool,
    /// Where the response's wake-ups go.
    pub(super) slot: Arc<Slot>,
}

/// Writes `answer` (no body for a `HEAD` request) with the headers every response carries (and
/// the CORS ones when `cors`: see [`reply::common_headers`]), and `Connection: close` when
/// `close`. A typed head ([`Answer::Typed`]) is written straight from its fields; a built
/// response's from its map. Returns whether the connection is to be closed after it (asked, or
/// the response said so), or the SSE body parked without a task (`park.rs`).
pub(super) async fn respond<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    budget: &Arc<Budget>,
    answer: Answer,
    is_head: bool,
    cors: bool,
    mut close: bool,
) -> io::Result<Answered> {
    out.clear();
    if out.capacity() == 0 {
        // An idle connection gave its buffer back.
        *out = super::spare::out_buf();
    }
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
        return Ok(Answered::Sent(close));
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
    let mut queue = Queue {
        lease: Lease::empty(budget, Use::Queued),
        deadline,
    };
    let Some(seat) = seat else {
        send_body(socket, out, &mut body, chunked, None, &mut queue).await?;
        return Ok(Answered::Sent(close));
    };
    // A seated body is polled with its slot's waker from the start, so that everything it
    // waits for wakes the slot, with or without a task (`park.rs`). Boxed: only SSE responses
    // on plain TCP have a seat, and every connection's future would hold this one's room.
    let parked = ParkedBody {
        body,
        seat,
        queue,
        close,
        slot: Slot::new(),
    };
    Box::pin(send_seated(socket, out, parked, false)).await
}

/// Sends a seated SSE body with its slot's waker (see [`respond`]), first taking the seat back
/// and writing the rest of a chunk the writer left unfinished when `resumed`.
async fn send_seated<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    parked: ParkedBody,
    resumed: bool,
) -> io::Result<Answered> {
    let ParkedBody {
        mut body,
        seat,
        mut queue,
        close,
        slot,
    } = parked;
    let sent = {
        let send = std::pin::pin!(async {
            if resumed {
                let rest = seat.0.reclaim();
                if !rest.is_empty() {
                    queue.write(socket, &[], &[Piece::Data(rest)]).await?;
                }
                out.clear();
            }
            send_body(socket, out, &mut body, true, Some(&seat.0), &mut queue).await
        });
        Forward::new(&slot, send).await?
    };
    Ok(match sent {
        Flow::Ended => Answered::Sent(close),
        Flow::Parked => Answered::Parked(ParkedBody {
            body,
            seat,
            queue,
            close,
            slot,
        }),
    })
}

/// Resumes a parked SSE response at its slot's wake-up: takes the seat back, writes the rest of
/// a chunk the writer left unfinished, then sends the body on as [`respond`] did.
pub(super) async fn resume<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    parked: ParkedBody,
) -> io::Result<Answered> {
    send_seated(socket, out, parked, true).await
}

/// How [`send_body`] stopped.
enum Flow {
    /// The body ended and all of it was written.
    Ended,
    /// The body was parked at its stream's writer: the connection's task may end.
    Parked,
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
/// has left, and [`Flow::Parked`] returned: the connection is resumed ([`resume`]) at the
/// first wake-up of its slot, which takes the seat back before anything else is written
/// (`seat.rs`). Writes still waiting at `queue`'s deadline end the connection.
async fn send_body<S: Io>(
    socket: &mut S,
    out: &mut Vec<u8>,
    body: &mut Body,
    chunked: bool,
    seat: Option<&Arc<Seat>>,
    queue: &mut Queue,
) -> io::Result<Flow> {
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
                let (wrote, yielded) = {
                    let write = std::pin::pin!(queue.write(socket, out, &pieces));
                    unyielding(write).await
                };
                wrote?;
                pieces.clear();
                out.clear();
                queued = 0;
                if let Some(seat) = seat {
                    // A seated body is polled once per wake-up, and every time it is pending
                    // again it comes back here: one that asked to park must be parked, or
                    // nothing would wake it for its stream.
                    if !yielded {
                        let parking = seat.park();
                        if parking == Parking::Start {
                            super::super::writer::start(seat.feed.clone());
                        }
                        if parking == Parking::No {
                            woken().await;
                        } else {
                            // The stream's writer writes the body's live frames until the
                            // slot is woken; then a task takes them over, the rest of an
                            // unfinished chunk first. Meanwhile nothing is rendered here:
                            // the buffers go back (a parked subscriber may sleep for
                            // minutes) and are taken again by the next frame, and the
                            // connection's task ends.
                            super::spare::give_out(std::mem::take(out));
                            return Ok(Flow::Parked);
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
    queue.write(socket, out, &pieces).await?;
    Ok(Flow::Ended)
}

/// Runs `f` to its end; with its output, whether it ever returned `Pending` (the task was then
/// polled again before it ended).
fn unyielding<F: Future + Unpin>(f: F) -> Unyielding<F> {
    Unyielding { f, yielded: false }
}

/// [`unyielding`]'s future: `f` held once (an `async fn` would hold it twice, as its argument
/// and pinned), since this future is part of every SSE connection's.
struct Unyielding<F> {
    f: F,
    yielded: bool,
}

impl<F: Future + Unpin> Future for Unyielding<F> {
    type Output = (F::Output, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.f).poll(cx) {
            Poll::Ready(out) => Poll::Ready((out, self.yielded)),
            Poll::Pending => {
                self.yielded = true;
                Poll::Pending
            }
        }
    }
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
/// The slices of each call are made afresh at every poll, so what waits for the peer is two
/// positions, not an array of slices (this future is held for an SSE connection's life).
async fn write_pieces<S: Io>(socket: &mut S, out: &[u8], pieces: &[Piece]) -> io::Result<()> {
    const BATCH: usize = 32;
    let bytes = |piece| piece_bytes(out, piece);
    // The first piece not wholly written, and how much of it was.
    let (mut at, mut done) = (0usize, 0usize);
    std::future::poll_fn(|cx| {
        loop {
            while at < pieces.len() && bytes(&pieces[at]).len() == done {
                at += 1;
                done = 0;
            }
            if at == pieces.len() {
                return Poll::Ready(Ok(()));
            }
            let mut slices: [IoSlice<'_>; BATCH] = [IoSlice::new(&[]); BATCH];
            let mut used = 0;
            for (slot, piece) in slices.iter_mut().zip(&pieces[at..]) {
                let piece = bytes(piece);
                *slot = IoSlice::new(if used == 0 { &piece[done..] } else { piece });
                used += 1;
            }
            let n =
                std::task::ready!(Pin::new(&mut *socket).poll_write_vectored(cx, &slices[..used]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let mut left = n;
            while left > 0 {
                let rest = bytes(&pieces[at]).len() - done;
                if left < rest {
                    done += left;
                    break;
                }
                left -= rest;
                at += 1;
                done = 0;
            }
        }
    })
    .await
}

/// A piece's bytes (`out` holds the head's and the chunks' framing).
fn piece_bytes<'a>(out: &'a [u8], piece: &'a Piece) -> &'a [u8] {
    match piece {
        Piece::Out(from, to) => &out[*from..*to],
        Piece::Data(data) => data,
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
