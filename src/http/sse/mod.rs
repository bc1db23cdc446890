//! `live=sse`: a stream read as server-sent events. Each chunk is a `data` event (text, or
//! base64 for binary content types) followed by a `control` event with the next offset and
//! cursor; at the tail the connection sleeps in [`Store::wait`](crate::Store::wait) until data,
//! closure, its deadline, a keep-alive or the server's shutdown.
//!
//! So that a browser's own `EventSource` resumes where it stopped (brook's extension, within
//! PROTOCOL.md 5.8 and 11.1): the connection opens with `retry:` (the reconnection delay), every
//! data and control event carries `id: <streamNextOffset>`, and a request with `Last-Event-ID`
//! (which the browser sends when it reconnects to the same URL) reads from that offset instead
//! of the URL's.

use std::convert::Infallible;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use crate::headers::{InvalidHeader, parse_read_from};
use crate::{Incarnation, Offset, ReadChunk, ReadFrom, ReadRequest, StreamName, is_json};
use crate::{Store, Watch};

mod render;

pub(crate) use render::{Encoding, render};
use render::{control_event, encoding_for, incomplete_utf8_tail, last_bytes};

use super::AppState;
use super::auth::CREDENTIAL_EXPIRED_EVENT;
use super::cursor::{interval_at, response_cursor};
use super::error::{ApiError, Op};
use super::fanout::{Source, TailRef};
use super::limits::LiveSlot;
use super::names::{STREAM_INCARNATION, STREAM_SSE_DATA_ENCODING, X_ACCEL_BUFFERING};
use super::read::{ReadParams, has_data, read_chunk, read_woken};
use super::reply::Reply;
use super::service::seat::{FrameKey, Seat, SeatHandle};

/// The request header an `EventSource` sends on reconnection: the last `id:` it saw.
const LAST_EVENT_ID: &str = "last-event-id";

/// The first frame of every connection: the reconnection delay an `EventSource` waits after the
/// server ends the connection (every `sse_max_duration`) or it drops. 1 s rather than the
/// browsers' default 3 s (Chromium's) keeps a planned reconnect's gap in delivery short, while a
/// server that is down sees one attempt per second per browser, not a storm.
const RETRY_FRAME: &[u8] = b"retry: 1000\n\n";

/// Where an SSE read starts: the `Last-Event-ID` header when there is one (an `EventSource`
/// reconnecting to its original URL sends the last `id:`, a `streamNextOffset`), else the URL's
/// `offset`. The header is validated as an `offset` is: malformed is 400 `INVALID_OFFSET`.
fn resume_from(headers: &HeaderMap, offset: Option<ReadFrom>) -> Result<ReadFrom, ApiError> {
    let mut values = headers.get_all(LAST_EVENT_ID).iter();
    let Some(value) = values.next() else {
        return Ok(offset.unwrap_or(ReadFrom::Start));
    };
    let parsed = if values.next().is_some() {
        Err(InvalidHeader {
            name: "offset",
            reason: "given more than once",
        })
    } else {
        value
            .to_str()
            .map_err(|_| InvalidHeader {
                name: "offset",
                reason: "not -1, now, or an offset this server returned",
            })
            .and_then(parse_read_from)
    };
    parsed.map_err(|e| {
        let mut err = ApiError::from(e);
        if let ApiError::Http { detail, .. } = &mut err {
            detail.insert_str(0, "Last-Event-ID: ");
        }
        err
    })
}

/// What ended an SSE connection's wait at the tail.
#[derive(Clone, Copy)]
enum Woke {
    /// The stream changed (or the writer handed the connection back).
    Stream,
    /// The connection's timer (keep-alive or deadline).
    Timer,
    /// The server is shutting down.
    Shutdown,
}

/// The state of one SSE connection.
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts about one connection (JSON content, told up to date, ended, just woken, shutdown armed), each read on its own"
)]
struct Sse {
    /// The store read (not the whole server state: this is kept per subscriber).
    store: Store,
    /// Turns `true` when the server shuts down.
    down: watch::Receiver<bool>,
    /// How long the connection may stay silent before a keep-alive comment.
    keepalive: Duration,
    /// The stream read.
    name: StreamName,
    /// The stream held for waiting on it (no lookup per wait).
    watch: Watch,
    /// The frames last rendered for the stream, shared with its other subscribers.
    tail: TailRef,
    /// The connection's seat at the stream's writer (`service/seat.rs`): used when its loop lent the
    /// socket (brook's HTTP/1.1 loop on plain TCP), else the connection waits on the stream.
    seat: Arc<Seat>,
    /// The incarnation the connection started on; a recreated stream ends the connection.
    incarnation: Incarnation,
    /// How data events carry the bytes.
    encoding: Encoding,
    /// The stream is JSON: its chunks are whole messages, never cut inside a character.
    json: bool,
    /// The request's `max_bytes`, for every read.
    max_bytes: Option<u64>,
    /// Where the next read starts.
    next: Offset,
    /// A chunk already read and not yet sent.
    pending: Option<ReadChunk>,
    /// Whether the client was told it is up to date at `next`.
    announced: bool,
    /// Cursors sent are at least this (the response cursor for the request's `cursor`).
    cursor_floor: u64,
    /// When the connection ends (`sse_max_duration` after it began, or earlier at
    /// `credential`).
    deadline: Instant,
    /// When the token that admitted the connection expires: it ends then, with a final
    /// `credential-expired` event.
    credential: Option<Instant>,
    /// One timer for the connection's deadline and its keep-alive comments, reset only when it
    /// fires, never per event: with 1000 subscribers woken 100 times a second, per-event resets
    /// make timer-wheel inserts and removals a visible part of the fan-out's CPU.
    timer: Pin<Box<Sleep>>,
    /// When the last frame went out (keep-alive comments are due `sse_keepalive` after it).
    last_sent: Instant,
    /// Resolves when the server shuts down (made before the flag is first looked at, which
    /// covers a signal sent before it); created once per connection, holding only the
    /// signal's handle.
    shutdown: Pin<Box<OwnedNotified>>,
    /// `shutdown` was polled once: it holds the task's waker until the server shuts down.
    shutdown_armed: bool,
    /// The stream's end was sent: the connection ends.
    done: bool,
    /// `Store::wait` just woke the connection: the next read is of fresh, loaded data.
    woken: bool,
    /// The connection's place among the server's live readers, freed when it ends.
    _slot: LiveSlot,
    /// Counts the connection among the live SSE readers while it is open.
    _reader: super::admin::Reader,
}

impl Sse {
    /// The cursor for the next control event: the current interval, never below the floor.
    fn cursor(&self) -> u64 {
        interval_at(SystemTime::now()).max(self.cursor_floor)
    }

    /// Reads the chunk at `next` (on this worker right after a wake-up); `None` when the read
    /// fails, which ends the connection.
    async fn read(&mut self) -> Option<ReadChunk> {
        let req = ReadRequest {
            from: ReadFrom::At(self.next),
            max_bytes: self.max_bytes,
            expect: Some(self.incarnation.clone()),
            whole_messages: false,
        };
        if std::mem::take(&mut self.woken) {
            return read_woken(&self.store, &self.name, &req).ok();
        }
        read_chunk(&self.store, &self.name, req).await.ok()
    }

    /// A text event must be valid UTF-8 on its own: a chunk cut inside a character (only a
    /// size-bounded chunk can be, so never one that reaches the tail) is read again just short
    /// of it.
    async fn whole_characters(&mut self, chunk: ReadChunk) -> Option<ReadChunk> {
        if self.encoding != Encoding::Text || self.json || chunk.up_to_date {
            return Some(chunk);
        }
        let cut = incomplete_utf8_tail(&last_bytes(&chunk.body));
        let len = chunk.body_len();
        if cut == 0 || len <= cut {
            return Some(chunk);
        }
        let req = ReadRequest {
            from: ReadFrom::At(chunk.start),
            max_bytes: Some((len - cut) as u64),
            expect: Some(self.incarnation.clone()),
            whole_messages: false,
        };
        read_chunk(&self.store, &self.name, req).await.ok()
    }

    /// The frame this connection's read at `next` would render now, if its stream's tail
    /// keeps it (`fanout.rs`); the connection then stands where the frame leaves it.
    fn shared(&mut self, cursor: u64) -> Option<Bytes> {
        let key = FrameKey {
            start: self.next,
            max_bytes: self.max_bytes,
            cursor,
        };
        let frame = self.tail.get(&key, self.watch.tail())?;
        self.woken = false;
        self.next = frame.next;
        self.announced = frame.up_to_date;
        self.done = frame.closed;
        Some(frame.bytes)
    }

    /// The next frame of the event stream, `None` when the connection should end.
    async fn step(&mut self) -> Option<Bytes> {
        loop {
            // The connection ends between events once its lifetime is up, even on a stream that
            // never goes idle, so a CDN can collapse new readers onto fresh connections.
            if self.done {
                return None;
            }
            if Instant::now() >= self.deadline {
                return self.end();
            }
            let chunk = match self.pending.take() {
                Some(c) => c,
                // Told it is up to date at `next` and not woken since: nothing to read yet.
                None if self.announced && !self.woken => {
                    if let Err(frame) = self.sleep().await {
                        return frame.or_else(|| self.end());
                    }
                    continue;
                }
                None => {
                    // Another subscriber at the same place may have rendered it already.
                    if let Some(frame) = self.shared(self.cursor()) {
                        return Some(frame);
                    }
                    self.read().await?
                }
            };
            let chunk = self.whole_characters(chunk).await?;
            // Taken after the read (as a read's own cursor would be): a frame kept for this
            // key is what this connection would render.
            let cursor = self.cursor();
            if has_data(&chunk) {
                self.next = chunk.next;
                self.announced = chunk.up_to_date;
                self.done = chunk.closed;
                let frame = render(&chunk, self.encoding, self.max_bytes, cursor);
                let bytes = frame.bytes.clone();
                self.tail.put(frame);
                return Some(bytes);
            }
            let mut out = Vec::new();
            self.next = chunk.next;
            if chunk.closed {
                self.done = true;
                control_event(&mut out, chunk.next, None, true, true);
                return Some(Bytes::from(out));
            }
            if !self.announced {
                self.announced = true;
                control_event(&mut out, chunk.next, Some(cursor), true, false);
                return Some(Bytes::from(out));
            }
            if let Err(frame) = self.sleep().await {
                return frame.or_else(|| self.end());
            }
        }
    }

    /// Waits at the tail until the stream changes (`Ok`), or answers what ends the wait
    /// instead: the keep-alive comment, or `None` to end the connection.
    ///
    /// Parked at the stream's writer (`service/seat.rs`: the connection's loop lent its socket)
    /// the connection's loop parks the seat once this returns pending, and the writer sends
    /// the frames of new data for it while the socket takes them; the stream's change is then
    /// the writer handing the seat back (its loop having taken the seat back first). Otherwise
    /// the connection waits on the stream itself.
    async fn sleep(&mut self) -> Result<(), Option<Bytes>> {
        let parked = self.seat.enabled();
        let wait = (!parked).then(|| self.watch.wait(self.next));
        tokio::pin!(wait);
        loop {
            let woke = std::future::poll_fn(|cx| {
                // The stream first: polled alone when it is what woke the connection.
                if let Some(wait) = wait.as_mut().as_pin_mut() {
                    if wait.poll(cx).is_ready() {
                        return Poll::Ready(Woke::Stream);
                    }
                } else {
                    let settled = self.seat.settle();
                    if let Some(next) = settled.next {
                        self.next = next;
                    }
                    if let Some(at) = settled.sent {
                        self.last_sent = at;
                    }
                    if settled.done || settled.back {
                        self.done |= settled.done;
                        return Poll::Ready(Woke::Stream);
                    }
                }
                if self.timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Timer);
                }
                // The shutdown signal keeps the waker of the first poll until it fires (the
                // connection's task, the same for every poll), so after that it is only looked
                // at: polled again once it is set. The flag turns true before the signal is
                // sent, so a connection that began after the signal sees the flag.
                let down = *self.down.borrow();
                if !self.shutdown_armed || down {
                    self.shutdown_armed = true;
                    if down || self.shutdown.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Woke::Shutdown);
                    }
                }
                if parked {
                    self.seat.ask(self.next, cx.waker());
                }
                Poll::Pending
            })
            .await;
            let keepalive = self.keepalive;
            let (deadline, last_sent) = (self.deadline, self.last_sent);
            if let ControlFlow::Break(end) =
                Self::after_wake(woke, &mut self.timer, deadline, last_sent, keepalive)
            {
                if end.is_ok() {
                    self.woken = true;
                }
                return end;
            }
        }
    }

    /// What a wait of [`Sse::sleep`] does on `woke`: `Break` ends
    /// it (`Ok`: the stream woke it, read again; `Err`: the keep-alive comment to send, or
    /// `None` to end), `Continue` waits on (the timer was set for its next stop).
    fn after_wake(
        woke: Woke,
        timer: &mut Pin<Box<Sleep>>,
        deadline: Instant,
        last_sent: Instant,
        keepalive: std::time::Duration,
    ) -> ControlFlow<Result<(), Option<Bytes>>> {
        match woke {
            Woke::Stream => ControlFlow::Break(Ok(())),
            Woke::Timer => match Self::timer_fired(timer, deadline, last_sent, keepalive) {
                ControlFlow::Break(frame) => ControlFlow::Break(Err(frame)),
                ControlFlow::Continue(()) => ControlFlow::Continue(()),
            },
            Woke::Shutdown => ControlFlow::Break(Err(None)),
        }
    }

    /// The connection's `timer` fired: `Break` ends the wait (with the keep-alive comment due
    /// `keepalive` after `last_sent`, or with `None` at the `deadline`); otherwise the timer is
    /// set for its next stop.
    fn timer_fired(
        timer: &mut Pin<Box<Sleep>>,
        deadline: Instant,
        last_sent: Instant,
        keepalive: std::time::Duration,
    ) -> ControlFlow<Option<Bytes>> {
        let now = Instant::now();
        if now >= deadline {
            return ControlFlow::Break(None);
        }
        let due = last_sent + keepalive;
        if now >= due {
            // The frame's `sent` moves the timer on.
            return ControlFlow::Break(Some(Bytes::from_static(b": keep-alive\n\n")));
        }
        timer.as_mut().reset(due.min(deadline));
        ControlFlow::Continue(())
    }

    /// The last frame of a connection at its deadline: the `credential-expired` event when its
    /// token expired (the connection then ends), else none.
    fn end(&mut self) -> Option<Bytes> {
        if self.done || self.credential.is_none_or(|c| Instant::now() < c) {
            return None;
        }
        self.done = true;
        Some(Bytes::from_static(CREDENTIAL_EXPIRED_EVENT))
    }

    /// Notes a frame going out now; the timer's next stop is the keep-alive after it.
    fn sent(&mut self, now: Instant) {
        self.last_sent = now;
        let next = (now + self.keepalive).min(self.deadline);
        if self.timer.deadline() < now {
            self.timer.as_mut().reset(next);
        }
    }
}

impl Drop for Sse {
    /// The writer lets the seat go (and the socket it was lent).
    fn drop(&mut self) {
        self.seat.release();
    }
}

/// The most stream data one SSE event carries (before base64), unless one JSON message alone is
/// larger: the bound on what a slow reader's connection holds.
pub(crate) const SSE_EVENT_BYTES: u64 = 256 << 10;

/// `live=sse`: catch-up chunks, each as a data event followed by its control event, then live
/// data as it becomes durable, until the stream is closed (final control with
/// `streamClosed: true`), the connection's lifetime is up, the `credential` that admitted it
/// expires (a final `credential-expired` event), or the server shuts down.
pub(super) async fn respond(
    app: &AppState,
    name: StreamName,
    headers: &HeaderMap,
    p: ReadParams,
    expect: Option<Incarnation>,
    credential: Option<Instant>,
) -> Result<Response, ApiError> {
    let from = resume_from(headers, p.from)?;
    // Events carry at most SSE_EVENT_BYTES of data (a single larger JSON message whole), so a
    // connection whose reader is slow holds at most about one event in memory.
    let max_bytes = Some(
        p.max_bytes
            .map_or(SSE_EVENT_BYTES, |m| m.min(SSE_EVENT_BYTES)),
    );
    let slot = app.live_reader(&name)?;
    // The first read happens before the response starts, so a missing stream is still a 404.
    let first = read_chunk(
        &app.store,
        &name,
        ReadRequest {
            from,
            max_bytes,
            expect,
            whole_messages: false,
        },
    )
    .await?;
    let encoding = encoding_for(&first.content_type);
    let watch = app
        .store
        .watch(&name)
        .map_err(|e| ApiError::Store(e, Op::Read))?;
    let tail = app.tails.join(&name, &first.incarnation);
    let mut r = Reply::new(StatusCode::OK)
        .fixed(
            header::CONTENT_TYPE,
            const { HeaderValue::from_static("text/event-stream") },
        )
        .fixed(
            header::CACHE_CONTROL,
            const { HeaderValue::from_static("no-cache") },
        )
        .header(STREAM_INCARNATION, first.incarnation.as_str())
        .fixed(X_ACCEL_BUFFERING, const { HeaderValue::from_static("no") });
    if encoding == Encoding::Base64 {
        r = r.fixed(
            STREAM_SSE_DATA_ENCODING,
            const { HeaderValue::from_static("base64") },
        );
    }
    let start = Instant::now();
    let lifetime = start + app.config.sse_max_duration;
    let deadline = credential.map_or(lifetime, |c| c.min(lifetime));
    let cursor_floor = response_cursor(p.cursor, SystemTime::now());
    tail.source.get_or_init(|| Source {
        app: app.clone(),
        name: name.clone(),
        incarnation: first.incarnation.clone(),
        encoding,
    });
    let seat = Seat::new(
        tail.shared(),
        max_bytes,
        cursor_floor,
        deadline,
        first.start,
    );
    let handle = SeatHandle(seat.clone());
    let state = Sse {
        store: app.store.clone(),
        down: app.shutdown.clone(),
        keepalive: app.config.sse_keepalive,
        name,
        watch,
        tail,
        seat,
        incarnation: first.incarnation.clone(),
        encoding,
        json: is_json(&first.content_type),
        max_bytes,
        next: first.start,
        announced: false,
        cursor_floor,
        deadline,
        credential,
        timer: Box::pin(tokio::time::sleep_until(
            (start + app.config.sse_keepalive).min(deadline),
        )),
        last_sent: start,
        shutdown: Box::pin(app.shutdown_notify.clone().notified_owned()),
        shutdown_armed: false,
        done: false,
        woken: false,
        _reader: app.metrics.sse_reader(),
        pending: Some(first),
        _slot: slot,
    };
    // Boxed: the state moves into and out of every step's future, as a pointer.
    let events = futures_util::stream::unfold(Box::new(state), |mut s| async move {
        let frame = s.step().await?;
        s.sent(Instant::now());
        Some((Ok::<_, Infallible>(frame), s))
    });
    let retry = futures_util::stream::once(std::future::ready(Ok::<_, Infallible>(
        Bytes::from_static(RETRY_FRAME),
    )));
    let mut res = r.body(Body::from_stream(retry.chain(events)));
    // brook's HTTP/1.1 loop finds the seat here and lends it the socket (`service/seat.rs`).
    res.extensions_mut().insert(handle);
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// repeated is 400 `INVALID_OFFSET`, naming the header.
    #[test]
    fn last_event_id_is_an_offset() {
        let off = Offset::new(3, 4);
        let mut h = HeaderMap::new();
        assert_eq!(resume_from(&h, None).unwrap(), ReadFrom::Start);
        assert_eq!(
            resume_from(&h, Some(ReadFrom::Tail)).unwrap(),
            ReadFrom::Tail
        );
        h.insert(LAST_EVENT_ID, off.to_string().parse().unwrap());
        assert_eq!(
            resume_from(&h, Some(ReadFrom::Start)).unwrap(),
            ReadFrom::At(off)
        );
        for bad in ["", "abc", "1_2", "0000000000000001_000000000000000x"] {
            h.insert(LAST_EVENT_ID, bad.parse().unwrap());
            match resume_from(&h, Some(ReadFrom::Start)) {
                Err(ApiError::Http { code, detail, .. }) => {
                    assert_eq!(code, "INVALID_OFFSET", "{bad:?}");
                    assert!(detail.starts_with("Last-Event-ID: "), "{detail}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        h.insert(
            LAST_EVENT_ID,
            axum::http::HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        let code = |h: &HeaderMap| resume_from(h, None).err().map(|e| e.code());
        assert_eq!(code(&h), Some("INVALID_OFFSET"), "a value that is not text");
        h.insert(LAST_EVENT_ID, off.to_string().parse().unwrap());
        h.append(LAST_EVENT_ID, off.to_string().parse().unwrap());
        assert_eq!(code(&h), Some("INVALID_OFFSET"), "two values");
    }
}
