//! A journal shard: the queue, the writer and group commit.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use event_listener::Event;
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::{self, Record};
use crate::options::{Durability, Options};

use super::apply::{apply, discard};
use super::checkpoint::Checkpoints;
use super::stream::{Stream, Visible};
use super::ticket::{Batch, Ticket};

pub(super) struct Queued {
    pub(super) stream: Arc<Stream>,
    pub(super) record: Record,
    pub(super) lsn: u64,
}

pub(super) struct Queue {
    pub(super) buf: Vec<u8>,
    pub(super) items: Vec<Queued>,
    /// The completion signal of the batch now forming.
    pub(super) batch: Arc<Batch>,
    pub(super) next_lsn: u64,
    pub(super) shutdown: bool,
    /// Checkpoints asked for by [`Engine::checkpoint`] (a count; see `Shard::checkpointed`).
    pub(super) checkpoint_requests: u64,
    /// A writer committing its own batch found a checkpoint due (Buffered mode).
    pub(super) checkpoint_due: bool,
    /// The shard thread sleeps until a push wakes it (Buffered mode: writers commit their own
    /// batches, so only the first push after an idle spell wakes the thread).
    pub(super) idle: bool,
}

/// The journal file and what is written to it; held while a batch is written and applied.
pub(super) struct Writer {
    pub(super) file: File,
    pub(super) file_base: u64,
    /// LSN just past the last byte written. Records still queued have higher LSNs, so a rotation
    /// starts the new file here, not at the queue's next LSN.
    pub(super) end_lsn: u64,
    /// Bytes written since the last rotation.
    pub(super) written: u64,
    /// The file was created by a rotation and its directory entry is not durable yet.
    pub(super) fresh: bool,
    /// Buffers swapped with the queue's, so a batch allocates nothing.
    pub(super) spare_buf: Vec<u8>,
    pub(super) spare_items: Vec<Queued>,
    pub(super) touched: Vec<Arc<Stream>>,
}

/// How long the shard thread leaves queued records to their writers (Buffered mode) before it
/// commits them itself: the bound on the delay of a record whose [`Pending`] nobody waits on.
pub(super) const LINGER: Duration = Duration::from_millis(20);

pub(crate) struct Shard {
    pub(super) id: usize,
    pub(super) dir: PathBuf,
    pub(super) root: PathBuf,
    pub(super) options: Options,
    /// Buffered mode: a writer commits the queue itself when it waits (no thread hand-off).
    pub(super) inline: bool,
    pub(super) queue: Mutex<Queue>,
    pub(super) wake: Condvar,
    pub(super) writer: Mutex<Writer>,
    pub(super) durable_lsn: AtomicU64,
    pub(super) durable: Event,
    pub(super) poisoned: AtomicBool,
    pub(super) checkpoints: Mutex<Checkpoints>,
    pub(super) checkpoints_cv: Condvar,
    /// The checkpoint requests answered so far.
    pub(super) checkpointed: AtomicU64,
    pub(super) checkpoint_done: Event,
    /// Streams whose applied state is newer than their sidecar (changed under `writer`).
    pub(super) dirty: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Shard {
    /// Encodes and enqueues a record; returns its ticket. Called with the stream's `core` held.
    pub(super) fn push(self: &Arc<Self>, stream: &Arc<Stream>, record: Record) -> Result<Ticket> {
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

    pub(super) fn ticket(self: &Arc<Self>, lsn: u64) -> Ticket {
        Ticket {
            shard: Some(self.clone()),
            lsn,
            batch: None,
        }
    }

    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
        self.durable.notify(usize::MAX);
        self.checkpoint_done.notify(usize::MAX);
    }

    /// Buffered mode: commits the queue on the caller's thread unless another thread is
    /// committing (which then commits what was queued meanwhile, too).
    pub(super) fn commit_inline(&self) {
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
    pub(super) fn drain(&self, w: &mut Writer) -> bool {
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
    pub(super) fn checkpoint_due(&self, w: &Writer) -> bool {
        // Dirty streams cannot be closed (evicted) before a checkpoint records them, so bound
        // them too: otherwise touching many streams between checkpoints keeps every one of them
        // open (two descriptors each) and exhausts `ulimit -n`.
        let dirty_cap = (self.options.max_open_streams / (2 * self.options.journal_shards)).max(8);
        w.written >= self.options.checkpoint_bytes || self.dirty.lock().len() >= dirty_cap
    }

    /// The shard thread: group commit (Sync mode) or the stragglers (Buffered mode), and the
    /// rotations that start checkpoints, until shutdown.
    pub(super) fn run(self: Arc<Self>) {
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
    pub(super) fn wait_checkpoints(&self) {
        let mut c = self.checkpoints.lock();
        while c.busy {
            self.checkpoints_cv.wait(&mut c);
        }
    }

    /// Step 3 and 4 for one batch: write it, apply it, sync it (Sync mode), publish it.
    pub(super) fn commit(&self, w: &mut Writer, buf: &[u8], items: &[Queued]) -> Result<()> {
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
}

/// A new journal file with its header (not yet synced: see `Writer::fresh`).
pub(super) fn open_journal_file(dir: &Path, shard: usize, base_lsn: u64) -> Result<File> {
    let path = journal::file_path(dir, base_lsn);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)?;
    f.write_all(&journal::file_header(shard as u32, base_lsn))?;
    Ok(f)
}

pub(super) fn new_journal_file(dir: &Path, shard: usize, base_lsn: u64) -> Result<File> {
    let f = open_journal_file(dir, shard, base_lsn)?;
    f.sync_all()?;
    fs::sync_dir(dir)?;
    Ok(f)
}
