//! Room in a stream's segment files for the appends of a batch, made before the batch reaches
//! the journal (write-path step 3's first part, `engine/journal/space.rs`), so that applying it meets no
//! full disk.
//!
//! An append's bytes reach the log (by `pwrite`) and its entries the index (by `pwrite`) only
//! after its journal record is written; on a sparse file, those writes allocate blocks, and on
//! a full disk one fails (`ENOSPC`) after the record is in the journal, where its outcome is
//! unknown. So before the batch is written, the writer makes room for it in each stream:
//!
//! 1. **A roll ahead.** If the last segment is full, the next segment is created now (its log
//!    and index, the index's header written); the batch's appends then go into it without a
//!    roll of their own (`SegmentSet::room`), however far past `segment_bytes` they take it.
//! 2. **The log's blocks.** The log is made long enough for the batch (a sparse length,
//!    doubling, as before), then its blocks are allocated (`fallocate`) up to past the end of
//!    the batch's bytes, doubling from [`LOG_MIN_STEP`] and then in [`LOG_STEP`]s: the bytes
//!    still buffered from earlier batches lie below that end too.
//! 3. **The index's blocks.** The index file is made long enough for the batch's entries
//!    (a sparse length, mapped again), then its blocks are allocated up to past them, doubling
//!    from a block up to the file's length.
//!
//! On a nearly full disk (a step would leave less than the engine's margin free, or does not
//! fit) exactly what the batch needs is allocated instead (`fs::allocate_ahead`).
//!
//! A failure here changes nothing a reader or recovery sees: a rolled-ahead segment is empty
//! and starts at the stream's end, and allocated blocks past the end are zeros. A file system
//! that cannot allocate ahead gets the lengths alone (`fs::allocate`), as before.

use crate::error::Result;
use crate::fs;

use super::log::Segment;
use super::set::BufferShare;
use super::set::SegmentSet;
use super::{ENTRY, FLUSH_AT, IDX_HEADER, MIN_LOG_CAP, WRITE_THROUGH, idx_path, log_path};

/// A log's blocks are set aside this many bytes at a time (below it, doubling from
/// [`LOG_MIN_STEP`]): a few calls per segment, and at most this much allocated and unused past
/// a sealed segment's end.
const LOG_STEP: u64 = 1 << 20;

/// The first step of a log's blocks: a stream of a few small messages takes a block or two,
/// not its log's whole first length (which stays sparse).
const LOG_MIN_STEP: u64 = 4096;

/// The fewest index entries whose blocks are set aside at once (doubling from here up to the
/// index file's length): a block.
const IDX_STEP_ENTRIES: u64 = 4096 / ENTRY;

impl SegmentSet {
    /// Makes room in the last segment for `bytes` more bytes in `entries` more messages (see
    /// the module docs), rolling ahead first if it is full; the next appends of up to `bytes`
    /// go there. Returns whether it allocated anything (the free space changed). Not while
    /// replaying, whose rolls follow the files on disk.
    ///
    /// A resting segment's log is opened here, before the batch's journal record, when the
    /// batch may write to it (`placed` appends, a buffer that may fill, a large body), so
    /// that running out of descriptors refuses the batch rather than failing it after its
    /// record; a batch that stays in the buffers opens nothing.
    pub(crate) fn make_room(
        &mut self,
        bytes: u64,
        entries: u64,
        placed: bool,
        room: &mut fs::Headroom,
    ) -> Result<bool> {
        self.room = 0;
        if bytes == 0 || self.replaying {
            return Ok(false);
        }
        // A resting segment opens its log only if its blocks or length must grow: the room a
        // closed stream set aside is in its record.
        let end = self.end();
        let segments = self.segs.len();
        self.roll_if_full(end)?;
        let rolled = self.segs.len() != segments;
        let limit = BufferShare {
            files: self.files.as_deref(),
            held: self.buffered,
        }
        .limit();
        let grew = match self.segs.last_mut() {
            Some(s) => {
                // Twice what the batch adds to the buffers, against the least that may make
                // them write: the share can shrink a little before the batch is applied.
                let adds = s.pending() as usize + bytes as usize + s.idx_pending.len();
                let adds = 2 * (adds + (entries * ENTRY) as usize);
                let writes = placed || adds >= limit.min(FLUSH_AT) || bytes >= WRITE_THROUGH as u64;
                let opened = if writes {
                    s.local_log().map(drop)
                } else {
                    Ok(())
                };
                opened.and_then(|()| s.set_aside(&self.dir, (bytes, entries), room))
            }
            None => Ok(false),
        };
        self.recount();
        let grew = grew?;
        self.room = bytes;
        Ok(rolled || grew)
    }
}

impl Segment {
    /// Steps 2 and 3 of the module docs for `bytes` more bytes in `entries` more messages.
    fn set_aside(
        &mut self,
        dir: &std::path::Path,
        (bytes, entries): (u64, u64),
        room: &mut fs::Headroom,
    ) -> Result<bool> {
        let base = self.base.bytes;
        let end = self.end - base;
        let need = end + bytes;
        // Written bytes have their blocks: allocation starts past them.
        let from = self.log_alloc.max(end - self.pending());
        let mut grew = false;
        if need > self.log_cap {
            // The length first, grown as a write past it would grow it (sparse: read maps
            // keep their doubling lengths), then the blocks.
            let cap = need.next_power_of_two().max(MIN_LOG_CAP);
            fs::set_len(&*self.local_log()?, &log_path(dir, base), cap)?;
            self.log_cap = cap;
        }
        if need > from {
            let step = need
                .next_power_of_two()
                .max(LOG_MIN_STEP)
                .min(need.next_multiple_of(LOG_STEP));
            let path = log_path(dir, base);
            let to = fs::allocate_ahead(&*self.local_log()?, &path, (from, need, step), room)?;
            self.log_alloc = to;
            self.log_cap = self.log_cap.max(to);
            grew = true;
        }
        let need_idx = IDX_HEADER + (self.count + entries) * ENTRY;
        let from_idx = self.idx_alloc.max(IDX_HEADER + self.idx_written * ENTRY);
        if need_idx > from_idx {
            // The file's length first (sparse, mapped again), then the blocks.
            let idx = self.open_index()?;
            self.grow_index_in(&idx, entries)?;
            let step = (IDX_HEADER
                + (self.count + entries)
                    .next_power_of_two()
                    .max(IDX_STEP_ENTRIES)
                    * ENTRY)
                .min(self.idx_len);
            let path = idx_path(dir, base);
            let to = fs::allocate_ahead(&idx, &path, (from_idx, need_idx, step), room)?;
            self.idx_alloc = to;
            grew = true;
        }
        Ok(grew)
    }
}
