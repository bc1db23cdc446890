//! Group commit, the journal's write barrier: writers enqueue their records (each under its
//! stream's `core` lock, so queue order is check order) and hold a ticket; one thread at a time
//! takes everything queued as one batch and commits it (`Shard::commit`: one journal write and,
//! in Sync mode, one `fdatasync` for the whole batch, on any number of streams), then finishes the
//! batch's signal for every ticket in it. Who commits: in Sync mode a writer blocking on its
//! ticket commits what is queued on its own thread when no one else is, and the shard thread
//! does otherwise; in Buffered mode the writer commits inline and the shard thread only takes
//! the stragglers. A failed batch fails every ticket in it, and how it failed (cut back off the
//! journal, or maybe in it) decides whether the shard heals or stays poisoned.

use std::sync::Arc;

use crate::engine::journal::Record;
use crate::error::{Error, Result};

use super::super::stream::Stream;
use super::super::ticket::{Batch, Ticket};
use super::shard::{Shard, Writer};

/// A record waiting in the queue, with the LSN just past its frame.
pub(in crate::engine) struct Queued {
    pub(in crate::engine) stream: Arc<Stream>,
    pub(in crate::engine) record: Record,
    pub(in crate::engine) lsn: u64,
}

/// What writers hand to the committer; guarded by the shard lock (`Shard::queue`).
pub(in crate::engine) struct Queue {
    /// The encoded frames of `items`, in order: the next batch's bytes.
    pub(in crate::engine) buf: Vec<u8>,
    pub(in crate::engine) items: Vec<Queued>,
    /// The completion signal of the batch now forming.
    pub(in crate::engine) batch: Arc<Batch>,
    /// The LSN just past the last queued frame.
    pub(super) next_lsn: u64,
    pub(in crate::engine) shutdown: bool,
    /// Checkpoints asked for by `Engine::checkpoint` (a count; see `Shard::checkpointed`).
    pub(super) checkpoint_requests: u64,
    /// A writer committing its own batch found a checkpoint due (Buffered mode).
    pub(super) checkpoint_due: bool,
    /// The shard thread sleeps until a push wakes it (Buffered mode: writers commit their own
    /// batches, so only the first push after an idle spell wakes the thread).
    pub(in crate::engine) idle: bool,
    /// Buffered mode: looks in a row at an empty queue (one per [`LINGER`](super::shard::LINGER)); at
    /// [`QUIET_LOOKS`](super::shard::QUIET_LOOKS) the thread goes `idle`.
    pub(in crate::engine) quiet: u32,
}

impl Shard {
    /// Encodes and enqueues a record (step 2's end); returns its ticket. Called with the
    /// stream's `core` held, so the record's place in the journal is its place in check order.
    ///
    /// A refused record's staged change stays in its stream's staged state: the stream is noted
    /// for [`Shard::heal`] to roll back.
    pub(in crate::engine) fn push(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        record: Record,
    ) -> Result<Ticket> {
        let mut q = self.queue.lock();
        if self.failed() {
            drop(q);
            // Refused before the queue: its only effect is on the stream's staged state.
            self.note_failed(stream, None);
            return Err(self.poisoned_error());
        }
        if q.shutdown {
            return Err(Error::ShutDown);
        }
        let len = record.encode_frame(&mut q.buf) as u64;
        q.next_lsn += len;
        let lsn = q.next_lsn;
        q.items.push(Queued {
            stream: stream.clone(),
            record,
            lsn,
        });
        let batch = q.batch.clone();
        let wake = !self.inline || std::mem::take(&mut q.idle);
        drop(q);
        if wake {
            self.wake.notify_one();
        }
        Ok(Ticket::for_batch(self.clone(), lsn, batch))
    }

    /// A ticket for state already staged up to `lsn` (a refusal, a duplicate, an idempotent
    /// create): durable once the shard's durable LSN reaches it.
    pub(in crate::engine) fn ticket(self: &Arc<Self>, lsn: u64) -> Ticket {
        Ticket::for_lsn(self.clone(), lsn)
    }

    /// Buffered mode: commits the queue on the caller's thread unless another thread is
    /// committing (which then commits what was queued meanwhile, too). A checkpoint found due is
    /// handed to the shard thread, which rotates the journal.
    pub(in crate::engine) fn commit_inline(&self) {
        loop {
            let Some(mut w) = self.writer.try_lock() else {
                return;
            };
            self.drain(&mut w);
            let due = self.checkpoint_due(&w);
            drop(w);
            let mut q = self.queue.lock();
            if due && !q.checkpoint_due && !self.checkpoints.lock().busy {
                q.checkpoint_due = true;
                drop(q);
                self.wake.notify_one();
                return;
            }
            if q.items.is_empty() {
                return;
            }
        }
    }

    /// Sync mode, a writer blocking on its ticket: commits what is queued once, sync included,
    /// on the caller's thread, unless another thread is committing. The shard thread (woken by
    /// the enqueue) finds the queue empty, or commits what came after, and still starts the
    /// checkpoints.
    pub(in crate::engine) fn commit_here(&self) {
        if let Some(mut w) = self.writer.try_lock() {
            self.drain(&mut w);
        }
    }

    /// Commits everything queued as one batch (steps 3 to 5) and finishes the batch's signal:
    /// durable, or failed if the shard is (or becomes) poisoned. False when the queue was empty.
    pub(in crate::engine) fn drain(&self, w: &mut Writer) -> bool {
        let (buf, items, batch) = {
            let mut q = self.queue.lock();
            if q.items.is_empty() {
                return false;
            }
            w.spare_buf.clear();
            let buf = std::mem::replace(&mut q.buf, std::mem::take(&mut w.spare_buf));
            let items = std::mem::replace(&mut q.items, std::mem::take(&mut w.spare_items));
            let batch = std::mem::replace(&mut q.batch, Batch::renew(&mut w.spare_batch));
            (buf, items, batch)
        };
        if self.failed() {
            for it in &items {
                self.note_failed(&it.stream, Some(&it.record));
            }
            batch.finish(false);
        } else if let Err((e, written)) = self.commit_guarded(w, &buf, &items) {
            // The cause is recorded before the batch fails, so its writers see it.
            if written {
                self.poison(e);
                batch.finish_unknown();
            } else {
                // Cut back off the journal: nothing of the batch stays, so the shard may heal.
                self.refuse(e);
                for it in &items {
                    self.note_failed(&it.stream, Some(&it.record));
                }
                batch.finish(false);
            }
        } else {
            batch.finish(true);
            w.written += buf.len() as u64;
            w.end_lsn += buf.len() as u64;
        }
        w.spare_buf = buf;
        w.spare_items = items;
        w.spare_items.clear();
        w.spare_batch = Some(batch);
        true
    }

    /// [`Shard::commit`], with a panic in it (a bug: the batch's and the streams' state is
    /// unknown) taken as a failure after the journal write: it poisons the shard, so the
    /// batch's writers and every later one get an error instead of waiting forever.
    fn commit_guarded(
        &self,
        w: &mut Writer,
        buf: &[u8],
        items: &[Queued],
    ) -> std::result::Result<(), (Error, bool)> {
        // Unwind safety: whatever the panic left half-done is behind the poisoning, which
        // stops every later commit; readers see only what was published before it.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.commit(w, buf, items)))
            .unwrap_or_else(|payload| {
                self.panicked("commit", &*payload);
                Err((self.poisoned_error(), true))
            })
    }
}
