//! The live tail of a stream's SSE connections, written from one place: the stream's writer.
//!
//! An SSE connection at the tail of its stream has nothing to do until the next append, and
//! then only one thing: send the frame every other subscriber at the same place sends too
//! (`fanout.rs`). Woken one by one, a thousand connections' tasks each paid a wake-up, a poll,
//! their timer's and their stream's registrations and a trip through the body's layers for one
//! `write`. Instead, a connection served by brook's own HTTP/1.1 loop on plain TCP *parks* at
//! its stream's writer when it is told it is up to date, and its task ends (the connection
//! waits in its slot, `transport/h1/park.rs`, with no task until it is woken): on each append
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

use std::net::TcpStream;
use std::sync::Arc;
use std::task::Waker;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Offset, Watch};

/// Who may write to a seated connection's socket (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    /// The connection's own task.
    Own,
    /// The connection's task, which will park the seat once it has written what it holds.
    Asked,
    /// The stream's writer.
    Parked,
}

/// What a seat's lock guards.
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts about one connection (asked, done, handed back, listed), each set and read on its own"
)]
pub(crate) struct SeatState {
    /// Who may write.
    pub(crate) phase: Phase,
    /// A second descriptor of the socket, while the connection's loop lends it (`None`: not
    /// lent, or released).
    pub(crate) tcp: Option<TcpStream>,
    /// Where the connection's next frame starts: current while `asked` (the body asked, or the
    /// writer moved it since); otherwise the body's own place is.
    pub(crate) next: Offset,
    /// The body asked to park since it last settled: `next` is current.
    pub(crate) asked: bool,
    /// When the writer last wrote for it (taken by the connection's next settle).
    pub(crate) sent: Option<Instant>,
    /// The writer sent the stream's end: the connection ends.
    pub(crate) done: bool,
    /// The writer handed the connection back to its task, which reads at `next` itself.
    pub(crate) back: bool,
    /// The bytes of a chunk the socket did not take, for the connection's loop to write first.
    pub(crate) rest: Bytes,
    /// The connection's task, woken when the writer hands it back.
    pub(crate) waker: Option<Waker>,
    /// In the writer's list (parked now or earlier; it leaves at the writer's next pass).
    pub(crate) listed: bool,
}

/// One SSE connection's place at its stream's writer.
pub(crate) struct Seat {
    /// The feed whose writer this seat parks at.
    pub(crate) feed: Arc<dyn Feed>,
    /// The connection's `max_bytes`.
    pub(crate) max_bytes: Option<u64>,
    /// Its cursors are at least this.
    pub(crate) cursor_floor: u64,
    /// The writer hands it back from here on (its lifetime or its token ends).
    deadline: Instant,
    /// Who writes, and where the connection stands.
    pub(crate) state: Mutex<SeatState>,
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
    /// A seat at `feed` for a connection reading with `max_bytes` from `next`, its cursors at
    /// least `cursor_floor`, ending at `deadline`.
    pub(crate) fn new(
        feed: Arc<dyn Feed>,
        max_bytes: Option<u64>,
        cursor_floor: u64,
        deadline: Instant,
        next: Offset,
    ) -> Arc<Seat> {
        Arc::new(Seat {
            feed,
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

    /// Parks the seat if its body asked for it (the loop has written everything before). The
    /// writer then writes the connection's frames until it hands it back; the transport starts
    /// the writer's task when [`Parking::Start`] says it is not running.
    pub(crate) fn park(self: &Arc<Self>) -> Parking {
        let mut s = self.state.lock();
        if s.phase != Phase::Asked {
            return Parking::No;
        }
        s.phase = Phase::Parked;
        let newcomer = !std::mem::replace(&mut s.listed, true);
        drop(s);
        if newcomer && self.feed.writer().admit(self) {
            return Parking::Start;
        }
        Parking::Parked
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
            self.feed.writer().kick.notify_one();
        }
    }
}

impl SeatState {
    /// Hands the connection back to its task.
    pub(crate) fn hand_back(&mut self) -> Option<Waker> {
        self.phase = Phase::Own;
        self.back = true;
        self.listed = false;
        self.waker.clone()
    }
}

/// What a writer's task has yet to take: seats newly parked, and whether it runs at all.
#[derive(Default)]
struct Newcomers {
    /// Seats parked since the task last looked.
    seats: Vec<Arc<Seat>>,
    /// The task runs (it takes the seats, or a new one is started for them).
    running: bool,
}

/// A feed's writer: its newcomers, whether its task runs, and the signal that wakes it. The
/// task itself is the transport's (`transport/writer.rs`).
#[derive(Default)]
pub(crate) struct Writer {
    /// Seats parked since the task last looked, and whether the task runs.
    state: Mutex<Newcomers>,
    /// Wakes the task: a newcomer, or a seat let go.
    pub(crate) kick: Notify,
}

impl Writer {
    /// Adds a newly parked seat to the writer's list: whether its task is to be started (it
    /// was not running).
    fn admit(&self, seat: &Arc<Seat>) -> bool {
        let mut st = self.state.lock();
        st.seats.push(seat.clone());
        let start = !std::mem::replace(&mut st.running, true);
        drop(st);
        if !start {
            self.kick.notify_one();
        }
        start
    }

    /// Moves the seats parked since the task last looked into `seats`.
    pub(crate) fn take_newcomers(&self, seats: &mut Vec<Arc<Seat>>) {
        seats.append(&mut self.state.lock().seats);
    }

    /// Ends the task's run if no seat is left, new or old (`held` is how many it still
    /// serves): whether it ended. A seat parked meanwhile keeps it running.
    pub(crate) fn stop_if_idle(&self, held: usize) -> Idle {
        let mut st = self.state.lock();
        if !st.seats.is_empty() {
            return Idle::Newcomers;
        }
        if held == 0 {
            st.running = false;
            return Idle::Stopped;
        }
        Idle::Serving
    }
}

/// What [`Writer::stop_if_idle`] found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Idle {
    /// Seats were parked since the task last looked: it takes them now.
    Newcomers,
    /// No seat is left: the task ends.
    Stopped,
    /// It still serves seats: it waits for the stream.
    Serving,
}

/// What [`Seat::park`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Parking {
    /// The body did not ask: the seat is the connection's.
    No,
    /// Parked at a writer whose task runs.
    Parked,
    /// Parked, and the writer's task is to be started.
    Start,
}

/// What decides a frame's bytes on one feed: where it starts, the connection's `max_bytes`
/// (which bounds where its data ends) and the cursor it carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct FrameKey {
    /// Where the frame's data starts.
    pub(crate) start: Offset,
    /// The connection's `max_bytes`.
    pub(crate) max_bytes: Option<u64>,
    /// The cursor it carries.
    pub(crate) cursor: u64,
}

/// One rendered frame of a live response and the state it leaves its reader in.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    /// What it was rendered for.
    pub(crate) key: FrameKey,
    /// The offset after its data.
    pub(crate) next: Offset,
    /// It reached the durable tail.
    pub(crate) up_to_date: bool,
    /// It reached the end of a closed stream.
    pub(crate) closed: bool,
    /// The bytes, as the response's body carries them (before the transport frames them).
    pub(crate) bytes: Bytes,
}

/// Where a parked connection's frames come from: one incarnation of one stream, as a protocol
/// handler renders it (the SSE handler's `fanout::Tail`). The transport's writer task asks it
/// for frames and writes them; it never reads the store or renders itself.
pub(crate) trait Feed: Send + Sync + 'static {
    /// The writer of the seats parked at this feed.
    fn writer(&self) -> &Writer;

    /// A watch of the stream, `None` when it cannot be watched (gone, or the feed is not set
    /// up): every seat then goes back to its connection.
    fn watch(&self) -> Option<Watch>;

    /// The cursor of a frame rendered now (one per writer pass): a connection's frame carries
    /// the larger of it and the connection's floor.
    fn cursor_now(&self) -> u64;

    /// The frame for `key` given the stream's durable tail and closure `now`: `None` when
    /// there is nothing a writer may send (the read failed, or found no new data: a closure,
    /// which the connection answers itself).
    fn frame(&self, key: &FrameKey, now: Option<(Offset, bool)>) -> Option<Frame>;
}
#[cfg(test)]
mod tests {
    use super::*;

    /// A feed with no stream behind it (the seat's own rules need none).
    #[derive(Default)]
    struct Still(Writer);

    impl Feed for Still {
        fn writer(&self) -> &Writer {
            &self.0
        }

        fn watch(&self) -> Option<Watch> {
            None
        }

        fn cursor_now(&self) -> u64 {
            0
        }

        fn frame(&self, _key: &FrameKey, _now: Option<(Offset, bool)>) -> Option<Frame> {
            None
        }
    }

    /// A seat parks only after its body asked and only with a socket lent; taking it back
    /// hands over the rest of a chunk once; the body learns a place only from an ask since its
    /// last settle (a place it moved past on its own is never handed back to it).
    #[tokio::test(flavor = "current_thread")]
    async fn a_seat_parks_only_when_asked_and_reports_only_fresh_places() {
        let at = |n| Offset::new(0, n);
        let seat = Seat::new(
            Arc::new(Still::default()),
            Some(10),
            0,
            Instant::now(),
            at(0),
        );
        let waker = std::task::Waker::noop();
        seat.ask(at(3), waker);
        assert_eq!(
            seat.park(),
            Parking::No,
            "no socket lent: the body waits on the stream"
        );
        assert!(seat.settle().next.is_none());

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let _peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        seat.enable(server);
        assert!(seat.enabled());
        assert_eq!(seat.park(), Parking::No, "not asked");
        seat.ask(at(3), waker);
        assert_eq!(
            seat.park(),
            Parking::Start,
            "the first seat starts the writer"
        );
        assert_eq!(seat.park(), Parking::No, "parked once");
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
        assert_eq!(seat.park(), Parking::No, "released: never parked again");
    }
}
