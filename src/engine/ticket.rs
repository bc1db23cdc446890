//! Durability tickets and the batches they wait on.
//!
//! Every accepted write returns a [`Ticket`] inside its `Pending`: the caller acknowledges only
//! once the ticket resolves, so nothing is acknowledged before it is durable (write-path step 5).
//! A ticket resolves to `Err(Error::Poisoned)`, carrying the shard's first failure, if its shard
//! was poisoned before the ticket's record reached the journal (nothing of it is stored), and to
//! `Err(Error::OutcomeUnknown)` if its batch reached the journal file and a later step failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use event_listener::{Event, EventListener, Listener};

use crate::error::Result;

use super::journal::shard::Shard;

/// [`Batch::state`] before the batch is committed.
const PENDING: u8 = 0;
/// [`Batch::state`] once the batch is durable.
const DURABLE: u8 = 1;
/// [`Batch::state`] once the batch failed before any of it stayed in the journal.
const FAILED: u8 = 2;
/// [`Batch::state`] once the batch failed after it was written to the journal file.
const UNKNOWN: u8 = 3;

/// Buffered mode: how many times a blocking writer whose batch another thread is committing
/// yields and looks again before it sleeps (see [`Ticket::wait`]).
const INLINE_SPINS: usize = 16;

/// The completion of one journal batch: every record in it becomes durable (or fails) at once,
/// so only the writers waiting on this batch are woken when it is synced.
pub(super) struct Batch {
    /// [`PENDING`], then [`DURABLE`] or [`FAILED`], set once.
    state: AtomicU8,
    event: Event,
    /// Set before anyone listens to `event`: a batch whose only writer committed it itself (a
    /// Buffered append on a quiet shard) is finished without a notify, which would allocate the
    /// event's listener list for nobody. Sequentially consistent with `state`: a finisher that
    /// sees no listener stored its state before the listener's last look at it.
    listened: AtomicBool,
}

impl Batch {
    /// A new, pending batch signal (the queue's batch now forming).
    pub(super) fn new() -> Arc<Batch> {
        Arc::new(Batch {
            state: AtomicU8::new(PENDING),
            event: Event::new(),
            listened: AtomicBool::new(false),
        })
    }

    /// The signal for the next batch: `spare` (a finished batch) made pending again when no
    /// one holds it any more (its writers all saw it finish and let go), else a new one. A
    /// writer that commits its own appends one at a time then allocates no signal.
    pub(super) fn renew(spare: &mut Option<Arc<Batch>>) -> Arc<Batch> {
        if let Some(mut b) = spare.take()
            && let Some(unheld) = Arc::get_mut(&mut b)
        {
            unheld.state = AtomicU8::new(PENDING);
            unheld.event = Event::new();
            unheld.listened = AtomicBool::new(false);
            return b;
        }
        Batch::new()
    }

    /// Marks the batch durable (`ok`) or failed and wakes its writers. On failure the shard's
    /// cause must already be recorded, so a woken writer finds it.
    pub(super) fn finish(&self, ok: bool) {
        self.state
            .store(if ok { DURABLE } else { FAILED }, Ordering::SeqCst);
        self.wake();
    }

    /// Wakes the batch's listeners, if any registered.
    fn wake(&self) {
        if self.listened.load(Ordering::SeqCst) {
            self.event.notify(usize::MAX);
        }
    }

    /// Marks the batch failed after its records were written to the journal file (they may be
    /// replayed after a restart) and wakes its writers. The shard's cause must be recorded.
    pub(super) fn finish_unknown(&self) {
        self.state.store(UNKNOWN, Ordering::SeqCst);
        self.wake();
    }
}

/// A durability ticket: what a caller must see durable before acknowledging. A writer's ticket
/// names its batch; a ticket for state read from the stream names an LSN.
pub(crate) struct Ticket {
    shard: Arc<Shard>,
    /// The LSN just past the record (or the staged state) this ticket waits for.
    pub(super) lsn: u64,
    /// The batch the record was queued in; `None` for a ticket on already staged state.
    batch: Option<Arc<Batch>>,
}

impl Ticket {
    /// The ticket of a record queued at `lsn` in `batch`.
    pub(super) fn for_batch(shard: Arc<Shard>, lsn: u64, batch: Arc<Batch>) -> Ticket {
        Ticket {
            shard,
            lsn,
            batch: Some(batch),
        }
    }

    /// A ticket on state staged up to `lsn`: resolves once the shard is durable that far.
    pub(super) fn for_lsn(shard: Arc<Shard>, lsn: u64) -> Ticket {
        Ticket {
            shard,
            lsn,
            batch: None,
        }
    }

    /// The outcome, if it is known yet: durable, or the shard's poisoning.
    fn poll(&self) -> Option<Result<()>> {
        if let Some(b) = &self.batch {
            return match b.state.load(Ordering::SeqCst) {
                PENDING => None,
                DURABLE => Some(Ok(())),
                UNKNOWN => Some(Err(match self.shard.poisoned_error() {
                    crate::Error::Poisoned { source } => crate::Error::OutcomeUnknown { source },
                    other => other,
                })),
                _ => Some(Err(self.shard.poisoned_error())),
            };
        }
        if self.shard.durable_lsn.load(Ordering::Acquire) >= self.lsn {
            return Some(Ok(()));
        }
        self.shard.poisoned().map(Err)
    }

    /// A listener for the event that resolves this ticket: its batch's, or the shard's durable
    /// LSN advancing.
    fn listen(&self) -> EventListener {
        match &self.batch {
            Some(b) => {
                b.listened.store(true, Ordering::SeqCst);
                b.event.listen()
            }
            None => self.shard.durable.listen(),
        }
    }

    /// Buffered mode: commits the batch on this thread unless another one is at it.
    fn help(&self) {
        if self.batch.is_some() && self.shard.inline && self.poll().is_none() {
            self.shard.commit_inline();
        }
    }

    /// The outcome if there is one, else a listener registered before a last look (so no
    /// completion can slip between the look and the sleep).
    fn outcome_or_listener(&self) -> std::result::Result<Result<()>, EventListener> {
        if let Some(r) = self.poll() {
            return Ok(r);
        }
        let l = self.listen();
        match self.poll() {
            Some(r) => Ok(r),
            None => Err(l),
        }
    }

    /// Blocks until the ticket's record (or state) is durable; `Err(Poisoned)` if it never will
    /// be. This thread commits the batch itself first (steps 3 to 5) unless another thread is
    /// committing.
    pub(crate) fn wait(&self) -> Result<()> {
        self.help();
        if self.batch.is_some() && !self.shard.inline && self.poll().is_none() {
            // Sync mode: a thread that blocks anyway commits the batch (the sync included)
            // itself when no one else is at it, sparing the hand-off to the shard thread and
            // back (two wakeups per append with one writer). Async waiters leave it to the
            // shard thread: a sync must not block a runtime's worker.
            self.shard.commit_here();
        }
        if self.batch.is_some() && self.shard.inline {
            // Buffered mode, another thread committing: it finishes within microseconds (a
            // `write` and the batch's apply), so give it the CPU and look again, committing
            // what it left, before sleeping on the batch's event. Parking and waking every
            // writer of a batch cost more than the commit itself when many threads append.
            for _ in 0..INLINE_SPINS {
                if let Some(r) = self.poll() {
                    return r;
                }
                std::thread::yield_now();
                self.shard.commit_inline();
            }
        }
        loop {
            match self.outcome_or_listener() {
                Ok(r) => return r,
                Err(l) => l.wait(),
            }
        }
    }

    /// [`Ticket::wait`] without blocking a thread while the sync is in flight.
    pub(crate) async fn wait_async(&self) -> Result<()> {
        self.help();
        loop {
            match self.outcome_or_listener() {
                Ok(r) => return r,
                Err(l) => l.await,
            }
        }
    }
}

impl Drop for Ticket {
    /// A write nobody waits for is committed now, not when the shard thread next looks.
    fn drop(&mut self) {
        self.help();
    }
}
