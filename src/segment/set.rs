//! A stream's run of segments: create, open and replay, append and roll, reads as views of
//! the maps (or cold pieces), message boundaries, and retention.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::fs;
use crate::name::Offset;
use crate::state::Body;

use super::log::Segment;
use super::{MapSlice, Piece, idx_path, log_path, parse_idx_name, parse_log_name};

/// The segments of one stream, from its base (fork point or zero) to its applied end.
pub(crate) struct SegmentSet {
    pub(super) dir: Arc<Path>,
    pub(super) segs: Vec<Segment>,
    pub(super) segment_bytes: u64,
    /// Opened or created by recovery's replay, until [`SegmentSet::end_replay`]: the logs on
    /// disk past the applied end may hold the bytes of placed appends still to be replayed
    /// ([`SegmentSet::adopt`]), so they are kept, and a segment created by a roll keeps the log
    /// already there.
    pub(super) replaying: bool,
    /// While `replaying`: the bases of the logs on disk past the last segment, ascending. The
    /// writer rolled to each of them (at its `segment_bytes`, which may not be this open's), so
    /// replay rolls exactly there and nowhere else, and finds placed bytes where they were put.
    pub(super) ahead: Vec<u64>,
    /// Bytes the writer made room for in the last segment before its batch
    /// ([`SegmentSet::make_room`]): appends within them go there without a roll, so every file
    /// operation that may need space happened before the batch reached the journal.
    pub(super) room: u64,
    /// The segments were put at rest ([`SegmentSet::rest`]): their files may be closed, and
    /// whatever needs one wakes them first ([`SegmentSet::wake`]).
    pub(super) resting: bool,
    /// The store's count of descriptors held by segment files and of write-buffer bytes, and
    /// this set's share of each.
    pub(super) files: Option<Arc<SegmentUse>>,
    pub(super) counted: usize,
    pub(super) buffered: usize,
}

/// What a segment of a closed stream keeps in its resident record (`engine/resident.rs`), so
/// that [`SegmentSet::resume`] rebuilds it without opening, listing or mapping anything: its
/// start, its files' lengths and how much of each has its blocks set aside, and how many of
/// its messages were checked against their CRCs. Its message count and end follow from the
/// next segment's base (or the stream's end).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentRecord {
    pub(super) base: Offset,
    pub(super) log_cap: u64,
    pub(super) log_alloc: u64,
    pub(super) idx_len: u64,
    pub(super) idx_alloc: u64,
    pub(super) verified: u64,
    pub(super) cold: bool,
}

/// What the segments of a store's streams hold together: descriptors, which the engine puts
/// idle streams at rest to keep within its budget (`max_stream_files`), and write-buffer
/// memory, which [`WRITE_BUFFERS`] bounds (each set's buffers grow only within its share of
/// it, `BufferShare::limit`).
#[derive(Debug, Default)]
pub(crate) struct SegmentUse {
    pub(super) files: AtomicUsize,
    pub(super) buffered: AtomicUsize,
    /// The sets holding any write-buffer memory: the budget's shares are split among them.
    pub(super) buffering: AtomicUsize,
}

impl SegmentUse {
    /// Descriptors held now.
    pub(crate) fn get(&self) -> usize {
        self.files.load(Ordering::Relaxed)
    }

    /// Bytes of write buffers (log bytes and index entries not yet written) held now.
    pub(crate) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }
}

/// The most memory the write buffers of a store's segments take together (their capacity).
/// A stream's appends are buffered (up to `FLUSH_AT`) so that one write carries many; across
/// thousands of streams each written now and then, the buffers took 8 KiB a stream (82 MB
/// over 10,000 streams in ds-bench's pool workload) and saved few writes. So each set's
/// buffers grow only within its share (this over the sets holding buffers, and no more than
/// the budget has left): a full buffer that may not grow is written and keeps its room, and a
/// stream that got no room writes its appends through (one `pwrite` each).
pub(crate) const WRITE_BUFFERS: usize = 8 << 20;

/// A set's view of the store's write-buffer budget, for a buffer that must grow.
#[derive(Clone, Copy)]
pub(super) struct BufferShare<'a> {
    /// The store's counts (none for a set no store counts: unbounded).
    pub(super) files: Option<&'a SegmentUse>,
    /// The set's buffers' capacity, as counted.
    pub(super) held: usize,
}

impl BufferShare<'_> {
    /// The most capacity the set's write buffers may take now: its share of [`WRITE_BUFFERS`]
    /// among the sets holding buffers (itself included), and no more than what it holds and
    /// the budget has left.
    pub(super) fn limit(self) -> usize {
        let Some(f) = self.files else {
            return usize::MAX;
        };
        let sets = f.buffering.load(Ordering::Relaxed) + usize::from(self.held == 0);
        let share = WRITE_BUFFERS / sets.max(1);
        let left = WRITE_BUFFERS.saturating_sub(f.buffered());
        share.min(self.held + left)
    }
}

/// Moves `counter` from `old` to `new`.
fn shift(counter: &AtomicUsize, old: usize, new: usize) {
    if new > old {
        counter.fetch_add(new - old, Ordering::Relaxed);
    } else if old > new {
        counter.fetch_sub(old - new, Ordering::Relaxed);
    }
}

impl Drop for SegmentSet {
    fn drop(&mut self) {
        if let Some(f) = &self.files {
            f.files.fetch_sub(self.counted, Ordering::Relaxed);
            f.buffered.fetch_sub(self.buffered, Ordering::Relaxed);
            if self.buffered > 0 {
                f.buffering.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The bases of the segment logs in `dir` past `after`, ascending.
fn logs_after(dir: &Path, after: u64) -> Result<Vec<u64>> {
    let (mut bases, _) = segment_files(dir)?;
    bases.retain(|&b| b > after);
    bases.sort_unstable();
    Ok(bases)
}

/// The bases of the segment logs and of the index files in `dir`, in directory order.
fn segment_files(dir: &Path) -> Result<(Vec<u64>, Vec<u64>)> {
    let (mut logs, mut indexes) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_str();
        if let Some(b) = name.and_then(parse_log_name) {
            logs.push(b);
        } else if let Some(b) = name.and_then(parse_idx_name) {
            indexes.push(b);
        }
    }
    Ok((logs, indexes))
}

/// Removes the index file at `base`, if there is one.
fn remove_index(dir: &Path, base: u64) -> Result<()> {
    match fs::remove_file(&idx_path(dir, base)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Removes the segment files at `bases`, logs that are none of the stream's segments (started
/// by a roll whose records never became durable), and syncs `dir` if there were any, so that a
/// power cut after the stream has grown past that base again cannot bring the old log back
/// inside a segment's range. (Replay would remove it again, see [`SegmentSet::end_replay`], and
/// a checkpoint's `syncfs` makes the removal durable anyway: the sync costs nothing when there
/// is nothing to remove, which is every open but the first after a crash.)
fn remove_strays(dir: &Path, bases: &[u64]) -> Result<()> {
    if bases.is_empty() {
        return Ok(());
    }
    for &b in bases {
        fs::remove_file(&log_path(dir, b))?;
        remove_index(dir, b)?;
    }
    fs::sync_dir(dir)?;
    Ok(())
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
        let dir: Arc<Path> = Arc::from(dir);
        let ahead = if replaying {
            logs_after(&dir, base.bytes)?
        } else {
            Vec::new()
        };
        Ok(SegmentSet {
            segs: vec![Segment::create(&dir, base, replaying)?],
            dir,
            segment_bytes,
            replaying,
            ahead,
            room: 0,
            resting: false,
            files: None,
            counted: 0,
            buffered: 0,
        })
    }

    /// Opens a stream's segments, valid from `start` (its base, or the retained start when
    /// retention may have reclaimed segments) to `end`; `earliest` is the stream's retained
    /// start. `cold` lists the sealed segments the cold tier holds, as (base byte position, log
    /// length): one whose local log is missing opens cold (its index must be here).
    ///
    /// Segment files that start at or after `end` (other than the first) hold nothing durable and
    /// are removed (kept while `replaying`: see [`SegmentSet::end_replay`]); so are those wholly
    /// before the segment holding `start`, which retention reclaimed (a power loss may keep
    /// some of those removals and undo others). A stream with forks is opened from its base,
    /// as retention reclaims nothing while forks exist; but it may have reclaimed segments
    /// before its first fork was made, and a power loss during that reclaim may bring back an
    /// older log without a newer one. So segments that do not join up with the next one, where
    /// that next one starts at or before `earliest`, are left out (readers never reach them,
    /// and a fork starts at or after the earliest offset of its time). The last message is
    /// checked against its index entry.
    pub(crate) fn open(
        dir: &Path,
        start: Offset,
        earliest: Offset,
        end: Offset,
        segment_bytes: u64,
        cold: &[(u64, u64)],
        replaying: bool,
    ) -> Result<SegmentSet> {
        let shared: Arc<Path> = Arc::from(dir);
        let (mut bases, indexes) = segment_files(dir)?;
        bases.extend(cold.iter().map(|c| c.0).filter(|b| *b < end.bytes));
        bases.sort_unstable();
        bases.dedup();
        // The segment holding `start` among those the state knows of (starting before `end`).
        let first = bases
            .iter()
            .rposition(|&b| b <= start.bytes && b < end.bytes)
            .unwrap_or(0);
        // Not while replaying: the sidecar that says where the stream starts may be one a
        // checkpoint wrote but had not synced when the process died, which a power cut before
        // recovery's own checkpoint can still take; the older sidecar then needs these
        // segments. `end_replay` removes them once that checkpoint made the state durable.
        if !replaying {
            for &b in &bases[..first] {
                let _ = fs::remove_file(&log_path(dir, b));
                let _ = fs::remove_file(&idx_path(dir, b));
            }
            // An index before the first segment kept, whose log is gone: a reclaim cut short
            // between its two steps (logs are removed, durably, before their indexes).
            let kept = bases.get(first).copied().unwrap_or(0);
            for b in indexes.into_iter().filter(|&b| b < kept) {
                let _ = fs::remove_file(&idx_path(dir, b));
            }
        }
        let mut segs: Vec<Segment> = Vec::new();
        let mut past_end = Vec::new();
        for &b in &bases[first..] {
            if segs.is_empty() || b < end.bytes {
                let cold_len = cold.iter().find(|c| c.0 == b).map(|c| c.1);
                segs.push(Segment::open(&shared, b, cold_len)?);
            } else if !replaying {
                past_end.push(b);
            }
        }
        remove_strays(dir, &past_end)?;
        if segs.is_empty() {
            return Err(Error::corrupt(dir, "stream has no segment"));
        }
        let n = segs.len();
        let mut apart = 0;
        for i in 0..n {
            let next = if i + 1 < n { segs[i + 1].base } else { end };
            match segs[i].reach(dir, next) {
                Err(_) if i + 1 < n && next.bytes <= earliest.bytes => apart = i + 1,
                other => other?,
            }
        }
        if apart > 0 {
            tracing::warn!(
                dir = %dir.display(),
                from = segs[0].base.bytes,
                to = segs[apart].base.bytes,
                "segments before the retained start that do not join the stream's are left out (a reclaim a power loss undid in part)"
            );
            segs.drain(..apart);
        }
        let ahead = match (replaying, segs.last()) {
            (true, Some(last)) => logs_after(dir, last.base.bytes)?,
            _ => Vec::new(),
        };
        let mut set = SegmentSet {
            dir: shared,
            segs,
            segment_bytes,
            replaying,
            ahead,
            room: 0,
            resting: false,
            files: None,
            counted: 0,
            buffered: 0,
        };
        set.verify_last()?;
        Ok(set)
    }

    /// What a closed stream's record keeps of its segments (see [`SegmentRecord`]); `None` when
    /// anything is still buffered or replay is not over (the record would not say all).
    pub(crate) fn record(&self) -> Option<Box<[SegmentRecord]>> {
        if self.replaying
            || self
                .segs
                .iter()
                .any(|s| s.pending() > 0 || !s.idx_pending.is_empty() || s.idx_written != s.count)
        {
            return None;
        }
        Some(
            self.segs
                .iter()
                .map(|s| SegmentRecord {
                    base: s.base,
                    log_cap: s.log_cap,
                    log_alloc: s.log_alloc,
                    idx_len: s.idx_len,
                    idx_alloc: s.idx_alloc,
                    verified: s.verified,
                    cold: s.cold,
                })
                .collect(),
        )
    }

    /// The set of a closed stream ending at `end`, from what its record kept
    /// ([`SegmentSet::record`]): at rest, nothing opened, its indexes not mapped. The files are
    /// this process's own and unchanged since (every change goes through an open set, and a
    /// closed stream had nothing unwritten), so nothing is read to check them: an append opens
    /// the log when it writes (at a checkpoint's flush, for most), a read maps the index first
    /// ([`SegmentSet::mapped`]).
    pub(crate) fn resume(
        dir: &Path,
        records: &[SegmentRecord],
        end: Offset,
        segment_bytes: u64,
    ) -> Result<SegmentSet> {
        if records.is_empty() {
            return Err(Error::corrupt(dir, "stream has no segment"));
        }
        let shared: Arc<Path> = Arc::from(dir);
        let segs = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let next = records.get(i + 1).map_or(end, |n| n.base);
                Segment::resume(&shared, r, next)
            })
            .collect();
        Ok(SegmentSet {
            dir: shared,
            segs,
            segment_bytes,
            replaying: false,
            ahead: Vec::new(),
            room: 0,
            resting: true,
            files: None,
            counted: 0,
            buffered: 0,
        })
    }

    /// Opens the last segment's log, the one appends write (the other logs and every index
    /// stay as they are): a stream resumed from its record opens it on the thread that looks
    /// it up, one `openat`, rather than on the writer's thread when its first batch writes.
    /// Out of descriptors it stays closed (opened when written, or the batch refused then).
    pub(crate) fn open_last(&mut self) -> Result<()> {
        let out = match self.segs.last_mut() {
            Some(s) if !s.cold => match s.wake().map_err(Error::or_out_of_descriptors) {
                Err(Error::TooManyOpenFiles) => Ok(()),
                other => other,
            },
            _ => Ok(()),
        };
        self.recount();
        out
    }

    /// This set with every index mapped, for the questions answered from the indexes (message
    /// boundaries and offsets): a set resumed from its record maps them on its first read.
    pub(crate) fn mapped(&mut self) -> Result<&SegmentSet> {
        self.map_indexes()?;
        Ok(self)
    }

    fn map_indexes(&mut self) -> Result<()> {
        for s in &mut self.segs {
            s.map_index().map_err(Error::or_out_of_descriptors)?;
        }
        Ok(())
    }

    /// Counts this set's descriptors in `files` from now on (the store's count, which
    /// [`SegmentSet::rest`] lowers).
    pub(crate) fn count_in(&mut self, files: &Arc<SegmentUse>) {
        if let Some(old) = self.files.replace(files.clone()) {
            old.files.fetch_sub(self.counted, Ordering::Relaxed);
            old.buffered.fetch_sub(self.buffered, Ordering::Relaxed);
            if self.buffered > 0 {
                old.buffering.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.counted = 0;
        self.buffered = 0;
        self.recount();
        self.recount_buffers();
    }

    /// Whether this set is counted in a store's [`SegmentUse`].
    pub(crate) fn is_counted(&self) -> bool {
        self.files.is_some()
    }

    /// Brings this set's share of the store's count up to date after files opened or closed.
    pub(super) fn recount(&mut self) {
        let now: usize = self.segs.iter().map(Segment::files).sum();
        if let Some(f) = &self.files {
            shift(&f.files, self.counted, now);
        }
        self.counted = now;
    }

    /// Brings this set's share of the store's write-buffer bytes up to date (only the last
    /// segment buffers: a roll flushes and frees the buffers of the one before).
    fn recount_buffers(&mut self) {
        let now = self.segs.last().map_or(0, Segment::buffer_capacity);
        if now != self.buffered {
            if let Some(f) = &self.files {
                shift(&f.buffered, self.buffered, now);
                if self.buffered == 0 {
                    f.buffering.fetch_add(1, Ordering::Relaxed);
                } else if now == 0 {
                    f.buffering.fetch_sub(1, Ordering::Relaxed);
                }
            }
            self.buffered = now;
        }
    }

    /// The descriptors this set holds.
    pub(crate) fn files_held(&self) -> usize {
        self.counted
    }

    /// Puts the set at rest: every segment's buffered bytes written, then its files closed
    /// (see `Segment::rest`); the maps of the indexes and every count stay, so everything
    /// answered from the index still is, and [`SegmentSet::wake`] only reopens files. Not
    /// while replaying, or with room made for a batch not yet applied (the caller checks the
    /// stream has nothing enqueued). False when something stayed buffered (its segment keeps
    /// its files; the set still counts as at rest, and wakes what is closed).
    pub(crate) fn rest(&mut self) -> Result<bool> {
        if self.replaying {
            return Ok(false);
        }
        let mut all = true;
        let mut out = Ok(());
        for s in &mut self.segs {
            match s.rest() {
                Ok(rested) => all &= rested,
                Err(e) => {
                    all = false;
                    out = Err(e);
                    break;
                }
            }
        }
        self.resting = true;
        self.room = 0;
        self.recount();
        self.recount_buffers();
        out.map(|()| all)
    }

    /// Reopens the files [`SegmentSet::rest`] closed; a no-op for a set not at rest. Every
    /// method that needs a file calls it first. Running out of descriptors is
    /// `TooManyOpenFiles` (retryable; the set stays at rest).
    pub(crate) fn wake(&mut self) -> Result<()> {
        if !self.resting {
            return Ok(());
        }
        let mut out = Ok(());
        for s in &mut self.segs {
            if let Err(e) = s.wake() {
                out = Err(e.or_out_of_descriptors());
                break;
            }
        }
        self.resting = out.is_err();
        self.recount();
        out
    }

    /// Recovery's replay is over and its checkpoint made the stream's state durable: later
    /// rolls start empty logs, and the segment logs on disk that are not this set's are
    /// removed, durably (see [`remove_strays`]): before the first segment, what retention
    /// reclaimed (`open` leaves them while replaying); past the last segment, a roll whose
    /// placed appends replay did not adopt; between two segments, a log that replay passed
    /// over because no record starts at its base (a roll of the writer's whose records a power
    /// cut took, or a log an earlier removal left behind); and the indexes of none of them.
    pub(crate) fn end_replay(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.replaying) {
            return Ok(());
        }
        self.ahead = Vec::new();
        SegmentSet::end_replay_of(&self.dir, &self.bases())
    }

    /// The byte positions the set's segments start at, ascending.
    pub(crate) fn bases(&self) -> Vec<u64> {
        self.segs.iter().map(|s| s.base.bytes).collect()
    }

    /// [`SegmentSet::end_replay`] for a set replay closed before its end, by the directory
    /// `dir` and the segment bases `ours` it had then (see `recovery::spill`).
    pub(crate) fn end_replay_of(dir: &Path, ours: &[u64]) -> Result<()> {
        let ours = |b: &u64| ours.contains(b);
        let (mut logs, mut indexes) = segment_files(dir)?;
        logs.retain(|b| !ours(b));
        indexes.retain(|b| !ours(b));
        logs.sort_unstable();
        remove_strays(dir, &logs)?;
        // Indexes left without their logs: a reclaim removes logs first, durably, then the
        // indexes, and may have been cut short between the two.
        for b in indexes {
            if logs.binary_search(&b).is_err() {
                remove_index(dir, b)?;
            }
        }
        Ok(())
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
        let len = body.data.len() as u64;
        if len <= self.room {
            self.room -= len;
        } else {
            self.room = 0;
            self.roll_if_full(start)?;
        }
        let share = BufferShare {
            files: self.files.as_deref(),
            held: self.buffered,
        };
        // A segment at rest opens its log only when it writes to it (`Segment::local_log`):
        // a small append to a resting stream is buffered without a file.
        let out = match self.segs.last_mut() {
            Some(s) => s.write(body, hold, share),
            None => Err(Error::corrupt(&*self.dir, "stream has no segment")),
        };
        self.recount();
        self.recount_buffers();
        out
    }

    /// Writes the buffered bytes to the log if placed bodies are held among them (one call for
    /// all the stream's placed appends in a batch); the index entries stay buffered. Held bodies
    /// can only be in the last segment: a roll, a copied body and a read write them first.
    pub(crate) fn write_placed(&mut self) -> Result<()> {
        let out = match self.segs.last_mut() {
            Some(s) if !s.held.is_empty() => s.flush_log(),
            _ => Ok(()),
        };
        self.recount();
        out
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
        placed: crate::engine::journal::Placed,
    ) -> Result<Option<Body>> {
        self.check_start(start)?;
        self.wake()?;
        self.roll_if_full(start)?;
        let share = BufferShare {
            files: self.files.as_deref(),
            held: self.buffered,
        };
        let (dir, segs) = (&self.dir, &mut self.segs);
        let Some(s) = segs.last_mut() else {
            return Err(Error::corrupt(&**dir, "stream has no segment"));
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
        s.entry_room(ends.len() as u64, share)?;
        s.add_entries(&body)?;
        s.written_to(rel + len);
        self.recount_buffers();
        Ok(Some(body))
    }

    fn check_start(&self, start: Offset) -> Result<()> {
        if start != self.end() {
            return Err(Error::corrupt(
                &*self.dir,
                format!("append at {start} but the stream ends at {}", self.end()),
            ));
        }
        Ok(())
    }

    /// Starts a new segment at `start` (the end) once the last one is full; while
    /// `replaying`, where the writer did (see `ahead`), keeping the bytes of the log there.
    pub(super) fn roll_if_full(&mut self, start: Offset) -> Result<()> {
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
            self.recount();
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
                let out = s.flush();
                self.recount();
                out?;
                if let Some(s) = self.segs.last_mut() {
                    s.unwritten = Vec::new();
                    s.idx_pending = Vec::new();
                }
                self.recount_buffers();
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Views of the bytes in `[from, to)`, without copying, and the cold tier's blocks for the
    /// parts in cold segments (to fetch without this set's lock: see [`Piece::Cold`]). Fails
    /// with `None` when part of the range is not held (reclaimed by retention).
    pub(crate) fn read(&mut self, from: u64, to: u64) -> Result<Option<Vec<Piece>>> {
        self.wake()?;
        self.map_indexes()?;
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
            if s.cold {
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
    pub(crate) fn verified(&self, from: u64, to: u64) -> bool {
        self.segs
            .iter()
            .filter(|s| s.end > from && s.base.bytes < to)
            .all(|s| {
                s.log.is_some()
                    && s.idx_map.is_some()
                    && (s.verified >= s.count || s.entry_start(s.verified) >= to)
            })
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
                s.cold = true;
                s.read_map = None;
                self.recount();
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

    /// Each segment's first offset and index file, oldest first; the last is the segment being
    /// written. A sealed segment's index was last written when its newest message was (a roll
    /// writes it out and nothing writes it after), unless a recovery replayed it later.
    pub(crate) fn segment_starts(&self) -> Vec<(Offset, PathBuf)> {
        self.segs
            .iter()
            .map(|s| (s.base, idx_path(&self.dir, s.base.bytes)))
            .collect()
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
        self.recount();
        gone
    }
}
