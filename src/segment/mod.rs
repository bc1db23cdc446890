//! A stream's own data: a run of segment logs with an mmap'd index each.
//!
//! `{base:020}.log` holds raw message bytes, contiguous, so a catch-up read is a view of the map
//! with no copy. `{base:020}.idx` holds one entry per message:
//! ```text
//! header  0..4   magic "BRKI"
//!         4..8   format version (u32 LE) = 1
//!         8..16  messages before the segment (u64 LE)
//!        16..24  bytes before the segment (u64 LE) (= the number in the file name)
//!        24..32  reserved, 0
//! entry   0..8   end of the message, absolute byte position (u64 LE)
//!         8..12  crc32 of the message's bytes (u32 LE)
//!        12..16  reserved, 0
//! ```
//! The index is derived: the stream's sidecar and journal say how many messages are valid, and
//! an index that disagrees with the log is reported as corruption.

mod mmap;

#[cfg(feature = "http")]
pub(crate) use mmap::{FileRange, file_range};

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::fs;
use crate::name::Offset;
use crate::state::Body;
use mmap::ReadMap;

const IDX_MAGIC: &[u8; 4] = b"BRKI";
const IDX_VERSION: u32 = 1;
const IDX_HEADER: u64 = 32;
const ENTRY: u64 = 16;
const MIN_LOG_CAP: u64 = 64 << 10;
const MIN_IDX_ENTRIES: u64 = 1024;

/// A snapshot blob's bytes as a view of its file (mapped, not read into memory), so serving a
/// large snapshot does not hold a copy of it.
pub(crate) fn blob_view(path: &Path) -> Result<Bytes> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    let len = usize::try_from(len)
        .map_err(|_| Error::corrupt(path, "snapshot blob larger than the address space"))?;
    Ok(Bytes::from_owner(mmap::map_blob(file, len)?))
}

fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

fn idx_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

/// Whether `path` names a segment log (whose removal must be durable before its index's: see
/// `discard_all` in the engine).
pub(crate) fn is_log(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_log_name)
        .is_some()
}

/// The base byte position of the segment log named `name`, or `None` if it names none.
pub(crate) fn parse_log_name(name: &str) -> Option<u64> {
    name.strip_suffix(".log")?.parse().ok()
}

struct Segment {
    base: Offset,
    /// Shared with the read maps, which keep it open for responses still sending their bytes.
    /// `None` for a cold segment: a sealed one whose log is only in the cold tier (its index
    /// stays here), read through [`Piece::Cold`].
    log: Option<Arc<File>>,
    log_cap: u64,
    idx: File,
    /// The index file, read-only: entries reach it by `pwrite` (see `idx_pending`), so a
    /// checkpoint's sync, which write-protects the pages it writes back, leaves no page for the
    /// next append to fault on.
    idx_map: Mmap,
    /// Messages in this segment.
    count: u64,
    /// Messages whose index entries are in the index file; those of the rest (up to `count`)
    /// are in `idx_pending`.
    idx_written: u64,
    /// The encoded index entries of messages `idx_written..count`, written to the index file
    /// with the log's buffered bytes (`flush`), in one call.
    idx_pending: Vec<u8>,
    /// Absolute end in bytes.
    end: u64,
    /// Messages, from the segment's first, whose bytes are known to match their index entry:
    /// written by this process, or checked against their CRC on first read after an open. Reads
    /// serve only checked bytes, so a damaged log or index is an error, never wrong data.
    verified: u64,
    read_map: Option<Arc<ReadMap>>,
    /// The last bytes appended, not yet written to the log file: they end at `end`. The
    /// journal holds them (an append is acknowledged once its journal record is written), so
    /// the log is written lazily, in one call for many appends: when [`FLUSH_AT`] bytes have
    /// gathered, when a read reaches into them, and when a checkpoint rotates the journal
    /// (before the sync that lets the journal go). Bodies of [`WRITE_THROUGH`] bytes or more
    /// are written at once (what is buffered first); their index entries wait with the others.
    unwritten: Vec<u8>,
    /// Bodies of placed appends (`journal::Placed`) that follow `unwritten`, held as they came
    /// (the request's own buffers) rather than copied: the writer writes them, with
    /// `unwritten`, in one `pwritev` before it acknowledges their batch. `held_len` is their
    /// total length.
    held: Vec<Bytes>,
    held_len: u64,
    /// The log's bytes, from the segment's start, whose write-back was asked for (see
    /// [`WRITEBACK_AT`]).
    started: u64,
    /// A range of the log (from, to; from the segment's start) to start writing back, once
    /// the engine takes it ([`SegmentSet::take_writeback`]).
    writeback: Option<(u64, u64)>,
}

impl Drop for Segment {
    /// Writes what is still buffered (the engine's checkpoints flush every stream they record,
    /// so this matters only to a segment dropped between checkpoints, such as one of a store
    /// that was shut down without its final checkpoint).
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// A segment's write buffer is written to its log once it holds this much: the bound on the
/// memory a stream's unwritten appends take.
const FLUSH_AT: usize = 16 << 10;

/// Once this many bytes were written to a log since its write-back was last asked for, the
/// range is handed to the engine, whose checkpoint thread has the kernel start writing it
/// (`fs::start_writeback`), so a checkpoint's `syncfs` does not find a whole checkpoint's
/// segment bytes dirty at once.
const WRITEBACK_AT: u64 = 1 << 20;

/// Bodies at least this long are written to the log at once (after what is buffered), not
/// copied into the segment's write buffer.
const WRITE_THROUGH: usize = 64 << 10;

/// The cold tier's unit of fetching and caching, in bytes of a segment: whole messages whose
/// starts fall in one aligned `COLD_BLOCK` of the segment (so a block is at most this plus its
/// last message).
pub(crate) const COLD_BLOCK: u64 = 1 << 20;

/// One part of a read, in order: bytes at hand, or a range of a cold block to fetch.
pub(crate) enum Piece {
    /// A view of a local segment's map.
    Local(Bytes),
    /// Bytes `want` (absolute positions) of the cold block `block` of the segment at
    /// `seg_base` (a log of `seg_len` bytes in the tier).
    Cold(ColdPiece),
}

/// A range of a cold block: see [`Piece::Cold`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColdPiece {
    /// The segment's base byte position (its name).
    pub(crate) seg_base: u64,
    /// The segment's log length.
    pub(crate) seg_len: u64,
    /// The block, absolute byte positions: whole messages.
    pub(crate) block: (u64, u64),
    /// The bytes of the read inside the block, absolute.
    pub(crate) want: (u64, u64),
}

/// An owner for a slice of a map, so `Bytes` can point into it without copying.
struct MapSlice {
    map: Arc<ReadMap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MapSlice {
    fn as_ref(&self) -> &[u8] {
        // Ranges are checked against the map's length when the slice is made.
        self.map.get(self.start..self.end).unwrap_or(&[])
    }
}

impl Segment {
    /// Creates a segment at `base`: an empty log, unless `keep_log` (replay), which keeps the
    /// bytes of a log already there for [`SegmentSet::adopt`]; always a new index.
    fn create(dir: &Path, base: Offset, keep_log: bool) -> Result<Segment> {
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
        let idx_map = mmap::map_index(&idx, idx_len as usize)?;
        Ok(Segment {
            base,
            log,
            log_cap,
            idx,
            idx_map,
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
        })
    }

    /// Opens a segment's files; `cold_len` is the log's length in the cold tier when the local
    /// log is missing and the tier holds it (the segment then opens cold).
    fn open(dir: &Path, base_bytes: u64, cold_len: Option<u64>) -> Result<Segment> {
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
        Ok(Segment {
            base,
            log,
            log_cap,
            idx,
            idx_map,
            count: 0,
            idx_written: 0,
            idx_pending: Vec::new(),
            end: base_bytes,
            verified: 0,
            read_map: None,
            unwritten: Vec::new(),
            held: Vec::new(),
            held_len: 0,
            started: 0,
            writeback: None,
        })
    }

    /// Index entry `i`'s bytes: from the file, or from `idx_pending` when not written yet.
    fn entry(&self, i: u64) -> Option<&[u8]> {
        let (bytes, at) = match i.checked_sub(self.idx_written) {
            Some(p) => (&self.idx_pending[..], p * ENTRY),
            None => (&self.idx_map[..], IDX_HEADER + i * ENTRY),
        };
        bytes.get(at as usize..(at + ENTRY) as usize)
    }

    fn entry_end(&self, i: u64) -> u64 {
        self.entry(i)
            .and_then(|e| e[0..8].try_into().ok())
            .map_or(u64::MAX, u64::from_le_bytes)
    }

    fn entry_crc(&self, i: u64) -> u32 {
        self.entry(i)
            .and_then(|e| e[8..12].try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }

    fn entry_start(&self, i: u64) -> u64 {
        if i == 0 {
            self.base.bytes
        } else {
            self.entry_end(i - 1)
        }
    }

    /// Messages of this segment that end at or before `pos`.
    fn count_ending_by(&self, pos: u64) -> u64 {
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

    fn map_for(&mut self, end: u64) -> Result<Arc<ReadMap>> {
        let need = end - self.base.bytes;
        if let Some(m) = &self.read_map
            && m.len() as u64 >= need
        {
            return Ok(m.clone());
        }
        let log = self.local_log()?;
        let m = Arc::new(mmap::map_read(log, self.log_cap as usize)?);
        self.read_map = Some(m.clone());
        Ok(m)
    }

    /// The local log file (a cold segment has none: `Corrupt`, as nothing reads or writes a
    /// cold segment's log here).
    fn local_log(&self) -> Result<&Arc<File>> {
        self.log.as_ref().ok_or_else(|| {
            Error::corrupt(
                format!("{:020}.log", self.base.bytes),
                "the segment's log is in the cold tier",
            )
        })
    }

    /// Bytes appended and not yet in the log file: `unwritten`, then `held`.
    fn pending(&self) -> u64 {
        self.unwritten.len() as u64 + self.held_len
    }

    /// Appends `body` (its bytes buffered, held (`hold`: a placed append's, see `held`) or
    /// written through, its index entries buffered) to this segment of the stream in `dir`,
    /// growing the files as needed.
    fn write(&mut self, dir: &Path, body: &Body, hold: bool) -> Result<()> {
        let rel = self.end - self.base.bytes;
        let need = rel + body.data.len() as u64;
        if need > self.log_cap {
            let cap = need.next_power_of_two().max(MIN_LOG_CAP);
            fs::set_len(self.local_log()?, &log_path(dir, self.base.bytes), cap)?;
            self.log_cap = cap;
        }
        if body.data.len() >= WRITE_THROUGH {
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
            if self.unwritten.len() + body.data.len() > self.unwritten.capacity().max(FLUSH_AT) {
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
                let want = (4 * body.data.len())
                    .max(2 * self.unwritten.capacity())
                    .min(FLUSH_AT + body.data.len())
                    .max(need);
                self.unwritten.reserve_exact(want - self.unwritten.len());
            }
            self.unwritten.extend_from_slice(&body.data);
        }
        self.add_entries(dir, body)
    }

    /// The index part of an append of `body`, whose bytes are in the log or its buffer from
    /// `end` on: buffers its index entries and moves `end` past it.
    fn add_entries(&mut self, dir: &Path, body: &Body) -> Result<()> {
        let n = body.ends.len() as u64;
        let need_idx = IDX_HEADER + (self.count + n) * ENTRY;
        if need_idx > self.idx_map.len() as u64 {
            let len =
                IDX_HEADER + (self.count + n).next_power_of_two().max(MIN_IDX_ENTRIES) * ENTRY;
            fs::set_len(&self.idx, &idx_path(dir, self.base.bytes), len)?;
            self.idx_map = mmap::map_index(&self.idx, len as usize)?;
        }
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
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffered bytes (`unwritten`, which end at `end`) to the log file, then the
    /// buffered index entries to the index file: one call each. What fails to be written stays
    /// buffered.
    fn flush(&mut self) -> Result<()> {
        self.flush_log()?;
        if !self.idx_pending.is_empty() {
            self.idx
                .write_all_at(&self.idx_pending, IDX_HEADER + self.idx_written * ENTRY)?;
            self.idx_written = self.count;
            self.idx_pending.clear();
        }
        Ok(())
    }

    /// Writes the buffered bytes to the log file, in one call; the index entries stay buffered
    /// (a read of the bytes finds their entries in the buffer).
    fn flush_log(&mut self) -> Result<()> {
        let pending = self.pending();
        if pending == 0 {
            return Ok(());
        }
        let rel = self.end - self.base.bytes - pending;
        match (self.unwritten.is_empty(), self.held.as_slice()) {
            (_, []) => self.local_log()?.write_all_at(&self.unwritten, rel)?,
            (true, [one]) => self.local_log()?.write_all_at(one, rel)?,
            (_, held) => {
                let mut bufs: Vec<&[u8]> = Vec::with_capacity(held.len() + 1);
                if !self.unwritten.is_empty() {
                    bufs.push(&self.unwritten);
                }
                bufs.extend(held.iter().map(|b| &b[..]));
                fs::write_all_vectored_at(self.local_log()?, &bufs, rel)?;
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
    fn written_to(&mut self, end: u64) {
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
    fn cold_pieces(&self, from: u64, to: u64, out: &mut Vec<Piece>) {
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
    fn verify_to(&mut self, to: u64, path: &Path) -> Result<()> {
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

/// The segments of one stream, from its base (fork point or zero) to its applied end.
pub(crate) struct SegmentSet {
    dir: PathBuf,
    segs: Vec<Segment>,
    segment_bytes: u64,
    /// Opened or created by recovery's replay, until [`SegmentSet::end_replay`]: the logs on
    /// disk past the applied end may hold the bytes of placed appends still to be replayed
    /// ([`SegmentSet::adopt`]), so they are kept, and a segment created by a roll keeps the log
    /// already there.
    replaying: bool,
    /// While `replaying`: the bases of the logs on disk past the last segment, ascending. The
    /// writer rolled to each of them (at its `segment_bytes`, which may not be this open's), so
    /// replay rolls exactly there and nowhere else, and finds placed bytes where they were put.
    ahead: Vec<u64>,
}

/// The bases of the segment logs in `dir` past `after`, ascending.
fn logs_after(dir: &Path, after: u64) -> Result<Vec<u64>> {
    let mut bases: Vec<u64> = std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(parse_log_name))
        .filter(|&b| b > after)
        .collect();
    bases.sort_unstable();
    Ok(bases)
}

impl SegmentSet {
    /// Creates the first segment of a new stream at `base`.
    pub(crate) fn create(dir: &Path, base: Offset, segment_bytes: u64) -> Result<SegmentSet> {
        Self::create_as(dir, base, segment_bytes, false)
    }

    /// Creates the first segment of a stream whose create replay is applying: a log already
    /// there keeps its bytes, for the placed appends that follow (see `replaying`).
    pub(crate) fn create_replaying(
        dir: &Path,
        base: Offset,
        segment_bytes: u64,
    ) -> Result<SegmentSet> {
        Self::create_as(dir, base, segment_bytes, true)
    }

    fn create_as(
        dir: &Path,
        base: Offset,
        segment_bytes: u64,
        replaying: bool,
    ) -> Result<SegmentSet> {
        let ahead = if replaying {
            logs_after(dir, base.bytes)?
        } else {
            Vec::new()
        };
        Ok(SegmentSet {
            dir: dir.to_path_buf(),
            segs: vec![Segment::create(dir, base, replaying)?],
            segment_bytes,
            replaying,
            ahead,
        })
    }

    /// Opens a stream's segments, valid from `start` (its base, or the retained start when
    /// retention may have reclaimed segments) to `end`. `cold` lists the sealed segments the
    /// cold tier holds, as (base byte position, log length): one whose local log is missing
    /// opens cold (its index must be here).
    ///
    /// Segment files that start at or after `end` (other than the first) hold nothing durable and
    /// are removed (kept while `replaying`: see [`SegmentSet::end_replay`]); so are those wholly
    /// before the segment holding `start`, which retention reclaimed (a power loss may keep
    /// some of those removals and undo others). The last message is checked against its index
    /// entry.
    pub(crate) fn open(
        dir: &Path,
        start: Offset,
        end: Offset,
        segment_bytes: u64,
        cold: &[(u64, u64)],
        replaying: bool,
    ) -> Result<SegmentSet> {
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(b) = entry.file_name().to_str().and_then(parse_log_name) {
                bases.push(b);
            }
        }
        bases.extend(cold.iter().map(|c| c.0).filter(|b| *b < end.bytes));
        bases.sort_unstable();
        bases.dedup();
        // The segment holding `start` among those the state knows of (starting before `end`).
        let first = bases
            .iter()
            .rposition(|&b| b <= start.bytes && b < end.bytes)
            .unwrap_or(0);
        for &b in &bases[..first] {
            let _ = fs::remove_file(&log_path(dir, b));
            let _ = fs::remove_file(&idx_path(dir, b));
        }
        let mut segs: Vec<Segment> = Vec::new();
        for &b in &bases[first..] {
            if segs.is_empty() || b < end.bytes {
                let cold_len = cold.iter().find(|c| c.0 == b).map(|c| c.1);
                segs.push(Segment::open(dir, b, cold_len)?);
            } else if !replaying {
                fs::remove_file(&log_path(dir, b))?;
                let _ = fs::remove_file(&idx_path(dir, b));
            }
        }
        if segs.is_empty() {
            return Err(Error::corrupt(dir, "stream has no segment"));
        }
        let n = segs.len();
        for i in 0..n {
            let next = if i + 1 < n { segs[i + 1].base } else { end };
            let s = &mut segs[i];
            if next.bytes < s.base.bytes || next.messages < s.base.messages {
                return Err(Error::corrupt(dir, "segments out of order"));
            }
            s.count = next.messages - s.base.messages;
            s.idx_written = s.count;
            s.end = next.bytes;
            let idx_entries = (s.idx_map.len() as u64 - IDX_HEADER) / ENTRY;
            if s.count > idx_entries || s.end - s.base.bytes > s.log_cap {
                return Err(Error::corrupt(
                    idx_path(dir, s.base.bytes),
                    "index or log shorter than the stream",
                ));
            }
            if s.count > 0 && s.entry_end(s.count - 1) != s.end {
                return Err(Error::corrupt(
                    idx_path(dir, s.base.bytes),
                    "index disagrees with the stream's length",
                ));
            }
        }
        let ahead = match (replaying, segs.last()) {
            (true, Some(last)) => logs_after(dir, last.base.bytes)?,
            _ => Vec::new(),
        };
        let mut set = SegmentSet {
            dir: dir.to_path_buf(),
            segs,
            segment_bytes,
            replaying,
            ahead,
        };
        set.verify_last()?;
        Ok(set)
    }

    /// Recovery's replay is over: later rolls start empty logs, and the segment files past the
    /// last segment (a roll whose placed appends replay did not adopt) are removed.
    pub(crate) fn end_replay(&mut self) {
        if !std::mem::take(&mut self.replaying) {
            return;
        }
        self.ahead = Vec::new();
        let last = self.segs.last().map_or(0, |s| s.base.bytes);
        for b in logs_after(&self.dir, last).unwrap_or_default() {
            let _ = fs::remove_file(&log_path(&self.dir, b));
            let _ = fs::remove_file(&idx_path(&self.dir, b));
        }
    }

    /// Checks the newest message's bytes against its index CRC.
    fn verify_last(&mut self) -> Result<()> {
        let Some(s) = self.segs.iter_mut().rev().find(|s| s.count > 0) else {
            return Ok(());
        };
        let i = s.count - 1;
        let (start, end) = (s.entry_start(i), s.end);
        let crc = s.entry_crc(i);
        let map = s.map_for(end)?;
        let range = start
            .checked_sub(s.base.bytes)
            .zip(end.checked_sub(s.base.bytes));
        let bytes = range.and_then(|(a, b)| map.get(a as usize..b as usize));
        if bytes.map(crc32fast::hash) != Some(crc) {
            return Err(Error::corrupt(
                log_path(&self.dir, s.base.bytes),
                "last message fails its checksum",
            ));
        }
        Ok(())
    }

    /// The applied end.
    pub(crate) fn end(&self) -> Offset {
        self.segs
            .last()
            .map(|s| Offset::new(s.base.messages + s.count, s.end))
            .unwrap_or_default()
    }

    /// Appends a body at the end; `start` must be the current end.
    pub(crate) fn append(&mut self, start: Offset, body: &Body) -> Result<()> {
        self.append_as(start, body, false)
    }

    /// Appends a placed body (see `journal::Placed`) at the end: as [`SegmentSet::append`], but
    /// its bytes are held, not copied, and reach the log at the next
    /// [`SegmentSet::write_placed`], which the writer calls before it acknowledges the batch.
    pub(crate) fn append_placed(&mut self, start: Offset, body: &Body) -> Result<()> {
        self.append_as(start, body, true)
    }

    fn append_as(&mut self, start: Offset, body: &Body, hold: bool) -> Result<()> {
        self.check_start(start)?;
        if body.data.is_empty() {
            return Ok(());
        }
        self.roll_if_full(start)?;
        match self.segs.last_mut() {
            Some(s) => s.write(&self.dir, body, hold),
            None => Err(Error::corrupt(&self.dir, "stream has no segment")),
        }
    }

    /// Writes the buffered bytes to the log if placed bodies are held among them (one call for
    /// all the stream's placed appends in a batch); the index entries stay buffered. Held bodies
    /// can only be in the last segment: a roll, a copied body and a read write them first.
    pub(crate) fn write_placed(&mut self) -> Result<()> {
        match self.segs.last_mut() {
            Some(s) if !s.held.is_empty() => s.flush_log(),
            _ => Ok(()),
        }
    }

    /// Replay: takes the `placed.len` bytes at the end of the log as the body of a placed
    /// append at `start` whose message ends are `ends`, if they are there and match
    /// `placed.crc`: appends their index entries and returns the body (its bytes read back).
    /// `None` when the log does not hold them (the process died before it wrote them; after a
    /// power loss, their pages never reached the disk): the stream ends before this append.
    pub(crate) fn adopt(
        &mut self,
        start: Offset,
        ends: &[u32],
        placed: crate::journal::Placed,
    ) -> Result<Option<Body>> {
        self.check_start(start)?;
        self.roll_if_full(start)?;
        let (dir, segs) = (&self.dir, &mut self.segs);
        let Some(s) = segs.last_mut() else {
            return Err(Error::corrupt(dir, "stream has no segment"));
        };
        // Bytes replayed from the journal before this append go to the log first, so the log
        // is written up to `end`.
        s.flush_log()?;
        let rel = s.end - s.base.bytes;
        let len = u64::from(placed.len);
        if rel + len > s.log_cap {
            return Ok(None);
        }
        let mut data = vec![0u8; placed.len as usize];
        if s.local_log()?.read_exact_at(&mut data, rel).is_err()
            || crc32fast::hash(&data) != placed.crc
        {
            return Ok(None);
        }
        let body = Body::new(Bytes::from(data), ends.to_vec());
        if ends.len() == 1 {
            let _ = body.crc.set(placed.crc);
        }
        s.add_entries(dir, &body)?;
        s.written_to(rel + len);
        Ok(Some(body))
    }

    fn check_start(&self, start: Offset) -> Result<()> {
        if start != self.end() {
            return Err(Error::corrupt(
                &self.dir,
                format!("append at {start} but the stream ends at {}", self.end()),
            ));
        }
        Ok(())
    }

    /// Starts a new segment at `start` (the end) once the last one is full; while
    /// `replaying`, where the writer did (see `ahead`), keeping the bytes of the log there.
    fn roll_if_full(&mut self, start: Offset) -> Result<()> {
        let roll = if self.replaying {
            self.ahead.retain(|&b| b >= start.bytes);
            self.ahead.first() == Some(&start.bytes)
                && self.segs.last().is_some_and(|s| s.base.bytes < start.bytes)
        } else {
            self.segs
                .last()
                .is_some_and(|s| s.count > 0 && s.end - s.base.bytes >= self.segment_bytes)
        };
        if roll {
            self.flush()?;
            let seg = Segment::create(&self.dir, start, self.replaying)?;
            self.segs.push(seg);
        }
        Ok(())
    }

    /// The last segment's log and the range of it written since its write-back was last asked
    /// for, once that is [`WRITEBACK_AT`] or more (absolute file offsets in the log).
    pub(crate) fn take_writeback(&mut self) -> Option<(Arc<File>, u64, u64)> {
        let seg = self.segs.last_mut()?;
        let (from, to) = seg.writeback.take()?;
        Some((seg.log.clone()?, from, to - from))
    }

    /// Writes the bytes appended since the last flush to the log file, and gives the write
    /// buffer's memory back. Appends are buffered (see `Segment::unwritten`); reads flush what
    /// they need themselves, and a checkpoint flushes before it syncs the file system.
    pub(crate) fn flush(&mut self) -> Result<()> {
        match self.segs.last_mut() {
            Some(s) => {
                s.flush()?;
                s.unwritten = Vec::new();
                s.idx_pending = Vec::new();
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Views of the bytes in `[from, to)`, without copying, and the cold tier's blocks for the
    /// parts in cold segments (to fetch without this set's lock: see [`Piece::Cold`]). Fails
    /// with `None` when part of the range is not held (reclaimed by retention).
    pub(crate) fn read(&mut self, from: u64, to: u64) -> Result<Option<Vec<Piece>>> {
        let mut out = Vec::new();
        let mut pos = from;
        for s in &mut self.segs {
            if pos >= to {
                break;
            }
            if s.end <= pos || s.base.bytes >= to {
                continue;
            }
            if s.base.bytes > pos {
                return Ok(None);
            }
            let end = to.min(s.end);
            if s.log.is_none() {
                s.cold_pieces(pos, end, &mut out);
                pos = end;
                continue;
            }
            if end > s.end - s.pending() {
                // A read is served from the log's map: the bytes it reaches must be in the file
                // (their index entries need not: they are read from the buffer).
                s.flush_log()?;
            }
            s.verify_to(end, &self.dir)?;
            let map = s.map_for(end)?;
            let (a, b) = ((pos - s.base.bytes) as usize, (end - s.base.bytes) as usize);
            if b > map.len() {
                return Err(Error::corrupt(
                    log_path(&self.dir, s.base.bytes),
                    "log shorter than its index",
                ));
            }
            out.push(Piece::Local(Bytes::from_owner(MapSlice {
                map,
                start: a,
                end: b,
            })));
            pos = end;
        }
        Ok((pos >= to).then_some(out))
    }

    /// [`SegmentSet::read`] of a range with no cold segment in it, as plain views (tests).
    #[cfg(test)]
    pub(crate) fn read_local(&mut self, from: u64, to: u64) -> Result<Option<Vec<Bytes>>> {
        Ok(self.read(from, to)?.map(|v| {
            v.into_iter()
                .map(|p| match p {
                    Piece::Local(b) => b,
                    Piece::Cold(c) => panic!("unexpected cold piece {c:?}"),
                })
                .collect()
        }))
    }

    /// Whether reading `[from, to)` needs no message checked against its checksum first, so the
    /// read touches no data pages (and can run where blocking is not allowed).
    #[cfg(feature = "http")]
    pub(crate) fn verified(&self, from: u64, to: u64) -> bool {
        self.segs
            .iter()
            .filter(|s| s.end > from && s.base.bytes < to)
            .all(|s| s.log.is_some() && (s.verified >= s.count || s.entry_start(s.verified) >= to))
    }

    #[cfg(feature = "tier")]
    /// Turns the sealed segment at byte position `base` cold: its log is in the cold tier and
    /// is about to leave the disk, so this set lets go of the file and its map (views already
    /// handed out keep theirs). False if no such sealed segment is here.
    pub(crate) fn make_cold(&mut self, base: u64) -> bool {
        let n = self.segs.len();
        match self
            .segs
            .iter_mut()
            .take(n.saturating_sub(1))
            .find(|s| s.base.bytes == base)
        {
            Some(s) => {
                s.log = None;
                s.read_map = None;
                true
            }
            None => false,
        }
    }

    #[cfg(feature = "tier")]
    /// Checks the bytes of a cold block (`block` as [`Piece::Cold`] named it, fetched from the
    /// tier) against the index entries of its messages: `Corrupt` if any differs or the block
    /// is not the length the index says.
    pub(crate) fn check_block(&self, seg_base: u64, block: (u64, u64), bytes: &[u8]) -> Result<()> {
        let bad = |why: &str| Error::corrupt(log_path(&self.dir, seg_base), why.to_owned());
        let s = self
            .segs
            .iter()
            .find(|s| s.base.bytes == seg_base)
            .ok_or_else(|| bad("the segment of a cold block is gone"))?;
        if bytes.len() as u64 != block.1 - block.0 {
            return Err(bad("a cold block has the wrong length"));
        }
        let mut i = s.count_ending_by(block.0);
        while i < s.count && s.entry_end(i) <= block.1 {
            let (a, b) = (s.entry_start(i) - block.0, s.entry_end(i) - block.0);
            let got = bytes.get(a as usize..b as usize).map(crc32fast::hash);
            if got != Some(s.entry_crc(i)) {
                return Err(bad(&format!("cold message {i} fails its checksum")));
            }
            i += 1;
        }
        Ok(())
    }

    fn seg_for(&self, pos: u64) -> Option<&Segment> {
        self.segs.iter().rev().find(|s| s.base.bytes <= pos)
    }

    /// The offset of byte position `pos`: the messages that end at or before it.
    pub(crate) fn offset_at(&self, pos: u64) -> Offset {
        match self.seg_for(pos) {
            Some(s) => Offset::new(s.base.messages + s.count_ending_by(pos), pos),
            None => Offset::new(0, pos),
        }
    }

    /// Whether `pos` is a message boundary (or the segment set's start).
    pub(crate) fn is_boundary(&self, pos: u64) -> bool {
        match self.seg_for(pos) {
            Some(s) if pos == s.base.bytes => true,
            Some(s) => {
                let k = s.count_ending_by(pos);
                k > 0 && s.entry_end(k - 1) == pos
            }
            None => false,
        }
    }

    /// The largest message boundary in `(from, limit]`, or, if none, the end of the message that
    /// contains `from` (so a read always makes progress by whole messages).
    pub(crate) fn boundary_for_read(&self, from: u64, limit: u64) -> u64 {
        let end = self.end().bytes;
        let limit = limit.min(end);
        if let Some(s) = self.seg_for(limit) {
            let k = s.count_ending_by(limit);
            let b = if k > 0 {
                s.entry_end(k - 1)
            } else {
                s.base.bytes
            };
            if b > from {
                return b;
            }
        }
        self.next_boundary_after(from).unwrap_or(end)
    }

    /// The first message end strictly after `pos`.
    pub(crate) fn next_boundary_after(&self, pos: u64) -> Option<u64> {
        let s = self.seg_for(pos)?;
        let k = s.count_ending_by(pos);
        if k < s.count {
            return Some(s.entry_end(k));
        }
        self.segs
            .iter()
            .find(|n| n.base.bytes > pos && n.count > 0)
            .map(|n| n.entry_end(0))
    }

    /// Message boundaries `(start, end)` of the messages inside `[from, to)`.
    pub(crate) fn message_ranges(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for s in &self.segs {
            if s.end <= from || s.base.bytes >= to {
                continue;
            }
            let mut i = s.count_ending_by(from);
            while i < s.count {
                let (a, b) = (s.entry_start(i), s.entry_end(i));
                if b > to {
                    break;
                }
                if a >= from {
                    out.push((a, b));
                }
                i += 1;
            }
        }
        out
    }

    /// Drops whole segments that end at or before `earliest` (never the last one) and returns
    /// their files, to be unlinked once the retention record is durable.
    pub(crate) fn retain(&mut self, earliest: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        while self.segs.len() > 1
            && self.segs[0].end <= earliest
            && self.segs[1].base.bytes <= earliest
        {
            let s = self.segs.remove(0);
            gone.push(log_path(&self.dir, s.base.bytes));
            gone.push(idx_path(&self.dir, s.base.bytes));
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(msgs: &[&[u8]]) -> Body {
        let mut data = Vec::new();
        let mut ends = Vec::new();
        for m in msgs {
            data.extend_from_slice(m);
            ends.push(data.len() as u32);
        }
        Body::new(data.into(), ends)
    }

    #[test]
    #[cfg(feature = "tier")]
    fn cold_segments_read_as_whole_message_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 3 << 20).unwrap();
        let mut expect = Vec::new();
        // 300-byte messages: a 1 MiB block boundary falls inside one.
        for i in 0..12_000u32 {
            let m = format!("{i:0300}");
            set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
            expect.extend_from_slice(m.as_bytes());
        }
        set.flush().unwrap();
        assert!(set.segs.len() > 1);
        let first_len = set.segs[1].base.bytes;
        assert!(set.make_cold(0));
        assert!(
            !set.make_cold(set.segs[1].base.bytes),
            "the open segment never goes cold"
        );
        let pieces = set.read(10, first_len + 10).unwrap().unwrap();
        let mut got = Vec::new();
        let mut blocks = Vec::new();
        for p in pieces {
            match p {
                Piece::Local(b) => got.extend_from_slice(&b),
                Piece::Cold(c) => {
                    assert_eq!(c.seg_base, 0);
                    assert!(c.block.0 <= c.want.0 && c.want.1 <= c.block.1);
                    assert!(set.is_boundary(c.block.0) && set.is_boundary(c.block.1));
                    let block = &expect[c.block.0 as usize..c.block.1 as usize];
                    set.check_block(0, c.block, block).unwrap();
                    let mut bad = block.to_vec();
                    bad[5] ^= 1;
                    assert!(matches!(
                        set.check_block(0, c.block, &bad),
                        Err(Error::Corrupt { ref reason, .. }) if reason.contains("fails its checksum")
                    ));
                    got.extend_from_slice(&expect[c.want.0 as usize..c.want.1 as usize]);
                    blocks.push(c.block);
                }
            }
        }
        assert_eq!(got, &expect[10..(first_len + 10) as usize]);
        assert!(blocks.len() >= 3, "{blocks:?}");
        assert!(blocks.windows(2).all(|w| w[0].1 == w[1].0));
        #[cfg(feature = "http")]
        assert!(!set.verified(0, 10));
    }

    #[test]
    fn append_read_roll_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 4096).unwrap();
        let mut expect = Vec::new();
        for i in 0..200u32 {
            let m = format!("message-{i:05}-").repeat(3);
            set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
            expect.extend_from_slice(m.as_bytes());
        }
        assert!(set.segs.len() > 1, "rolled");
        let end = set.end();
        assert_eq!(end, Offset::new(200, expect.len() as u64));
        let got: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
        assert_eq!(got, expect);
        let m = 42u64; // each message is "message-NNNNN-" three times
        assert!(set.is_boundary(m * 2));
        assert!(!set.is_boundary(m * 2 + 1));
        assert_eq!(set.offset_at(m * 5), Offset::new(5, m * 5));
        assert_eq!(set.offset_at(m * 5 + 3), Offset::new(5, m * 5 + 3));
        assert_eq!(set.boundary_for_read(0, 100), 84);
        assert_eq!(set.boundary_for_read(0, 10), 42);
        assert_eq!(
            set.message_ranges(42, 168),
            vec![(42, 84), (84, 126), (126, 168)]
        );
        let late = 150 * m;
        assert!(set.is_boundary(late));
        assert_eq!(set.offset_at(late + 1), Offset::new(150, late + 1));
        assert_eq!(set.next_boundary_after(late + 1), Some(late + m));
        drop(set);
        let mut set = SegmentSet::open(dir.path(), Offset::ZERO, end, 4096, &[], false).unwrap();
        let got: Vec<u8> = set.read_local(100, end.bytes).unwrap().unwrap().concat();
        assert_eq!(got, &expect[100..]);
        // Reopening at an earlier end (a checkpoint before a crash) drops later segments.
        let early = Offset::new(10, 420);
        drop(set);
        let set = SegmentSet::open(dir.path(), Offset::ZERO, early, 4096, &[], false).unwrap();
        assert_eq!(set.end(), early);
        assert_eq!(set.segs.len(), 1);
    }

    /// Bodies whose size does not divide `FLUSH_AT` never make the write buffer grow past
    /// a flush's worth (what is buffered is written first instead of copied into a larger
    /// buffer), and every byte still reads back, flushed or not.
    #[test]
    fn the_write_buffer_never_grows_past_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
        let mut expect = Vec::new();
        for (i, size) in [
            1usize, 4096, 4096, 4096, 4096, 5000, 300, 9000, 4095, 16_383,
        ]
        .into_iter()
        .cycle()
        .take(60)
        .enumerate()
        {
            let m: Vec<u8> = (0..size).map(|j| (i + j) as u8).collect();
            set.append(set.end(), &body(&[&m])).unwrap();
            expect.extend_from_slice(&m);
            let s = set.segs.last().unwrap();
            assert!(
                s.unwritten.capacity() <= FLUSH_AT + size,
                "capacity {} after a {size} B body",
                s.unwritten.capacity()
            );
            assert!(s.unwritten.len() < FLUSH_AT, "a full buffer is written");
        }
        let end = set.end().bytes;
        let got: Vec<u8> = set.read_local(0, end).unwrap().unwrap().concat();
        assert_eq!(got, expect);
        drop(set);
        let set = SegmentSet::open(
            dir.path(),
            Offset::ZERO,
            Offset::new(60, end),
            1 << 20,
            &[],
            false,
        );
        let got: Vec<u8> = set.unwrap().read_local(0, end).unwrap().unwrap().concat();
        assert_eq!(got, expect, "dropping the set wrote what was buffered");
    }

    /// Index entries wait with the buffered bytes and reach the index file at a flush (the map
    /// is read-only), not at a read; boundaries read the same before and after, a body of many
    /// small messages is flushed once its entries fill a buffer, and a reopened set finds every
    /// entry.
    #[test]
    fn index_entries_are_written_at_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
        set.append(set.end(), &body(&[b"ab", b"cde"])).unwrap();
        set.append(set.end(), &body(&[b"f"])).unwrap();
        let s = set.segs.last().unwrap();
        assert_eq!(
            (s.idx_written, s.idx_pending.len()),
            (0, 3 * ENTRY as usize)
        );
        let idx = std::fs::read(idx_path(dir.path(), 0)).unwrap();
        assert!(
            idx[IDX_HEADER as usize..].iter().all(|&b| b == 0),
            "nothing written yet"
        );
        let ends = |set: &SegmentSet| (1..=6).filter(|&p| set.is_boundary(p)).collect::<Vec<_>>();
        assert_eq!(ends(&set), [2, 5, 6]);
        // A read writes the bytes it serves, not their entries.
        let got: Vec<u8> = set.read_local(0, 6).unwrap().unwrap().concat();
        assert_eq!(got, b"abcdef");
        let s = set.segs.last().unwrap();
        assert!(s.unwritten.is_empty() && s.idx_pending.len() == 3 * ENTRY as usize);
        set.flush().unwrap();
        let s = set.segs.last().unwrap();
        assert_eq!((s.idx_written, s.idx_pending.len()), (3, 0));
        assert_eq!(ends(&set), [2, 5, 6]);
        let idx = std::fs::read(idx_path(dir.path(), 0)).unwrap();
        let at = IDX_HEADER as usize + 2 * ENTRY as usize;
        assert_eq!(
            idx[at..at + 8],
            6u64.to_le_bytes(),
            "the third entry ends at 6"
        );
        // 4096 one-byte messages: 64 KiB of entries for 4 KiB of data.
        let many: Vec<&[u8]> = vec![b"x"; 4096];
        set.append(set.end(), &body(&many)).unwrap();
        let s = set.segs.last().unwrap();
        assert!(
            s.idx_pending.is_empty() && s.idx_written == s.count,
            "flushed by its entries"
        );
        let end = set.end();
        drop(set);
        let mut set = SegmentSet::open(dir.path(), Offset::ZERO, end, 1 << 20, &[], false).unwrap();
        assert_eq!(set.end(), Offset::new(4099, 4102));
        assert!(set.is_boundary(4101) && set.is_boundary(5));
        let got: Vec<u8> = set.read_local(0, 6).unwrap().unwrap().concat();
        assert_eq!(got, b"abcdef");
    }

    #[test]
    fn a_damaged_last_message_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
        set.append(Offset::ZERO, &body(&[b"hello", b"world"]))
            .unwrap();
        let end = set.end();
        drop(set);
        let log = log_path(dir.path(), 0);
        let f = OpenOptions::new().write(true).open(&log).unwrap();
        f.write_all_at(b"W", 5).unwrap();
        assert!(matches!(
            SegmentSet::open(dir.path(), Offset::ZERO, end, 1 << 20, &[], false),
            Err(Error::Corrupt { .. })
        ));
    }

    /// Replay adopts a placed body where the writer put it, across a roll the writer made
    /// (whatever segment size this open has), and adopts nothing whose bytes are missing or
    /// differ; once replay is over, the logs past the last segment go.
    #[test]
    fn replay_adopts_placed_bytes_where_the_writer_put_them() {
        use crate::journal::Placed;
        let dir = tempfile::tempdir().unwrap();
        let a = body(&[&[1u8; 3000]]);
        let b = body(&[&[2u8; 1000], &[3u8; 2500]]);
        let c = body(&[&[4u8; 5000]]);
        let placed = |x: &Body| Placed {
            len: x.data.len() as u32,
            crc: crc32fast::hash(&x.data),
        };
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 4096).unwrap();
        set.append(Offset::ZERO, &a).unwrap();
        set.flush().unwrap();
        let after_a = set.end();
        set.append_placed(after_a, &b).unwrap();
        set.write_placed().unwrap();
        let after_b = set.end();
        // The first segment holds 6500 bytes now: `c` rolls to a second one.
        set.append_placed(after_b, &c).unwrap();
        set.write_placed().unwrap();
        let end = set.end();
        assert_eq!(set.segs.len(), 2);
        drop(set);
        let mut all = a.data.to_vec();
        all.extend_from_slice(&b.data);
        all.extend_from_slice(&c.data);
        for size in [4096, 1 << 20] {
            let mut set =
                SegmentSet::open(dir.path(), Offset::ZERO, after_a, size, &[], true).unwrap();
            let got = set.adopt(after_a, &b.ends, placed(&b)).unwrap();
            assert_eq!(got.map(|g| g.data), Some(b.data.clone()), "size {size}");
            let got = set.adopt(after_b, &c.ends, placed(&c)).unwrap();
            assert_eq!(got.map(|g| g.data), Some(c.data.clone()), "size {size}");
            assert_eq!((set.end(), set.segs.len()), (end, 2), "size {size}");
            let read: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
            assert_eq!(read, all, "size {size}");
            assert_eq!(set.message_ranges(0, end.bytes).len(), 4);
        }
        // Bytes that fail the CRC, or lie past the log's end, are not adopted.
        let mut set = SegmentSet::open(dir.path(), Offset::ZERO, after_a, 4096, &[], true).unwrap();
        let wrong = Placed {
            crc: placed(&b).crc ^ 1,
            ..placed(&b)
        };
        assert!(set.adopt(after_a, &b.ends, wrong).unwrap().is_none());
        assert_eq!(set.end(), after_a);
        let past = Placed {
            len: 1 << 20,
            crc: 0,
        };
        assert!(set.adopt(after_a, &[1 << 20], past).unwrap().is_none());
        // Replay ended before the roll: its log goes with the end of replay.
        let rolled = log_path(dir.path(), after_b.bytes);
        assert!(rolled.exists());
        set.end_replay();
        assert!(!rolled.exists());
        assert!(!idx_path(dir.path(), after_b.bytes).exists());
    }

    /// Placed bodies are held, not copied, and written after the bytes copied before them, in
    /// order, whether a read, a copied body, a flush or `write_placed` writes them.
    #[test]
    fn held_placed_bodies_reach_the_log_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
        let mut all = Vec::new();
        let mut at = Offset::ZERO;
        for k in 0..40u32 {
            let len = if k % 3 == 0 { 100 } else { 2500 + k as usize };
            let b = body(&[&vec![(k % 251) as u8; len]]);
            if k % 3 == 0 {
                set.append(at, &b).unwrap();
            } else {
                set.append_placed(at, &b).unwrap();
            }
            all.extend_from_slice(&b.data);
            at = set.end();
            if k % 7 == 6 {
                set.write_placed().unwrap();
            }
            if k % 11 == 10 {
                // A read of everything so far writes what is pending first.
                let read: Vec<u8> = set.read_local(0, at.bytes).unwrap().unwrap().concat();
                assert_eq!(read, all, "after body {k}");
            }
        }
        set.write_placed().unwrap();
        set.flush().unwrap();
        let log = std::fs::read(log_path(dir.path(), 0)).unwrap();
        assert_eq!(&log[..all.len()], &all[..]);
        drop(set);
        let mut set = SegmentSet::open(dir.path(), Offset::ZERO, at, 1 << 20, &[], false).unwrap();
        let read: Vec<u8> = set.read_local(0, at.bytes).unwrap().unwrap().concat();
        assert_eq!(read, all);
    }
}
