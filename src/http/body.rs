//! Request bodies in (bounded, never buffered past the limit) and read chunks out (without a
//! copy).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use super::budget::{Budget, Lease, Owner, Use};
use super::error::ApiError;
use super::pace::Pace;

/// A response body made of the pieces of a [`ReadChunk`](crate::ReadChunk): views of the
/// stream's files handed to the socket as they are, with an exact length (so the response
/// has a `Content-Length`).
pub(crate) struct Pieces {
    /// The pieces not yet sent.
    pieces: VecDeque<Bytes>,
    /// Their total length.
    remaining: u64,
}

impl Pieces {
    /// A body of `pieces`, in order; empty pieces are dropped (they would be empty frames).
    pub(crate) fn new(pieces: Vec<Bytes>) -> Self {
        let remaining = pieces.iter().map(|b| b.len() as u64).sum();
        Pieces {
            pieces: pieces.into_iter().filter(|b| !b.is_empty()).collect(),
            remaining,
        }
    }

    /// As the body type handlers answer with (no copy: `Body` wraps it).
    pub(crate) fn into_body(self) -> Body {
        Body::new(self)
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    /// The next piece, as it is; never pending.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.pieces.pop_front() {
            Some(piece) => {
                self.remaining -= piece.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(piece))))
            }
            None => Poll::Ready(None),
        }
    }

    /// Whether every piece went out.
    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The exact bytes left, so hyper sends a `Content-Length`.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// How a request body must arrive: within the idle limit between frames, at the minimum rate
/// over a sliding window once the grace period has passed, whole within its deadline
/// (`pace.rs`), and within the memory budget.
#[derive(Clone)]
pub(crate) struct BodyRules {
    /// The longest a body may deliver nothing (408 `REQUEST_TIMEOUT`).
    pub(crate) idle: Duration,
    /// The least rate over the last window once `grace` has passed, in bytes per second (408
    /// `BODY_TOO_SLOW`); 0 for none.
    pub(crate) min_rate: u64,
    /// How long a body may take before `min_rate` applies, and the window it is measured over
    /// (at least 1 s).
    pub(crate) grace: Duration,
    /// The longest a body may take in all (408 `BODY_DEADLINE`); zero for no limit.
    pub(crate) deadline: Duration,
    /// What the body's bytes are held against (503 `MEMORY_BUDGET`).
    pub(crate) budget: Arc<Budget>,
    /// Who a large body's bytes are charged to (its peer's address, its token).
    pub(crate) owner: Owner,
}

impl BodyRules {
    /// The window `min_rate` is measured over: the grace period, at least 1 s.
    pub(crate) fn window(&self) -> Duration {
        self.grace.max(Duration::from_secs(1))
    }
}

/// A request body read whole, and the share of the memory budget it holds until dropped.
pub(crate) struct Held {
    /// The body.
    pub(crate) bytes: Bytes,
    /// Its bytes' lease.
    _lease: Lease,
}

/// The capacity a body buffer holding `len` bytes grows to for `more` bytes, for a body of at
/// most `target` bytes: the smallest of `target`, `target / 2`, `target / 4`, ... (none under
/// 16 KiB) that holds them. Each step about doubles the buffer (so it is at most twice what
/// arrived) and the last one reaches `target` exactly, so growing never holds more than
/// [`body_peak`](super::budget::body_peak) of `target` (the old buffer and the new one while
/// the bytes move).
pub(crate) fn grown(len: usize, more: usize, target: usize) -> usize {
    let need = len + more;
    let mut cap = target.max(need);
    while cap / 2 >= need.max(16 << 10) {
        cap /= 2;
    }
    cap
}

/// Reads a whole request body of at most `limit` bytes; `declared` is its `Content-Length`. A
/// larger body is refused with 413 as soon as that is known: from its `Content-Length` before
/// reading anything, or once the bytes read pass the limit, never after buffering all of it.
/// A body that arrives in one frame (a small one nearly always does) is returned as it is.
///
/// The body's bytes are leased from the memory budget as they arrive, never ahead of them (a
/// head that declares 64 MiB and sends nothing holds nothing): a body in one frame takes one
/// lease of its length; past one frame the bytes are copied into a buffer of their own that
/// grows by [`grown`], each size leased before it is allocated. 503 `MEMORY_BUDGET` when the
/// budget cannot spare them. A body that delivers nothing for the idle limit is refused with
/// 408 `REQUEST_TIMEOUT`, one that falls below the minimum rate with 408 `BODY_TOO_SLOW`, one
/// still arriving at its deadline with 408 `BODY_DEADLINE` (see [`BodyRules`]).
pub(crate) async fn read_body(
    mut body: Body,
    declared: Option<u64>,
    limit: usize,
    rules: &BodyRules,
) -> Result<Held, ApiError> {
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit as u64));
    }
    let mut lease = Lease::empty_for(&rules.budget, Use::Bodies, rules.owner);
    // A declared empty body is complete: an HTTP/2 client (undici) may send `content-length: 0`
    // and leave its side of the stream open, so waiting for the end would wait forever.
    if declared == Some(0) {
        return Ok(Held {
            bytes: Bytes::new(),
            _lease: lease,
        });
    }
    let mut pace = Pace::new();
    // The body at most this long: what the copy buffer grows toward.
    let target = declared.map_or(limit, |n| usize::try_from(n).unwrap_or(limit));
    let mut first = Bytes::new();
    let mut more: Option<BytesMut> = None;
    let mut total = 0usize;
    while !http_body::Body::is_end_stream(&body) {
        let Some(frame) = next_frame(&mut body, rules, &mut pace, total as u64).await? else {
            break;
        };
        let Ok(frame) = frame else {
            return Err(ApiError::bad_request(
                "INVALID_BODY",
                "the request body could not be read",
            ));
        };
        // Trailers carry no data.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        if total > limit {
            return Err(ApiError::too_large(limit as u64));
        }
        if first.is_empty() && more.is_none() {
            // The common case: one frame, one lease of its length.
            lease.grow(data.len() as u64)?;
            first = data;
            continue;
        }
        // The lease holds the first frame or the buffer's capacity.
        let buf = more.get_or_insert_with(BytesMut::new);
        let held = if buf.capacity() == 0 {
            &first[..]
        } else {
            &buf[..]
        };
        if held.len() + data.len() > buf.capacity() {
            let cap = grown(held.len(), data.len(), target);
            // The old bytes and the new buffer are held together while they move.
            lease.resize(lease.bytes() + cap as u64)?;
            let mut next = BytesMut::with_capacity(cap);
            next.extend_from_slice(held);
            *buf = next;
            first = Bytes::new();
            lease
                .resize(cap as u64)
                .expect("a lease shrinks without asking the budget");
        }
        buf.extend_from_slice(&data);
    }
    Ok(Held {
        bytes: more.map_or(first, BytesMut::freeze),
        _lease: lease,
    })
}

/// A body of `declared` bytes (at most [`SMALL`](super::budget::SMALL)) taken whole at once when
/// its one frame is there already, as brook's HTTP/1.1 loop hands a small body over (and hyper
/// a small body that came in one read): one lease of its length, with none of [`read_body`]'s
/// pace, rules or buffer. `Ok(Err(body))` gives the body back to be read by [`read_body`]: its
/// frame has not come yet (nothing was taken from it), or the frame taken was not all of it
/// (then put back in front of the rest).
pub(crate) fn take_whole(
    mut body: Body,
    declared: u64,
    budget: &Arc<Budget>,
) -> Result<Result<Held, Body>, ApiError> {
    debug_assert!(declared <= super::budget::SMALL);
    let Some(frame) = futures_util::FutureExt::now_or_never(body.frame()) else {
        return Ok(Err(body));
    };
    let frame = match frame {
        // Ended with no frame: an empty body, as `read_body` takes one.
        None => {
            return Ok(Ok(Held {
                bytes: Bytes::new(),
                _lease: Lease::empty(budget, Use::Bodies),
            }));
        }
        Some(Err(_)) => {
            return Err(ApiError::bad_request(
                "INVALID_BODY",
                "the request body could not be read",
            ));
        }
        Some(Ok(frame)) => frame,
    };
    match frame.into_data() {
        Ok(data) if data.len() as u64 == declared && http_body::Body::is_end_stream(&body) => {
            // Small: charged to no one (see `Lease::try_grow`).
            let mut lease = Lease::empty(budget, Use::Bodies);
            lease.grow(declared)?;
            Ok(Ok(Held {
                bytes: data,
                _lease: lease,
            }))
        }
        Ok(data) => Ok(Err(Body::new(Prepend {
            first: Some(Frame::data(data)),
            rest: body,
        }))),
        Err(frame) => Ok(Err(Body::new(Prepend {
            first: Some(frame),
            rest: body,
        }))),
    }
}

/// A body with one frame taken from it put back in front (see [`take_whole`]).
struct Prepend {
    /// The frame taken, until it is read again.
    first: Option<Frame<Bytes>>,
    /// The rest of the body.
    rest: Body,
}

impl http_body::Body for Prepend {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + first);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}

/// The body's next frame, refused when it does not come in time ([`Pace::due`]), `received`
/// bytes in. A frame already there (as a small body's nearly always is) is taken without
/// arming a timer or reading the clock.
async fn next_frame(
    body: &mut Body,
    rules: &BodyRules,
    pace: &mut Pace,
    received: u64,
) -> Result<Option<Result<Frame<Bytes>, axum::Error>>, ApiError> {
    let mut next = body.frame();
    if let Some(ready) = futures_util::FutureExt::now_or_never(&mut next) {
        return Ok(ready);
    }
    pace.note(received, rules.window());
    let (at, refusal) = pace.due(rules, received);
    tokio::time::timeout_at(at, next).await.map_err(|_| refusal)
}

/// What a pumped body may hold in memory at once, for the memory budget: its channel's frames
/// and the one being copied (hyper's frames are at most its read buffer).
pub(crate) const PUMP_HELD: u64 = 5 * (64 << 10);

/// A blocking [`io::Read`] over a request body that an async task pumps in, so the engine can
/// stream a large body (a snapshot) to disk from the blocking pool without it ever being held
/// in memory whole. At most a few frames are in flight.
pub(crate) struct ChannelReader {
    /// The frames the pump sends, or its error.
    rx: mpsc::Receiver<io::Result<Bytes>>,
    /// What is left of the frame being read.
    current: Bytes,
}

impl io::Read for ChannelReader {
    /// Copies from the current frame, blocking for the next one when it is used up; 0 at the end
    /// of the body.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                self.current.copy_to_slice(&mut buf[..n]);
                return Ok(n);
            }
            // Called only on the blocking pool (see `pump`), where blocking is allowed.
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
    }
}

/// What went wrong with a pumped body, if anything.
#[derive(Clone, Default)]
pub(crate) struct PumpStatus {
    /// Set when the body passed its limit.
    overflow: Arc<AtomicBool>,
    /// Set when the body could not be read.
    failed: Arc<AtomicBool>,
    /// Set when the body delivered nothing for the idle limit, fell below the minimum rate,
    /// passed its deadline or could not be leased its frames (`failed` is set too).
    refused: Arc<AtomicBool>,
    /// The refusal due then ([`PumpStatus::refused`]).
    refusal: Arc<parking_lot::Mutex<Option<ApiError>>>,
}

impl PumpStatus {
    /// The body went over its limit.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow.load(Ordering::Acquire)
    }

    /// The body could not be read (the client went away or sent a broken body).
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The body came too slowly (see [`BodyRules`]) or the memory budget could not spare its
    /// frames: the refusal due.
    pub(crate) fn refused(&self) -> Option<ApiError> {
        if !self.refused.load(Ordering::Acquire) {
            return None;
        }
        self.refusal.lock().take()
    }
}

/// A reader for a body of at most `limit` bytes, and the task that feeds it. Run the task
/// concurrently with the blocking consumer of the reader. Past the limit, the reader fails and
/// [`PumpStatus::overflowed`] turns true; on a broken body, [`PumpStatus::failed`]. The frames
/// in flight ([`PUMP_HELD`]) are leased when the first one arrives, not before: a head with no
/// body holds none of the budget.
pub(crate) fn pump(
    body: Body,
    limit: u64,
    rules: BodyRules,
) -> (
    ChannelReader,
    PumpStatus,
    impl std::future::Future<Output = Lease> + Send,
) {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
    let status = PumpStatus::default();
    let flags = status.clone();
    let task = async move {
        let mut body = body;
        let mut total = 0u64;
        let mut pace = Pace::new();
        // Returned to the caller, which holds it until the consumer is done with the frames.
        let mut lease = Lease::empty_for(&rules.budget, Use::Bodies, rules.owner);
        let refuse = async |refusal: ApiError| {
            flags.failed.store(true, Ordering::Release);
            flags.refused.store(true, Ordering::Release);
            *flags.refusal.lock() = Some(refusal);
            let _ = tx
                .send(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the request body was refused",
                )))
                .await;
        };
        let feed = async {
            loop {
                let next = match next_frame(&mut body, &rules, &mut pace, total).await {
                    Ok(next) => next,
                    Err(refusal) => return refuse(refusal).await,
                };
                if lease.bytes() == 0
                    && next.is_some()
                    && let Err(refusal) = lease.grow(PUMP_HELD)
                {
                    return refuse(refusal).await;
                }
                let item = match next {
                    None => return,
                    Some(Err(_)) => {
                        flags.failed.store(true, Ordering::Release);
                        Err(io::Error::other("the request body could not be read"))
                    }
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            total += data.len() as u64;
                            if total > limit {
                                flags.overflow.store(true, Ordering::Release);
                                Err(io::Error::other("the request body is over the limit"))
                            } else {
                                Ok(data)
                            }
                        }
                        // Trailers carry no data.
                        Err(_) => continue,
                    },
                };
                let stop = item.is_err();
                // A closed channel means the consumer finished or gave up: stop reading.
                if tx.send(item).await.is_err() || stop {
                    return;
                }
            }
        };
        feed.await;
        lease
    };
    (
        ChannelReader {
            rx,
            current: Bytes::new(),
        },
        status,
        task,
    )
}

/// Streams `body`, of at most `limit` bytes, into `call`, a blocking engine call that reads it
/// on the blocking pool while the pump feeds it: the body is never held whole, and what is in
/// flight between the two is leased from the memory budget (charged to the request's owner,
/// from `parts`). A declared length over `limit` is 413 before anything is read. When `call`
/// fails because the body did, the body's failure is the answer: 413 past `limit`, the
/// slow-body or budget refusal, 400 `INVALID_BODY` when it broke; otherwise `call`'s own error
/// (as `op`).
pub(crate) async fn pump_to_store<T, F>(
    app: &super::AppState,
    parts: &axum::http::request::Parts,
    body: Body,
    limit: u64,
    op: super::error::Op,
    call: F,
) -> Result<T, ApiError>
where
    F: FnOnce(&mut ChannelReader) -> crate::Result<T> + Send + 'static,
    T: Send + 'static,
{
    // The declared length (hyper's from `Content-Length`, brook's loop's from the body it read).
    if http_body::Body::size_hint(&body)
        .exact()
        .is_some_and(|n| n > limit)
    {
        return Err(ApiError::too_large(limit));
    }
    let (mut reader, status, feed) = pump(body, limit, app.body_rules_for(parts, None));
    let consume = super::blocking(op, move || call(&mut reader));
    let (_in_flight, done) = tokio::join!(feed, consume);
    match done {
        Ok(v) => Ok(v),
        Err(_) if status.overflowed() => Err(ApiError::too_large(limit)),
        Err(_) if let Some(refusal) = status.refused() => Err(refusal),
        Err(_) if status.failed() => Err(ApiError::bad_request(
            "INVALID_BODY",
            "the request body could not be read",
        )),
        Err(e) => Err(e),
    }
}

/// Which of one connection's request bodies were read to their end (see [`Tracked`]): each
/// tracked body gets the next number and records it when it ends. Shared by the connection's
/// requests, so tracking a body allocates nothing.
#[derive(Default)]
pub(crate) struct Ends {
    /// The last number given to a body.
    issued: AtomicU64,
    /// The highest number of a body that ended.
    ended: AtomicU64,
}

impl Ends {
    /// The number of the next tracked body.
    pub(crate) fn issue(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether body `n` was read to its end. Asked when its response is ready, before the
    /// connection's next request (and body) exists; a body of an earlier request that ends late
    /// records a lower number, which `fetch_max` ignores.
    pub(crate) fn ended(&self, n: u64) -> bool {
        self.ended.load(Ordering::Acquire) >= n
    }
}

/// A request body that records when it was read to its end, so the server can tell a client
/// not to reuse a connection whose request body was left unread (a refusal decided from the
/// headers alone): hyper then closes the connection after the response, and a client that
/// reused it would see it close under its next request.
pub(crate) struct Tracked {
    /// The body as received.
    inner: hyper::body::Incoming,
    /// Where its end is recorded.
    ends: Arc<Ends>,
    /// Its number there.
    n: u64,
}

impl Tracked {
    /// Tracks `inner` as body `n` of `ends`.
    pub(crate) fn new(inner: hyper::body::Incoming, ends: Arc<Ends>, n: u64) -> Tracked {
        Tracked { inner, ends, n }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    /// The next frame of the body; the end (or the frame that reaches it) sets `done`.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.inner.is_end_stream() {
            this.ends.ended.fetch_max(this.n, Ordering::Release);
        }
        polled
    }

    /// Whether the body has ended.
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    /// The body's declared length, if any.
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
