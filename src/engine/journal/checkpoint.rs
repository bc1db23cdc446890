//! Checkpoints (write-path step 6): the writer rotates the journal and takes each dirty stream's
//! applied state (6a); the shard's checkpoint thread makes that state durable in the streams'
//! sidecars and drops the journal files it replaces (6b to 6e), while commits go on.
//!
//! One checkpoint runs at a time per shard. A sidecar never claims more than is durable: it is
//! written after a `syncfs` that covers every file change applied before the rotation, and the
//! old journal goes only after a second `syncfs` covers the sidecars.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use event_listener::Listener;

use crate::engine::journal;
use crate::error::{Error, Result};
use crate::fs;
use crate::options::Durability;
use crate::sidecar;
use crate::state::StreamState;

use super::images::Written;

use super::super::Engine;
use super::super::stream::Stream;
use super::shard::{Shard, Writer};

/// How much the checkpoint thread lowers its CPU priority (a nice increment, Linux): it takes
/// the CPU that the threads serving requests leave, instead of an equal share beside them
/// (DESIGN.md, section 3, step 6).
const CHECKPOINT_NICE: libc::c_int = 10;

/// Lowers the calling thread's CPU priority by [`CHECKPOINT_NICE`], to at most 19 (elsewhere
/// than Linux, nothing). Failing leaves the priority as it was: a preference, not a need.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        #[expect(
            unsafe_code,
            reason = "nice(3) changes the calling thread's priority; no memory is shared"
        )]
        // SAFETY: takes an integer, reads and writes no memory of ours. On Linux a nice value
        // belongs to a thread, so this changes no other thread's.
        unsafe {
            libc::nice(CHECKPOINT_NICE);
        }
    }
}

/// One checkpoint, handed from the writer (which rotated the journal) to the checkpoint thread.
pub(in crate::engine) struct CheckpointJob {
    /// The rotation point: every record below it is in the streams' files and in `streams`.
    lsn: u64,
    /// The checkpoint requests this one answers.
    requests: u64,
    /// Each dirty stream with its applied LSN and state at the rotation, and whether its
    /// sidecar must be written (its configuration changed, or it has none yet) rather than an
    /// image in the checkpoint file.
    streams: Vec<(Arc<Stream>, u64, StreamState, bool)>,
    /// Streams deleted since the last checkpoint: their images in checkpoint files go.
    gone: Vec<Box<str>>,
}

/// The hand-off between a shard's writer and its checkpoint thread (under `Shard::checkpoints`).
#[derive(Default)]
pub(in crate::engine) struct Checkpoints {
    /// The posted job, until the checkpoint thread takes it.
    job: Option<CheckpointJob>,
    /// A job is posted or running.
    pub(in crate::engine) busy: bool,
    /// Shutdown: the checkpoint thread exits once no job is left.
    pub(in crate::engine) stop: bool,
    /// Ranges of files whose write-back the committers want started (see
    /// `Shard::start_writeback_later`), for the checkpoint thread between jobs.
    writeback: Vec<Writeback>,
    /// The writer asked for a prepared journal file (`engine/journal/prepared.rs`), for the checkpoint
    /// thread between jobs.
    pub(super) prepare: bool,
    /// A prepared journal file, ready for the writer.
    pub(in crate::engine) prepared: Option<File>,
}

/// What the checkpoint thread does next.
enum Work {
    Checkpoint(CheckpointJob),
    Writeback,
    Prepare,
}

/// A range of a journal or segment log written since its write-back was last started.
pub(super) struct Writeback {
    pub(in crate::engine) file: Arc<File>,
    pub(in crate::engine) offset: u64,
    pub(in crate::engine) len: u64,
}

impl Shard {
    /// Step 6a, under `writer` between two batches: later batches go to a new journal file
    /// starting at the current LSN; the dirty streams' applied state at this point is what the
    /// checkpoint records. Streams deleted meanwhile are left out.
    pub(in crate::engine) fn rotate(&self, w: &mut Writer, requests: u64) -> Result<CheckpointJob> {
        let lsn = w.end_lsn;
        if lsn > w.file_base {
            // In Buffered mode the old file's batches were never synced, and are not synced
            // here (that would stall every writer for the whole file's writeback): the new
            // file says so in its header, and recovery accepts a torn end in an older file
            // only when the file after it says so. Step 6b's `syncfs` makes the old file
            // durable before anything depends on it.
            let flags = if self.options.durability == Durability::Buffered {
                journal::FLAG_PREV_UNSYNCED
            } else {
                0
            };
            self.start_journal_file(w, flags)?;
            w.written = 0;
        }
        let dirty: Vec<Arc<Stream>> = self.dirty.lock().drain().map(|(_, s)| s).collect();
        let mut streams = Vec::with_capacity(dirty.len());
        let gone = std::mem::take(&mut *self.deleted.lock());
        for s in dirty {
            let mut d = s.data.lock();
            d.in_dirty = false;
            if !d.deleted {
                let due = d.sidecar_due || d.generation == 0 || !self.images.enabled;
                d.sidecar_due = false;
                let (lsn, state) = (d.applied_lsn, d.state.clone());
                drop(d);
                streams.push((s, lsn, state, due));
            }
        }
        Ok(CheckpointJob {
            lsn,
            requests,
            streams,
            gone,
        })
    }

    /// The bytes of checkpoint files past which a checkpoint folds the oldest into its own: the
    /// journal's checkpoint size, so recovery reads about as much of them as of the journal.
    fn fold_bytes(&self) -> u64 {
        self.options.checkpoint_bytes
    }

    /// Puts streams taken by a rotation or checkpoint that failed back in the dirty set, so the
    /// next checkpoint records them (deleted ones excepted), and the deletes it took back in
    /// the shard's list.
    fn redirty<'a>(&self, streams: impl Iterator<Item = &'a Arc<Stream>>, gone: &[Box<str>]) {
        self.deleted.lock().extend(gone.iter().cloned());
        let mut dirty = self.dirty.lock();
        for s in streams {
            let mut d = s.data.lock();
            // What the failed checkpoint was to write is written again, as a sidecar.
            d.sidecar_due = true;
            if !d.deleted && !dirty.contains_key(s.name.as_str()) {
                dirty.insert(s.name.as_str().to_owned(), s.clone());
                d.in_dirty = true;
            }
        }
    }

    /// A failed sync of a checkpoint: its outcome is unknown (the kernel may have dropped the
    /// pages it could not write), so the shard is poisoned until the store is reopened.
    fn sync_failed(&self, e: std::io::Error) -> Error {
        self.poison(e.into());
        self.poisoned_error()
    }

    /// Asks the checkpoint thread to start the write-back of `range` when it is not running a
    /// job (`fs::start_writeback`, which may block on a busy disk, never on a committer's path).
    pub(super) fn start_writeback_later(&self, range: Writeback) {
        self.checkpoints.lock().writeback.push(range);
        self.checkpoints_cv.notify_all();
    }

    /// Hands a rotated job to the checkpoint thread (which must be idle: see `busy`).
    pub(super) fn post_checkpoint(&self, job: CheckpointJob) {
        let mut c = self.checkpoints.lock();
        c.job = Some(job);
        c.busy = true;
        self.checkpoints_cv.notify_all();
    }

    /// Waits until no checkpoint is posted or running.
    pub(super) fn wait_checkpoints(&self) {
        let mut c = self.checkpoints.lock();
        while c.busy {
            self.checkpoints_cv.wait(&mut c);
        }
    }

    /// The checkpoint thread: runs the jobs the writer posts, one at a time, until shutdown. A
    /// failed sync poisons the shard, any other failed step makes it refuse writes until it
    /// heals; a job on a poisoned or refusing shard only answers its requests. A panic poisons
    /// the shard (see [`Shard::panicked`]) and ends the thread, answering its job, so no one
    /// waits on a checkpoint that will not come.
    pub(in crate::engine) fn checkpointer(self: Arc<Self>) {
        lower_priority();
        let syncer = match File::open(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                self.poison(e.into());
                return;
            }
        };
        // Unwind safety: after a panic the shard is poisoned and checkpoints nothing more.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.serve_checkpoints(&syncer);
        }));
        if let Err(payload) = served {
            self.panicked("checkpoint thread", &*payload);
            let mut c = self.checkpoints.lock();
            if let Some(job) = c.job.take() {
                self.checkpointed.fetch_max(job.requests, Ordering::AcqRel);
            }
            c.busy = false;
            if c.prepared.take().is_some() {
                let _ = fs::remove_file(&self.dir.join(journal::PREPARED));
            }
            drop(c);
            self.checkpoints_cv.notify_all();
            self.checkpoint_done.notify(usize::MAX);
        }
    }

    /// [`Shard::checkpointer`]'s loop, until shutdown.
    fn serve_checkpoints(&self, syncer: &File) {
        loop {
            let work = {
                let mut c = self.checkpoints.lock();
                loop {
                    if let Some(job) = c.job.take() {
                        // The job's `syncfs` writes these ranges anyway (and may delete the
                        // journal file some are in).
                        c.writeback.clear();
                        break Work::Checkpoint(job);
                    }
                    if c.stop {
                        if c.prepared.take().is_some() {
                            let _ = fs::remove_file(&self.dir.join(journal::PREPARED));
                        }
                        return;
                    }
                    if !c.writeback.is_empty() {
                        break Work::Writeback;
                    }
                    if c.prepare && c.prepared.is_none() {
                        break Work::Prepare;
                    }
                    self.checkpoints_cv.wait(&mut c);
                }
            };
            let job = match work {
                Work::Checkpoint(job) => job,
                Work::Writeback => {
                    let ranges = std::mem::take(&mut self.checkpoints.lock().writeback);
                    for r in ranges {
                        fs::start_writeback(&r.file, r.offset, r.len);
                    }
                    continue;
                }
                Work::Prepare => {
                    self.prepare();
                    continue;
                }
            };
            if self.poisoned().is_none()
                && let Err(e) = self.checkpoint(syncer, &job)
                && self.poisoned().is_none()
            {
                // Not a sync (that poisoned the shard): the journal still holds everything the
                // checkpoint would have recorded, so the shard refuses writes until it heals,
                // and the next checkpoint records these streams.
                self.redirty(job.streams.iter().map(|(s, _, _, _)| s), &job.gone);
                self.refuse(e);
            }
            self.checkpointed.fetch_max(job.requests, Ordering::AcqRel);
            drop(job);
            self.checkpoints.lock().busy = false;
            self.checkpoints_cv.notify_all();
            self.checkpoint_done.notify(usize::MAX);
        }
    }

    /// Removes the journal files that start before `lsn`, oldest first, each removal made
    /// durable before the next; returns the bytes they held.
    ///
    /// One sync for all would let a power cut keep some removals and undo others (the kernel
    /// promises no order among unsynced directory changes), and bring back an old file with
    /// the files after it gone: a journal with a hole, whose records past the hole are in no
    /// file. Removed in order, what can come back is the newest of them, which ends where the
    /// kept journal starts (recovery replays it again, harmlessly). There are two files to drop
    /// when Sync mode switched to a prepared file since the last checkpoint, rarely more.
    pub(in crate::engine) fn drop_journal_before(&self, lsn: u64) -> Result<u64> {
        let mut dropped = 0u64;
        for (base, path) in journal::list_files(&self.dir)? {
            if base < lsn {
                dropped += std::fs::metadata(&path).map_or(0, |m| m.len());
                fs::remove_file(&path)?;
                fs::sync_dir(&self.dir).map_err(|e| self.sync_failed(e))?;
            }
        }
        Ok(dropped)
    }

    /// Steps 6b to 6e: makes the job's streams' files and sidecars durable and drops the journal
    /// files before its rotation point. Runs beside the writer, which goes on committing; takes
    /// one stream's `data` at a time.
    pub(in crate::engine) fn checkpoint(&self, syncer: &File, job: &CheckpointJob) -> Result<()> {
        let started = Instant::now();
        // The segments' buffered appends reach their logs before 6b syncs them: the sidecar
        // will say they are in the stream's files, and the journal holding them will go. Done
        // here rather than at the rotation, under `writer`, where a thousand streams' buffers
        // stalled every writer; what was appended since the rotation goes too (a superset).
        // A failed flush keeps its bytes for the next try; the caller redirties the streams.
        // In the order they were written (taking them in the order of their directories
        // instead cost 10-20% of Sync mode's appends/s over 20,000 streams: docs/benchmarks.md).
        for (s, _, _, _) in &job.streams {
            let mut d = s.data.lock();
            if !d.deleted
                && let Some(segs) = d.segs.as_mut()
            {
                segs.flush()?;
            }
        }
        // 6b [sync]. Everything applied before the rotation (segments, indexes, directories)
        // becomes durable (and whatever was applied since: sidecars never claim more than that).
        fs::sync_fs(syncer, &self.dir).map_err(|e| self.sync_failed(e))?;
        // 6c. Each stream's state at the rotation: a sidecar when its configuration changed (or
        // it has none), else an image in the shard's checkpoint file for this rotation, written
        // in one piece (one encoding buffer for all the sidecars).
        let mut scratch = Vec::new();
        let mut written = Written::default();
        let mut sidecars: Vec<(Box<str>, u64)> = Vec::new();
        for (s, lsn, state, due) in &job.streams {
            let mut d = s.data.lock();
            if d.deleted {
                continue;
            }
            if *due {
                // A failed write leaves the generation, so the next one goes to the same slot
                // and the other slot keeps the newest good sidecar.
                let generation = d.generation + 1;
                sidecar::write_with(&mut scratch, &s.dir, generation, *lsn, state)?;
                d.generation = generation;
                sidecars.push((s.name.as_str().into(), *lsn));
            } else {
                written.push(self.images.shard(), job.lsn, d.generation, *lsn, state);
            }
            d.checkpointed_lsn = d.checkpointed_lsn.max(*lsn);
        }
        // The oldest checkpoint file's newest images move into this one once the files pass
        // their bound, so recovery reads a bounded number of them (2.8).
        if let Some(oldest) = self.images.fold_due(self.fold_bytes()) {
            let taken: std::collections::HashSet<&str> = job
                .streams
                .iter()
                .map(|(s, _, _, _)| s.name.as_str())
                .collect();
            self.images
                .fold(oldest, job.lsn, &mut written, &|n| taken.contains(n))?;
        }
        let file = self.images.write(job.lsn, &written)?;
        self.counters
            .checkpoint_images
            .fetch_add(written.len() as u64, Ordering::Relaxed);
        // Its streams are closable now: the registry's eviction may scan again.
        self.counters
            .sidecars_written
            .fetch_add(1, Ordering::Release);
        // 6d [sync]. The sidecars and the checkpoint file become durable; only then may the
        // journal they replace go, and the checkpoint files whose images they replace.
        fs::sync_fs(syncer, &self.dir).map_err(|e| self.sync_failed(e))?;
        self.images
            .commit(job.lsn, written, file, &sidecars, &job.gone)?;
        // 6e. Drop the replaced journal files, durably.
        let dropped = self.drop_journal_before(job.lsn)?;
        // 6f. The files the recorded state no longer needs go (see `Shard::reclaim`).
        let ready: Vec<(Arc<Stream>, std::path::PathBuf)> = {
            let mut r = self.reclaim.lock();
            let (ready, keep) = r.drain(..).partition(|(lsn, _, _)| *lsn <= job.lsn);
            *r = keep;
            ready.into_iter().map(|(_, s, p)| (s, p)).collect()
        };
        super::super::recovery::reclaim(ready);
        // The checkpointed state is durable: the cold tier may upload what it made sealed.
        #[cfg(feature = "tier")]
        if let Some(t) = self.tier.get() {
            t.note(job.streams.iter().map(|(s, _, _, _)| s.dir.clone()));
        }
        self.counters.checkpoint.observe_duration(started.elapsed());
        // Churn (creates and deletes) grows the name index's log: rewrite it once it doubled.
        self.names.compact_if_needed()?;
        tracing::debug!(
            shard = self.id,
            streams = job.streams.len(),
            journal_bytes_dropped = dropped,
            elapsed = ?started.elapsed(),
            "checkpoint"
        );
        Ok(())
    }
}

impl Engine {
    /// Asks every shard for a checkpoint and waits for them until `deadline`: whether every
    /// one was done by then. Streams written before the call are closable once it is. A
    /// caller that may hold a lock the checkpoint needs gets `false` at the deadline instead
    /// of waiting forever.
    pub(in crate::engine) fn checkpoint_by(&self, deadline: Instant) -> bool {
        for shard in &self.shards {
            let n = {
                let mut q = shard.queue.lock();
                if q.shutdown {
                    return false;
                }
                q.checkpoint_requests += 1;
                q.checkpoint_requests
            };
            shard.wake.notify_one();
            loop {
                if shard.poisoned().is_some() {
                    return false;
                }
                if shard.checkpointed.load(Ordering::Acquire) >= n {
                    break;
                }
                let l = shard.checkpoint_done.listen();
                if shard.checkpointed.load(Ordering::Acquire) >= n || shard.poisoned().is_some() {
                    continue;
                }
                if l.wait_deadline(deadline).is_none() {
                    return false;
                }
            }
        }
        true
    }

    /// Checkpoints every shard (step 6) and waits until each checkpoint is done: afterwards
    /// every acknowledged change is in the streams' sidecars and recovery replays nothing
    /// written before the call. Fails on a poisoned shard, with its cause.
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
                if let Some(e) = shard.poisoned() {
                    return Err(e);
                }
                if shard.checkpointed.load(Ordering::Acquire) >= n {
                    break;
                }
                let l = shard.checkpoint_done.listen();
                if shard.checkpointed.load(Ordering::Acquire) >= n || shard.poisoned().is_some() {
                    continue;
                }
                l.wait();
            }
        }
        Ok(())
    }
}
