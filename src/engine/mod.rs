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

mod append;
mod apply;
mod checkpoint;
mod expiry;
mod fork;
mod lifecycle;
mod read;
mod recovery;
mod registry;
mod shard;
mod snapshot;
mod stream;
mod ticket;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use event_listener::Event;
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::fs;
use crate::options::{Durability, Options};

#[cfg(feature = "http")]
pub(crate) use append::Attempt;
use checkpoint::Checkpoints;
use expiry::reaper;
use recovery::{replay_shard, restore_trash, store_manifest};
use shard::{Queue, Shard, Writer, new_journal_file};
use stream::Stream;
use ticket::Batch;
pub(crate) use ticket::Ticket;

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
