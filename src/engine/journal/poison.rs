//! Poisoning and healing of a journal shard: what a write on a failed shard gets, the two kinds
//! of failure, and how the shard takes writes again after one whose outcome is known.
//!
//! * *Refused, heals* ([`Shard::refuse`]): nothing of the failed work is acknowledged or left
//!   in the journal. A full disk found before a batch is written (the journal's reservation,
//!   the free-space look: `engine/journal/space.rs`), a journal write that was cut back off the file, a
//!   rotation, a checkpoint step other than a sync. Writes get `Poisoned` with the cause
//!   (`507 INSUFFICIENT_STORAGE` for a full disk) until [`Shard::heal`] succeeds.
//! * *Poisoned until reopen* ([`Shard::poison`]): the on-disk state is unknown. Any failed
//!   sync (after a failed `fsync` the kernel may have dropped the dirty pages), a batch in the
//!   journal that could not be applied, a failed cut-back, and a panic in a shard's thread or
//!   a committer (the code's invariants no longer hold: [`Shard::panicked`]).

use std::io::Seek;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::journal::{self, Record};
use crate::error::Error;
use crate::fs;

use super::super::stream::Stream;
use super::shard::Shard;

/// A failure the shard may heal from, and what healing must roll back.
#[derive(Default)]
pub(in crate::engine) struct Refused {
    /// The first such failure since the last heal; `None` while the shard takes writes.
    pub(in crate::engine) cause: Option<Arc<std::io::Error>>,
    /// Streams whose staged state ran ahead of what was committed: their records failed.
    pub(in crate::engine) streams: Vec<Arc<Stream>>,
    /// A failed record was not an append: its staged effects (registry, forks, names) cannot
    /// be rolled back in place, so healing poisons the shard instead.
    pub(in crate::engine) blocked: bool,
}

impl Shard {
    /// The error every write on a poisoned or refusing shard gets (carrying the failure), or
    /// `None` while the shard takes writes.
    pub(in crate::engine) fn poisoned(&self) -> Option<Error> {
        let source = match self.poison.get() {
            Some(cause) => cause.clone(),
            None if self.refusing.load(Ordering::Acquire) => self.refused.lock().cause.clone()?,
            None => return None,
        };
        Some(Error::Poisoned { source })
    }

    /// Whether the shard is poisoned or refusing writes.
    pub(in crate::engine) fn failed(&self) -> bool {
        self.poison.get().is_some() || self.refusing.load(Ordering::Acquire)
    }

    /// The error of a write that failed because the shard is poisoned. The cause is recorded
    /// before any batch fails, so the fallback (a cause of unknown origin) is never expected.
    pub(in crate::engine) fn poisoned_error(&self) -> Error {
        self.poisoned().unwrap_or_else(|| Error::Poisoned {
            source: Arc::new(std::io::Error::other("journal batch failed")),
        })
    }

    /// Poisons the shard with `cause` and wakes everyone waiting on it. Only the first cause is
    /// kept (and logged); later failures are consequences of it.
    pub(in crate::engine) fn poison(&self, cause: Error) {
        let mut first = false;
        let kept = self.poison.get_or_init(|| {
            first = true;
            let io = cause.into_io();
            // Poisoned for good, the shard does not heal when space comes back: a full disk
            // as the cause (a sync, or an apply, that met `ENOSPC` after the batch reached
            // the journal) is kept as the cause's text, not its kind, so the refusals say
            // `POISONED` (503), not `INSUFFICIENT_STORAGE` (507, which heals).
            Arc::new(if io.kind() == std::io::ErrorKind::StorageFull {
                std::io::Error::other(io)
            } else {
                io
            })
        });
        if first {
            tracing::error!(
                shard = self.id,
                error = %kept,
                "journal shard poisoned: nothing more is acknowledged on it until the store is reopened"
            );
        }
        self.durable.notify(usize::MAX);
        self.checkpoint_done.notify(usize::MAX);
    }

    /// Makes the shard refuse writes after a failure whose outcome is known (nothing of the
    /// failed work is acknowledged or left in the journal), until [`Shard::heal`] succeeds.
    /// Only the first cause is kept (and logged) until then.
    pub(in crate::engine) fn refuse(&self, cause: Error) {
        let mut r = self.refused.lock();
        let first = r.cause.is_none();
        if first {
            // A failure that was itself a refusal (work that met the shard refusing, and
            // failed after it healed) keeps that refusal's cause: wrapped again, a full disk
            // would read as `POISONED` rather than `INSUFFICIENT_STORAGE`.
            r.cause = Some(match cause {
                Error::Poisoned { source } => source,
                other => Arc::new(other.into_io()),
            });
            self.refusing.store(true, Ordering::Release);
        }
        let kept = r.cause.clone();
        drop(r);
        if first && let Some(kept) = kept {
            tracing::error!(
                shard = self.id,
                error = %kept,
                "journal shard refusing writes: the failed write changed nothing; writes resume once the cause is gone"
            );
        }
        self.durable.notify(usize::MAX);
        self.checkpoint_done.notify(usize::MAX);
        self.wake.notify_one();
    }

    /// Notes a stream whose record failed while the shard refused writes: healing rolls its
    /// staged state back. A record that failed in the queue (`queued`) and is not an append
    /// had effects beyond the staged state (a registered create, a delete), which healing
    /// cannot roll back: see `Refused::blocked`.
    pub(super) fn note_failed(&self, stream: &Arc<Stream>, queued: Option<&Record>) {
        let mut r = self.refused.lock();
        if r.cause.is_some() {
            r.streams.push(stream.clone());
            r.blocked |= queued.is_some_and(|rec| !matches!(rec, Record::Append { .. }));
            drop(r);
            self.wake.notify_one();
        }
    }

    /// Takes writes again after a failure whose outcome is known, when its cause is gone: under
    /// `writer`, fails what is still queued, cuts the journal back to its last committed byte
    /// and the zeros set aside past it, and syncs it (a failure here poisons the shard: the
    /// sync's outcome is unknown); after a
    /// full disk, goes on refusing unless the disk now has room to heal
    /// (`Shard::room_to_heal`: more than a batch's refusal leaves, so the shard does not
    /// take writes again only to refuse the next one); then
    /// rolls each noted stream's staged state back to its applied state (under its `core`,
    /// `writer` released) and clears the failure. The shard thread calls it while refusing.
    pub(super) fn heal(&self) {
        if !self.refusing.load(Ordering::Acquire) || self.poison.get().is_some() {
            return;
        }
        {
            let mut w = self.writer.lock();
            loop {
                self.drain(&mut w);
                let mut q = self.queue.lock();
                if q.items.is_empty() {
                    // Pushes are refused now: LSNs continue from the journal's real end.
                    q.next_lsn = w.end_lsn;
                    break;
                }
            }
            // What the writer set aside past the end stays (zeros: recovery reads them as a
            // clean end), so the free space looked at below is what the next batch finds; a
            // reservation that failed part-way grew the file past it, which goes.
            let end = journal::HEADER_LEN + (w.end_lsn - w.file_base);
            w.alloc = w.alloc.max(end);
            let cut = fs::set_len(&w.file, &w.path, w.alloc)
                .and_then(|()| w.file.seek(std::io::SeekFrom::Start(end)).map(drop))
                .and_then(|()| fs::sync_data(&w.file, &w.path));
            w.unstarted = 0;
            w.shared_file = None;
            if let Err(e) = cut {
                drop(w);
                self.poison(e.into());
                return;
            }
            w.unlooked = 0;
            if self.full_disk() && !self.room_to_heal(&w) {
                // Still full: writes stay refused (and readiness says so) until space exists.
                return;
            }
        }
        loop {
            let (streams, blocked) = {
                let mut r = self.refused.lock();
                (std::mem::take(&mut r.streams), r.blocked)
            };
            if blocked {
                let cause = self.refused.lock().cause.clone();
                if let Some(cause) = cause {
                    self.poison(Error::Poisoned { source: cause });
                }
                return;
            }
            for s in &streams {
                let mut core = s.core.lock();
                let d = s.data.lock();
                core.state = d.state.clone();
                core.last_lsn = d.applied_lsn;
            }
            let mut r = self.refused.lock();
            if r.streams.is_empty() && !r.blocked {
                r.cause = None;
                self.refusing.store(false, Ordering::Release);
                break;
            }
        }
        tracing::info!(shard = self.id, "journal shard healed: taking writes again");
    }

    /// Whether the shard refuses writes because the disk was full.
    fn full_disk(&self) -> bool {
        self.refused
            .lock()
            .cause
            .as_ref()
            .is_some_and(|c| c.kind() == std::io::ErrorKind::StorageFull)
    }

    /// Poisons the shard after a panic on one of its paths (`what`: the commit, the shard
    /// thread, the checkpoint thread), with the panic's message as the cause, and wakes
    /// everyone waiting on it. The panic itself was reported by the panic hook.
    pub(in crate::engine) fn panicked(&self, what: &str, payload: &(dyn std::any::Any + Send)) {
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let cause =
            std::io::Error::other(format!("the journal shard's {what} panicked: {message}"));
        self.poison(Error::Io(cause));
    }
}
