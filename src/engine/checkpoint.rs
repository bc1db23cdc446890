//! Checkpoints: journal rotation, sidecars, dropping old journal files.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use event_listener::Listener;

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::{self};
use crate::sidecar;
use crate::state::StreamState;

use super::Engine;
use super::shard::{Shard, Writer, open_journal_file};
use super::stream::Stream;

/// One checkpoint, handed from the writer (which rotated the journal) to the checkpoint thread.
pub(super) struct CheckpointJob {
    /// The rotation point: every record below it is in the streams' files and in `streams`.
    pub(super) lsn: u64,
    /// The checkpoint requests this one answers.
    pub(super) requests: u64,
    /// Each dirty stream with its applied LSN and state at the rotation.
    pub(super) streams: Vec<(Arc<Stream>, u64, StreamState)>,
}

#[derive(Default)]
pub(super) struct Checkpoints {
    pub(super) job: Option<CheckpointJob>,
    /// A job is posted or running.
    pub(super) busy: bool,
    pub(super) stop: bool,
}

impl Shard {
    /// Step 5a: later batches go to a new journal file starting at the current LSN; the dirty
    /// streams' state at this point is what the checkpoint records.
    pub(super) fn rotate(&self, w: &mut Writer, requests: u64) -> Result<CheckpointJob> {
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
    pub(super) fn checkpointer(self: Arc<Self>) {
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
    pub(super) fn checkpoint(&self, syncer: &File, job: &CheckpointJob) -> Result<()> {
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

impl Engine {
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
}
