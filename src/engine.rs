//! The store's machinery: the stream registry, per-stream locks, journal shards with group
//! commit, checkpoints, recovery and expiry.
//!
//! Write path (numbered as in DESIGN.md):
//! 1. The caller prepares the body (JSON validation and flattening) without any lock.
//! 2. Under the stream's `core` lock it checks every guard against the *staged* state, applies the
//!    change to that state, encodes the journal record into its shard's queue (shard lock, a
//!    memcpy) and notes the record's LSN. Holding `core` while enqueueing keeps journal order equal
//!    to the order of the checks.
//! 3. A committer takes the whole queue as one batch under the shard's `writer` lock, writes it to
//!    the journal file with one `write`, applies each record to its stream's files and *applied*
//!    state (`data` lock), then `fdatasync`s the journal (Sync mode) — one sync for every append
//!    in the batch, on any stream. The committer is the shard thread in Sync mode; in Buffered
//!    mode it is the writer that waits on (or drops) its ticket, on its own thread.
//! 4. It publishes each touched stream's durable view (`visible`), wakes its waiters, advances the
//!    shard's durable LSN and wakes the writers waiting on it: only then is anything acknowledged
//!    or readable.
//! 5. When the journal passes `checkpoint_bytes` the committer rotates the journal and hands each
//!    dirty stream's state to the shard's checkpoint thread, which syncs the file system, writes
//!    the sidecars, syncs again and deletes the old journal files while commits go on.
//!
//! Lock order: registry → core → (shard queue | writer → data → visible). Committers never take
//! `core`, so writers, committers and the checkpoint thread cannot deadlock.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use event_listener::{Event, Listener};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::{self, Record};
use crate::name::{Incarnation, Offset, ReadFrom, StreamName, is_json, normalize_content_type};
use crate::options::{Durability, Options};
use crate::segment::SegmentSet;
use crate::sidecar;
use crate::state::{
    AppendCheck, AppendRecord, Config, Decision, StreamState, filter_stream_seq, now_ms,
    prepare_body, to_ms, validate_producer,
};
use crate::store::Pending;
use crate::types::{
    AppendOutcome, AppendRequest, AppendStatus, CreateOptions, Created, Expiry, ForkFrom, Message,
    ReadChunk, ReadRequest, Snapshot, SnapshotInfo, StreamInfo,
};

const STORE_MAGIC: &[u8; 8] = b"BROOK\0\0\x01";

// ---------------------------------------------------------------------------------------------
// Streams

/// One incarnation of a stream. A stream deleted and created again is a new `Stream`.
pub(crate) struct Stream {
    name: StreamName,
    dir: PathBuf,
    shard: usize,
    config: Config,
    incarnation: Incarnation,
    json: bool,
    /// Staged state: what the checks see, including changes not yet durable.
    core: Mutex<Core>,
    /// Applied state and the files: owned by the shard thread (and by readers briefly).
    data: Mutex<Data>,
    /// The durable view readers and waiters see.
    visible: Mutex<Visible>,
    event: Event,
    last_access_ms: AtomicU64,
    last_used: AtomicU64,
}

struct Core {
    state: StreamState,
    /// LSN of this stream's newest enqueued record.
    last_lsn: u64,
    /// Hard-deleted (or expired); the registry no longer holds it.
    gone: bool,
}

struct Data {
    state: StreamState,
    segs: Option<SegmentSet>,
    applied_lsn: u64,
    checkpointed_lsn: u64,
    generation: u64,
    deleted: bool,
}

#[derive(Clone)]
struct Visible {
    tail: Offset,
    closed: bool,
    earliest: Offset,
    snapshots: Arc<Vec<SnapshotInfo>>,
    stream_seq: Option<String>,
    soft_deleted: bool,
    deleted: bool,
}

impl Visible {
    fn of(s: &StreamState, deleted: bool) -> Visible {
        Visible {
            tail: s.tail,
            closed: s.closed,
            earliest: s.earliest,
            snapshots: Arc::new(s.snapshots.clone()),
            stream_seq: s.stream_seq.clone(),
            soft_deleted: s.soft_deleted,
            deleted,
        }
    }
}

impl Stream {
    fn new(
        state: StreamState,
        dir: PathBuf,
        shard: usize,
        segs: Option<SegmentSet>,
        lsn: u64,
        generation: u64,
        visible: bool,
    ) -> Arc<Stream> {
        let name = StreamName::new(&state.config.name)
            .unwrap_or_else(|_| StreamName(state.config.name.clone()));
        let vis = if visible {
            Visible::of(&state, false)
        } else {
            // A stream being created: nothing is readable until its create record is durable.
            let mut v = Visible::of(&state, false);
            v.tail = state.base;
            v.closed = false;
            v
        };
        let now = now_ms();
        Arc::new(Stream {
            name,
            dir,
            shard,
            incarnation: Incarnation::from_raw(state.config.incarnation.clone()),
            json: is_json(&state.config.content_type),
            config: state.config.clone(),
            core: Mutex::new(Core {
                state: state.clone(),
                last_lsn: lsn,
                gone: false,
            }),
            data: Mutex::new(Data {
                state,
                segs,
                applied_lsn: lsn,
                checkpointed_lsn: lsn,
                generation,
                deleted: false,
            }),
            visible: Mutex::new(vis),
            event: Event::new(),
            last_access_ms: AtomicU64::new(now),
            last_used: AtomicU64::new(now),
        })
    }

    fn visible(&self) -> Visible {
        self.visible.lock().clone()
    }

    fn expired_at(&self, now: u64) -> bool {
        match self.config.expiry {
            Expiry::Never => false,
            Expiry::Ttl(s) => {
                self.last_access_ms
                    .load(Ordering::Relaxed)
                    .saturating_add(s.saturating_mul(1000))
                    <= now
            }
            Expiry::At(t) => {
                t.duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
                    <= now
            }
        }
    }

    fn touch(&self) {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn check_expect(&self, expect: Option<&Incarnation>) -> Result<()> {
        match expect {
            Some(e) if *e != self.incarnation => Err(Error::IncarnationMismatch {
                current: self.incarnation.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn info(&self, v: &Visible) -> StreamInfo {
        let last = self.last_access_ms.load(Ordering::Relaxed);
        let expires_at = match self.config.expiry {
            Expiry::Never => None,
            Expiry::Ttl(s) => Some(UNIX_EPOCH + Duration::from_millis(last + s * 1000)),
            Expiry::At(t) => Some(t),
        };
        StreamInfo {
            name: self.name.clone(),
            content_type: self.config.content_type.clone(),
            tail: v.tail,
            closed: v.closed,
            expiry: self.config.expiry,
            expires_at,
            incarnation: self.incarnation.clone(),
            earliest: v.earliest,
            snapshot: v.snapshots.last().cloned(),
            fork: self
                .config
                .fork
                .as_ref()
                .map(|(s, o)| (StreamName(s.clone()), *o)),
            stream_seq: v.stream_seq.clone(),
        }
    }

    fn staged_info(&self, s: &StreamState) -> StreamInfo {
        self.info(&Visible::of(s, false))
    }

    fn base(&self) -> Offset {
        self.core.lock().state.base
    }
}

// ---------------------------------------------------------------------------------------------
// Journal shards

/// The completion of one journal batch: every record in it becomes durable (or fails) at once,
/// so only the writers waiting on this batch are woken when it is synced.
struct Batch {
    /// 0 pending, 1 durable, 2 failed (the shard is poisoned).
    state: std::sync::atomic::AtomicU8,
    event: Event,
}

impl Batch {
    fn new() -> Arc<Batch> {
        Arc::new(Batch {
            state: std::sync::atomic::AtomicU8::new(0),
            event: Event::new(),
        })
    }

    fn finish(&self, ok: bool) {
        self.state.store(if ok { 1 } else { 2 }, Ordering::Release);
        self.event.notify(usize::MAX);
    }
}

/// A durability ticket: what a caller must see durable before acknowledging. A writer's ticket
/// names its batch; a ticket for state read from the stream names an LSN.
pub(crate) struct Ticket {
    shard: Option<Arc<Shard>>,
    lsn: u64,
    batch: Option<Arc<Batch>>,
}

impl Ticket {
    fn poll(&self) -> Option<Result<()>> {
        if let Some(b) = &self.batch {
            return match b.state.load(Ordering::Acquire) {
                0 => None,
                1 => Some(Ok(())),
                _ => Some(Err(Error::Poisoned)),
            };
        }
        let shard = self.shard.as_ref()?;
        if shard.durable_lsn.load(Ordering::Acquire) >= self.lsn {
            return Some(Ok(()));
        }
        if shard.poisoned.load(Ordering::Acquire) {
            return Some(Err(Error::Poisoned));
        }
        None
    }

    fn listen(&self) -> Option<event_listener::EventListener> {
        match (&self.batch, &self.shard) {
            (Some(b), _) => Some(b.event.listen()),
            (None, Some(shard)) => Some(shard.durable.listen()),
            (None, None) => None,
        }
    }

    /// Buffered mode: commits the batch on this thread unless another one is at it.
    fn help(&self) {
        if let (Some(shard), Some(_)) = (&self.shard, &self.batch)
            && shard.inline
            && self.poll().is_none()
        {
            shard.commit_inline();
        }
    }

    /// The outcome if there is one, else a listener registered before a last look (so no
    /// completion can slip between the look and the sleep).
    fn outcome_or_listener(
        &self,
    ) -> std::result::Result<Result<()>, event_listener::EventListener> {
        if let Some(r) = self.poll() {
            return Ok(r);
        }
        let Some(l) = self.listen() else {
            return Ok(Ok(()));
        };
        match self.poll() {
            Some(r) => Ok(r),
            None => Err(l),
        }
    }

    pub(crate) fn wait(&self) -> Result<()> {
        self.help();
        loop {
            match self.outcome_or_listener() {
                Ok(r) => return r,
                Err(l) => l.wait(),
            }
        }
    }

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

struct Queued {
    stream: Arc<Stream>,
    record: Record,
    lsn: u64,
}

struct Queue {
    buf: Vec<u8>,
    items: Vec<Queued>,
    /// The completion signal of the batch now forming.
    batch: Arc<Batch>,
    next_lsn: u64,
    shutdown: bool,
    /// Checkpoints asked for by [`Engine::checkpoint`] (a count; see `Shard::checkpointed`).
    checkpoint_requests: u64,
    /// A writer committing its own batch found a checkpoint due (Buffered mode).
    checkpoint_due: bool,
    /// The shard thread sleeps until a push wakes it (Buffered mode: writers commit their own
    /// batches, so only the first push after an idle spell wakes the thread).
    idle: bool,
}

/// The journal file and what is written to it; held while a batch is written and applied.
struct Writer {
    file: File,
    file_base: u64,
    /// LSN just past the last byte written. Records still queued have higher LSNs, so a rotation
    /// starts the new file here, not at the queue's next LSN.
    end_lsn: u64,
    /// Bytes written since the last rotation.
    written: u64,
    /// The file was created by a rotation and its directory entry is not durable yet.
    fresh: bool,
    /// Buffers swapped with the queue's, so a batch allocates nothing.
    spare_buf: Vec<u8>,
    spare_items: Vec<Queued>,
    touched: Vec<Arc<Stream>>,
}

/// One checkpoint, handed from the writer (which rotated the journal) to the checkpoint thread.
struct CheckpointJob {
    /// The rotation point: every record below it is in the streams' files and in `streams`.
    lsn: u64,
    /// The checkpoint requests this one answers.
    requests: u64,
    /// Each dirty stream with its applied LSN and state at the rotation.
    streams: Vec<(Arc<Stream>, u64, StreamState)>,
}

#[derive(Default)]
struct Checkpoints {
    job: Option<CheckpointJob>,
    /// A job is posted or running.
    busy: bool,
    stop: bool,
}

/// How long the shard thread leaves queued records to their writers (Buffered mode) before it
/// commits them itself: the bound on the delay of a record whose [`Pending`] nobody waits on.
const LINGER: Duration = Duration::from_millis(20);

pub(crate) struct Shard {
    id: usize,
    dir: PathBuf,
    root: PathBuf,
    options: Options,
    /// Buffered mode: a writer commits the queue itself when it waits (no thread hand-off).
    inline: bool,
    queue: Mutex<Queue>,
    wake: Condvar,
    writer: Mutex<Writer>,
    durable_lsn: AtomicU64,
    durable: Event,
    poisoned: AtomicBool,
    checkpoints: Mutex<Checkpoints>,
    checkpoints_cv: Condvar,
    /// The checkpoint requests answered so far.
    checkpointed: AtomicU64,
    checkpoint_done: Event,
    /// Streams whose applied state is newer than their sidecar (changed under `writer`).
    dirty: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Shard {
    /// Encodes and enqueues a record; returns its ticket. Called with the stream's `core` held.
    fn push(self: &Arc<Self>, stream: &Arc<Stream>, record: Record) -> Result<Ticket> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let mut q = self.queue.lock();
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
        Ok(Ticket {
            shard: Some(self.clone()),
            lsn,
            batch: Some(batch),
        })
    }

    fn ticket(self: &Arc<Self>, lsn: u64) -> Ticket {
        Ticket {
            shard: Some(self.clone()),
            lsn,
            batch: None,
        }
    }

    fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
        self.durable.notify(usize::MAX);
        self.checkpoint_done.notify(usize::MAX);
    }

    /// Buffered mode: commits the queue on the caller's thread unless another thread is
    /// committing (which then commits what was queued meanwhile, too).
    fn commit_inline(&self) {
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

    /// Commits everything queued as one batch (steps 3 and 4); false when the queue was empty.
    fn drain(&self, w: &mut Writer) -> bool {
        let (buf, items, batch) = {
            let mut q = self.queue.lock();
            if q.items.is_empty() {
                return false;
            }
            w.spare_buf.clear();
            let buf = std::mem::replace(&mut q.buf, std::mem::take(&mut w.spare_buf));
            let items = std::mem::replace(&mut q.items, std::mem::take(&mut w.spare_items));
            let batch = std::mem::replace(&mut q.batch, Batch::new());
            (buf, items, batch)
        };
        if self.poisoned.load(Ordering::Acquire) {
            batch.finish(false);
        } else if let Err(_e) = self.commit(w, &buf, &items) {
            self.poison();
            batch.finish(false);
        } else {
            batch.finish(true);
            w.written += buf.len() as u64;
            w.end_lsn += buf.len() as u64;
        }
        w.spare_buf = buf;
        w.spare_items = items;
        w.spare_items.clear();
        true
    }

    /// Whether the journal or the dirty set has grown enough for a checkpoint.
    fn checkpoint_due(&self, w: &Writer) -> bool {
        // Dirty streams cannot be closed (evicted) before a checkpoint records them, so bound
        // them too: otherwise touching many streams between checkpoints keeps every one of them
        // open (two descriptors each) and exhausts `ulimit -n`.
        let dirty_cap = (self.options.max_open_streams / (2 * self.options.journal_shards)).max(8);
        w.written >= self.options.checkpoint_bytes || self.dirty.lock().len() >= dirty_cap
    }

    /// The shard thread: group commit (Sync mode) or the stragglers (Buffered mode), and the
    /// rotations that start checkpoints, until shutdown.
    fn run(self: Arc<Self>) {
        let mut answered = 0;
        loop {
            let (requests, due, shutdown) = {
                let mut q = self.queue.lock();
                loop {
                    if q.shutdown || q.checkpoint_requests > answered || q.checkpoint_due {
                        break;
                    }
                    if !self.inline {
                        if !q.items.is_empty() {
                            break;
                        }
                        self.wake.wait(&mut q);
                        continue;
                    }
                    if q.items.is_empty() {
                        q.idle = true;
                        self.wake.wait(&mut q);
                        q.idle = false;
                        continue;
                    }
                    // Writers commit their own batches; take what they leave after a while.
                    self.wake.wait_for(&mut q, LINGER);
                    break;
                }
                (
                    q.checkpoint_requests,
                    std::mem::take(&mut q.checkpoint_due),
                    q.shutdown,
                )
            };
            let mut w = self.writer.lock();
            self.drain(&mut w);
            let forced = requests > answered || shutdown;
            if !(forced || due || self.checkpoint_due(&w)) || self.poisoned.load(Ordering::Acquire)
            {
                if shutdown {
                    break;
                }
                continue;
            }
            if self.checkpoints.lock().busy {
                if !forced {
                    continue;
                }
                drop(w);
                self.wait_checkpoints();
                w = self.writer.lock();
                self.drain(&mut w);
            }
            match self.rotate(&mut w, requests) {
                Ok(job) => {
                    let mut c = self.checkpoints.lock();
                    c.job = Some(job);
                    c.busy = true;
                    self.checkpoints_cv.notify_all();
                }
                Err(_e) => self.poison(),
            }
            answered = requests;
            if shutdown {
                break;
            }
        }
        // Shutdown: the last batches are committed; wait for the final checkpoint, then stop the
        // checkpoint thread.
        self.wait_checkpoints();
        self.checkpoints.lock().stop = true;
        self.checkpoints_cv.notify_all();
        self.checkpoint_done.notify(usize::MAX);
    }

    /// Waits until no checkpoint is posted or running.
    fn wait_checkpoints(&self) {
        let mut c = self.checkpoints.lock();
        while c.busy {
            self.checkpoints_cv.wait(&mut c);
        }
    }

    /// Step 3 and 4 for one batch: write it, apply it, sync it (Sync mode), publish it.
    fn commit(&self, w: &mut Writer, buf: &[u8], items: &[Queued]) -> Result<()> {
        w.file.write_all(buf)?;
        let mut after: Vec<PathBuf> = Vec::new();
        w.touched.clear();
        for it in items {
            apply(
                &self.root,
                &self.options,
                &it.stream,
                it.lsn,
                &it.record,
                &mut after,
            )?;
            let mut dirty = self.dirty.lock();
            if it.stream.data.lock().deleted {
                dirty.remove(it.stream.name.as_str());
            } else if !dirty.contains_key(it.stream.name.as_str()) {
                dirty.insert(it.stream.name.as_str().to_owned(), it.stream.clone());
            }
            if !w.touched.iter().any(|s| Arc::ptr_eq(s, &it.stream)) {
                w.touched.push(it.stream.clone());
            }
        }
        if self.options.durability == Durability::Sync {
            w.file.sync_data()?;
            if w.fresh {
                // The first sync of a rotated journal makes its name durable too.
                fs::sync_dir(&self.dir)?;
                w.fresh = false;
            }
        }
        for s in &w.touched {
            let d = s.data.lock();
            *s.visible.lock() = Visible::of(&d.state, d.deleted);
            drop(d);
            s.event.notify(usize::MAX);
        }
        w.touched.clear();
        if let Some(last) = items.last() {
            self.durable_lsn.store(last.lsn, Ordering::Release);
        }
        self.durable.notify(usize::MAX);
        for p in after {
            discard(&p);
        }
        Ok(())
    }

    /// Step 5a: later batches go to a new journal file starting at the current LSN; the dirty
    /// streams' state at this point is what the checkpoint records.
    fn rotate(&self, w: &mut Writer, requests: u64) -> Result<CheckpointJob> {
        let lsn = w.end_lsn;
        if lsn > w.file_base {
            w.file = open_journal_file(&self.dir, self.id, lsn)?;
            w.file_base = lsn;
            w.written = 0;
            w.fresh = true;
        }
        let dirty: Vec<Arc<Stream>> = self.dirty.lock().drain().map(|(_, s)| s).collect();
        let mut streams = Vec::with_capacity(dirty.len());
        for s in dirty {
            let d = s.data.lock();
            if !d.deleted {
                let (lsn, state) = (d.applied_lsn, d.state.clone());
                drop(d);
                streams.push((s, lsn, state));
            }
        }
        Ok(CheckpointJob {
            lsn,
            requests,
            streams,
        })
    }

    /// The checkpoint thread: runs the jobs the writer posts, one at a time.
    fn checkpointer(self: Arc<Self>) {
        let syncer = match File::open(&self.dir) {
            Ok(f) => f,
            Err(_e) => {
                self.poison();
                return;
            }
        };
        loop {
            let job = {
                let mut c = self.checkpoints.lock();
                loop {
                    if let Some(job) = c.job.take() {
                        break job;
                    }
                    if c.stop {
                        return;
                    }
                    self.checkpoints_cv.wait(&mut c);
                }
            };
            if self.poisoned.load(Ordering::Acquire) || self.checkpoint(&syncer, &job).is_err() {
                self.poison();
            }
            self.checkpointed.fetch_max(job.requests, Ordering::AcqRel);
            drop(job);
            self.checkpoints.lock().busy = false;
            self.checkpoints_cv.notify_all();
            self.checkpoint_done.notify(usize::MAX);
        }
    }

    /// Steps 5b-5d: makes the job's streams' files and sidecars durable and drops the journal
    /// files before its rotation point. Runs beside the writer, which goes on committing.
    fn checkpoint(&self, syncer: &File, job: &CheckpointJob) -> Result<()> {
        // 5b. Everything applied before the rotation (segments, indexes, directories) becomes
        // durable (and whatever was applied since: sidecars never claim more than that).
        fs::sync_fs(syncer)?;
        // 5c. Sidecars record each stream's state at the rotation.
        for (s, lsn, state) in &job.streams {
            let mut d = s.data.lock();
            if d.deleted {
                continue;
            }
            d.generation += 1;
            sidecar::write(&s.dir, d.generation, *lsn, state)?;
            d.checkpointed_lsn = d.checkpointed_lsn.max(*lsn);
        }
        // 5d. The sidecars become durable; only then may the journal they replace go.
        fs::sync_fs(syncer)?;
        for (base, path) in journal::list_files(&self.dir)? {
            if base < job.lsn {
                std::fs::remove_file(path)?;
            }
        }
        fs::sync_dir(&self.dir)?;
        Ok(())
    }
}

/// A new journal file with its header (not yet synced: see `Writer::fresh`).
fn open_journal_file(dir: &Path, shard: usize, base_lsn: u64) -> Result<File> {
    let path = journal::file_path(dir, base_lsn);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)?;
    f.write_all(&journal::file_header(shard as u32, base_lsn))?;
    Ok(f)
}

fn new_journal_file(dir: &Path, shard: usize, base_lsn: u64) -> Result<File> {
    let f = open_journal_file(dir, shard, base_lsn)?;
    f.sync_all()?;
    fs::sync_dir(dir)?;
    Ok(f)
}

/// Applies one record to a stream's files and applied state (the shard thread and recovery).
/// Paths to remove once the record is durable are pushed to `after`.
fn apply(
    root: &Path,
    options: &Options,
    stream: &Stream,
    lsn: u64,
    record: &Record,
    after: &mut Vec<PathBuf>,
) -> Result<()> {
    let mut d = stream.data.lock();
    if lsn <= d.applied_lsn && !matches!(record, Record::Create { .. }) {
        return Ok(());
    }
    match record {
        Record::Create { state, initial } => {
            if d.segs.is_some() && lsn <= d.applied_lsn {
                return Ok(());
            }
            // Only replay finds the directory already there, holding this incarnation's files from
            // before the crash (an earlier incarnation's directory went to the trash with its
            // delete, which precedes this create in the same journal). Its segments are rebuilt
            // from here; its snapshot blobs were made durable before their records and stay.
            if stream.dir.exists() {
                for e in std::fs::read_dir(&stream.dir)?.flatten() {
                    let keep = e
                        .file_name()
                        .to_str()
                        .is_some_and(|n| parse_snapshot_file(n).is_some());
                    if keep {
                        continue;
                    }
                    if e.path().is_dir() {
                        std::fs::remove_dir_all(e.path())?;
                    } else {
                        std::fs::remove_file(e.path())?;
                    }
                }
            }
            std::fs::create_dir_all(&stream.dir)?;
            let mut segs = SegmentSet::create(&stream.dir, state.base, options.segment_bytes)?;
            segs.append(initial.start, &initial.body)?;
            d.state = (**state).clone();
            d.state.apply_append(initial);
            d.segs = Some(segs);
        }
        Record::Append { rec, .. } => {
            let segs = d
                .segs
                .as_mut()
                .ok_or_else(|| Error::corrupt(&stream.dir, "append before create"))?;
            segs.append(rec.start, &rec.body)?;
            d.state.apply_append(rec);
        }
        Record::Delete { soft: true, .. } => d.state.soft_deleted = true,
        Record::Delete { soft: false, .. } => {
            d.deleted = true;
            d.segs = None;
            // Move the directory aside now, so a later create of the same name starts clean; the
            // trash is emptied once the delete is durable (and restored by recovery if it is not).
            let trash =
                root.join("trash")
                    .join(format!("{}-{}", dir_key(&stream.dir), stream.incarnation));
            if stream.dir.exists() {
                std::fs::rename(&stream.dir, &trash)?;
            }
            after.push(trash);
        }
        Record::Snapshot { info, .. } => d.state.apply_snapshot(info),
        Record::Retention { to, .. } => {
            d.state.apply_retention(*to);
            // Forks read their inherited range from this stream's segments: while any fork
            // exists, retention moves the earliest offset but reclaims nothing.
            let reclaim = d.state.forks.is_empty();
            if let Some(segs) = d.segs.as_mut().filter(|_| reclaim) {
                after.extend(segs.retain(to.bytes));
            }
            let keep: Vec<Offset> = d.state.snapshots.iter().map(|s| s.offset).collect();
            if let Ok(rd) = std::fs::read_dir(&stream.dir) {
                for e in rd.flatten() {
                    let n = e.file_name();
                    if let Some(o) = n.to_str().and_then(parse_snapshot_file)
                        && !keep.contains(&o)
                    {
                        after.push(e.path());
                    }
                }
            }
        }
        Record::ForkRef { fork, add, .. } => {
            if *add {
                d.state.forks.insert(fork.clone());
            } else {
                d.state.forks.remove(fork);
            }
        }
    }
    d.applied_lsn = lsn;
    Ok(())
}

fn dir_key(dir: &Path) -> String {
    dir.file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("unknown")
        .to_owned()
}

fn snapshot_file(offset: Offset) -> String {
    format!("snap-{offset}.blob")
}

fn parse_snapshot_file(name: &str) -> Option<Offset> {
    name.strip_prefix("snap-")?
        .strip_suffix(".blob")?
        .parse()
        .ok()
}

/// A refused append, with the durability ticket of the state the refusal rested on (the caller
/// waits for it before answering, so a refusal never rests on state a crash could roll back).
pub(crate) struct Refusal {
    error: Error,
    ticket: Option<Ticket>,
}

impl Refusal {
    fn now(error: Error) -> Refusal {
        Refusal {
            error,
            ticket: None,
        }
    }
}

#[cfg(feature = "http")]
/// What [`Engine::try_append`] did.
pub(crate) enum Attempt {
    /// Accepted (or answered without writing): wait on the pending outcome.
    Accepted(Pending<AppendOutcome>),
    /// Refused: wait on the ticket, if any, then answer with the error.
    Refused(Error, Option<Ticket>),
    /// Needs a blocking thread: call [`Engine::append`] there with the request.
    Blocking(AppendRequest),
}

// ---------------------------------------------------------------------------------------------
// The engine

pub(crate) struct Engine {
    root: PathBuf,
    options: Options,
    _lock: File,
    registry: Mutex<HashMap<String, Arc<Stream>>>,
    shards: Vec<Arc<Shard>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stopped: AtomicBool,
    counter: AtomicU64,
    reaper_stop: Arc<(Mutex<bool>, Condvar)>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl Engine {
    pub(crate) fn open(dir: &Path, options: Options) -> Result<Arc<Engine>> {
        options.validate()?;
        std::fs::create_dir_all(dir)?;
        let root = dir.canonicalize()?;
        let lock = fs::lock(&root)?;
        let mut options = options;
        options.journal_shards = store_manifest(&root, options.journal_shards)?;
        std::fs::create_dir_all(root.join("streams"))?;
        std::fs::create_dir_all(root.join("trash"))?;
        restore_trash(&root)?;

        let mut registry: HashMap<String, Arc<Stream>> = HashMap::new();
        let mut shards = Vec::new();
        for id in 0..options.journal_shards {
            let jdir = root.join("journal").join(format!("{id:02}"));
            std::fs::create_dir_all(&jdir)?;
            let end = replay_shard(&root, &options, id, &jdir, &mut registry)?;
            let file = new_journal_file(&jdir, id, end)?;
            let shard = Arc::new(Shard {
                id,
                dir: jdir.clone(),
                root: root.clone(),
                options: options.clone(),
                inline: options.durability == Durability::Buffered,
                queue: Mutex::new(Queue {
                    buf: Vec::with_capacity(64 << 10),
                    items: Vec::new(),
                    batch: Batch::new(),
                    next_lsn: end,
                    shutdown: false,
                    checkpoint_requests: 0,
                    checkpoint_due: false,
                    idle: false,
                }),
                wake: Condvar::new(),
                writer: Mutex::new(Writer {
                    file,
                    file_base: end,
                    end_lsn: end,
                    written: 0,
                    fresh: false,
                    spare_buf: Vec::with_capacity(64 << 10),
                    spare_items: Vec::new(),
                    touched: Vec::new(),
                }),
                durable_lsn: AtomicU64::new(end),
                durable: Event::new(),
                poisoned: AtomicBool::new(false),
                checkpoints: Mutex::new(Checkpoints::default()),
                checkpoints_cv: Condvar::new(),
                checkpointed: AtomicU64::new(0),
                checkpoint_done: Event::new(),
                dirty: Mutex::new(HashMap::new()),
            });
            // Streams replayed from this shard's journal are dirty until the first checkpoint.
            {
                let mut dirty = shard.dirty.lock();
                for (name, s) in &registry {
                    let dirty_now = s.shard == id && {
                        let d = s.data.lock();
                        d.applied_lsn > d.checkpointed_lsn
                    };
                    if dirty_now {
                        dirty.insert(name.clone(), s.clone());
                    }
                }
            }
            // Make the replayed state a checkpoint right away, so the old journal can go.
            let job = shard.rotate(&mut shard.writer.lock(), 0)?;
            shard.checkpoint(&File::open(&jdir)?, &job)?;
            shards.push(shard);
        }
        registry.retain(|_, s| !s.data.lock().deleted);
        let mut threads = Vec::new();
        for shard in &shards {
            let (s, name) = (shard.clone(), format!("brook-journal-{}", shard.id));
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || s.run())?,
            );
            let (s, name) = (shard.clone(), format!("brook-checkpoint-{}", shard.id));
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || s.checkpointer())?,
            );
        }
        let engine = Arc::new(Engine {
            root,
            options,
            _lock: lock,
            registry: Mutex::new(registry),
            shards,
            threads: Mutex::new(threads),
            stopped: AtomicBool::new(false),
            counter: AtomicU64::new(0),
            reaper_stop: Arc::new((Mutex::new(false), Condvar::new())),
        });
        let weak = Arc::downgrade(&engine);
        let stop = engine.reaper_stop.clone();
        let reaper = std::thread::Builder::new()
            .name("brook-expiry".into())
            .spawn(move || reaper(weak, stop))?;
        engine.threads.lock().push(reaper);
        Ok(engine)
    }

    pub(crate) fn options(&self) -> &Options {
        &self.options
    }

    fn shard_of(&self, name: &str) -> usize {
        let k = fs::key(name);
        (u64::from_le_bytes([k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]])
            % self.shards.len() as u64) as usize
    }

    fn new_incarnation(&self, name: &str) -> String {
        use sha2::Digest;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut h = sha2::Sha256::new();
        h.update(t.to_le_bytes());
        h.update(n.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update(name.as_bytes());
        let d = h.finalize();
        let hex: String = d[..10].iter().map(|b| format!("{b:02x}")).collect();
        format!("{:x}-{hex}", t / 1_000_000)
    }

    /// Looks a stream up, loading it from disk if needed. Includes soft-deleted streams.
    fn lookup(&self, name: &str) -> Result<Option<Arc<Stream>>> {
        let mut reg = self.registry.lock();
        if let Some(s) = reg.get(name) {
            if s.core.lock().gone {
                // A tombstone: deleted, and until the delete is applied its files must not be
                // loaded again. Once applied, the directory is gone and the entry can go too.
                if s.data.lock().deleted {
                    reg.remove(name);
                }
                return Ok(None);
            }
            s.last_used.store(now_ms(), Ordering::Relaxed);
            return Ok(Some(s.clone()));
        }
        let dir = fs::stream_dir(&self.root, name);
        let Some(sc) = sidecar::load(&dir)? else {
            return Ok(None);
        };
        if sc.state.config.name != name {
            return Err(Error::corrupt(
                &dir,
                "stream directory belongs to another name (hash collision)",
            ));
        }
        let segs = SegmentSet::open(
            &dir,
            sc.state.base,
            sc.state.tail,
            self.options.segment_bytes,
        )?;
        let s = Stream::new(
            sc.state,
            dir,
            self.shard_of(name),
            Some(segs),
            sc.applied_lsn,
            sc.generation,
            true,
        );
        s.data.lock().checkpointed_lsn = sc.applied_lsn;
        reg.insert(name.to_owned(), s.clone());
        if reg.len() > self.options.max_open_streams {
            evict(&mut reg, self.options.max_open_streams);
        }
        Ok(Some(s))
    }

    /// A stream clients may address: not soft-deleted, not expired.
    fn live(&self, name: &StreamName) -> Result<Arc<Stream>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired_at(now_ms()) {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    fn expire(&self, s: &Arc<Stream>) {
        if let Ok(p) = self.delete_stream(s, None, true) {
            let _ = p.ticket.wait();
        }
    }

    // --- create -----------------------------------------------------------------------------

    pub(crate) fn create(&self, name: &StreamName, req: CreateOptions) -> Result<Pending<Created>> {
        if req.data.len() > self.options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                self.options.max_append_bytes
            )));
        }
        let stream_seq = filter_stream_seq(req.stream_seq.clone())?;
        let requested_ct = req
            .content_type
            .as_deref()
            .map(normalize_content_type)
            .transpose()?;
        if let Expiry::Ttl(s) = req.expiry
            && s > u64::MAX / 2000
        {
            return Err(Error::InvalidArgument("Stream-TTL is too large".into()));
        }
        let expiry = match req.expiry {
            Expiry::At(t) => Expiry::At(to_ms(t)),
            e => e,
        };

        // An existing stream: idempotent success or a conflict.
        if let Some(existing) = self.lookup(name.as_str())? {
            let expired = existing.expired_at(now_ms());
            if expired && !existing.core.lock().state.soft_deleted {
                self.expire(&existing);
            } else {
                return self.confirm_existing(&existing, &req, requested_ct.as_deref(), expiry);
            }
        }
        if req.expect.is_some() {
            return Err(Error::IncarnationMissing);
        }

        // Resolve the fork's source and position.
        let mut fork_ticket = None;
        let (content_type, base, fork, expiry, source) = match &req.fork {
            None => (
                requested_ct
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                Offset::ZERO,
                None,
                expiry,
                None,
            ),
            Some(f) => {
                let src = self
                    .lookup(f.source.as_str())?
                    .ok_or(Error::ForkSourceNotFound)?;
                if src.core.lock().state.soft_deleted {
                    return Err(Error::ForkSourceGone);
                }
                if src.expired_at(now_ms()) {
                    self.expire(&src);
                    return Err(Error::ForkSourceNotFound);
                }
                let sct = src.config.content_type.clone();
                if let Some(ct) = &requested_ct
                    && *ct != sct
                {
                    return Err(Error::ContentTypeMismatch { expected: sct });
                }
                let pos = self.fork_position(&src, f)?;
                let expiry = match (expiry, src.config.expiry) {
                    (Expiry::Never, inherited) => inherited,
                    (own, _) => own,
                };
                (
                    sct,
                    pos,
                    Some((f.source.as_str().to_owned(), pos)),
                    expiry,
                    Some(src),
                )
            }
        };
        let json = is_json(&content_type);
        let body = prepare_body(json, req.data.clone(), true)?;
        let config = Config {
            name: name.as_str().to_owned(),
            incarnation: self.new_incarnation(name.as_str()),
            content_type,
            expiry,
            fork,
        };
        let mut state = StreamState::new(config, base);
        // A fork's data starts where its source's readable data starts: what retention retired
        // there is not served through the fork either (it may already be reclaimed).
        if let Some(src) = &source {
            state.earliest = src.visible().earliest;
        }

        let mut reg = self.registry.lock();
        if reg.get(name.as_str()).is_some_and(|s| !s.core.lock().gone) {
            drop(reg);
            // Lost a race with another create: answer as for an existing stream.
            let existing = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
            return self.confirm_existing(&existing, &req, requested_ct.as_deref(), expiry);
        }
        if let Some(src) = &source {
            let mut core = src.core.lock();
            if core.gone || core.state.soft_deleted {
                return Err(Error::ForkSourceGone);
            }
            let rec = Record::ForkRef {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                fork: name.as_str().to_owned(),
                add: true,
            };
            core.state.forks.insert(name.as_str().to_owned());
            let t = self.shards[src.shard].push(src, rec)?;
            core.last_lsn = t.lsn;
            fork_ticket = Some(t);
        }
        let shard = self.shard_of(name.as_str());
        let dir = fs::stream_dir(&self.root, name.as_str());
        let stream = Stream::new(state.clone(), dir, shard, None, 0, 0, false);
        let initial = AppendRecord {
            start: base,
            body,
            close: req.closed,
            stream_seq,
            producer: None,
        };
        let ticket = {
            let mut core = stream.core.lock();
            core.state.apply_append(&initial);
            let t = self.shards[shard].push(
                &stream,
                Record::Create {
                    state: Box::new(state),
                    initial,
                },
            )?;
            core.last_lsn = t.lsn;
            t
        };
        reg.insert(name.as_str().to_owned(), stream.clone());
        if reg.len() > self.options.max_open_streams {
            evict(&mut reg, self.options.max_open_streams);
        }
        drop(reg);
        if let Some(t) = fork_ticket {
            t.wait()?;
        }
        let info = stream.staged_info(&stream.core.lock().state);
        Ok(Pending {
            value: Created {
                created: true,
                info,
            },
            ticket,
        })
    }

    fn confirm_existing(
        &self,
        s: &Arc<Stream>,
        req: &CreateOptions,
        ct: Option<&str>,
        expiry: Expiry,
    ) -> Result<Pending<Created>> {
        // Resolve the requested fork position (offset plus sub-offset) as a create would, before
        // taking this stream's lock.
        let requested_pos = match (&req.fork, &s.config.fork) {
            (Some(f), Some((src, _))) if f.source.as_str() == src && f.offset.is_some() => {
                match self.lookup(src)? {
                    Some(source) => self.fork_position(&source, f).ok(),
                    None => None,
                }
            }
            _ => None,
        };
        let core = s.core.lock();
        if core.state.soft_deleted {
            return Err(Error::ConfigMismatch(
                "the stream was deleted and is kept for its forks",
            ));
        }
        s.check_expect(req.expect.as_ref())?;
        let want_ct = match (ct, &req.fork) {
            (Some(ct), _) => ct.to_owned(),
            (None, Some(_)) => s.config.content_type.clone(),
            (None, None) => "application/octet-stream".to_owned(),
        };
        if want_ct != s.config.content_type {
            return Err(Error::ConfigMismatch("content type differs"));
        }
        if req.fork.is_none() && expiry != s.config.expiry {
            return Err(Error::ConfigMismatch("expiry differs"));
        }
        if req.closed != core.state.closed {
            return Err(Error::ConfigMismatch("closure status differs"));
        }
        match (&req.fork, &s.config.fork) {
            (None, None) => {}
            (Some(f), Some((src, at))) => {
                let differs = match requested_pos {
                    Some(pos) => pos.bytes != at.bytes,
                    None => f.offset.is_some_and(|o| o.bytes != at.bytes) || f.sub_offset != 0,
                };
                if f.source.as_str() != src || differs {
                    return Err(Error::ConfigMismatch("fork source or offset differs"));
                }
                if expiry != Expiry::Never && expiry != s.config.expiry {
                    return Err(Error::ConfigMismatch("expiry differs"));
                }
            }
            _ => return Err(Error::ConfigMismatch("fork configuration differs")),
        }
        let ticket = self.shards[s.shard].ticket(core.last_lsn);
        let info = s.staged_info(&core.state);
        Ok(Pending {
            value: Created {
                created: false,
                info,
            },
            ticket,
        })
    }

    /// The divergence point of a fork: `offset` (default the source's tail) refined by the
    /// sub-offset, validated against the source.
    fn fork_position(&self, src: &Arc<Stream>, f: &ForkFrom) -> Result<Offset> {
        let vis = src.visible();
        let at = f.offset.unwrap_or(vis.tail);
        if at.bytes > vis.tail.bytes {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is beyond the source's tail {}",
                vis.tail
            )));
        }
        if at.bytes < vis.earliest.bytes {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is before the source's retained start"
            )));
        }
        if !self.is_boundary(src, at.bytes)? {
            return Err(Error::InvalidForkPosition(format!(
                "offset {at} is not a position brook returned"
            )));
        }
        let mut pos = at.bytes;
        if f.sub_offset > 0 {
            if src.json {
                for _ in 0..f.sub_offset {
                    match self.next_boundary(src, pos)? {
                        Some(b) if b <= vis.tail.bytes => pos = b,
                        _ => {
                            return Err(Error::InvalidForkPosition(
                                "sub-offset reaches past the tail".into(),
                            ));
                        }
                    }
                }
            } else {
                let next = self
                    .next_boundary(src, pos)?
                    .unwrap_or(vis.tail.bytes)
                    .min(vis.tail.bytes);
                if pos + f.sub_offset > next {
                    return Err(Error::InvalidForkPosition(
                        "sub-offset reaches past the next message boundary".into(),
                    ));
                }
                pos += f.sub_offset;
            }
        }
        self.offset_at(src, pos)
    }

    // --- the data of a stream and its fork chain -----------------------------------------------

    fn source_of(&self, s: &Stream) -> Result<Arc<Stream>> {
        let (src, _) = s
            .config
            .fork
            .as_ref()
            .ok_or_else(|| Error::corrupt(&s.dir, "fork without source"))?;
        self.lookup(src)?
            .ok_or_else(|| Error::corrupt(&s.dir, "fork source is missing"))
    }

    fn offset_at(&self, s: &Arc<Stream>, pos: u64) -> Result<Offset> {
        let base = s.base();
        if pos < base.bytes || (pos == base.bytes && s.config.fork.is_some()) {
            if pos == base.bytes {
                return Ok(base);
            }
            return self.offset_at(&self.source_of(s)?, pos);
        }
        let d = s.data.lock();
        Ok(d.segs
            .as_ref()
            .map_or(Offset::new(0, pos), |g| g.offset_at(pos)))
    }

    fn is_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<bool> {
        let base = s.base();
        if pos == base.bytes {
            return Ok(true);
        }
        if pos < base.bytes {
            return self.is_boundary(&self.source_of(s)?, pos);
        }
        let d = s.data.lock();
        Ok(d.segs.as_ref().is_some_and(|g| g.is_boundary(pos)))
    }

    fn next_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<Option<u64>> {
        let base = s.base();
        if pos < base.bytes {
            let b = self.next_boundary(&self.source_of(s)?, pos)?;
            return Ok(Some(b.map_or(base.bytes, |b| b.min(base.bytes))));
        }
        let d = s.data.lock();
        Ok(d.segs.as_ref().and_then(|g| g.next_boundary_after(pos)))
    }

    fn read_boundary(&self, s: &Arc<Stream>, from: u64, limit: u64, tail: u64) -> Result<u64> {
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            let b = self.read_boundary(&src, from, limit.min(base.bytes), base.bytes)?;
            if b < base.bytes || limit <= base.bytes {
                return Ok(b.min(base.bytes));
            }
            // The whole inherited range fits: continue into the fork's own data.
            if limit > base.bytes && tail > base.bytes {
                let own = self.read_boundary(s, base.bytes, limit, tail)?;
                return Ok(if own > limit { base.bytes } else { own });
            }
            return Ok(base.bytes);
        }
        let d = s.data.lock();
        Ok(d.segs
            .as_ref()
            .map_or(tail, |g| g.boundary_for_read(from, limit))
            .min(tail))
    }

    fn read_range(&self, s: &Arc<Stream>, from: u64, to: u64, out: &mut Vec<Bytes>) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            self.read_range(&src, from, to.min(base.bytes), out)?;
            return self.read_range(s, base.bytes, to, out);
        }
        let mut d = s.data.lock();
        let segs = d.segs.as_mut().ok_or(Error::NotFound)?;
        match segs.read(from, to)? {
            Some(v) => {
                out.extend(v);
                Ok(())
            }
            None => Err(Error::OffsetGone {
                earliest: s.visible().earliest,
            }),
        }
    }

    fn message_ranges(
        &self,
        s: &Arc<Stream>,
        from: u64,
        to: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            self.message_ranges(&src, from, to.min(base.bytes), out)?;
        }
        let d = s.data.lock();
        if let Some(g) = d.segs.as_ref() {
            out.extend(g.message_ranges(from.max(base.bytes), to));
        }
        Ok(())
    }

    // --- append -----------------------------------------------------------------------------

    pub(crate) fn append(
        &self,
        name: &StreamName,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>> {
        Self::validate_append(&self.options, &req)?;
        let s = self.live(name)?;
        match self.append_to(&s, name, req) {
            Ok(p) => Ok(p),
            Err(Refusal { error, ticket }) => {
                // A refusal may rest on state that is not durable yet: wait for it first.
                if let Some(t) = ticket {
                    t.wait()?;
                }
                Err(error)
            }
        }
    }

    #[cfg(feature = "http")]
    /// The append path without any blocking step, for async callers: `Blocking` hands the
    /// request back when the stream is not open (opening reads its files), has expired, or the
    /// body is large enough that validating it belongs on a blocking thread.
    pub(crate) fn try_append(&self, name: &StreamName, req: AppendRequest) -> Attempt {
        const INLINE_BODY: usize = 64 << 10;
        if let Err(e) = Self::validate_append(&self.options, &req) {
            return Attempt::Refused(e, None);
        }
        if req.data.len() > INLINE_BODY {
            return Attempt::Blocking(req);
        }
        let s = {
            let reg = self.registry.lock();
            match reg.get(name.as_str()) {
                Some(s) => s.clone(),
                None => return Attempt::Blocking(req),
            }
        };
        {
            let core = s.core.lock();
            if core.gone {
                return Attempt::Refused(Error::NotFound, None);
            }
            if core.state.soft_deleted {
                return Attempt::Refused(Error::Gone, None);
            }
        }
        if s.expired_at(now_ms()) {
            return Attempt::Blocking(req);
        }
        s.last_used.store(now_ms(), Ordering::Relaxed);
        match self.append_to(&s, name, req) {
            Ok(p) => Attempt::Accepted(p),
            Err(Refusal { error, ticket }) => Attempt::Refused(error, ticket),
        }
    }

    fn validate_append(options: &Options, req: &AppendRequest) -> Result<()> {
        if req.data.len() > options.max_append_bytes {
            return Err(Error::TooLarge(format!(
                "body is larger than {} bytes",
                options.max_append_bytes
            )));
        }
        filter_stream_seq(req.stream_seq.clone())?;
        if let Some(p) = &req.producer {
            validate_producer(p)?;
        }
        Ok(())
    }

    /// Steps 1 and 2 of the write path for an append to an open, live stream.
    fn append_to(
        &self,
        s: &Arc<Stream>,
        name: &StreamName,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>, Refusal> {
        let stream_seq = filter_stream_seq(req.stream_seq).map_err(Refusal::now)?;
        let ct = req
            .content_type
            .as_deref()
            .map(normalize_content_type)
            .transpose()
            .map_err(Refusal::now)?;
        s.check_expect(req.expect.as_ref()).map_err(Refusal::now)?;
        let has_data = !req.data.is_empty();
        // Step 1: validate and convert the body outside any lock.
        let body = prepare_body(s.json, req.data, false);
        let shard = &self.shards[s.shard];
        let mut core = s.core.lock();
        if core.gone {
            return Err(Refusal::now(Error::NotFound));
        }
        if core.state.soft_deleted {
            return Err(Refusal::now(Error::Gone));
        }
        let check = AppendCheck {
            body: &body,
            has_data,
            content_type: ct.as_deref(),
            close: req.close,
            stream_seq: stream_seq.as_deref(),
            producer: req.producer.as_ref(),
        };
        let decision = match core.state.check_append(&check) {
            Ok(d) => d,
            Err(error) => {
                return Err(Refusal {
                    error,
                    ticket: Some(shard.ticket(core.last_lsn)),
                });
            }
        };
        s.touch();
        match decision {
            Decision::Answer(status) => {
                let echo = req
                    .producer
                    .as_ref()
                    .and_then(|p| core.state.producers.get(&p.id).map(|x| (x.epoch, x.seq)));
                let outcome = AppendOutcome {
                    status,
                    tail: core.state.tail,
                    closed: core.state.closed,
                    producer: echo,
                    incarnation: s.incarnation.clone(),
                };
                let ticket = shard.ticket(core.last_lsn);
                Ok(Pending {
                    value: outcome,
                    ticket,
                })
            }
            Decision::Accept => {
                let body = body.unwrap_or_default();
                let rec = AppendRecord {
                    start: core.state.tail,
                    body,
                    close: req.close,
                    stream_seq,
                    producer: req.producer,
                };
                core.state.apply_append(&rec);
                let outcome = AppendOutcome {
                    status: AppendStatus::Appended,
                    tail: core.state.tail,
                    closed: core.state.closed,
                    producer: rec.producer.as_ref().map(|p| (p.epoch, p.seq)),
                    incarnation: s.incarnation.clone(),
                };
                let record = Record::Append {
                    name: name.as_str().to_owned(),
                    incarnation: s.incarnation.as_str().to_owned(),
                    rec,
                };
                let ticket = shard.push(s, record).map_err(Refusal::now)?;
                core.last_lsn = ticket.lsn;
                Ok(Pending {
                    value: outcome,
                    ticket,
                })
            }
        }
    }

    // --- read -------------------------------------------------------------------------------

    fn read_plan(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Result<(Arc<Stream>, Visible, u64, u64)> {
        self.read_plan_of(self.live(name)?, req)
    }

    /// The range a read of the live stream `s` covers, with the view it was planned on.
    fn read_plan_of(
        &self,
        s: Arc<Stream>,
        req: &ReadRequest,
    ) -> Result<(Arc<Stream>, Visible, u64, u64)> {
        s.touch();
        let vis = s.visible();
        let start = match req.from {
            // The seed: once retention trimmed the start, a read from the start (`offset=-1`)
            // answers 410 rather than silently skipping what it cannot count.
            ReadFrom::Start if vis.earliest.bytes > 0 => {
                return Err(Error::OffsetGone {
                    earliest: vis.earliest,
                });
            }
            ReadFrom::Start => vis.earliest,
            ReadFrom::Tail => vis.tail,
            ReadFrom::At(o) => o,
        };
        if start.bytes > vis.tail.bytes {
            return Err(Error::OffsetBeyondTail { tail: vis.tail });
        }
        if start.bytes < vis.earliest.bytes {
            return Err(Error::OffsetGone {
                earliest: vis.earliest,
            });
        }
        // After the range checks: a read that would answer 404, 410 or 416 without
        // Stream-Incarnation still does with it (the seed).
        s.check_expect(req.expect.as_ref())?;
        if s.json && !self.is_boundary(&s, start.bytes)? && start.bytes != vis.tail.bytes {
            return Err(Error::InvalidArgument(format!(
                "offset {start} is not a message boundary"
            )));
        }
        let max = req
            .max_bytes
            .unwrap_or(self.options.max_read_bytes)
            .clamp(1, self.options.max_read_bytes);
        let mut end = if req.from == ReadFrom::Tail {
            start.bytes
        } else {
            vis.tail.bytes.min(start.bytes.saturating_add(max))
        };
        // A JSON read ends on a message boundary (at least one whole message), unless it is
        // `offset=now` or reaches the tail.
        if s.json && end < vis.tail.bytes && req.from != ReadFrom::Tail {
            end = self.read_boundary(&s, start.bytes, end, vis.tail.bytes)?;
        }
        Ok((s, vis, start.bytes, end))
    }

    pub(crate) fn read(&self, name: &StreamName, req: &ReadRequest) -> Result<ReadChunk> {
        let (s, vis, from, to) = self.read_plan(name, req)?;
        self.read_planned(&s, &vis, from, to)
    }

    #[cfg(feature = "http")]
    /// A read without any blocking step, for async callers: `None` when it would block (the
    /// stream is not open, is a fork, has expired, or the range holds messages not yet checked
    /// against their checksums since the stream was opened); the caller then reads on a
    /// blocking thread. Otherwise the read is index lookups and map slicing.
    pub(crate) fn try_read(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Option<Result<ReadChunk>> {
        let s = self.registry.lock().get(name.as_str()).cloned()?;
        if s.config.fork.is_some() || s.expired_at(now_ms()) {
            return None;
        }
        {
            let core = s.core.lock();
            if core.gone || core.state.soft_deleted {
                return None;
            }
        }
        let (s, vis, from, to) = match self.read_plan_of(s, req) {
            Ok(plan) => plan,
            Err(e) => return Some(Err(e)),
        };
        if !s
            .data
            .lock()
            .segs
            .as_ref()
            .is_some_and(|g| g.verified(from, to))
        {
            return None;
        }
        Some(self.read_planned(&s, &vis, from, to))
    }

    fn read_planned(
        &self,
        s: &Arc<Stream>,
        vis: &Visible,
        from: u64,
        to: u64,
    ) -> Result<ReadChunk> {
        let mut pieces = Vec::new();
        self.read_range(s, from, to, &mut pieces)?;
        let data_len = to - from;
        let body = if s.json { json_array(pieces) } else { pieces };
        self.chunk(s, vis, from, to, body, data_len)
    }

    fn chunk(
        &self,
        s: &Arc<Stream>,
        vis: &Visible,
        from: u64,
        to: u64,
        body: Vec<Bytes>,
        data_len: u64,
    ) -> Result<ReadChunk> {
        let up_to_date = to == vis.tail.bytes;
        let next = if up_to_date {
            vis.tail
        } else {
            self.offset_at(s, to)?
        };
        let start = if from == vis.tail.bytes {
            vis.tail
        } else {
            self.offset_at(s, from)?
        };
        Ok(ReadChunk {
            start,
            next,
            body,
            data_len,
            up_to_date,
            closed: up_to_date && vis.closed,
            content_type: s.config.content_type.clone(),
            incarnation: s.incarnation.clone(),
        })
    }

    pub(crate) fn read_messages(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Result<(Vec<Message>, ReadChunk)> {
        let (s, vis, from, to) = self.read_plan(name, req)?;
        let mut pieces = Vec::new();
        self.read_range(&s, from, to, &mut pieces)?;
        let flat: Bytes = if pieces.len() == 1 {
            pieces.pop().unwrap_or_default()
        } else {
            Bytes::from(pieces.concat())
        };
        let mut ranges = Vec::new();
        self.message_ranges(&s, from, to, &mut ranges)?;
        let mut msgs = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            let (ra, mut rb) = ((a - from) as usize, (b - from) as usize);
            if s.json && rb > ra {
                rb -= 1; // the separator after each JSON message
            }
            let start = self.offset_at(&s, a)?;
            msgs.push(Message {
                start,
                data: flat.slice(ra.min(flat.len())..rb.min(flat.len())),
            });
        }
        let chunk = self.chunk(&s, &vis, from, to, Vec::new(), to - from)?;
        Ok((msgs, chunk))
    }

    pub(crate) fn resolve(&self, name: &StreamName, from: ReadFrom) -> Result<Offset> {
        let s = self.live(name)?;
        let vis = s.visible();
        Ok(match from {
            ReadFrom::Start => vis.earliest,
            ReadFrom::Tail => vis.tail,
            ReadFrom::At(o) => o,
        })
    }

    pub(crate) fn head(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<StreamInfo> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        Ok(s.info(&s.visible()))
    }

    pub(crate) fn touch(&self, name: &StreamName) -> Result<()> {
        self.live(name)?.touch();
        Ok(())
    }

    // --- wait -------------------------------------------------------------------------------

    fn wait_ready(&self, s: &Stream, after: Offset) -> bool {
        let v = s.visible.lock();
        v.tail.bytes > after.bytes
            || v.closed
            || v.deleted
            || v.soft_deleted
            || s.core.lock().gone
            || s.expired_at(now_ms())
    }

    pub(crate) async fn wait(&self, name: &StreamName, after: Offset) -> Result<()> {
        let s = self.live(name)?;
        loop {
            let l = s.event.listen();
            if self.wait_ready(&s, after) {
                return Ok(());
            }
            l.await;
        }
    }

    pub(crate) fn wait_blocking(
        &self,
        name: &StreamName,
        after: Offset,
        timeout: Duration,
    ) -> Result<bool> {
        let s = self.live(name)?;
        let deadline = Instant::now() + timeout;
        loop {
            let l = s.event.listen();
            if self.wait_ready(&s, after) {
                return Ok(true);
            }
            if l.wait_deadline(deadline).is_none() && !self.wait_ready(&s, after) {
                return Ok(false);
            }
        }
    }

    // --- delete -----------------------------------------------------------------------------

    pub(crate) fn delete(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<Pending<()>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired_at(now_ms()) {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        self.delete_stream(&s, expect, false)
    }

    /// Forks of `s` that still exist and still read from it.
    fn live_forks(&self, s: &Stream, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|f| {
                matches!(self.lookup(f), Ok(Some(fs)) if !fs.core.lock().gone
                    && fs.config.fork.as_ref().is_some_and(|(src, _)| src == s.name.as_str()))
            })
            .cloned()
            .collect()
    }

    fn delete_stream(
        &self,
        s: &Arc<Stream>,
        expect: Option<&Incarnation>,
        expiring: bool,
    ) -> Result<Pending<()>> {
        let forks: Vec<String> = s.core.lock().state.forks.iter().cloned().collect();
        let live = self.live_forks(s, &forks);
        let reg = self.registry.lock();
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        if core.state.soft_deleted {
            return Err(Error::Gone);
        }
        if !expiring {
            s.check_expect(expect)?;
        }
        let shard = &self.shards[s.shard];
        let soft = !live.is_empty();
        let record = Record::Delete {
            name: s.name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            soft,
        };
        let ticket = shard.push(s, record)?;
        core.last_lsn = ticket.lsn;
        if soft {
            core.state.soft_deleted = true;
        } else {
            core.gone = true;
        }
        drop(core);
        drop(reg);
        s.event.notify(usize::MAX);
        if !soft {
            self.release_source(s)?;
        }
        Ok(Pending { value: (), ticket })
    }

    /// After a fork is gone: drop it from its source's fork list, and collect a soft-deleted
    /// source that no live fork reads any more (cascading up the chain).
    fn release_source(&self, fork: &Stream) -> Result<()> {
        let Some((src_name, _)) = &fork.config.fork else {
            return Ok(());
        };
        let Some(src) = self.lookup(src_name)? else {
            return Ok(());
        };
        let remaining: Vec<String> = {
            let mut core = src.core.lock();
            if core.gone {
                return Ok(());
            }
            let rec = Record::ForkRef {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                fork: fork.name.as_str().to_owned(),
                add: false,
            };
            core.state.forks.remove(fork.name.as_str());
            let t = self.shards[src.shard].push(&src, rec)?;
            core.last_lsn = t.lsn;
            if !core.state.soft_deleted {
                drop(core);
                return t.wait();
            }
            core.state.forks.iter().cloned().collect()
        };
        if self.live_forks(&src, &remaining).is_empty() {
            let reg = self.registry.lock();
            let mut core = src.core.lock();
            if core.gone {
                return Ok(());
            }
            let rec = Record::Delete {
                name: src.name.as_str().to_owned(),
                incarnation: src.incarnation.as_str().to_owned(),
                soft: false,
            };
            let t = self.shards[src.shard].push(&src, rec)?;
            core.last_lsn = t.lsn;
            core.gone = true;
            drop(core);
            drop(reg);
            src.event.notify(usize::MAX);
            t.wait()?;
            self.release_source(&src)?;
        }
        Ok(())
    }

    // --- snapshots and retention ------------------------------------------------------------------

    pub(crate) fn publish_snapshot(
        &self,
        name: &StreamName,
        offset: Offset,
        content_type: Option<&str>,
        blob: &mut dyn Read,
        expect_digest: Option<&str>,
        expect: Option<&Incarnation>,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        use sha2::Digest;
        let s = self.live(name)?;
        s.check_expect(expect)?;
        let ct = normalize_content_type(content_type.unwrap_or("application/octet-stream"))?;
        // Refuse what can be refused before streaming a blob of up to `max_snapshot_bytes` to
        // disk; everything is checked again under the lock below.
        {
            let core = s.core.lock();
            let st = &core.state;
            let latest = st.latest_snapshot();
            let republish = st.snapshots.iter().any(|x| x.offset.bytes == offset.bytes);
            if offset.bytes > st.tail.bytes {
                return Err(Error::OffsetBeyondTail { tail: st.tail });
            }
            if offset.bytes < st.earliest.bytes {
                return Err(Error::OffsetGone {
                    earliest: st.earliest,
                });
            }
            if expect_digest.is_some_and(|want| latest.map(|l| l.digest.as_str()) != Some(want)) {
                return Err(Error::SnapshotMatchFailed {
                    current: latest.map(|l| l.digest.clone()),
                });
            }
            if let Some(l) = latest.filter(|l| l.offset.bytes > offset.bytes && !republish) {
                return Err(Error::SnapshotStale { latest: l.offset });
            }
        }
        // Stream the blob to a temporary file, hashing as it goes.
        let tmp = s.dir.join(format!(
            "snap-tmp-{}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        ));
        let cleanup = TempFile(tmp.clone());
        let mut f = File::create(&tmp)?;
        let mut hasher = sha2::Sha256::new();
        hasher.update(ct.as_bytes());
        hasher.update([0u8]);
        let mut buf = vec![0u8; 256 << 10];
        let mut len = 0u64;
        loop {
            let n = blob.read(&mut buf)?;
            if n == 0 {
                break;
            }
            len += n as u64;
            if len > self.options.max_snapshot_bytes {
                return Err(Error::TooLarge(format!(
                    "snapshot is larger than {} bytes",
                    self.options.max_snapshot_bytes
                )));
            }
            hasher.update(&buf[..n]);
            f.write_all(&buf[..n])?;
        }
        f.sync_all()?;
        drop(f);
        let digest = format!(
            "sha256:{}",
            hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        let tail = core.state.tail;
        if offset.bytes > tail.bytes {
            return Err(Error::OffsetBeyondTail { tail });
        }
        if offset.bytes < core.state.earliest.bytes {
            return Err(Error::OffsetGone {
                earliest: core.state.earliest,
            });
        }
        let latest = core.state.latest_snapshot().cloned();
        if let Some(want) = expect_digest
            && latest.as_ref().map(|l| l.digest.as_str()) != Some(want)
        {
            return Err(Error::SnapshotMatchFailed {
                current: latest.map(|l| l.digest),
            });
        }
        if let Some(existing) = core
            .state
            .snapshots
            .iter()
            .find(|x| x.offset.bytes == offset.bytes)
        {
            if existing.digest == digest && existing.content_type == ct {
                let info = existing.clone();
                let t = self.shards[s.shard].ticket(core.last_lsn);
                let sinfo = s.staged_info(&core.state);
                drop(core);
                t.wait()?;
                return Ok((info, sinfo));
            }
            return Err(Error::SnapshotConflict);
        }
        if let Some(l) = &latest
            && l.offset.bytes > offset.bytes
        {
            return Err(Error::SnapshotStale { latest: l.offset });
        }
        drop(core);
        let canonical = self.offset_at(&s, offset.bytes)?;
        if !self.is_boundary(&s, offset.bytes)? && offset.bytes != tail.bytes {
            return Err(Error::NotOnBoundary(offset));
        }
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        if core
            .state
            .snapshots
            .iter()
            .any(|x| x.offset.bytes >= offset.bytes)
        {
            return Err(Error::SnapshotConflict);
        }
        let info = SnapshotInfo {
            offset: canonical,
            digest,
            content_type: ct,
            len,
        };
        std::fs::rename(&tmp, s.dir.join(snapshot_file(canonical)))?;
        std::mem::forget(cleanup);
        fs::sync_dir(&s.dir)?;
        core.state.apply_snapshot(&info);
        let record = Record::Snapshot {
            name: name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            info: info.clone(),
        };
        let t = self.shards[s.shard].push(&s, record)?;
        core.last_lsn = t.lsn;
        let sinfo = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok((info, sinfo))
    }

    pub(crate) fn snapshot(
        &self,
        name: &StreamName,
        offset: Option<Offset>,
        expect: Option<&Incarnation>,
    ) -> Result<Snapshot> {
        let s = self.live(name)?;
        let vis = s.visible();
        let info = match offset {
            None => vis.snapshots.last().cloned(),
            Some(o) => vis
                .snapshots
                .iter()
                .find(|x| x.offset.bytes == o.bytes)
                .cloned(),
        }
        .ok_or(Error::SnapshotNotFound)?;
        // A request that would answer 404 without Stream-Incarnation still does (the seed).
        s.check_expect(expect)?;
        let data = match crate::segment::blob_view(&s.dir.join(snapshot_file(info.offset))) {
            // Retention removed it since `visible()`.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::SnapshotNotFound);
            }
            other => other?,
        };
        // The blob is served only if it is still the one published (its length and digest).
        let path = s.dir.join(snapshot_file(info.offset));
        if data.len() as u64 != info.len
            || snapshot_digest(&info.content_type, &data) != info.digest
        {
            return Err(Error::corrupt(
                path,
                "snapshot blob does not match its digest",
            ));
        }
        Ok(Snapshot {
            info,
            data,
            tail: vis.tail,
            closed: vis.closed,
            incarnation: s.incarnation.clone(),
        })
    }

    pub(crate) fn delete_snapshot(
        &self,
        name: &StreamName,
        offset: Offset,
        expect: Option<&Incarnation>,
    ) -> Result<()> {
        let s = self.live(name)?;
        let vis = s.visible();
        match vis.snapshots.last() {
            Some(l) if l.offset.bytes == offset.bytes => {
                s.check_expect(expect)?;
                Err(Error::SnapshotDeleteRefused)
            }
            // 404 with or without Stream-Incarnation (the seed).
            _ => Err(Error::SnapshotNotFound),
        }
    }

    pub(crate) fn set_retention(
        &self,
        name: &StreamName,
        offset: Offset,
        expect: Option<&Incarnation>,
    ) -> Result<StreamInfo> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        if !self.is_boundary(&s, offset.bytes)? {
            return Err(Error::NotOnBoundary(offset));
        }
        let canonical = self.offset_at(&s, offset.bytes)?;
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        match core.state.latest_snapshot() {
            Some(l) if l.offset.bytes >= offset.bytes => {}
            _ => return Err(Error::RetentionBeyondSnapshot),
        }
        if canonical.bytes <= core.state.earliest.bytes {
            let t = self.shards[s.shard].ticket(core.last_lsn);
            let info = s.staged_info(&core.state);
            drop(core);
            t.wait()?;
            return Ok(info);
        }
        core.state.apply_retention(canonical);
        let record = Record::Retention {
            name: name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            to: canonical,
        };
        let t = self.shards[s.shard].push(&s, record)?;
        core.last_lsn = t.lsn;
        let info = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok(info)
    }

    // --- listing, checkpoints, shutdown ---------------------------------------------------------

    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<StreamName>> {
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        let now = now_ms();
        let mut names: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let loaded: HashMap<String, Arc<Stream>> = self.registry.lock().clone();
        for (n, s) in &loaded {
            let core = s.core.lock();
            if n.starts_with(prefix) && !core.gone && !core.state.soft_deleted && !s.expired_at(now)
            {
                names.insert(n.clone());
            }
        }
        for top in std::fs::read_dir(self.root.join("streams"))?.flatten() {
            for dir in std::fs::read_dir(top.path())?.flatten() {
                if let Some(sc) = sidecar::load(&dir.path())? {
                    let n = &sc.state.config.name;
                    if loaded.contains_key(n) || !n.starts_with(prefix) || sc.state.soft_deleted {
                        continue;
                    }
                    let expired = match sc.state.config.expiry {
                        Expiry::At(t) => {
                            t.duration_since(UNIX_EPOCH)
                                .map_or(0, |d| d.as_millis() as u64)
                                <= now
                        }
                        _ => false,
                    };
                    if !expired {
                        names.insert(n.clone());
                    }
                }
            }
        }
        Ok(names
            .into_iter()
            .filter_map(|n| StreamName::new(&n).ok())
            .collect())
    }

    pub(crate) fn checkpoint(&self) -> Result<()> {
        for shard in &self.shards {
            let n = {
                let mut q = shard.queue.lock();
                if q.shutdown {
                    return Err(Error::ShutDown);
                }
                q.checkpoint_requests += 1;
                q.checkpoint_requests
            };
            shard.wake.notify_one();
            loop {
                if shard.poisoned.load(Ordering::Acquire) {
                    return Err(Error::Poisoned);
                }
                if shard.checkpointed.load(Ordering::Acquire) >= n {
                    break;
                }
                let l = shard.checkpoint_done.listen();
                if shard.checkpointed.load(Ordering::Acquire) >= n
                    || shard.poisoned.load(Ordering::Acquire)
                {
                    continue;
                }
                l.wait();
            }
        }
        Ok(())
    }

    pub(crate) fn shutdown(&self) -> Result<()> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        {
            let (m, cv) = &*self.reaper_stop;
            *m.lock() = true;
            cv.notify_all();
        }
        for shard in &self.shards {
            shard.queue.lock().shutdown = true;
            shard.wake.notify_one();
        }
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        if self
            .shards
            .iter()
            .any(|s| s.poisoned.load(Ordering::Acquire))
        {
            return Err(Error::Poisoned);
        }
        Ok(())
    }
}

/// A snapshot's digest: `sha256:` and the hex SHA-256 of its content type, a NUL, and the blob.
fn snapshot_digest(content_type: &str, blob: &[u8]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(content_type.as_bytes());
    h.update([0u8]);
    h.update(blob);
    format!(
        "sha256:{}",
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Removes a temporary file when dropped (unless forgotten).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Wraps a JSON stream's stored messages (`m1,m2,`) as an array (`[m1,m2]`) without copying them.
fn json_array(mut pieces: Vec<Bytes>) -> Vec<Bytes> {
    // Drop the separator after the last message.
    while let Some(last) = pieces.last_mut() {
        if last.is_empty() {
            pieces.pop();
            continue;
        }
        last.truncate(last.len() - 1);
        if last.is_empty() {
            pieces.pop();
        }
        break;
    }
    let mut out = Vec::with_capacity(pieces.len() + 2);
    out.push(Bytes::from_static(b"["));
    out.extend(pieces);
    out.push(Bytes::from_static(b"]"));
    out
}

/// Closes idle, clean streams beyond `cap`, least recently used first.
fn evict(reg: &mut HashMap<String, Arc<Stream>>, cap: usize) {
    let target = cap - cap / 8;
    let mut candidates: Vec<(u64, String)> = reg
        .iter()
        .filter(|(_, s)| Arc::strong_count(s) == 1)
        .filter(|(_, s)| {
            let Some(d) = s.data.try_lock() else {
                return false;
            };
            let Some(c) = s.core.try_lock() else {
                return false;
            };
            d.deleted
                || (d.applied_lsn == d.checkpointed_lsn
                    && c.last_lsn <= d.applied_lsn
                    && !c.state.soft_deleted)
        })
        .map(|(n, s)| (s.last_used.load(Ordering::Relaxed), n.clone()))
        .collect();
    candidates.sort_unstable();
    let excess = reg.len().saturating_sub(target);
    for (_, n) in candidates.into_iter().take(excess) {
        reg.remove(&n);
    }
}

/// Deletes expired streams in the background, so their waiters wake and their space is freed.
fn reaper(engine: Weak<Engine>, stop: Arc<(Mutex<bool>, Condvar)>) {
    loop {
        {
            let (m, cv) = &*stop;
            let mut stopped = m.lock();
            if *stopped {
                return;
            }
            cv.wait_for(&mut stopped, Duration::from_millis(250));
            if *stopped {
                return;
            }
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let now = now_ms();
        let expired: Vec<Arc<Stream>> = engine
            .registry
            .lock()
            .values()
            .filter(|s| s.config.expiry != Expiry::Never && s.expired_at(now))
            .cloned()
            .collect();
        for s in expired {
            if !s.core.lock().state.soft_deleted {
                engine.expire(&s);
            }
        }
    }
}

/// Reads or writes the store manifest (`STORE`): magic and the journal shard count.
fn store_manifest(root: &Path, shards: usize) -> Result<usize> {
    let path = root.join("STORE");
    match std::fs::read(&path) {
        Ok(b) => {
            if b.len() != 12 || &b[..8] != STORE_MAGIC {
                return Err(Error::corrupt(&path, "not a brook store manifest"));
            }
            let n = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
            if !(1..=64).contains(&n) {
                return Err(Error::corrupt(&path, "bad shard count"));
            }
            // The journal directories, made before the manifest, say the count again: a damaged
            // count would hash streams to other shards, whose LSNs their sidecars do not know.
            let mut dirs: Vec<usize> = Vec::new();
            for e in std::fs::read_dir(root.join("journal"))? {
                let name = e?.file_name();
                if let Some(id) = name
                    .to_str()
                    .filter(|s| s.len() == 2)
                    .and_then(|s| s.parse().ok())
                {
                    dirs.push(id);
                }
            }
            dirs.sort_unstable();
            if dirs != (0..n).collect::<Vec<_>>() {
                return Err(Error::corrupt(
                    &path,
                    "the shard count disagrees with the journal directories",
                ));
            }
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Journal directories first: the manifest's rename makes the store's layout durable.
            std::fs::create_dir_all(root.join("journal"))?;
            for id in 0..shards {
                std::fs::create_dir_all(root.join("journal").join(format!("{id:02}")))?;
            }
            fs::sync_dir(&root.join("journal"))?;
            let mut b = STORE_MAGIC.to_vec();
            b.extend_from_slice(&(shards as u32).to_le_bytes());
            let tmp = root.join("STORE.tmp");
            let mut f = File::create(&tmp)?;
            f.write_all(&b)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            fs::sync_dir(root)?;
            Ok(shards)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes a file or trash directory that a durable record made obsolete. A directory is first
/// renamed to `*.gone` and the rename synced, so a crash while it is being emptied leaves a
/// directory that recovery finishes removing, never a partial one that it would restore.
fn discard(p: &Path) {
    if !p.is_dir() {
        let _ = std::fs::remove_file(p);
        return;
    }
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let gone = p.with_file_name(format!("{name}.gone"));
    if std::fs::rename(p, &gone).is_err() {
        return;
    }
    if let Some(parent) = gone.parent() {
        let _ = fs::sync_dir(parent);
    }
    let _ = std::fs::remove_dir_all(&gone);
}

/// Puts back stream directories moved to the trash by deletes that never became durable; the
/// journal replay that follows deletes them again if their delete record is durable.
fn restore_trash(root: &Path) -> Result<()> {
    for e in std::fs::read_dir(root.join("trash"))?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".gone") {
            // Its delete was durable and it was being emptied (see `discard`): finish.
            std::fs::remove_dir_all(e.path())?;
            continue;
        }
        let Some((key, _inc)) = name.split_once('-') else {
            std::fs::remove_dir_all(e.path())?;
            continue;
        };
        if key.len() < 2 {
            std::fs::remove_dir_all(e.path())?;
            continue;
        }
        let dest = root.join("streams").join(&key[..2]).join(key);
        if dest.exists() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::create_dir_all(root.join("streams").join(&key[..2]))?;
            std::fs::rename(e.path(), &dest)?;
        }
    }
    Ok(())
}

/// Replays one shard's journal into the registry; returns the LSN after its last valid record.
fn replay_shard(
    root: &Path,
    options: &Options,
    id: usize,
    dir: &Path,
    registry: &mut HashMap<String, Arc<Stream>>,
) -> Result<u64> {
    let files = journal::list_files(dir)?;
    let mut end = 0;
    let count = files.len();
    for (i, (_, path)) in files.iter().enumerate() {
        let scanned = journal::scan(path, id as u32)?;
        if scanned.torn && i + 1 < count {
            return Err(Error::corrupt(
                path,
                "corrupt record in a journal file that is not the newest",
            ));
        }
        if scanned.torn {
            // Cut the torn tail off now, so a crash during this recovery cannot leave it in a
            // journal file that is no longer the newest.
            if std::fs::metadata(path)?.len() < journal::HEADER_LEN {
                // Its header never became durable: it holds nothing.
                std::fs::remove_file(path)?;
                fs::sync_dir(dir)?;
            } else {
                let f = OpenOptions::new().write(true).open(path)?;
                f.set_len(journal::HEADER_LEN + (scanned.end_lsn - scanned.base_lsn))?;
                f.sync_all()?;
            }
        }
        if i == 0 || scanned.base_lsn >= end {
            end = end.max(scanned.base_lsn);
        }
        for (lsn, record) in scanned.records {
            end = lsn;
            let name = record.name().to_owned();
            let stream = match (&record, registry.get(&name)) {
                (Record::Create { state, .. }, existing) => {
                    let same = existing.is_some_and(|s| {
                        s.incarnation.as_str() == state.config.incarnation
                            && s.data.lock().applied_lsn >= lsn
                    });
                    if same {
                        continue;
                    }
                    let sdir = fs::stream_dir(root, &name);
                    // A sidecar of this very incarnation at or past this LSN means the create is checkpointed.
                    if let Some(sc) = sidecar::load(&sdir)?
                        && sc.state.config.incarnation == state.config.incarnation
                        && sc.applied_lsn >= lsn
                    {
                        let segs = SegmentSet::open(
                            &sdir,
                            sc.state.base,
                            sc.state.tail,
                            options.segment_bytes,
                        )?;
                        let s = Stream::new(
                            sc.state,
                            sdir,
                            id,
                            Some(segs),
                            sc.applied_lsn,
                            sc.generation,
                            true,
                        );
                        registry.insert(name.clone(), s);
                        continue;
                    }
                    let s = Stream::new((**state).clone(), sdir, id, None, 0, 0, true);
                    registry.insert(name.clone(), s.clone());
                    s
                }
                (_, Some(s)) => s.clone(),
                (_, None) => {
                    let sdir = fs::stream_dir(root, &name);
                    let Some(sc) = sidecar::load(&sdir)? else {
                        continue;
                    };
                    if sc.state.config.incarnation != record.incarnation() {
                        continue;
                    }
                    let segs = SegmentSet::open(
                        &sdir,
                        sc.state.base,
                        sc.state.tail,
                        options.segment_bytes,
                    )?;
                    let s = Stream::new(
                        sc.state,
                        sdir,
                        id,
                        Some(segs),
                        sc.applied_lsn,
                        sc.generation,
                        true,
                    );
                    registry.insert(name.clone(), s.clone());
                    s
                }
            };
            if stream.incarnation.as_str() != record.incarnation() {
                continue;
            }
            let mut after = Vec::new();
            apply(root, options, &stream, lsn, &record, &mut after)?;
            for p in after {
                discard(&p);
            }
            let d = stream.data.lock();
            let deleted = d.deleted;
            let state = d.state.clone();
            drop(d);
            {
                let mut core = stream.core.lock();
                core.state = state.clone();
                core.last_lsn = lsn;
                core.gone = deleted;
            }
            *stream.visible.lock() = Visible::of(&state, deleted);
            if deleted {
                registry.remove(&name);
            }
        }
        end = end.max(scanned.end_lsn);
    }
    // Streams replayed here must be checkpointed; mark them by leaving checkpointed_lsn behind.
    Ok(end)
}
