//! The writer task of a feed's parked connections (the seats of `service/seat.rs`): while any
//! seat is parked, it waits for the stream to move past the lowest place a seat is at, asks the
//! feed for each seat's next frame (once per key per pass), frames it as an HTTP/1.1 chunk and
//! writes it to every parked socket that takes it without waiting. What a socket does not take
//! whole, what does not reach the tail and what ends the stream goes back to the connection's
//! own task (see the seat's module doc for who writes when).
//!
//! This is the only place besides the HTTP/1.1 loop that writes to a connection's socket, and
//! it writes only under the seat's lock while the seat is parked.

use std::io::Write as _;
use std::sync::Arc;
use std::task::Waker;

use bytes::Bytes;
use tokio::time::Instant;

use crate::Offset;
use crate::http::service::seat::{Feed, Frame, FrameKey, Idle, Phase, Seat};

/// How many seats a writer serves before it lets the worker's other tasks run.
const YIELD_EVERY: usize = 256;

/// Starts the writer task of `feed` (its first seat parked: [`Parking::Start`]).
///
/// [`Parking::Start`]: crate::http::service::seat::Parking::Start
pub(crate) fn start(feed: Arc<dyn Feed>) {
    tokio::spawn(run(feed));
}

/// A frame and its chunked framing, made once per pass for every seat with its key.
struct Ready {
    /// The frame.
    frame: Frame,
    /// `{len:x}\r\n{frame}\r\n`: what is written to each socket.
    chunk: Bytes,
}

impl Ready {
    /// `frame` in the chunked framing of a response body.
    fn new(frame: Frame) -> Ready {
        // The size line is at most 16 hex digits.
        let mut chunk = Vec::with_capacity(frame.bytes.len() + 20);
        super::h1::extend_hex(&mut chunk, frame.bytes.len());
        chunk.extend_from_slice(b"\r\n");
        chunk.extend_from_slice(&frame.bytes);
        chunk.extend_from_slice(b"\r\n");
        Ready {
            frame,
            chunk: Bytes::from(chunk),
        }
    }
}

/// One pass's view: the stream's tail, the time, and the frames framed so far.
struct Pass<'a> {
    /// Where the frames come from.
    feed: &'a dyn Feed,
    /// The durable tail and closure (`None`: the stream cannot be read).
    now: Option<(Offset, bool)>,
    /// The time of the pass.
    at: Instant,
    /// The cursor of the frames rendered in this pass (before each connection's floor).
    cursor: u64,
    /// The frames of this pass: (key, frame or `None` when there is none to send).
    frames: Vec<(FrameKey, Option<Ready>)>,
    /// Tasks to wake once the pass lets go of the seats' locks.
    wake: Vec<Waker>,
}

impl Pass<'_> {
    /// Serves one parked seat: writes its next frame if the socket takes it whole. Where the
    /// seat stands if it stays parked; `None` when it left the writer's list.
    fn serve(&mut self, seat: &Seat) -> Option<Offset> {
        let mut s = seat.state.lock();
        if s.phase != Phase::Parked {
            s.listed = false;
            return None;
        }
        let Some((tail, closed)) = self.now else {
            self.wake.extend(s.hand_back());
            return None;
        };
        if s.next == tail && !closed {
            return Some(s.next);
        }
        if self.at >= seat.deadline() {
            self.wake.extend(s.hand_back());
            return None;
        }
        let key = FrameKey {
            start: s.next,
            max_bytes: seat.max_bytes,
            cursor: self.cursor.max(seat.cursor_floor),
        };
        let i = if let Some(i) = self.frames.iter().position(|(k, _)| *k == key) {
            i
        } else {
            let ready = self.feed.frame(&key, self.now).map(Ready::new);
            self.frames.push((key, ready));
            self.frames.len() - 1
        };
        let Some(ready) = self.frames.get(i).and_then(|(_, r)| r.as_ref()) else {
            self.wake.extend(s.hand_back());
            return None;
        };
        // A frame short of the tail may need the connection's care (a text chunk cut inside
        // a character is read again shorter), and more follows it: the connection's own.
        let (Some(tcp), true) = (&s.tcp, ready.frame.up_to_date) else {
            self.wake.extend(s.hand_back());
            return None;
        };
        // A socket that is full (or broken) takes nothing: the connection's own write waits
        // (or fails) as it always did.
        if let Ok(n) = (&*tcp).write(&ready.chunk) {
            s.next = ready.frame.next;
            s.sent = Some(self.at);
            s.done = ready.frame.closed;
            if n < ready.chunk.len() {
                s.rest = ready.chunk.slice(n..);
            } else if !s.done {
                return Some(s.next);
            }
        }
        self.wake.extend(s.hand_back());
        None
    }
}

/// A writer's task: while any seat is parked, waits for the stream to move past the lowest
/// place a seat is at (or for a newcomer, or a seat let go), then serves every parked seat.
/// Ends when no seat is left.
async fn run(feed: Arc<dyn Feed>) {
    let writer = feed.writer();
    // `None` when the stream cannot be watched (gone): the first pass hands every seat back.
    let watch = feed.watch();
    let mut seats: Vec<Arc<Seat>> = Vec::new();
    let mut frames = Vec::new();
    let mut wake = Vec::new();
    loop {
        writer.take_newcomers(&mut seats);
        let mut pass = Pass {
            feed: &*feed,
            now: watch.as_ref().and_then(crate::Watch::tail),
            at: Instant::now(),
            cursor: feed.cursor_now(),
            frames: std::mem::take(&mut frames),
            wake: std::mem::take(&mut wake),
        };
        let mut lowest: Option<Offset> = None;
        let mut i = 0;
        let mut served = 0usize;
        while i < seats.len() {
            if let Some(next) = pass.serve(&seats[i]) {
                lowest = Some(lowest.map_or(next, |l| l.min(next)));
                i += 1;
            } else {
                seats.swap_remove(i);
            }
            served += 1;
            if served.is_multiple_of(YIELD_EVERY) {
                // A long pass lets the worker's other tasks (the seats handed back among them)
                // run between its batches.
                for w in pass.wake.drain(..) {
                    w.wake();
                }
                tokio::task::yield_now().await;
            }
        }
        frames = pass.frames;
        frames.clear();
        wake = pass.wake;
        for w in wake.drain(..) {
            w.wake();
        }
        match writer.stop_if_idle(seats.len()) {
            Idle::Newcomers => continue,
            Idle::Stopped => return,
            Idle::Serving => {}
        }
        let (Some(at), Some(w)) = (lowest, watch.as_ref()) else {
            continue;
        };
        tokio::select! {
            biased;
            () = w.wait(at) => {}
            () = writer.kick.notified() => {}
        }
    }
}
