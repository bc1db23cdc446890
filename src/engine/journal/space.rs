//! The journal writer's disk space: a full disk must show before a batch is written, never
//! inside its commit, where a failure leaves the batch's outcome unknown and poisons the shard.
//!
//! Everything the batch may need space for is set aside, and the free space looked at, before
//! the batch's first byte is written (write-path step 3, [`Shard::set_aside`]), in this order:
//!
//! 1. **The journal's reservation** ([`Shard::reserve`]): the journal file grows ahead of its
//!    writes in [`journal::JOURNAL_STEP`]s with its blocks allocated (`fallocate`), so neither
//!    the batch's `write` nor its `fdatasync` allocates.
//! 2. **The segments' room** ([`Shard::make_room`], `segment/room.rs`): for each stream the
//!    batch appends to, a roll to a new segment if the last one is full, and the blocks of its
//!    log and index up to past the batch's bytes and entries, so that applying the batch (the
//!    log's `pwrite`s, the buffered bytes of earlier batches written with them, the index
//!    entries) allocates nothing either.
//! 3. **The free-space look** ([`Shard::admit`]): while the file system holding the journal
//!    has less than [`FREE_FLOOR`] free beyond twice the batch's bytes (its journal frames and
//!    the data its apply writes to the segment logs), the batch is refused with `ENOSPC`. The
//!    floor leaves the room that what cannot be set aside needs: a checkpoint's sidecars and
//!    directory changes (so that it can drop journal files), a create's directory and files,
//!    the name index. The look (`fstatvfs`) is taken again once the batches since the last one
//!    could have used half of what was free then (at most every [`LOOK_EVERY`] bytes), and
//!    after anything took space the batches do not count: 1 or 2 allocated, or the journal
//!    moved to another file. A look the batch's allocations took already (to size their
//!    steps, `fs/headroom.rs`), less what they allocated, serves as the batch's. So a disk
//!    with room costs one call per [`LOOK_EVERY`] (and one per batch that allocates), and a
//!    nearly full one a call per batch.
//!
//! Any of these refusing makes the shard refuse writes (`engine/journal/poison.rs`): `507
//! INSUFFICIENT_STORAGE`, nothing of the batch written, and the shard heals by itself once
//! space exists again. What remains unguarded is a file system that cannot allocate ahead
//! (`EOPNOTSUPP`: the lengths alone are set) when space another process takes between the
//! look and the apply runs out, and what lies outside the floor: then the apply's or the
//! sync's `ENOSPC` comes after the batch reached the journal, and poisons the shard until the
//! store is reopened.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::journal::{self, Record};
use crate::error::Result;
use crate::fs;

use super::super::stream::Stream;
use super::commit::Queued;
use super::shard::{Shard, Writer};

/// Free space the writer keeps on the journal's file system beyond what a batch may take: room
/// for a checkpoint (the segment buffers it flushes, sidecars, directory changes) to drop the
/// journal files it replaces.
pub(super) const FREE_FLOOR: u64 = 1 << 20;

/// Free space a shard refusing writes after a full disk waits for before it takes writes
/// again: well past where it refused (below [`FREE_FLOOR`] and a batch), so that it heals once
/// space was freed rather than flapping between a heal and the next refusal.
const HEAL_FREE: u64 = 2 * FREE_FLOOR;

/// The most bytes the writer commits between two looks at the free space.
const LOOK_EVERY: u64 = 64 << 20;

/// A full disk, as the operating system reports one.
fn no_space() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSPC)
}

impl Shard {
    /// Steps 1 to 3 above for a batch of `buf` with `items`, whose journal frames end at `need`
    /// in the current file: `ENOSPC` (or the allocation's own error) when the disk cannot take
    /// it, before any of it is written.
    pub(in crate::engine) fn set_aside(
        &self,
        w: &mut Writer,
        need: u64,
        buf: &[u8],
        items: &[Queued],
    ) -> Result<()> {
        let alloc = w.alloc;
        // A step ahead (of the journal or a segment) is taken only while it leaves what
        // healing waits for free: on a nearly full disk, exactly what the batch needs.
        let mut room = fs::Headroom::new(HEAL_FREE);
        let set = (|| -> Result<()> {
            Self::reserve(w, need, &mut room)?;
            if Self::make_room(items, &mut w.room_want, &mut room)? || w.alloc != alloc {
                w.unlooked = 0;
            }
            Ok(self.admit(w, buf, items, &room)?)
        })();
        if set.is_err() && w.alloc != alloc {
            // A refused batch keeps no reservation: the free space healing looks at is what
            // the next batch finds.
            fs::set_len(&w.file, &w.path, alloc)?;
            w.alloc = alloc;
        }
        set
    }

    /// The segments' room (2 above) for the appends among `items`, one call per stream;
    /// whether any space was allocated. `want` is the writer's scratch list (empty between
    /// batches, so a batch allocates nothing once it has room): per stream, the index in
    /// `items` of its first append, the bytes and entries of all of them, and whether any is
    /// placed (its bytes go to the log before the batch is acknowledged).
    fn make_room(
        items: &[Queued],
        want: &mut Vec<(usize, u64, u64, bool)>,
        room: &mut fs::Headroom,
    ) -> Result<bool> {
        want.clear();
        // Each stream's place in `want`, once a batch is large enough that a scan would cost
        // (none for a small batch: a map's hasher alone costs more than its scan).
        let mut at: Option<HashMap<*const Stream, usize>> =
            (items.len() > 16).then(|| HashMap::with_capacity(items.len()));
        for (i, it) in items.iter().enumerate() {
            let Record::Append { rec, placed, .. } = &it.record else {
                continue;
            };
            let (bytes, entries) = (rec.body.data.len() as u64, rec.body.ends.len() as u64);
            if bytes == 0 {
                continue;
            }
            let found = match &at {
                Some(at) => at.get(&Arc::as_ptr(&it.stream)).copied(),
                None => want
                    .iter()
                    .position(|&(first, ..)| Arc::ptr_eq(&items[first].stream, &it.stream)),
            };
            if let Some(w) = found.and_then(|k| want.get_mut(k)) {
                w.1 += bytes;
                w.2 += entries;
                w.3 |= placed.is_some();
            } else {
                if let Some(at) = &mut at {
                    at.insert(Arc::as_ptr(&it.stream), want.len());
                }
                want.push((i, bytes, entries, placed.is_some()));
            }
        }
        let mut grew = false;
        let mut out = Ok(());
        for &(first, bytes, entries, placed) in want.iter() {
            // A stream created in this batch has no segments yet: its appends go into the
            // first segment as it is created (inside the floor).
            if let Some(segs) = items[first].stream.data.lock().segs.as_mut() {
                match segs.make_room(bytes, entries, placed, room) {
                    Ok(g) => grew |= g,
                    Err(e) => {
                        out = Err(e);
                        break;
                    }
                }
            }
        }
        want.clear();
        out.map(|()| grew)
    }

    /// Whether a shard refusing writes after a full disk may take them again: the journal's
    /// file system has [`HEAL_FREE`] free (or cannot say).
    pub(super) fn room_to_heal(&self, w: &Writer) -> bool {
        let free = fs::available_bytes(&w.file, &w.path);
        if free.is_some_and(|f| f < HEAL_FREE) {
            tracing::debug!(shard = self.id, free, "still too little free space to heal");
            return false;
        }
        true
    }

    /// The free-space look (3 above) for a batch of `buf` with `items`: `ENOSPC` when the file
    /// system is too full to take it, before any of it is written. A look `room` took for this
    /// batch's allocations (less what they took) is the look.
    fn admit(
        &self,
        w: &mut Writer,
        buf: &[u8],
        items: &[Queued],
        room: &fs::Headroom,
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
        match room.available(&w.file, &w.path) {
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

    /// The reservation (1 above): makes the journal file's allocated length at least `need`,
    /// a [`journal::JOURNAL_STEP`] multiple, or exactly what the batch needs when a whole step
    /// does not fit or would leave less than `room`'s margin free. On failure nothing was
    /// written (the file may have grown: healing cuts it back).
    fn reserve(w: &mut Writer, need: u64, room: &mut fs::Headroom) -> std::io::Result<()> {
        if need <= w.alloc {
            return Ok(());
        }
        let step = need.next_multiple_of(journal::JOURNAL_STEP);
        let exact = need.next_multiple_of(4096);
        w.alloc = fs::allocate_ahead(&w.file, &w.path, (w.alloc, exact, step), room)?;
        // Past its prepared zeros (if it had any): the shard may prepare another.
        w.prewritten = false;
        Ok(())
    }
}
