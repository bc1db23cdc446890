//! The tier thread: passes over the streams a checkpoint made durable (and, at start, over
//! every stream), each doing, for one stream, in order:
//!
//! 1. read its sidecar (the checkpointed state: what is durable) and its manifest;
//! 2. retention: without forks, delete the objects of manifest segments that end at or before
//!    the earliest offset, then drop them from the manifest;
//! 3. upload each sealed local segment (one with a successor that starts before the
//!    checkpointed tail) the manifest lacks: its log and index are put, read back and compared
//!    (length and crc32), and only then added to the manifest, which is replaced durably;
//! 4. the same for each snapshot blob of the state, and deletes of blobs no longer in it;
//!
//! then deletes what deleted streams left (`tier-gone/` markers), and evicts the oldest
//! uploaded local logs while the local bytes exceed the budget. A pass that fails (the object
//! store down, say) is retried after a backoff that doubles up to the configured maximum;
//! appends never wait on any of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use parking_lot::{Condvar, Mutex};

use super::Tier;
use super::manifest::{self, Manifest, SegmentEntry, SnapshotEntry};
use crate::error::{Error, Result};
use crate::name::Offset;
use crate::sidecar;

/// The directory of delete markers: `tier-gone/{key}-{incarnation}`, one per deleted stream
/// incarnation whose objects are still to delete.
pub(crate) const GONE_DIR: &str = "tier-gone";

/// The tier thread's queue, under one lock.
#[derive(Default)]
pub(crate) struct Work {
    state: Mutex<Queue>,
    cv: Condvar,
}

/// Work asked of the next pass, besides the queued directories.
#[derive(Default)]
struct Asks {
    /// Look at every stream and every delete marker.
    full: bool,
    /// Look at the delete markers.
    gone: bool,
    /// Evict down to the budget (the engine became available).
    evict: bool,
}

impl Asks {
    fn any(&self) -> bool {
        self.full || self.gone || self.evict
    }
}

#[derive(Default)]
struct Queue {
    /// Stream directories to look at.
    dirs: BTreeSet<PathBuf>,
    /// What the next pass is asked to do besides `dirs`.
    asks: Asks,
    /// No pass before this (backoff after a failure).
    not_before: Option<Instant>,
    backoff: Duration,
    stop: bool,
    /// Passes asked for by `sync` and passes finished, with the last one's failure.
    asked: u64,
    finished: u64,
    last_failure: Option<String>,
}

impl Work {
    /// Queues stream directories for the next pass.
    pub(super) fn note(&self, dirs: impl IntoIterator<Item = PathBuf>) {
        let mut q = self.state.lock();
        let before = q.dirs.len();
        q.dirs.extend(dirs);
        if q.dirs.len() != before {
            self.cv.notify_all();
        }
    }

    /// Asks for a pass that evicts down to the budget.
    pub(super) fn note_evict(&self) {
        self.state.lock().asks.evict = true;
        self.cv.notify_all();
    }

    /// Asks for the delete markers to be handled in the next pass.
    pub(super) fn note_gone(&self) {
        self.state.lock().asks.gone = true;
        self.cv.notify_all();
    }

    /// Whether the tier is stopping (object operations give up waiting).
    pub(super) fn stopping(&self) -> bool {
        self.state.lock().stop
    }

    /// Stops the thread at its next look at the queue.
    pub(super) fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_all();
    }

    /// Asks for a full pass now (backoff or not) and waits for it to finish.
    pub(super) fn sync(&self) -> Result<()> {
        let mut q = self.state.lock();
        q.asked += 1;
        let want = q.asked;
        q.asks.full = true;
        q.not_before = None;
        self.cv.notify_all();
        while q.finished < want && !q.stop {
            self.cv.wait(&mut q);
        }
        match (&q.last_failure, q.stop && q.finished < want) {
            (_, true) => Err(Error::ShutDown),
            (Some(f), _) => Err(Error::TierUnavailable { reason: f.clone() }),
            (None, _) => Ok(()),
        }
    }
}

/// A local log the tier holds, a candidate for eviction.
#[derive(Clone)]
struct Resident {
    len: u64,
    name: String,
    incarnation: String,
}

/// Uploaded local logs, oldest (by modification time: about when they were sealed) first.
#[derive(Default)]
struct Residents {
    by_age: BTreeMap<(u128, PathBuf, u64), Resident>,
    of_dir: HashMap<PathBuf, Vec<(u128, PathBuf, u64)>>,
    bytes: u64,
}

impl Residents {
    /// Replaces what is known of `dir`'s local logs.
    fn set(&mut self, dir: &Path, now: Vec<(u128, u64, Resident)>) {
        for k in self.of_dir.remove(dir).unwrap_or_default() {
            if let Some(r) = self.by_age.remove(&k) {
                self.bytes -= r.len;
            }
        }
        let mut keys = Vec::new();
        for (age, base, r) in now {
            let k = (age, dir.to_path_buf(), base);
            self.bytes += r.len;
            self.by_age.insert(k.clone(), r);
            keys.push(k);
        }
        if !keys.is_empty() {
            self.of_dir.insert(dir.to_path_buf(), keys);
        }
    }

    /// Takes the oldest.
    fn pop(&mut self) -> Option<(PathBuf, u64, Resident)> {
        let ((age, dir, base), r) = self.by_age.pop_first()?;
        self.bytes -= r.len;
        if let Some(v) = self.of_dir.get_mut(&dir) {
            v.retain(|k| *k != (age, dir.clone(), base));
        }
        Some((dir, base, r))
    }
}

/// The log files of a stream directory, by base, sorted.
fn local_logs(dir: &Path) -> Result<Vec<u64>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Some(b) = e
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse().ok())
        {
            v.push(b);
        }
    }
    v.sort_unstable();
    Ok(v)
}

/// The messages before a segment, from its index header (bytes 8..16).
fn idx_messages(dir: &Path, base: u64) -> Result<u64> {
    let path = dir.join(format!("{base:020}.idx"));
    let f = std::fs::File::open(&path)?;
    let mut h = [0u8; 8];
    f.read_exact_at(&mut h, 8)?;
    Ok(u64::from_le_bytes(h))
}

/// The first `len` bytes of a file.
fn read_prefix(path: &Path, len: u64) -> Result<Bytes> {
    let f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; usize::try_from(len).map_err(|_| Error::corrupt(path, "too long"))?];
    f.read_exact_at(&mut buf, 0)?;
    Ok(Bytes::from(buf))
}

/// Every stream directory under `streams/`.
fn all_stream_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(shards) = std::fs::read_dir(root.join("streams")) else {
        return out;
    };
    for s in shards.flatten() {
        if let Ok(rd) = std::fs::read_dir(s.path()) {
            out.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    out
}

/// Modification time in ns since the epoch (0 if unknown).
fn age(path: &Path) -> u128 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

impl Tier {
    /// The tier thread: one pass after another, as work comes; a failed pass is retried after
    /// its backoff.
    pub(super) fn run(&self) {
        let mut residents = Residents::default();
        self.work.state.lock().asks.full = true;
        loop {
            let (dirs, full, asked) = {
                let mut q = self.work.state.lock();
                loop {
                    if q.stop {
                        return;
                    }
                    let due = q.not_before.is_none_or(|t| Instant::now() >= t);
                    let work = q.asks.any() || !q.dirs.is_empty();
                    if due && work {
                        break;
                    }
                    match q.not_before.filter(|_| work) {
                        Some(t) => {
                            let _ = self.work.cv.wait_until(&mut q, t);
                        }
                        None => self.work.cv.wait(&mut q),
                    }
                }
                let dirs = std::mem::take(&mut q.dirs);
                let asks = std::mem::take(&mut q.asks);
                let (full, gone) = (asks.full, asks.gone || asks.full);
                self.counters
                    .pending
                    .store(dirs.len() as u64, Ordering::Relaxed);
                (dirs, (full, gone), q.asked)
            };
            let failure = self.pass(dirs, full, &mut residents);
            let mut q = self.work.state.lock();
            if let Some((why, retry, retry_gone)) = &failure {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                q.backoff = (q.backoff * 2)
                    .max(self.options.retry_min)
                    .min(self.options.retry_max);
                tracing::warn!(error = %why, retry_in = ?q.backoff, "cold tier pass failed; retrying");
                q.not_before = Some(Instant::now() + q.backoff);
                q.dirs.extend(retry.iter().cloned());
                q.asks.gone |= *retry_gone;
            } else {
                q.backoff = Duration::ZERO;
                q.not_before = None;
            }
            self.counters
                .pending
                .store(q.dirs.len() as u64, Ordering::Relaxed);
            self.counters
                .local_bytes
                .store(residents.bytes, Ordering::Relaxed);
            q.last_failure = failure.map(|f| f.0);
            q.finished = q.finished.max(asked);
            self.work.cv.notify_all();
        }
    }

    /// One pass: the streams in `dirs` (every stream when `full`), the delete markers (when
    /// `gone`), then eviction. A failure: its text, the directories left to do, and whether the
    /// delete markers are.
    fn pass(
        &self,
        mut dirs: BTreeSet<PathBuf>,
        (full, gone): (bool, bool),
        residents: &mut Residents,
    ) -> Option<(String, Vec<PathBuf>, bool)> {
        if full {
            dirs.extend(all_stream_dirs(&self.root));
        }
        let mut left: Vec<PathBuf> = dirs.into_iter().collect();
        left.reverse();
        // A stream that fails locally (a damaged manifest, a file that vanished) is retried
        // later without holding up the others; the object store failing ends the pass.
        let mut failed: Option<String> = None;
        let mut retry = Vec::new();
        while let Some(dir) = left.pop() {
            match self.sync_stream(&dir, residents) {
                Ok(()) => {}
                Err(e @ Error::TierUnavailable { .. }) => {
                    retry.push(dir);
                    retry.extend(left);
                    return Some((e.to_string(), retry, gone));
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cold tier: stream left for a later pass");
                    failed.get_or_insert_with(|| e.to_string());
                    retry.push(dir);
                }
            }
        }
        if gone && let Err(e) = self.delete_gone() {
            return Some((e.to_string(), retry, true));
        }
        // Before the engine is attached (the start's first pass, during recovery) nothing is
        // evicted; attaching asks for a pass that does it.
        let attached = self.engine.lock().strong_count() > 0;
        while attached && residents.bytes > self.options.local_budget {
            let Some((dir, base, r)) = residents.pop() else {
                break;
            };
            if let Err(e) = self.evict(&dir, base, &r) {
                tracing::warn!(error = %e, dir = %dir.display(), base, "eviction failed");
            }
        }
        failed.map(|f| (f, retry, false))
    }

    /// Puts `bytes` at `object`, reads it back and compares length and crc32.
    fn put_verified(&self, object: &ObjectPath, bytes: Bytes) -> Result<u32> {
        let crc = crc32fast::hash(&bytes);
        let len = bytes.len();
        let (store, o) = (self.store.clone(), object.clone());
        self.wait(async move { store.put(&o, bytes.into()).await })?;
        let (store, o) = (self.store.clone(), object.clone());
        let back = self.wait(async move { store.get(&o).await?.bytes().await })?;
        if back.len() != len || crc32fast::hash(&back) != crc {
            return Err(Error::TierUnavailable {
                reason: format!("{object}: the copy read back differs from what was put"),
            });
        }
        self.counters.uploads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .upload_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(crc)
    }

    /// Deletes an object; one already gone is fine (deletes are retried).
    fn delete(&self, object: &ObjectPath) -> Result<()> {
        let (store, o) = (self.store.clone(), object.clone());
        match self.wait(async move {
            match store.delete(&o).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                r => r,
            }
        }) {
            Ok(()) => {
                self.counters.deletes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Steps 1 to 4 for the stream in `dir` (see the module docs), and what of it may be
    /// evicted.
    fn sync_stream(&self, dir: &Path, residents: &mut Residents) -> Result<()> {
        let Some(sc) = (match sidecar::load(dir) {
            Ok(sc) => sc,
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        }) else {
            residents.set(dir, Vec::new());
            return Ok(());
        };
        let st = &sc.state;
        let inc = st.config.incarnation.as_str();
        let mut m = manifest::load(dir)?
            .filter(|m| m.incarnation == inc)
            .unwrap_or_else(|| Manifest::new(inc));
        let before = m.clone();
        // 2. Retention (forks read the retained range: nothing is reclaimed while any exists).
        let reclaim = st.forks.is_empty();
        if reclaim {
            let (gone, keep): (Vec<SegmentEntry>, Vec<SegmentEntry>) = m
                .segments
                .iter()
                .partition(|e| e.end.bytes <= st.earliest.bytes);
            for e in &gone {
                for ext in ["log", "idx"] {
                    let f = format!("{:020}.{ext}", e.base.bytes);
                    self.delete(&self.object(dir, inc, &f))?;
                }
            }
            m.segments = keep;
        }
        // 3. Sealed, checkpointed local segments.
        let logs = local_logs(dir)?;
        let mut resident = Vec::new();
        for w in logs.windows(2) {
            let (b, next) = (w[0], w[1]);
            if next >= st.tail.bytes || (reclaim && next <= st.earliest.bytes) {
                continue;
            }
            let log = dir.join(format!("{b:020}.log"));
            if !m.segments.iter().any(|e| e.base.bytes == b) {
                let base = Offset::new(idx_messages(dir, b)?, b);
                let end = Offset::new(idx_messages(dir, next)?, next);
                let idx_len = 32 + (end.messages - base.messages) * 16;
                let data = read_prefix(&log, next - b)?;
                let idx = read_prefix(&dir.join(format!("{b:020}.idx")), idx_len)?;
                let log_crc =
                    self.put_verified(&self.object(dir, inc, &format!("{b:020}.log")), data)?;
                let idx_crc =
                    self.put_verified(&self.object(dir, inc, &format!("{b:020}.idx")), idx)?;
                m.segments.push(SegmentEntry {
                    base,
                    end,
                    log_crc,
                    idx_len,
                    idx_crc,
                });
                m.segments.sort_by_key(|e| e.base.bytes);
                manifest::store(dir, &m)?;
            }
            resident.push((
                age(&log),
                b,
                Resident {
                    len: next - b,
                    name: st.config.name.clone(),
                    incarnation: inc.to_owned(),
                },
            ));
        }
        // 4. Snapshot blobs: upload those of the state, delete the others.
        for s in &st.snapshots {
            if m.snapshots.iter().any(|e| e.offset == s.offset) {
                continue;
            }
            let file = format!("snap-{}.blob", s.offset);
            let path = dir.join(&file);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let data = read_prefix(&path, meta.len())?;
            let crc = self.put_verified(&self.object(dir, inc, &file), data)?;
            m.snapshots.push(SnapshotEntry {
                offset: s.offset,
                len: meta.len(),
                crc,
            });
            manifest::store(dir, &m)?;
        }
        let (gone, keep): (Vec<SnapshotEntry>, Vec<SnapshotEntry>) = m
            .snapshots
            .iter()
            .partition(|e| !st.snapshots.iter().any(|s| s.offset == e.offset));
        for e in &gone {
            self.delete(&self.object(dir, inc, &format!("snap-{}.blob", e.offset)))?;
        }
        m.snapshots = keep;
        if m != before {
            manifest::store(dir, &m)?;
        }
        residents.set(dir, resident);
        Ok(())
    }

    /// Turns the uploaded segment at `base` of the stream in `dir` cold: in memory if the
    /// stream is open, then its local log is unlinked (under the registry lock, so a stream
    /// being loaded sees the log or the manifest's cold entry, never neither).
    fn evict(&self, dir: &Path, base: u64, r: &Resident) -> Result<()> {
        let Some(engine) = self.engine.lock().upgrade() else {
            return Ok(());
        };
        let evicted = engine.evict_segment(dir, &r.name, &r.incarnation, base)?;
        if evicted {
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.counters
                .evicted_bytes
                .fetch_add(r.len, Ordering::Relaxed);
            tracing::debug!(stream = %r.name, base, bytes = r.len, "segment evicted to the cold tier");
        }
        Ok(())
    }

    /// Deletes every object of each deleted stream incarnation with a marker in `tier-gone/`
    /// (listed by prefix, so uploads a crash cut short go too), then the marker.
    fn delete_gone(&self) -> Result<()> {
        let gone = self.root.join(GONE_DIR);
        let Ok(rd) = std::fs::read_dir(&gone) else {
            return Ok(());
        };
        for e in rd.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Some((key, inc)) = name.split_once('-') else {
                continue;
            };
            let prefix = self.prefix.child(key).child(inc);
            let store = self.store.clone();
            let p = prefix.clone();
            let objects = self.wait(async move {
                let listed: Vec<object_store::Result<object_store::ObjectMeta>> =
                    store.list(Some(&p)).collect().await;
                listed.into_iter().collect::<object_store::Result<Vec<_>>>()
            })?;
            for o in objects {
                self.delete(&o.location)?;
            }
            self.forget(&prefix);
            crate::fs::remove_file(&e.path())?;
            tracing::debug!(
                key,
                incarnation = inc,
                "deleted stream's tier objects removed"
            );
        }
        Ok(())
    }
}
