//! A journal shard: its journal writer, the commit of one batch (write-path steps 3 to 5: the
//! journal write, the records applied, the sync, the durable views published), the shard
//! thread, and the hand-off to checkpoints. The queue and who commits it (group commit, the
//! write barrier) are in `commit.rs`; poisoning and healing in `poison.rs`.
//!
//! A shard's records are committed in queue order, which is the order their checks ran in (each
//! record is enqueued under its stream's `core` lock). One `fdatasync` covers a whole batch, on
//! any number of streams.
//!
//! A failure on the durability path makes the shard refuse every write (`Error::Poisoned`, with
//! the failure as its source). When the failure's outcome is unknown (a sync failed, or a batch
//! in the journal could not be applied) the shard is poisoned until the store is reopened:
//! after a failed `fsync` the kernel may have dropped the dirty pages, so only recovery knows
//! what is on disk. When it is known (a journal write that was cut back off the file, a
//! checkpoint step other than a sync), the shard heals in place: the shard thread makes the
//! journal's end durable again, rolls the streams whose records failed back to their applied
//! state, and takes writes again (see [`Shard::heal`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use event_listener::Event;
use parking_lot::{Condvar, Mutex};

use crate::engine::journal::{self, Record};
use crate::error::{Error, Result};
use crate::fs;
use crate::options::{Durability, Options};
use crate::segment::SegmentSet;
use crate::stats::Counters;

use super::super::apply::{apply, discard_all};
use super::super::names::Names;
use super::super::stream::Stream;
use super::super::ticket::Batch;
use super::checkpoint::{Checkpoints, Writeback};
use super::commit::{Queue, Queued};
use super::images::Images;
use super::poison::Refused;

/// How long the shard thread leaves queued records to their writers (Buffered mode) before it
/// commits them itself. A record whose `Pending` nobody waits on (or drops) is committed within
/// two of these: the thread looks at the queue once per `LINGER` while writers are active.
pub(in crate::engine) const LINGER: Duration = Duration::from_millis(20);

/// Buffered mode: after this many looks in a row at an empty queue (a second with no writes)
/// the shard thread sleeps until the next push wakes it, so an idle store costs no wakeups.
pub(super) const QUIET_LOOKS: u32 = 50;

/// While a shard refuses writes after a failure it may heal from, how often the shard thread
/// tries to heal (a refused write also wakes it).
const HEAL_RETRY: Duration = Duration::from_millis(200);

/// A journal sync slower than this is logged (at warn): the disk is struggling.
const SLOW_SYNC: Duration = Duration::from_millis(100);

/// Buffered mode: once this many journal bytes were written since their write-back was last
/// asked for, the checkpoint thread is asked to start it (`fs::start_writeback`).
const WRITEBACK_AT: u64 = 1 << 20;

/// The journal file and what is written to it; held while a batch is written and applied.
pub(in crate::engine) struct Writer {
    pub(in crate::engine) file: File,
    /// The current file's path (what the file-system seam is told).
    pub(in crate::engine) path: PathBuf,
    /// The LSN of the current file's first record byte (its name).
    pub(super) file_base: u64,
    /// LSN just past the last byte written. Records still queued have higher LSNs, so a rotation
    /// starts the new file here, not at the queue's next LSN.
    pub(in crate::engine) end_lsn: u64,
    /// Bytes written since the last rotation.
    pub(in crate::engine) written: u64,
    /// The current file's length: its header and records, then zeros set aside for the
    /// next batches (grown in [`journal::JOURNAL_STEP`]s).
    pub(super) alloc: u64,
    /// The file was created by a rotation and its directory entry is not durable yet.
    pub(in crate::engine) fresh: bool,
    /// Sync mode: the current file was prepared (`engine/journal/prepared.rs`): zeros written and
    /// synced up to `alloc` before the first batch.
    pub(super) prewritten: bool,
    /// Sync mode: a prepared file was asked for since the current file was started.
    pub(in crate::engine) asked: bool,
    /// Sync mode: the syncs of the current file.
    pub(in crate::engine) syncs: u64,
    /// Buffered mode: bytes written at the current file's end whose write-back has not been
    /// asked for (see [`WRITEBACK_AT`]), and the current file's descriptor shared with the
    /// checkpoint thread that starts it (made at the first such request for the file).
    pub(super) unstarted: u64,
    pub(super) shared_file: Option<Arc<File>>,
    /// Bytes the writer may commit before it looks at the free space again (`engine/journal/space.rs`).
    pub(super) unlooked: u64,
    /// Buffers swapped with the queue's, and the last batch's signal (see `Batch::renew`), so
    /// a batch allocates nothing.
    pub(super) spare_buf: Vec<u8>,
    pub(super) spare_batch: Option<Arc<Batch>>,
    pub(super) spare_items: Vec<Queued>,
    /// The streams of the batch being committed, each once.
    touched: Vec<Arc<Stream>>,
    /// Scratch for the room a batch's streams need (`engine/journal/space.rs`), kept empty
    /// between batches for its allocation.
    pub(super) room_want: Vec<(usize, u64, u64, bool)>,
}

/// One journal shard: its queue, its writer, its durable LSN and its checkpoint hand-off.
///
/// Lock order inside a shard: `queue` is a leaf (held only to push or take the queue); `writer`
/// is taken before any stream's `data` and `visible`, never while holding `queue`.
pub(crate) struct Shard {
    pub(in crate::engine) id: usize,
    /// The shard's journal directory (`journal/NN`).
    pub(in crate::engine) dir: PathBuf,
    /// The store's root directory (for the trash a delete moves a stream to).
    root: PathBuf,
    /// Told of every stream a batch publishes (one atomic load while no subscription exists).
    hook: Arc<super::super::subscription::Hook>,
    pub(in crate::engine) options: Options,
    /// Buffered mode: a writer commits the queue itself when it waits (no thread hand-off).
    pub(in crate::engine) inline: bool,
    pub(in crate::engine) queue: Mutex<Queue>,
    /// Wakes the shard thread: records were queued, a checkpoint was asked for, or shutdown.
    pub(in crate::engine) wake: Condvar,
    pub(in crate::engine) writer: Mutex<Writer>,
    /// The LSN up to which this shard's journal is durable (as the durability mode promises).
    pub(in crate::engine) durable_lsn: AtomicU64,
    /// Notified when `durable_lsn` advances or the shard is poisoned.
    pub(in crate::engine) durable: Event,
    /// The first failure whose outcome is unknown; once set, nothing more is committed until
    /// the store is reopened.
    pub(in crate::engine) poison: OnceLock<Arc<std::io::Error>>,
    /// A failure whose outcome is known: writes are refused until [`Shard::heal`] clears it.
    pub(in crate::engine) refused: Mutex<Refused>,
    /// `refused.cause` is set (the fast path's one load).
    pub(in crate::engine) refusing: AtomicBool,
    pub(in crate::engine) checkpoints: Mutex<Checkpoints>,
    pub(super) checkpoints_cv: Condvar,
    /// `checkpoints.prepared` holds a file (the writer's one load per batch).
    pub(super) prepared_ready: AtomicBool,
    /// The checkpoint requests answered so far.
    pub(in crate::engine) checkpointed: AtomicU64,
    /// Notified when a checkpoint finishes or the shard is poisoned.
    pub(super) checkpoint_done: Event,
    /// Files durable records made obsolete (segments and snapshots behind retention), each with
    /// the LSN of its record and its stream: a sidecar may still refer to them until a
    /// checkpoint past that LSN is durable, which then removes them (unless the stream was
    /// deleted meanwhile: see `recovery::reclaim`).
    pub(in crate::engine) reclaim: Mutex<Vec<(u64, Arc<Stream>, PathBuf)>>,
    /// Streams whose applied state is newer than their sidecar (changed under `writer`).
    pub(in crate::engine) dirty: Mutex<HashMap<String, Arc<Stream>>>,
    /// Streams deleted for good since the last rotation: their images in checkpoint files stop
    /// counting at the next checkpoint (2.8).
    pub(in crate::engine) deleted: Mutex<Vec<Box<str>>>,
    /// The store's counters (batch sizes, sync and checkpoint durations).
    pub(in crate::engine) counters: Arc<Counters>,
    /// The store's name index: a Create adds its name, a completed delete removes it.
    pub(in crate::engine) names: Arc<Names>,
    /// The shard's checkpoint files (2.8) and the newest stream images in them.
    pub(in crate::engine) images: Arc<Images>,
    /// The cold tier, told about each checkpoint's streams (set once, at open).
    #[cfg(feature = "tier")]
    pub(in crate::engine) tier: OnceLock<Arc<crate::tier::Tier>>,
}

impl Shard {
    /// A shard whose journal continues at `end` in `file` (a new, synced file named `end`),
    /// sharing the store's subscription hook, counters and name index, with its checkpoint
    /// files as read at open.
    pub(in crate::engine) fn new(
        id: usize,
        dir: PathBuf,
        root: PathBuf,
        options: &Options,
        (file, end): (File, u64),
        hook: Arc<super::super::subscription::Hook>,
        (counters, names, images): (Arc<Counters>, Arc<Names>, Arc<Images>),
    ) -> Shard {
        let path = journal::file_path(&dir, end);
        Shard {
            id,
            counters,
            names,
            images,
            dir,
            root,
            hook,
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
                quiet: 0,
            }),
            wake: Condvar::new(),
            writer: Mutex::new(Writer {
                file,
                path,
                file_base: end,
                end_lsn: end,
                written: 0,
                alloc: journal::HEADER_LEN,
                fresh: false,
                prewritten: false,
                asked: false,
                syncs: 0,
                unstarted: 0,
                shared_file: None,
                unlooked: 0,
                spare_buf: Vec::with_capacity(64 << 10),
                spare_batch: None,
                spare_items: Vec::new(),
                touched: Vec::new(),
                room_want: Vec::new(),
            }),
            durable_lsn: AtomicU64::new(end),
            durable: Event::new(),
            poison: OnceLock::new(),
            refused: Mutex::new(Refused::default()),
            refusing: AtomicBool::new(false),
            checkpoints: Mutex::new(Checkpoints::default()),
            checkpoints_cv: Condvar::new(),
            prepared_ready: AtomicBool::new(false),
            checkpointed: AtomicU64::new(0),
            checkpoint_done: Event::new(),
            dirty: Mutex::new(HashMap::new()),
            deleted: Mutex::new(Vec::new()),
            #[cfg(feature = "tier")]
            tier: OnceLock::new(),
            reclaim: Mutex::new(Vec::new()),
        }
    }

    /// The LSN of the newest record enqueued: every later record's is higher.
    pub(in crate::engine) fn last_lsn(&self) -> u64 {
        self.queue.lock().next_lsn
    }

    /// Whether the journal or the dirty set has grown enough for a checkpoint.
    pub(super) fn checkpoint_due(&self, w: &Writer) -> bool {
        // Dirty streams cannot be closed (evicted) before a checkpoint records them, so bound
        // them too: otherwise touching many streams between checkpoints keeps every one of them
        // open (their maps and a descriptor each) and exhausts `ulimit -n`.
        let dirty_cap = (self.options.max_open_streams / (2 * self.options.journal_shards)).max(8);
        w.written >= self.options.checkpoint_bytes || self.dirty.lock().len() >= dirty_cap
    }

    /// The shard thread: group commit (Sync mode) or the stragglers (Buffered mode), and the
    /// rotations that start checkpoints (step 6a), until shutdown. At shutdown it commits what
    /// is queued, posts a last checkpoint, waits for it and stops the checkpoint thread.
    ///
    /// A panic in it poisons the shard (see [`Shard::panicked`]); the thread then fails what
    /// is queued and stops its checkpoint thread as at shutdown.
    pub(in crate::engine) fn run(self: Arc<Self>) {
        // Unwind safety: after a panic the shard is poisoned and commits nothing more.
        if let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
        {
            self.panicked("thread", &*payload);
            // Pushes are refused from now on; what was queued before fails.
            let mut w = self.writer.lock();
            while self.drain(&mut w) {}
        }
        self.wait_checkpoints();
        self.checkpoints.lock().stop = true;
        self.checkpoints_cv.notify_all();
        self.checkpoint_done.notify(usize::MAX);
    }

    /// [`Shard::run`]'s loop, until shutdown.
    fn serve(&self) {
        let mut answered = 0;
        loop {
            let (requests, due, shutdown) = self.next_work(answered);
            self.heal();
            let mut w = self.writer.lock();
            self.drain(&mut w);
            let forced = requests > answered || shutdown;
            if !(forced || due || self.checkpoint_due(&w)) || self.failed() {
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
                Ok(job) => self.post_checkpoint(job),
                // A rotation changes nothing durable, and gives back what it took on failure.
                Err(e) => self.refuse(e),
            }
            answered = requests;
            if shutdown {
                break;
            }
        }
    }

    /// Sleeps until the shard thread has something to do; returns the checkpoint requests so
    /// far, whether a writer found a checkpoint due, and whether the store is shutting down.
    ///
    /// Sync mode wakes on every enqueue. Buffered mode leaves batches to their writers: it
    /// sleeps while the queue is empty, and otherwise commits what is left after [`LINGER`].
    fn next_work(&self, answered: u64) -> (u64, bool, bool) {
        let mut q = self.queue.lock();
        loop {
            if q.shutdown || q.checkpoint_requests > answered || q.checkpoint_due {
                break;
            }
            if self.refusing.load(Ordering::Acquire) {
                // Time to try healing (a refused write wakes the thread sooner).
                self.wake.wait_for(&mut q, HEAL_RETRY);
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
                if q.quiet >= QUIET_LOOKS {
                    q.idle = true;
                    self.wake.wait(&mut q);
                    q.idle = false;
                    q.quiet = 0;
                    continue;
                }
                // Writers were active lately: look again after a while rather than be woken
                // (a futex pair) by every push.
                self.wake.wait_for(&mut q, LINGER);
                if q.items.is_empty() {
                    q.quiet += 1;
                }
                continue;
            }
            q.quiet = 0;
            self.wake.wait_for(&mut q, LINGER);
            break;
        }
        (
            q.checkpoint_requests,
            std::mem::take(&mut q.checkpoint_due),
            q.shutdown,
        )
    }

    /// Steps 3 to 5 for one batch: write it to the journal, apply each record to its stream's
    /// files and applied state, sync the journal (Sync mode), publish each touched stream's
    /// durable view, advance the durable LSN, and remove the files the batch made obsolete.
    ///
    /// Called under `writer`; takes each stream's `data` then `visible` (never `core`).
    ///
    /// On failure, says whether the batch may be in the journal (`true`): a journal write that
    /// fails is cut back off the file (`false`, nothing of the batch stays) unless that fails too.
    pub(in crate::engine) fn commit(
        &self,
        w: &mut Writer,
        buf: &[u8],
        items: &[Queued],
    ) -> std::result::Result<(), (Error, bool)> {
        // Step 3: one write for the batch, then the records' effects on the streams' files.
        self.counters.batch_records.observe(items.len() as f64);
        self.maybe_switch(w);
        let start = journal::HEADER_LEN + (w.end_lsn - w.file_base);
        let need = start + buf.len() as u64;
        // A full disk shows here, before any byte of the batch is written (`engine/journal/space.rs`).
        self.set_aside(w, need, buf, items)
            .map_err(|e| (e, false))?;
        if let Err(e) = fs::check_write(&w.path).and_then(|()| w.file.write_all(buf)) {
            let cut = fs::set_len(&w.file, &w.path, start)
                .and_then(|()| w.file.seek(std::io::SeekFrom::Start(start)).map(drop));
            w.alloc = start;
            return Err((e.into(), cut.is_err()));
        }
        if self.options.durability == Durability::Buffered {
            // Nothing syncs these bytes before the checkpoint's `syncfs`: have the kernel
            // write them as they come, so that sync does not meet a whole file at once.
            w.unstarted += buf.len() as u64;
            if w.unstarted >= WRITEBACK_AT {
                if w.shared_file.is_none() {
                    w.shared_file = w.file.try_clone().ok().map(Arc::new);
                }
                if let Some(file) = &w.shared_file {
                    self.start_writeback_later(Writeback {
                        file: file.clone(),
                        offset: need - w.unstarted,
                        len: w.unstarted,
                    });
                }
                w.unstarted = 0;
            }
        }
        self.apply_and_sync(w, buf, items).map_err(|e| (e, true))
    }

    /// Steps 3 (apply) to 5 for a batch already written to the journal file.
    fn apply_and_sync(&self, w: &mut Writer, buf: &[u8], items: &[Queued]) -> Result<()> {
        let mut after: Vec<PathBuf> = Vec::new();
        w.touched.clear();
        let mut reclaim = Vec::new();
        let mut placed = false;
        for it in items {
            let before = after.len();
            apply(
                &self.root,
                &self.options,
                &it.stream,
                (it.lsn, &it.record),
                false,
                &mut after,
            )?;
            if matches!(it.record, Record::Create { .. })
                && let Some(segs) = it.stream.data.lock().segs.as_mut()
                && !segs.is_counted()
            {
                segs.count_in(&self.counters.stream_files);
            }
            // A deleted stream's trash goes once durable; files behind retention wait for a
            // checkpoint.
            let mut i = before;
            while i < after.len() {
                if after[i].is_dir() {
                    i += 1;
                } else {
                    reclaim.push((it.lsn, it.stream.clone(), after.swap_remove(i)));
                }
            }
            let (deleted, was_dirty) = {
                let d = it.stream.data.lock();
                (d.deleted, d.in_dirty)
            };
            match &it.record {
                Record::Create { .. } => self.names.add(it.stream.name.as_str())?,
                Record::Delete { .. } if deleted => {
                    self.names.remove(it.stream.name.as_str())?;
                    self.deleted.lock().push(it.stream.name.as_str().into());
                }
                _ => {}
            }
            // The flag follows the set, never leads it (see `Data::in_dirty`).
            if deleted {
                self.dirty.lock().remove(it.stream.name.as_str());
                it.stream.data.lock().in_dirty = false;
            } else if !was_dirty {
                self.dirty
                    .lock()
                    .entry(it.stream.name.as_str().to_owned())
                    .or_insert_with(|| it.stream.clone());
                it.stream.data.lock().in_dirty = true;
            }
            if !w.touched.iter().any(|s| Arc::ptr_eq(s, &it.stream)) {
                w.touched.push(it.stream.clone());
            }
            if let Record::Append {
                placed: Some(p), ..
            } = &it.record
            {
                // The checkpoint's bound counts the bytes written for a record, wherever they
                // went (recovery reads them back either way).
                w.written += u64::from(p.len);
                placed = true;
            }
        }
        // A placed append is acknowledged with the batch: its bytes go to the log first (one
        // write per stream for all of the batch's).
        if placed {
            for s in &w.touched {
                if let Some(segs) = s.data.lock().segs.as_mut() {
                    segs.write_placed()?;
                }
            }
        }
        // Step 4 [sync].
        if self.options.durability == Durability::Sync {
            let started = Instant::now();
            fs::sync_data(&w.file, &w.path)?;
            w.syncs += 1;
            let took = started.elapsed();
            self.counters.journal_sync.observe_duration(took);
            if took > SLOW_SYNC {
                tracing::warn!(
                    shard = self.id,
                    ?took,
                    bytes = buf.len(),
                    "slow journal sync"
                );
            }
            if w.fresh {
                // The first sync of a rotated journal makes its name durable too.
                fs::sync_dir(&self.dir)?;
                w.fresh = false;
            }
        }
        // Step 5: publish, wake readers and writers, then drop what the batch made obsolete.
        for s in &w.touched {
            let mut d = s.data.lock();
            s.visible.lock().refresh(&d.state, d.deleted);
            let written = d.segs.as_mut().and_then(SegmentSet::take_writeback);
            drop(d);
            if let Some((file, offset, len)) = written {
                self.start_writeback_later(Writeback { file, offset, len });
            }
            s.event.notify(usize::MAX);
            self.hook.touched(&s.name);
        }
        w.touched.clear();
        if let Some(last) = items.last() {
            self.durable_lsn.store(last.lsn, Ordering::Release);
        }
        self.durable.notify(usize::MAX);
        #[cfg(feature = "tier")]
        let deleted_dirs = after.iter().any(|p| p.is_dir());
        if !after.is_empty() {
            discard_all(&after);
        }
        if !reclaim.is_empty() {
            self.reclaim.lock().extend(reclaim);
        }
        // A deleted stream left a marker for the cold tier (see `discard`): its objects go next.
        #[cfg(feature = "tier")]
        if deleted_dirs && let Some(t) = self.tier.get() {
            t.note_gone();
        }
        Ok(())
    }
}

/// Creates a journal file named `base_lsn` with its header and `flags` (not yet synced: see
/// `Writer::fresh`). An existing file of that name is truncated.
pub(super) fn open_journal_file(
    dir: &Path,
    shard: usize,
    base_lsn: u64,
    flags: u32,
) -> Result<File> {
    let path = journal::file_path(dir, base_lsn);
    let mut f = fs::open_create(
        OpenOptions::new().create(true).write(true).truncate(true),
        &path,
    )?;
    f.write_all(&journal::file_header(shard as u32, base_lsn, flags))?;
    Ok(f)
}

/// Creates a journal file like [`open_journal_file`] and makes it and its name durable (at
/// open, before anything is written to it).
pub(in crate::engine) fn new_journal_file(dir: &Path, shard: usize, base_lsn: u64) -> Result<File> {
    let f = open_journal_file(dir, shard, base_lsn, 0)?;
    fs::sync_all(&f, &journal::file_path(dir, base_lsn))?;
    fs::sync_dir(dir)?;
    Ok(f)
}
