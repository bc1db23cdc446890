//! Parked SSE connections without a task.
//!
//! A parked SSE connection (`service/seat.rs`) has nothing to do until its stream's writer
//! hands it back, its keep-alive or deadline timer fires, or the server shuts down: its frames
//! are the writer's. A task sleeping for it would keep the whole connection future (the loop's
//! request reader and response writer, sized for the largest of them) and the task's header for
//! minutes. Instead, once parked, the connection's loop ends its task and leaves what the
//! connection is made of (socket, body, seat, counters: a few hundred bytes) to the connection's
//! [`Slot`]; the first wake-up spawns a task that resumes the response where it stopped and
//! then serves the connection as before.
//!
//! Every wake-up of a seated response goes through its slot: the response is polled by
//! [`Forward`] with the slot's waker, so the body's timers, the shutdown signal and the seat
//! keep that waker, whichever task polled last. While a task runs, the slot passes wake-ups to
//! it and notes them; one noted since the task's last poll began means the connection has
//! work already, and parking starts its next task at once. A slot with no task starts one at
//! its first wake-up, on the runtime that parked it (a wake-up may come from any thread).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;

/// What resumes a parked connection: spawns its task.
pub(super) type Resume = Box<dyn FnOnce(&tokio::runtime::Handle) + Send>;

/// Where a seated response's wake-ups go (see the module doc).
pub(super) struct Slot {
    /// The runtime that parked the connection.
    runtime: tokio::runtime::Handle,
    /// Who is woken.
    state: Mutex<State>,
}

/// A slot's connection: served by a task, or parked.
enum State {
    /// A task serves the connection: wake-ups go to its waker (`None` until it first polls)
    /// and set `woken`.
    Running { waker: Option<Waker>, woken: bool },
    /// Parked without a task: the first wake-up resumes it.
    Parked(Resume),
}

impl State {
    /// A task runs, or is about to, and has not polled yet.
    const fn starting() -> State {
        State::Running {
            waker: None,
            woken: false,
        }
    }
}

impl Slot {
    /// A slot for a response whose task runs now, on the current runtime.
    pub(super) fn new() -> Arc<Slot> {
        Arc::new(Slot {
            runtime: tokio::runtime::Handle::current(),
            state: Mutex::new(State::starting()),
        })
    }

    /// The connection's task ends, leaving the connection to `resume`: run at the first
    /// wake-up, or at once if a wake-up came since the task's last poll began.
    pub(super) fn park(&self, resume: Resume) {
        let mut state = self.state.lock();
        if matches!(*state, State::Running { woken: true, .. }) {
            *state = State::starting();
            drop(state);
            resume(&self.runtime);
            return;
        }
        *state = State::Parked(resume);
    }

    /// Whether a task is to be started (the connection was parked), with the resume to run.
    fn wake_up(&self) -> Option<Resume> {
        let mut state = self.state.lock();
        match std::mem::replace(&mut *state, State::starting()) {
            State::Parked(resume) => Some(resume),
            State::Running { waker, .. } => {
                if let Some(waker) = &waker {
                    waker.wake_by_ref();
                }
                *state = State::Running { waker, woken: true };
                None
            }
        }
    }

    /// A task polls the connection: its waker is the one woken from now on, and the wake-ups
    /// before this poll are spent.
    fn polled_by(&self, cx: &Context<'_>) {
        let mut state = self.state.lock();
        if let State::Running { waker, woken } = &mut *state {
            *woken = false;
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
    }
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(resume) = self.wake_up() {
            resume(&self.runtime);
        }
    }
}

/// Polls `f` with its slot's waker (see the module doc).
pub(super) struct Forward<F> {
    /// The slot.
    slot: Arc<Slot>,
    /// The slot as a waker, made once.
    waker: Waker,
    /// The response's future.
    f: F,
}

impl<F> Forward<F> {
    /// `f`, polled with `slot`'s waker.
    pub(super) fn new(slot: &Arc<Slot>, f: F) -> Forward<F> {
        Forward {
            slot: slot.clone(),
            waker: Waker::from(slot.clone()),
            f,
        }
    }
}

impl<F: Future + Unpin> Future for Forward<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.slot.polled_by(cx);
        let this = &mut *self;
        let mut forwarded = Context::from_waker(&this.waker);
        Pin::new(&mut this.f).poll(&mut forwarded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A parked slot resumes once, at its first wake-up, from a thread outside the runtime too;
    /// a wake-up that came while the task ran resumes at once when it parks.
    #[tokio::test]
    async fn a_parked_slot_resumes_at_its_first_wake_up() {
        let resumed = Arc::new(AtomicUsize::new(0));
        let resume = |resumed: &Arc<AtomicUsize>| -> Resume {
            let resumed = resumed.clone();
            Box::new(move |rt| {
                rt.spawn(async move {
                    resumed.fetch_add(1, Ordering::SeqCst);
                });
            })
        };
        let slot = Slot::new();
        let waker = Waker::from(slot.clone());
        slot.park(resume(&resumed));
        tokio::task::yield_now().await;
        assert_eq!(resumed.load(Ordering::SeqCst), 0, "resumed with no wake-up");
        let from = waker.clone();
        std::thread::spawn(move || from.wake()).join().unwrap();
        waker.wake_by_ref();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            resumed.load(Ordering::SeqCst),
            1,
            "not resumed exactly once"
        );

        // Running again (resumed): a wake-up now is noted, and parking resumes at once.
        let mut polled = Forward::new(&slot, std::future::pending::<()>());
        let noop = Waker::noop();
        assert!(
            Pin::new(&mut polled)
                .poll(&mut Context::from_waker(noop))
                .is_pending()
        );
        waker.wake_by_ref();
        slot.park(resume(&resumed));
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            resumed.load(Ordering::SeqCst),
            2,
            "a noted wake-up was lost"
        );
    }
}
