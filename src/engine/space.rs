//! The journal writer's disk space: a full disk must show before a batch is written, never
//! inside its commit, where a failure leaves the batch's outcome unknown and poisons the shard.
//!
//! Two looks, both before the batch's first byte is written (write-path step 3):
//!
//! 1. **The free-space look** ([`Shard::admit`]): while the file system holding the journal
//!    has less than [`FREE_FLOOR`] free beyond twice the batch's bytes (its journal frames and
//!    the data its apply writes to the segment logs), the batch is refused with `ENOSPC`. The
//!    look (`fstatvfs`) is taken again only once the batches since the last one could have
//!    used half of what was free then (at most every [`LOOK_EVERY`] bytes), so a disk with
//!    room costs one call per [`LOOK_EVERY`] and a nearly full one a call per batch. The floor
//!    also leaves the room a checkpoint needs (segment flushes, sidecars) to drop journal
//!    files.
//! 2. **The reservation** ([`Shard::reserve`]): the journal file grows ahead of its writes in
//!    [`journal::JOURNAL_STEP`]s with its blocks allocated (`fallocate`), so neither the
//!    batch's `write` nor its `fdatasync` allocates: on a full disk the reservation fails, and
//!    nothing was written.
//!
//! Either refusal makes the shard refuse writes (`engine/poison.rs`): `507
//! INSUFFICIENT_STORAGE`, and the shard heals by itself once space exists again. What remains
//! unguarded is space another process takes between the look and the apply, on a file system
//! that cannot allocate ahead: then the apply's or the sync's `ENOSPC` comes after the batch
//! reached the journal, and poisons the shard until the store is reopened.

use crate::fs;
use crate::journal::{self, Record};

use super::shard::{Queued, Shard, Writer};

/// Free space the writer keeps on the journal's file system beyond what a batch may take: room
/// for a checkpoint (the segment buffers it flushes, sidecars, directory changes) to drop the
/// journal files it replaces.
pub(super) const FREE_FLOOR: u64 = 1 << 20;

/// The most bytes the writer commits between two looks at the free space.
const LOOK_EVERY: u64 = 64 << 20;

/// A full disk, as the operating system reports one.
fn no_space() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSPC)
}

impl Shard {
    /// The free-space look (1 above) for a batch of `buf` with `items`: `ENOSPC` when the file
    /// system is too full to take it, before any of it is written.
    pub(super) fn admit(
        &self,
        w: &mut Writer,
        buf: &[u8],
        items: &[Queued],
    ) -> std::io::Result<()> {
        let placed: u64 = items
            .iter()
            .map(|it| match &it.record {
                Record::Append {
                    placed: Some(p), ..
                } => u64::from(p.len),
                _ => 0,
            })
            .sum();
        // Its journal frames and its data in the segment logs (a placed body only there).
        let cost = (buf.len() as u64 + placed).saturating_mul(2);
        if cost <= w.unlooked {
            w.unlooked -= cost;
            return Ok(());
        }
        match fs::available_bytes(&w.file) {
            // A file system that cannot say: the reservation is the only look.
            None => w.unlooked = LOOK_EVERY,
            Some(free) if free >= FREE_FLOOR.saturating_add(cost) => {
                w.unlooked = ((free - FREE_FLOOR - cost) / 2).min(LOOK_EVERY);
            }
            Some(free) => {
                w.unlooked = 0;
                tracing::debug!(
                    shard = self.id,
                    free,
                    batch = cost,
                    "too little free space for a journal batch"
                );
                return Err(no_space());
            }
        }
        Ok(())
    }

    /// The reservation (2 above): makes the journal file's allocated length at least `need`,
    /// a [`journal::JOURNAL_STEP`] multiple, or exactly what the batch needs when a whole step
    /// does not fit. On failure nothing was written (the file may have grown: healing cuts it
    /// back).
    pub(super) fn reserve(w: &mut Writer, need: u64) -> std::io::Result<()> {
        if need <= w.alloc {
            return Ok(());
        }
        let step = need.next_multiple_of(journal::JOURNAL_STEP);
        let exact = need.next_multiple_of(4096);
        let reserved = fs::allocate(&w.file, &w.path, w.alloc, step - w.alloc)
            .map(|()| step)
            .or_else(|e| {
                if e.kind() != std::io::ErrorKind::StorageFull || exact >= step {
                    return Err(e);
                }
                fs::allocate(&w.file, &w.path, w.alloc, exact - w.alloc).map(|()| exact)
            })?;
        w.alloc = reserved;
        // Past its prepared zeros (if it had any): the shard may prepare another.
        w.prewritten = false;
        Ok(())
    }
}
