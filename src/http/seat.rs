//! The live tail of a stream's SSE connections, written from one place: the stream's writer.
//!
//! An SSE connection at the tail of its stream has nothing to do until the next append, and
//! then only one thing: send the frame every other subscriber at the same place sends too
//! (`fanout.rs`). Woken one by one, a thousand connections' tasks each paid a wake-up, a poll,
//! their timer's and their stream's registrations and a trip through the body's layers for one
//! `write`. Instead, a connection served by brook's own HTTP/1.1 loop on plain TCP *parks* at
//! its stream's writer when it is told it is up to date, and its task sleeps: on each append
//! the writer task (one per stream incarnation with parked connections) renders the frame
//! once, in its chunked framing, and writes it to every parked connection's socket that
//! accepts it without waiting (one non-blocking `send` each, through a second descriptor of
//! the socket that the connection's loop lends for as long as its response lasts). Everything
//! else goes back to the connection's own task, which serves it as it always did:
//!
//! * a socket that takes only part of the frame (its rest is written by the connection's task,
//!   before anything else, with the write-stall guard of `socket.rs`) or none of it;
//! * a frame that does not reach the tail (the connection reads the rest itself), a stream
//!   closed with no new data, deleted, recreated or expired (its own read ends it the way it
//!   always did), a connection past its deadline;
//! * a frame that ends the stream (written here; the connection then ends its body);
//! * its keep-alive timer and the server's shutdown, which wake the connection's task as
//!   before: its loop takes the connection back first.
//!
//! **Who writes.** A [`Seat`] is one connection's place here; its lock decides who may write to
//! the socket. `Own`: the connection's task (the normal path). `Asked`: the body found nothing to
//! send and would sleep; the loop, once it has written everything before, parks the seat
//! ([`Seat::park`]): `Parked`, and only the writer writes, under the seat's lock. Any wake-up of
//! the connection's task makes its loop take the seat back ([`Seat::reclaim`], `Own` again)
//! before it polls the body or writes, so the two never write at the same time and frames
//! leave in order. The writer hands a seat back by setting `back` and waking the task.
//!
//! Only what a connection's own read would send is written: frames come from the durable view
//! (`Tail::get` or a read of it), reach the stream's tail, and are keyed by the connection's
//! place, `max_bytes` and cursor like every shared frame.

use std::io::Write as _;
use std::net::TcpStream;
use std::sync::Arc;
use std::task::Waker;
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Incarnation, Offset, ReadFrom, ReadRequest, StreamName};

use super::AppState;
use super::cursor::interval_at;
use super::fanout::{Frame, FrameKey, Tail};
use super::read::{has_data, read_woken};
use super::sse::{Encoding, render};

/// Who may write to a seated connection's socket (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// The connection's own task.
    Own,
    /// The connection's task, which will park the seat once it has written what it holds.
    Asked,
    /// The stream's writer.
    Parked,
}

/// How many seats a writer serves before it lets the worker's other tasks run.
const YIELD_EVERY: usize = 256;

/// What a seat's lock guards.
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts about one connection (asked, done, handed back, listed), each set and read on its own"
)]
struct SeatState {
    /// Who may write.
    phase: Phase,
    /// A second descriptor of the socket, while the connection's loop lends it (`None`: not
    /// lent, or released).
    tcp: Option<TcpStream>,
    /// Where the connection's next frame starts: current while `asked` (the body asked, or the
    /// writer moved it since); otherwise the body's own place is.
    next: Offset,
    /// The body asked to park since it last settled: `next` is current.
    asked: bool,
    /// When the writer last wrote for it (taken by the connection's next settle).
    sent: Option<Instant>,
    /// The writer sent the stream's end: the connection ends.
    done: bool,
    /// The writer handed the connection back to its task, which reads at `next` itself.
    back: bool,
    /// The bytes of a chunk the socket did not take, for the connection's loop to write first.
    rest: Bytes,
    /// The connection's task, woken when the writer hands it back.
    waker: Option<Waker>,
    /// In the writer's list (parked now or earlier; it leaves at the writer's next pass).
    listed: bool,
}

/// One SSE connection's place at its stream's writer.
pub(crate) struct Seat {
    /// The tail whose writer this seat parks at.
    tail: Arc<Tail>,
    /// The connection's `max_bytes`.
    max_bytes: Option<u64>,
    /// Its cursors are at least this.
    cursor_floor: u64,
    /// The writer hands it back from here on (its lifetime or its token ends).
    deadline: Instant,
    /// Who writes, and where the connection stands.
    state: Mutex<SeatState>,
}

/// A response's seat, found by brook's HTTP/1.1 loop in the response's extensions.
#[derive(Clone)]
pub(crate) struct SeatHandle(pub(crate) Arc<Seat>);

/// What the writer did for a connection while it was parked.
pub(crate) struct Settled {
    /// Where its next frame starts (`None`: the body's own `next` stands; it did not ask to
    /// park since it last settled).
    pub(crate) next: Option<Offset>,
    /// When the writer last wrote for it, if it did.
    pub(crate) sent: Option<Instant>,
    /// The stream's end was sent.
    pub(crate) done: bool,
    /// Handed back: the connection reads at `next` itself.
    pub(crate) back: bool,
}

impl Seat {
    /// A seat at `tail` for a connection reading with `max_bytes` from `next`, its cursors at
    /// least `cursor_floor`, ending at `deadline`.
    pub(crate) fn new(
        tail: Arc<Tail>,
        max_bytes: Option<u64>,
        cursor_floor: u64,
        deadline: Instant,
        next: Offset,
    ) -> Arc<Seat> {
        Arc::new(Seat {
            tail,
            max_bytes,
            cursor_floor,
            deadline,
            state: Mutex::new(SeatState {
                phase: Phase::Own,
                tcp: None,
                next,
                asked: false,
                sent: None,
                done: false,
                back: false,
                rest: Bytes::new(),
                waker: None,
                listed: false,
            }),
        })
    }

    /// When the connection ends (its lifetime or its token's): its loop gives up a write
    /// still waiting for the peer then.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Lends the connection's socket: from now on the body parks (brook's HTTP/1.1 loop on
    /// plain TCP calls this before the body's first poll; no other path does).
    pub(crate) fn enable(&self, tcp: TcpStream) {
        self.state.lock().tcp = Some(tcp);
    }

    /// Whether the connection's loop lent its socket (the body then parks instead of waiting).
    pub(crate) fn enabled(&self) -> bool {
        self.state.lock().tcp.is_some()
    }

    /// The body would sleep at `next`: asks its loop to park it, and to wake `waker` when the
    /// writer hands it back.
    pub(crate) fn ask(&self, next: Offset, waker: &Waker) {
        let mut s = self.state.lock();
        if s.tcp.is_none() {
            return;
        }
        s.phase = Phase::Asked;
        s.next = next;
        s.asked = true;
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
    }

    /// Parks the seat if its body asked for it (the loop has written everything before):
    /// whether it did. The writer then writes the connection's frames until it hands it back.
    pub(crate) fn park(self: &Arc<Self>) -> bool {
        let mut s = self.state.lock();
        if s.phase != Phase::Asked {
            return false;
        }
        s.phase = Phase::Parked;
        let newcomer = !std::mem::replace(&mut s.listed, true);
        drop(s);
        if newcomer {
            self.tail.writer.admit(self);
        }
        true
    }

    /// Takes the connection back for its own task (after any wake-up, before the loop writes
    /// or polls the body): the bytes of a chunk the writer left unfinished, to be written
    /// first.
    pub(crate) fn reclaim(&self) -> Bytes {
        let mut s = self.state.lock();
        s.phase = Phase::Own;
        std::mem::take(&mut s.rest)
    }

    /// What the writer did while the connection was parked; the seat is the connection's.
    pub(crate) fn settle(&self) -> Settled {
        let mut s = self.state.lock();
        s.phase = Phase::Own;
        Settled {
            next: std::mem::take(&mut s.asked).then_some(s.next),
            sent: s.sent.take(),
            done: s.done,
            back: std::mem::take(&mut s.back),
        }
    }

    /// The connection ends: the socket is no longer lent, and the writer lets the seat go.
    pub(crate) fn release(&self) {
        let mut s = self.state.lock();
        s.phase = Phase::Own;
        s.tcp = None;
        s.waker = None;
        let listed = s.listed;
        drop(s);
        if listed {
            // Its next pass drops the seat (and ends the writer when no seat is left).
            self.tail.writer.kick.notify_one();
        }
    }
}

impl SeatState {
    /// Hands the connection back to its task.
    fn hand_back(&mut self) -> Option<Waker> {
        self.phase = Phase::Own;
        self.back = true;
        self.listed = false;
        self.waker.clone()
    }
}

/// What the writer reads and renders with, fixed per tail (set by its first connection).
pub(crate) struct Source {
    /// The server.
    pub(crate) app: AppState,
    /// The stream.
    pub(crate) name: StreamName,
    /// Its incarnation (a read that finds another hands the seats back).
    pub(crate) incarnation: Incarnation,
    /// How its data events carry bytes.
    pub(crate) encoding: Encoding,
}

/// What a writer's task has yet to take: seats newly parked, and whether it runs at all.
#[derive(Default)]
struct Newcomers {
    /// Seats parked since the task last looked.
    seats: Vec<Arc<Seat>>,
    /// The task runs (it takes the seats, or a new one is started for them).
    running: bool,
}

/// A tail's writer: its newcomers, whether its task runs, and the signal that wakes it.
#[derive(Default)]
pub(crate) struct Writer {
    /// What it reads and renders with.
    pub(crate) source: std::sync::OnceLock<Source>,
    /// Seats parked since the task last looked, and whether the task runs.
    state: Mutex<Newcomers>,
    /// Wakes the task: a newcomer, or a seat let go.
    kick: Notify,
}

impl Writer {
    /// Adds a newly parked seat to the writer's list, starting the writer's task if it is not
    /// running.
    fn admit(&self, seat: &Arc<Seat>) {
        let mut st = self.state.lock();
        st.seats.push(seat.clone());
        let start = !std::mem::replace(&mut st.running, true);
        drop(st);
        if start {
            tokio::spawn(run(seat.tail.clone()));
        } else {
            self.kick.notify_one();
        }
    }
}

/// A frame and its chunked framing, rendered once per pass for every seat with its key.
struct Ready {
    /// The frame.
    frame: Frame,
    /// `{len:x}\r\n{frame}\r\n`: what is written to each socket.
    chunk: Bytes,
}

/// The frame for `key` in its chunked framing: one kept by the tail, else read from the
/// durable view and rendered (and kept for the others). `None` when there is nothing a writer
/// may send: the read failed, or found no new data (a closure, which the connection answers).
fn frame_for(
    tail: &Tail,
    source: &Source,
    key: &FrameKey,
    now: Option<(Offset, bool)>,
) -> Option<Ready> {
    let frame = if let Some(f) = tail.get(key, now) {
        f
    } else {
        let req = ReadRequest {
            from: ReadFrom::At(key.start),
            max_bytes: key.max_bytes,
            expect: Some(source.incarnation.clone()),
            whole_messages: false,
        };
        let chunk = read_woken(&source.app, &source.name, &req).ok()?;
        if !has_data(&chunk) {
            return None;
        }
        let frame = render(&chunk, source.encoding, key.max_bytes, key.cursor);
        tail.share(frame.clone());
        frame
    };
    // The size line is at most 16 hex digits.
    let mut chunk = Vec::with_capacity(frame.bytes.len() + 20);
    super::h1::extend_hex(&mut chunk, frame.bytes.len());
    chunk.extend_from_slice(b"\r\n");
    chunk.extend_from_slice(&frame.bytes);
    chunk.extend_from_slice(b"\r\n");
    Some(Ready {
        frame,
        chunk: Bytes::from(chunk),
    })
}

/// One pass's view: the stream's tail, the time, and the frames rendered so far.
struct Pass<'a> {
    /// The tail.
    tail: &'a Tail,
    /// What it reads with.
    source: &'a Source,
    /// The durable tail and closure (`None`: the stream cannot be read).
    now: Option<(Offset, bool)>,
    /// The time of the pass.
    at: Instant,
    /// The current cursor interval.
    interval: u64,
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
        if self.at >= seat.deadline {
            self.wake.extend(s.hand_back());
            return None;
        }
        let key = FrameKey {
            start: s.next,
            max_bytes: seat.max_bytes,
            cursor: self.interval.max(seat.cursor_floor),
        };
        let i = if let Some(i) = self.frames.iter().position(|(k, _)| *k == key) {
            i
        } else {
            let ready = frame_for(self.tail, self.source, &key, self.now);
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
async fn run(tail: Arc<Tail>) {
    let Some(source) = tail.writer.source.get() else {
        // Never so: a tail's first connection sets its source before it has a seat. Were it
        // so, every seat goes back to its connection.
        let mut st = tail.writer.state.lock();
        st.running = false;
        let seats = std::mem::take(&mut st.seats);
        drop(st);
        for seat in seats {
            let waker = seat.state.lock().hand_back();
            if let Some(w) = waker {
                w.wake();
            }
        }
        return;
    };
    // `None` when the stream cannot be watched (gone): the first pass hands every seat back.
    let watch = source.app.store.watch(&source.name).ok();
    let mut seats: Vec<Arc<Seat>> = Vec::new();
    let mut frames = Vec::new();
    let mut wake = Vec::new();
    loop {
        seats.append(&mut tail.writer.state.lock().seats);
        let mut pass = Pass {
            tail: &tail,
            source,
            now: watch.as_ref().and_then(crate::Watch::tail),
            at: Instant::now(),
            interval: interval_at(SystemTime::now()),
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
        {
            let mut st = tail.writer.state.lock();
            if !st.seats.is_empty() {
                continue;
            }
            if seats.is_empty() {
                st.running = false;
                return;
            }
        }
        let (Some(at), Some(w)) = (lowest, watch.as_ref()) else {
            continue;
        };
        tokio::select! {
            biased;
            () = w.wait(at) => {}
            () = tail.writer.kick.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::fanout::Tails;

    /// A seat parks only after its body asked and only with a socket lent; taking it back
    /// hands over the rest of a chunk once; the body learns a place only from an ask since its
    /// last settle (a place it moved past on its own is never handed back to it).
    #[tokio::test(flavor = "current_thread")]
    async fn a_seat_parks_only_when_asked_and_reports_only_fresh_places() {
        let tails = std::sync::Arc::new(Tails::default());
        let name = StreamName::new("s").expect("valid");
        let inc = Incarnation::new("i1").expect("valid");
        let tail = tails.join(&name, &inc);
        let at = |n| Offset::new(0, n);
        let seat = Seat::new(tail.shared(), Some(10), 0, Instant::now(), at(0));
        let waker = std::task::Waker::noop();
        seat.ask(at(3), waker);
        assert!(!seat.park(), "no socket lent: the body waits on the stream");
        assert!(seat.settle().next.is_none());

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let _peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        seat.enable(server);
        assert!(seat.enabled());
        assert!(!seat.park(), "not asked");
        seat.ask(at(3), waker);
        assert!(seat.park());
        assert!(!seat.park(), "parked once");
        {
            let mut s = seat.state.lock();
            s.next = at(7);
            s.rest = Bytes::from_static(b"rest");
        }
        assert_eq!(&seat.reclaim()[..], b"rest");
        assert!(seat.reclaim().is_empty(), "the rest is taken once");
        let settled = seat.settle();
        assert_eq!(settled.next, Some(at(7)));
        assert!(!settled.back && !settled.done);
        // The body moves on by itself; its next settle must not move it back.
        assert!(seat.settle().next.is_none());
        seat.release();
        assert!(!seat.enabled());
        seat.ask(at(9), waker);
        assert!(!seat.park(), "released: never parked again");
    }
}
