//! One segment: its log and its index, the write buffer and held bodies that reach the log
//! lazily, index entries, the read map, and checking messages against their CRCs on first read.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::fs;
use crate::name::Offset;
use crate::state::Body;

use super::mmap::{self, ReadMap};
use super::set::BufferShare;
use super::{
    COLD_BLOCK, ColdPiece, ENTRY, FLUSH_AT, IDX_FLOOR, IDX_HEADER, IDX_MAGIC, IDX_VERSION,
    MIN_IDX_ENTRIES, MIN_LOG_CAP, Piece, WRITE_THROUGH, WRITEBACK_AT, idx_path, log_path,
};

pub(super) struct Segment {
    pub(super) base: Offset,
    /// The stream's directory, shared with its set: the index file is opened there whenever
    /// entries are written or it grows (see `idx_map`).
    pub(super) dir: Arc<Path>,
    /// Shared with the read maps, which keep it open for responses still sending their bytes.
    /// `None` for a cold segment (see `cold`) and for one at rest (see [`Segment::rest`]).
    pub(super) log: Option<Arc<File>>,
    /// A sealed segment whose log is only in the cold tier (its index stays here), read through
    /// [`Piece::Cold`]: it has no local log to open.
    pub(super) cold: bool,
    pub(super) log_cap: u64,
    /// The log's bytes, from the segment's start, whose blocks the writer set aside before a
    /// batch (`segment/room.rs`); past the written bytes, writes below it allocate nothing.
    pub(super) log_alloc: u64,
    /// The index file's bytes whose blocks are set aside likewise (the map's length at most).
    pub(super) idx_alloc: u64,
    /// The index file, read-only: entries reach it by `pwrite` (see `idx_pending`), so a
    /// checkpoint's sync, which write-protects the pages it writes back, leaves no page for the
    /// next append to fault on. The map is all a segment keeps of its index: the file is opened
    /// only to write entries or to grow ([`Segment::open_index`]), so an open segment holds one
    /// descriptor (its log's), and entries are written in batches (a flush's worth, or at a
    /// checkpoint), which is when the open is paid. `None` in a segment resumed from its
    /// resident record ([`Segment::resume`]) until something reads its index
    /// ([`Segment::map_index`]): appends need only `idx_len`.
    pub(super) idx_map: Option<Mmap>,
    /// The index file's length (the map's, when mapped).
    pub(super) idx_len: u64,
    /// Messages in this segment.
    pub(super) count: u64,
    /// Messages whose index entries are in the index file; those of the rest (up to `count`)
    /// are in `idx_pending`.
    pub(super) idx_written: u64,
    /// The encoded index entries of messages `idx_written..count`, written to the index file
    /// with the log's buffered bytes (`flush`), in one call.
    pub(super) idx_pending: Vec<u8>,
    /// Absolute end in bytes.
    pub(super) end: u64,
    /// Messages, from the segment's first, whose bytes are known to match their index entry:
    /// written by this process, or checked against their CRC on first read after an open. Reads
    /// serve only checked bytes, so a damaged log or index is an error, never wrong data.
    pub(super) verified: u64,
    pub(super) read_map: Option<Arc<ReadMap>>,
    /// The last bytes appended, not yet written to the log file: they end at `end`. The
    /// journal holds them (an append is acknowledged once its journal record is written), so
    /// the log is written lazily, in one call for many appends: when [`FLUSH_AT`] bytes have
    /// gathered, when a read reaches into them, and when a checkpoint rotates the journal
    /// (before the sync that lets the journal go). Bodies of [`WRITE_THROUGH`] bytes or more
    /// are written at once (what is buffered first); their index entries wait with the others.
    pub(super) unwritten: Vec<u8>,
    /// Bodies of placed appends (`journal::Placed`) that follow `unwritten`, held as they came
    /// (the request's own buffers) rather than copied: the writer writes them, with
    /// `unwritten`, in one `pwritev` before it acknowledges their batch. `held_len` is their
    /// total length.
    pub(super) held: Vec<Bytes>,
    pub(super) held_len: u64,
    /// The log's bytes, from the segment's start, whose write-back was asked for (see
    /// [`WRITEBACK_AT`]).
    pub(super) started: u64,
    /// A range of the log (from, to; from the segment's start) to start writing back, once
    /// the engine takes it ([`SegmentSet::take_writeback`]).
    pub(super) writeback: Option<(u64, u64)>,
}

/// The error of a segment file used while its segment is at rest: a bug (every user wakes the
/// set first), reported as an I/O error rather than a panic.
fn resting(file: &str) -> Error {
    Error::Io(std::io::Error::other(format!(
        "segment file {file} used while its segment is at rest"
    )))
}

impl Drop for Segment {
    /// Writes what is still buffered (the engine's checkpoints flush every stream they record,
    /// so this matters only to a segment dropped between checkpoints, such as one of a store
    /// that was shut down without its final checkpoint).
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
impl Segment {
    /// Creates a segment at `base`: an empty log, unless `keep_log` (replay), which keeps the
    /// bytes of a log already there for [`SegmentSet::adopt`]; always a new index.
    pub(super) fn create(dir: &Arc<Path>, base: Offset, keep_log: bool) -> Result<Segment> {
        let log = Arc::new(fs::open_create(
            OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(!keep_log),
            &log_path(dir, base.bytes),
        )?);
        let had = if keep_log { log.metadata()?.len() } else { 0 };
        if had < MIN_LOG_CAP {
            fs::set_len(&log, &log_path(dir, base.bytes), MIN_LOG_CAP)?;
        }
        let log_cap = had.max(MIN_LOG_CAP);
        let log = Some(log);
        let idx = fs::open_create(
            OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(true),
            &idx_path(dir, base.bytes),
        )?;
        let idx_len = IDX_HEADER + MIN_IDX_ENTRIES * ENTRY;
        fs::set_len(&idx, &idx_path(dir, base.bytes), idx_len)?;
        let mut header = [0u8; IDX_HEADER as usize];
        header[0..4].copy_from_slice(IDX_MAGIC);
        header[4..8].copy_from_slice(&IDX_VERSION.to_le_bytes());
        header[8..16].copy_from_slice(&base.messages.to_le_bytes());
        header[16..24].copy_from_slice(&base.bytes.to_le_bytes());
        idx.write_all_at(&header, 0)?;
        // Writing the header set aside the index's first block (a delayed allocation reserves
        // it at the write), so the first entries need no `fallocate` of their own: at most a
        // 4 KiB block, and no more than the file system's block.
        let block = std::os::unix::fs::MetadataExt::blksize(&idx.metadata()?).min(4096);
        let idx_map = mmap::map_index(&idx, idx_len as usize)?;
        let mut seg = Segment::opened(dir, base, log, log_cap, idx_map, idx_len);
        seg.idx_alloc = block.min(idx_len);
        Ok(seg)
    }

    /// Opens a segment's files; `cold_len` is the log's length in the cold tier when the local
    /// log is missing and the tier holds it (the segment then opens cold).
    pub(super) fn open(dir: &Arc<Path>, base_bytes: u64, cold_len: Option<u64>) -> Result<Segment> {
        let lp = log_path(dir, base_bytes);
        let ip = idx_path(dir, base_bytes);
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Error::corrupt(p, "segment file is missing"),
                    _ => e.into(),
                })
        };
        let (log, log_cap) = match (open(&lp), cold_len) {
            (Ok(f), _) => {
                let cap = f.metadata()?.len();
                (Some(Arc::new(f)), cap)
            }
            (Err(Error::Corrupt { .. }), Some(len)) => (None, len),
            (Err(e), _) => return Err(e),
        };
        let cold = log.is_none();
        let idx = open(&ip)?;
        let idx_len = idx.metadata()?.len();
        if idx_len < IDX_HEADER || !(idx_len - IDX_HEADER).is_multiple_of(ENTRY) {
            return Err(Error::corrupt(
                ip,
                "index length is not a whole number of entries",
            ));
        }
        let idx_map = mmap::map_index(&idx, idx_len as usize)?;
        let h = &idx_map[..IDX_HEADER as usize];
        let field = |r: std::ops::Range<usize>| {
            h.get(r)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        if &h[0..4] != IDX_MAGIC || h[4..8] != IDX_VERSION.to_le_bytes() {
            return Err(Error::corrupt(ip, "bad index header"));
        }
        let base = Offset::new(field(8..16).unwrap_or(0), field(16..24).unwrap_or(u64::MAX));
        if base.bytes != base_bytes {
            return Err(Error::corrupt(
                ip,
                "index header does not match its file name",
            ));
        }
        let mut seg = Segment::opened(dir, base, log, log_cap, idx_map, idx_len);
        seg.cold = cold;
        Ok(seg)
    }

    /// A segment from its resident record (`SegmentSet::resume`), running up to `next`: at
    /// rest, no file open, its index not mapped, its entries all written.
    pub(super) fn resume(dir: &Arc<Path>, r: &super::set::SegmentRecord, next: Offset) -> Segment {
        let count = next.messages.saturating_sub(r.base.messages);
        Segment {
            base: r.base,
            dir: dir.clone(),
            log: None,
            cold: r.cold,
            log_cap: r.log_cap,
            log_alloc: r.log_alloc,
            idx_alloc: r.idx_alloc,
            idx_map: None,
            idx_len: r.idx_len,
            count,
            idx_written: count,
            idx_pending: Vec::new(),
            end: next.bytes.max(r.base.bytes),
            verified: r.verified.min(count),
            read_map: None,
            unwritten: Vec::new(),
            held: Vec::new(),
            held_len: 0,
            started: next.bytes.saturating_sub(r.base.bytes),
            writeback: None,
        }
    }

    /// A segment at `base` over its files as opened, before anything of it is read or
    /// verified: no entries counted, nothing written, held or mapped for reads yet. Its end is
    /// `base` until the caller scans the index.
    fn opened(
        dir: &Arc<Path>,
        base: Offset,
        log: Option<Arc<File>>,
        log_cap: u64,
        idx_map: Mmap,
        idx_len: u64,
    ) -> Segment {
        Segment {
            base,
            dir: dir.clone(),
            log,
            cold: false,
            log_cap,
            log_alloc: 0,
            idx_alloc: 0,
            idx_map: Some(idx_map),
            idx_len,
            count: 0,
            idx_written: 0,
            idx_pending: Vec::new(),
            end: base.bytes,
            verified: 0,
            read_map: None,
            unwritten: Vec::new(),
            held: Vec::new(),
            held_len: 0,
            started: 0,
            writeback: None,
        }
    }

    /// Takes this freshly opened segment to run up to `next` (the next segment's base, or the
    /// stream's end), checking its index against that: its message count, end and the entry of
    /// its last message. `dir` names the files in errors.
    pub(super) fn reach(&mut self, dir: &Path, next: Offset) -> Result<()> {
        if next.bytes < self.base.bytes || next.messages < self.base.messages {
            return Err(Error::corrupt(dir, "segments out of order"));
        }
        self.count = next.messages - self.base.messages;
        self.idx_written = self.count;
        self.end = next.bytes;
        let idx_entries = (self.idx_len - IDX_HEADER) / ENTRY;
        if self.count > idx_entries || self.end - self.base.bytes > self.log_cap {
            return Err(Error::corrupt(
                idx_path(dir, self.base.bytes),
                "index or log shorter than the stream",
            ));
        }
        if self.count > 0 && self.entry_end(self.count - 1) != self.end {
            return Err(Error::corrupt(
                idx_path(dir, self.base.bytes),
                "index disagrees with the stream's length",
            ));
        }
        Ok(())
    }

    /// Index entry `i`'s bytes: from the file, or from `idx_pending` when not written yet.
    /// The index must be mapped (`SegmentSet::mapped`) for entries already written.
    fn entry(&self, i: u64) -> Option<&[u8]> {
        let (bytes, at) = if let Some(p) = i.checked_sub(self.idx_written) {
            (&self.idx_pending[..], p * ENTRY)
        } else {
            debug_assert!(self.idx_map.is_some(), "index entry read before its map");
            (self.idx_map.as_deref()?, IDX_HEADER + i * ENTRY)
        };
        bytes.get(at as usize..(at + ENTRY) as usize)
    }

    pub(super) fn entry_end(&self, i: u64) -> u64 {
        self.entry(i)
            .and_then(|e| e[0..8].try_into().ok())
            .map_or(u64::MAX, u64::from_le_bytes)
    }

    pub(super) fn entry_crc(&self, i: u64) -> u32 {
        self.entry(i)
            .and_then(|e| e[8..12].try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }

    pub(super) fn entry_start(&self, i: u64) -> u64 {
        if i == 0 {
            self.base.bytes
        } else {
            self.entry_end(i - 1)
        }
    }

    /// Messages of this segment that end at or before `pos`.
    pub(super) fn count_ending_by(&self, pos: u64) -> u64 {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = u64::midpoint(lo, hi);
            if self.entry_end(mid) <= pos {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub(super) fn map_for(&mut self, end: u64) -> Result<Arc<ReadMap>> {
        let need = end - self.base.bytes;
        if let Some(m) = &self.read_map
            && m.len() as u64 >= need
        {
            return Ok(m.clone());
        }
        let log = self.local_log()?;
        let m = Arc::new(mmap::map_read(&log, self.log_cap as usize)?);
        self.read_map = Some(m.clone());
        Ok(m)
    }

    /// The local log file, opened if the segment is at rest (a cold segment has none:
    /// `Corrupt`, as nothing reads or writes a cold segment's log here). Running out of
    /// descriptors is `TooManyOpenFiles` (retryable). The set counts the descriptor at its next
    /// `recount`.
    pub(super) fn local_log(&mut self) -> Result<Arc<File>> {
        if self.log.is_none() {
            if self.cold {
                return Err(Error::corrupt(
                    format!("{:020}.log", self.base.bytes),
                    "the segment's log is in the cold tier",
                ));
            }
            self.wake().map_err(Error::or_out_of_descriptors)?;
        }
        self.log
            .clone()
            .ok_or_else(|| resting(&format!("{:020}.log", self.base.bytes)))
    }

    /// Whether the log is open or opens now: `false` when no descriptor is free to open it
    /// (`TooManyOpenFiles`). An append, applied after its journal record, then buffers what it
    /// would have written, instead of failing where its outcome would be unknown.
    fn can_write(&mut self) -> Result<bool> {
        match self.local_log() {
            Ok(_) => Ok(true),
            Err(Error::TooManyOpenFiles) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Maps the index, if it is not (see `idx_map`): open, map, close.
    pub(super) fn map_index(&mut self) -> Result<()> {
        if self.idx_map.is_none() {
            let idx = self.open_index()?;
            self.idx_map = Some(mmap::map_index(&idx, self.idx_len as usize)?);
        }
        Ok(())
    }

    /// Opens the index file to write entries or grow it, for as long as the caller holds it.
    /// The file is this process's own and only grows while the store is open, so one shorter
    /// than the map was cut behind the store's back: `Corrupt`. Running out of descriptors is
    /// `TooManyOpenFiles` (retryable).
    pub(super) fn open_index(&self) -> Result<File> {
        let ip = idx_path(&self.dir, self.base.bytes);
        let idx = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&ip)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::corrupt(&ip, "segment file is missing"),
                _ => Error::from(e).or_out_of_descriptors(),
            })?;
        if idx.metadata()?.len() < self.idx_len {
            return Err(Error::corrupt(ip, "index shorter than its map"));
        }
        Ok(idx)
    }

    /// The descriptors this segment holds: its log's (shared with read maps, which may keep it
    /// open longer); the index is open only while entries are written.
    pub(super) fn files(&self) -> usize {
        usize::from(self.log.is_some())
    }

    /// Puts the segment at rest: its buffered bytes written, its log and its read map closed,
    /// then its buffered index entries written. The index map stays (reads of the index need
    /// no descriptor), and so does every count, so [`Segment::wake`] reopens one file and reads
    /// nothing. False, with the log kept, when bytes stay buffered.
    ///
    /// The log is closed before the index is opened to write its entries, so a process out of
    /// descriptors can still put its streams at rest (the accept loop does, when a connection
    /// cannot be accepted for want of one): the index takes the descriptor the log gave back.
    /// Should the index still not open, the segment rests with its entries buffered (reads find
    /// them there, and the next flush, a checkpoint's or the segment's own when it wakes, writes
    /// them), and the error is returned.
    pub(super) fn rest(&mut self) -> Result<bool> {
        self.flush_log()?;
        if self.pending() > 0 {
            return Ok(false);
        }
        self.unwritten = Vec::new();
        self.read_map = None;
        self.writeback = None;
        self.log = None;
        self.flush()?;
        self.idx_pending = Vec::new();
        Ok(true)
    }

    /// Reopens the log [`Segment::rest`] closed (a cold segment's log stays in the tier). The
    /// file is this process's own, unchanged since (every change goes through an awake
    /// segment), but its length is checked against what the segment holds, so a log cut short
    /// behind the store's back is `Corrupt`, as at an open.
    pub(super) fn wake(&mut self) -> Result<()> {
        if self.log.is_none() && !self.cold {
            #[cfg(test)]
            if super::tests::NO_DESCRIPTORS.get() {
                return Err(std::io::Error::from_raw_os_error(24).into());
            }
            let lp = log_path(&self.dir, self.base.bytes);
            let log = OpenOptions::new().read(true).write(true).open(&lp)?;
            if log.metadata()?.len() < self.end - self.base.bytes {
                return Err(Error::corrupt(lp, "log shorter than when it was last open"));
            }
            self.log = Some(Arc::new(log));
        }
        Ok(())
    }

    /// The memory the write buffers take (`unwritten` and `idx_pending`, by capacity).
    pub(super) fn buffer_capacity(&self) -> usize {
        self.unwritten.capacity() + self.idx_pending.capacity()
    }

    /// Bytes appended and not yet in the log file: `unwritten`, then `held`.
    pub(super) fn pending(&self) -> u64 {
        self.unwritten.len() as u64 + self.held_len
    }

    /// Appends `body` (its bytes buffered, held (`hold`: a placed append's, see `held`) or
    /// written through, its index entries buffered) to this segment of the stream in `dir`,
    /// growing the files as needed (sparse lengths: the writer set their blocks aside before
    /// the batch, `segment/room.rs`).
    ///
    /// `share`: the set's share of the store's write-buffer budget, the most capacity the two
    /// buffers may take together ([`BufferShare::limit`], asked only when one must grow). A
    /// buffer grows only within it; a full one that may not grow is written, and keeps its room
    /// while it is within the limit.
    pub(super) fn write(&mut self, body: &Body, hold: bool, share: BufferShare) -> Result<()> {
        // The index grows first, and its buffer makes room for the body's entries: once the
        // body's bytes are written or buffered, only its entries are left to add, so a failure
        // cannot leave bytes buffered past `end`.
        self.grow_index(body.ends.len() as u64)?;
        self.entry_room(body.ends.len() as u64, share)?;
        let rel = self.end - self.base.bytes;
        let need = rel + body.data.len() as u64;
        if need > self.log_cap {
            let cap = need.next_power_of_two().max(MIN_LOG_CAP);
            fs::set_len(
                &*self.local_log()?,
                &log_path(&self.dir, self.base.bytes),
                cap,
            )?;
            self.log_cap = cap;
        }
        if body.data.len() >= WRITE_THROUGH && self.can_write()? {
            self.flush_log()?;
            self.local_log()?.write_all_at(&body.data, rel)?;
            self.written_to(rel + body.data.len() as u64);
        } else if hold {
            self.held.push(body.data.clone());
            self.held_len += body.data.len() as u64;
        } else {
            if !self.held.is_empty() {
                // Copied bytes go after the held ones: those go first.
                self.flush_log()?;
            }
            if self.unwritten.len() + body.data.len() > self.unwritten.capacity().max(FLUSH_AT)
                && self.can_write()?
            {
                // This body would take a full buffer past a flush's worth: write what is
                // buffered first, rather than copy it into a larger buffer (with bodies whose
                // size does not divide `FLUSH_AT`, a copy of up to 16 KiB per stream after
                // each checkpoint gave its buffer back).
                self.flush()?;
            }
            let need = self.unwritten.len() + body.data.len();
            if need > self.unwritten.capacity() {
                // Room for a few more bodies like this one, or twice the room it had, up to a
                // flush's worth: bodies of a few KiB are not copied again at every doubling,
                // and small ones are copied a few times in all before the buffer is written.
                // Within the limit only, and then no more than it leaves.
                let limit = share.limit();
                let fits = limit.saturating_sub(self.idx_pending.capacity());
                let want = (4 * body.data.len())
                    .max(2 * self.unwritten.capacity())
                    .min(FLUSH_AT + body.data.len())
                    .min(fits)
                    .max(need);
                if want <= fits {
                    self.unwritten.reserve_exact(want - self.unwritten.len());
                } else if self.write_full(&body.data, rel, limit)? {
                    return self.add_entries(body);
                }
            }
            self.unwritten.extend_from_slice(&body.data);
        }
        self.add_entries(body)
    }

    /// Room in the entries' buffer for `n` more entries, made before an append's bytes are
    /// taken. The buffer grows within the share (see [`Segment::write`]), or up to [`IDX_FLOOR`]
    /// whatever the limit, so a stream that got no share of the budget writes its entries once
    /// per that many, not at each append. Full and not allowed to grow, it writes its entries
    /// first and keeps its room while within the limit; with no descriptor free to open the
    /// index, the entries stay and the buffer grows (the next flush writes them).
    #[inline]
    pub(super) fn entry_room(&mut self, n: u64, share: BufferShare) -> Result<()> {
        if self.idx_pending.len() + (n * ENTRY) as usize <= self.idx_pending.capacity() {
            return Ok(());
        }
        self.grow_entries(n, share)
    }

    /// [`Segment::entry_room`] when the buffer has no room for the entries.
    fn grow_entries(&mut self, n: u64, share: BufferShare) -> Result<()> {
        let add = (n * ENTRY) as usize;
        let limit = share.limit();
        let fits = limit
            .saturating_sub(self.unwritten.capacity())
            .max(IDX_FLOOR);
        let want = (2 * self.idx_pending.capacity())
            .max(4 * ENTRY as usize)
            .min(FLUSH_AT)
            .min(fits);
        if self.idx_pending.len() + add > want && !self.idx_pending.is_empty() {
            match self.write_entries() {
                Err(Error::TooManyOpenFiles) => {}
                other => other?,
            }
            if self.idx_pending.is_empty() && self.buffer_capacity() > limit.max(IDX_FLOOR) {
                self.idx_pending = Vec::new();
            }
        }
        let need = self.idx_pending.len() + add;
        if need > self.idx_pending.capacity() {
            self.idx_pending
                .reserve_exact(want.max(need) - self.idx_pending.len());
        }
        Ok(())
    }

    /// A body at `rel` that the log's buffer has no room for, and which may not grow past
    /// `limit`: what the buffer holds is written, with the body too (one call) if it does not
    /// fit the buffer's room, and the room is kept while the buffers are within `limit` (given
    /// back past it: the share shrank as more streams took buffers). Whether the body was
    /// written; if not, the emptied buffer has room for it.
    fn write_full(&mut self, data: &[u8], rel: u64, limit: usize) -> Result<bool> {
        if !self.can_write()? {
            // No descriptor to open the log with: the body is buffered past the share rather
            // than refused after its journal record (the next flush writes it).
            self.unwritten.reserve(data.len());
            return Ok(false);
        }
        if self.buffer_capacity() > limit {
            self.flush_log()?;
            self.unwritten = Vec::new();
        } else if data.len() <= self.unwritten.capacity() {
            self.flush_log()?;
            return Ok(false);
        }
        if self.unwritten.is_empty() {
            self.local_log()?.write_all_at(data, rel)?;
        } else {
            let from = rel - self.unwritten.len() as u64;
            let log = self.local_log()?;
            fs::write_all_vectored_at(&log, &[&self.unwritten, data], from)?;
            self.unwritten.clear();
        }
        self.written_to(rel + data.len() as u64);
        Ok(true)
    }

    /// The index part of an append of `body`, whose bytes are in the log or its buffer from
    /// `end` on: buffers its index entries (in the room [`Segment::entry_room`] made) and moves
    /// `end` past it.
    pub(super) fn add_entries(&mut self, body: &Body) -> Result<()> {
        let n = body.ends.len() as u64;
        self.grow_index(n)?;
        let mut prev = 0usize;
        for &end in body.ends.iter() {
            let end = end as usize;
            let crc = if n == 1 {
                body.single_crc()
            } else {
                crc32fast::hash(body.data.get(prev..end).unwrap_or(&[]))
            };
            let mut entry = [0u8; ENTRY as usize];
            entry[0..8].copy_from_slice(&(self.end + end as u64).to_le_bytes());
            entry[8..12].copy_from_slice(&crc.to_le_bytes());
            self.idx_pending.extend_from_slice(&entry);
            prev = end;
        }
        if self.verified == self.count {
            self.verified += n;
        }
        self.count += n;
        self.end += body.data.len() as u64;
        // Bodies of many small messages gather more entry bytes than data bytes.
        if self.unwritten.len() >= FLUSH_AT || self.idx_pending.len() >= FLUSH_AT {
            match self.flush() {
                // Entries stay buffered when no descriptor is free to open the index: the
                // next flush writes them (a checkpoint's, at the latest, which waits for one).
                Err(Error::TooManyOpenFiles) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Makes the index file long enough for `n` more entries (a sparse length, mapped again),
    /// unless it is; the file is opened only when it must grow.
    pub(super) fn grow_index(&mut self, n: u64) -> Result<()> {
        if self.index_room_for(n) {
            return Ok(());
        }
        let idx = self.open_index()?;
        self.grow_index_in(&idx, n)
    }

    /// Whether the index file is long enough for `n` more entries.
    pub(super) fn index_room_for(&self, n: u64) -> bool {
        IDX_HEADER + (self.count + n) * ENTRY <= self.idx_len
    }

    /// [`Segment::grow_index`] with the index file `idx` already open.
    pub(super) fn grow_index_in(&mut self, idx: &File, n: u64) -> Result<()> {
        if !self.index_room_for(n) {
            let len =
                IDX_HEADER + (self.count + n).next_power_of_two().max(MIN_IDX_ENTRIES) * ENTRY;
            fs::set_len(idx, &idx_path(&self.dir, self.base.bytes), len)?;
            self.idx_len = len;
            if self.idx_map.is_some() {
                self.idx_map = Some(mmap::map_index(idx, len as usize)?);
            }
        }
        Ok(())
    }

    /// Writes the buffered bytes (`unwritten`, which end at `end`) to the log file, then the
    /// buffered index entries to the index file: one call each. What fails to be written stays
    /// buffered.
    pub(super) fn flush(&mut self) -> Result<()> {
        self.flush_log()?;
        self.write_entries()
    }

    /// Writes the buffered index entries to the index file, in one call (the buffer keeps its
    /// room).
    fn write_entries(&mut self) -> Result<()> {
        if !self.idx_pending.is_empty() {
            self.open_index()?
                .write_all_at(&self.idx_pending, IDX_HEADER + self.idx_written * ENTRY)?;
            self.idx_written = self.count;
            self.idx_pending.clear();
        }
        Ok(())
    }

    /// Writes the buffered bytes to the log file, in one call; the index entries stay buffered
    /// (a read of the bytes finds their entries in the buffer).
    pub(super) fn flush_log(&mut self) -> Result<()> {
        let pending = self.pending();
        if pending == 0 {
            return Ok(());
        }
        let rel = self.end - self.base.bytes - pending;
        let log = self.local_log()?;
        match (self.unwritten.is_empty(), self.held.as_slice()) {
            (_, []) => log.write_all_at(&self.unwritten, rel)?,
            (true, [one]) => log.write_all_at(one, rel)?,
            (_, held) => {
                let mut bufs: Vec<&[u8]> = Vec::with_capacity(held.len() + 1);
                if !self.unwritten.is_empty() {
                    bufs.push(&self.unwritten);
                }
                bufs.extend(held.iter().map(|b| &b[..]));
                fs::write_all_vectored_at(&log, &bufs, rel)?;
            }
        }
        self.unwritten.clear();
        self.held.clear();
        self.held_len = 0;
        self.written_to(self.end - self.base.bytes);
        Ok(())
    }

    /// The log holds its bytes up to `end` (from the segment's start): once [`WRITEBACK_AT`]
    /// of them were not asked for, notes their range for [`SegmentSet::take_writeback`].
    pub(super) fn written_to(&mut self, end: u64) {
        if end.saturating_sub(self.started) >= WRITEBACK_AT {
            let from = self.writeback.map_or(self.started, |(from, _)| from);
            self.writeback = Some((from, end));
            self.started = end;
        }
    }

    /// The first message of this segment that starts at or after byte position `pos` (its
    /// index; `count` past the last).
    fn first_starting_at(&self, pos: u64) -> u64 {
        let k = self.count_ending_by(pos);
        if k < self.count && self.entry_start(k) < pos {
            k + 1
        } else {
            k
        }
    }

    /// Where cold block `g` of this segment starts: at its first message, the first that
    /// starts at or after `base + g * COLD_BLOCK` (the segment's end past the last).
    fn cold_block_start(&self, g: u64) -> u64 {
        let i = self.first_starting_at(self.base.bytes.saturating_add(g * COLD_BLOCK));
        if i < self.count {
            self.entry_start(i)
        } else {
            self.end
        }
    }

    /// Appends the cold blocks covering `[from, to)` of this (cold) segment to `out`. A message
    /// belongs to the block its start falls in (`(start - base) / COLD_BLOCK`), so blocks hold
    /// whole messages, can be checked against the index, and are the same for every read.
    pub(super) fn cold_pieces(&self, from: u64, to: u64, out: &mut Vec<Piece>) {
        let mut pos = from;
        while pos < to {
            // The message containing `pos`, and the block its start falls in.
            let i = self.count_ending_by(pos).min(self.count.saturating_sub(1));
            let g = (self.entry_start(i) - self.base.bytes) / COLD_BLOCK;
            let start = self.cold_block_start(g);
            let mut end = self.cold_block_start(g + 1);
            if end <= pos {
                end = self.end;
            }
            let want = (pos, to.min(end));
            out.push(Piece::Cold(ColdPiece {
                seg_base: self.base.bytes,
                seg_len: self.end - self.base.bytes,
                block: (start, end),
                want,
            }));
            pos = want.1;
        }
    }

    /// Checks, against their index entries, the messages not yet verified that start before `to`.
    pub(super) fn verify_to(&mut self, to: u64, path: &Path) -> Result<()> {
        while self.verified < self.count && self.entry_start(self.verified) < to {
            let i = self.verified;
            let (start, end) = (self.entry_start(i), self.entry_end(i));
            if start < self.base.bytes || end <= start || end > self.end {
                return Err(Error::corrupt(
                    idx_path(path, self.base.bytes),
                    format!("index entry {i} is out of order"),
                ));
            }
            let crc = self.entry_crc(i);
            let map = self.map_for(end)?;
            let bytes =
                map.get((start - self.base.bytes) as usize..(end - self.base.bytes) as usize);
            if bytes.map(crc32fast::hash) != Some(crc) {
                return Err(Error::corrupt(
                    log_path(path, self.base.bytes),
                    format!("message {i} fails its checksum"),
                ));
            }
            self.verified += 1;
        }
        Ok(())
    }
}
