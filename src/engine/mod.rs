//! The store's machinery: the stream registry, per-stream locks, journal shards with group
//! commit, checkpoints, recovery and expiry. `Store` is its public face.
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | `stream` | the in-memory `Stream`: `core` (staged), `data` (applied, files), `visible` (durable) |
//! | `registry` | lookup and loading, the live-stream check, eviction, listing |
//! | `ticket` | durability tickets and the batch signals they wait on |
//! | `shard` | a journal shard: queue, writer, group commit (steps 3 to 5), poisoning |
//! | `checkpoint` | journal rotation and the checkpoint thread (step 6) |
//! | `apply` | applying one journal record to a stream's files and applied state |
//! | `recovery` | the store manifest, trash restore, journal replay |
//! | `lifecycle` | create, fork, confirm an existing stream, delete, release a fork's source |
//! | `fork` | positions, boundaries and data along a fork chain |
//! | `append` | appends (steps 1 and 2) |
//! | `read` | reads and waits |
//! | `snapshot` | snapshots and retention |
//! | `parts` | snapshots uploaded in parts: staging, commit, discard |
//! | `expiry` | expiring streams, the reaper thread |
//! | `retention` | retention policies: the enforcer thread |
//!
//! # Write path
//!
//! Numbered as DESIGN.md ("Write path") and the comments in this module's files cite it; sync
//! points are marked **\[sync\]**.
//!
//! 1. The caller prepares the body (JSON validation and flattening) without any lock.
//! 2. Under the stream's `core` lock it runs the whole order of checks against the *staged*
//!    state (`StreamState::order_of_checks`), applies the change to that state, encodes the
//!    journal record into its shard's queue (shard lock, a memcpy) and notes the record's LSN.
//!    Holding `core` while enqueueing keeps journal order equal to the order of the checks.
//! 3. A committer takes the whole queue as one batch under the shard's `writer` lock, writes it
//!    to the journal file with one `write`, and applies each record to its stream's files and
//!    *applied* state (`data` lock), with the same `apply` recovery uses. The committer is the
//!    shard thread in Sync mode; in Buffered mode it is the writer that waits on (or drops) its
//!    ticket, on its own thread.
//! 4. **\[sync\]** It `fdatasync`s the journal (Sync mode only): one sync for every record in
//!    the batch, on any stream.
//! 5. It publishes each touched stream's durable view (`visible`), wakes its waiters, advances
//!    the shard's durable LSN and finishes the batch, waking the writers waiting on it: only then
//!    is anything acknowledged or readable. Files the batch made obsolete are removed now.
//! 6. Checkpoint, when the journal passes `checkpoint_bytes` or the dirty streams reach their
//!    bound, on `Store::checkpoint`, after recovery and at shutdown: (a) under `writer`, between
//!    two batches, the committer rotates the journal and takes each dirty stream's applied
//!    state; the shard's checkpoint thread then (b) **\[sync\]** `syncfs`, (c) writes the
//!    sidecars, (d) **\[sync\]** `syncfs`, (e) deletes the journal files before the rotation
//!    point and syncs the journal directory, while commits go on.
//!
//! # Lock order
//!
//! registry → stream `core` → (shard `queue` | shard `writer` → stream `data` → stream
//! `visible`). A lock is only ever taken while holding locks to its left:
//!
//! * writers hold `core` while they push to `queue` (a leaf); committers take `writer`, then
//!   `data` and `visible` of the streams in their batch, never `core` (a Buffered writer commits
//!   only after it let go of `core`, in `Ticket::wait` or its drop);
//! * the checkpoint thread takes one stream's `data` at a time;
//! * readers take `data` (to slice segments) and `visible` (a copy of the view), never with
//!   `core`; waiters look at `visible` and `core` one after the other, never holding both;
//! * eviction only *tries* `data` and `core` under the registry lock, so it never waits;
//! * the cold tier's eviction takes `data` under the registry lock; its cold reads fetch with no
//!   lock held (`engine/tier.rs`).
//!
//! So writers, committers, readers and the checkpoint thread cannot deadlock.

mod append;
mod apply;
mod archive;
mod check;
mod expiry;
mod fork;
pub(crate) mod journal;
mod lifecycle;
mod names;
pub(crate) mod parts;
mod read;
mod recovery;
mod registry;
mod resident;
mod retention;
mod snapshot;
mod stream;
pub(crate) mod subscription;
mod ticket;
#[cfg(feature = "tier")]
mod tier;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use crate::error::Result;
use crate::fs;
use crate::options::Options;
use crate::stats::{Counters, Stats};

use expiry::reaper;
use journal::images::Images;
use journal::prepared;
use journal::shard::{Shard, new_journal_file};
use names::Names;
pub use read::Watch;
use recovery::{Replayed, replay_shard, restore_trash, store_manifest};
use stream::Stream;
pub(crate) use ticket::Ticket;

/// An open store: its streams, its journal shards and the threads that serve them.
pub(crate) struct Engine {
    /// The data directory (canonical).
    root: PathBuf,
    options: Options,
    /// The directory's `LOCK` file, `flock`ed while the store is open.
    _lock: File,
    /// Open streams (and tombstones) by name: see `registry`.
    registry: Mutex<HashMap<String, Arc<Stream>>>,
    /// Streams registered so far, in all and by name (changed only under `registry`): see
    /// `registry`'s lookup.
    registered: AtomicU64,
    registered_by_name: registry::Registrations,
    /// The names being loaded without the registry lock, one load of a name at a time (see
    /// `registry`'s lookup), and the signal that one such load ended.
    loading: registry::Loading,
    /// The records of the streams the registry closed (`resident`).
    resident: resident::Residents,
    /// The last eviction scan, if it fell short of its target (taken under `registry`).
    short_scan: Mutex<Option<registry::ShortScan>>,
    /// The descriptors the streams' segment files may hold now: `max_stream_files` at the
    /// open, changed by [`Engine::set_max_stream_files`] (a server lends it what its
    /// connections do not use).
    stream_file_budget: AtomicUsize,
    /// The soft open-file limit the open found (after raising it to the hard one), if read:
    /// the ceiling of [`Engine::set_max_stream_files`].
    open_file_limit: Option<u64>,
    shards: Vec<Arc<Shard>>,
    /// The shard, checkpoint and reaper threads, joined at shutdown.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// `shutdown` ran.
    stopped: AtomicBool,
    /// Makes incarnation tokens and temporary file names unique within the process.
    counter: AtomicU64,
    /// Tells the reaper and retention threads to stop.
    reaper_stop: Arc<(Mutex<bool>, Condvar)>,
    /// Subscriptions: their state, the append hook, the subscription thread (joined first at
    /// shutdown, while the shards still commit its appends).
    subs: subscription::Subscriptions,
    subs_thread: Mutex<Option<JoinHandle<()>>>,
    /// Every stream name, sorted: what listing pages through (DESIGN.md 2.6).
    pub(crate) names: Arc<Names>,
    /// The running figures [`Engine::stats`] reports.
    pub(crate) counters: Arc<Counters>,
    /// What the open's recovery did: journal bytes replayed, streams touched, seconds taken.
    recovered: (u64, u64, f64),
    /// The cold tier, when configured (`Options::with_tier`).
    #[cfg(feature = "tier")]
    pub(crate) tier: Option<Arc<crate::tier::Tier>>,
    /// Staged snapshot parts (`parts`).
    parts: parts::StagedParts,
}

impl Drop for Engine {
    /// Shuts the store down (a poisoned shard's error is lost here: call `shutdown` to see it).
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Raises the soft limit on open files to the hard limit, and lowers `max_stream_files` to what
/// the limit leaves for stream files: half of it (the other half stays for connections,
/// journals, snapshots and the embedding program), so running out of descriptors is a refused
/// connection, not a failed journal write; and lowers `max_open_streams` to a third of
/// `vm.max_map_count` (an open stream holds a map per segment, and a read map per segment read).
fn fit_descriptors(mut options: Options) -> (Options, Option<u64>) {
    let open_file_limit = fs::raise_open_file_limit();
    if let Some(limit) = open_file_limit {
        let fit = usize::try_from(limit / 2).unwrap_or(usize::MAX).max(16);
        if options.max_stream_files > fit {
            tracing::warn!(
                open_file_limit = limit,
                requested = options.max_stream_files,
                max_stream_files = fit,
                "the open-file limit leaves room for fewer stream files than requested; raise `ulimit -n` to keep more open"
            );
            options.max_stream_files = fit;
        }
    }
    if let Some(maps) = fs::max_map_count() {
        let fit = usize::try_from(maps / 3).unwrap_or(usize::MAX).max(16);
        if options.max_open_streams > fit {
            tracing::warn!(
                max_map_count = maps,
                requested = options.max_open_streams,
                max_open_streams = fit,
                "vm.max_map_count leaves room for fewer open streams than requested; raise it to keep more open"
            );
            options.max_open_streams = fit;
        }
    }
    tracing::debug!(
        max_open_streams = options.max_open_streams,
        max_stream_files = options.max_stream_files,
        "stream budgets"
    );
    (options, open_file_limit)
}

impl Engine {
    /// Opens (creating if needed) the store in `dir`: takes its lock, reads or writes the
    /// manifest, restores the trash, replays each shard's journal and checkpoints the replayed
    /// state (DESIGN.md, "Recovery"), then starts the shard, checkpoint and reaper threads.
    pub(crate) fn open(dir: &Path, options: Options) -> Result<Arc<Engine>> {
        let started = Instant::now();
        options.validate()?;
        let (options, open_file_limit) = fit_descriptors(options);
        fs::create_dir_all(dir)?;
        let root = dir.canonicalize()?;
        let lock = fs::lock(&root)?;
        let mut options = options;
        options.journal_shards = store_manifest(&root, options.journal_shards)?;
        fs::create_dir_all(&root.join("streams"))?;
        fs::create_dir_all(&root.join("trash"))?;
        restore_trash(&root)?;
        let parts = parts::StagedParts::open(&root)?;
        let names = Names::open(&root)?;
        // Stopped again if the open fails from here on (see `TierGuard`).
        #[cfg(feature = "tier")]
        let tier = tier::TierGuard(match options.tier.clone() {
            Some(t) => {
                fs::create_dir_all(&root.join(crate::tier::GONE_DIR))?;
                Some(crate::tier::Tier::start(&root, t)?)
            }
            None => None,
        });
        #[cfg(feature = "tier")]
        if let Some(t) = &tier.0 {
            tier::restore_indexes(&root, t)?;
        }

        // A cold tier's thread reads a stream's state from its sidecar, so with one every
        // checkpoint writes sidecars (2.8).
        #[cfg(feature = "tier")]
        let has_tier = tier.0.is_some();
        #[cfg(not(feature = "tier"))]
        let has_tier = false;
        let mut registry: HashMap<String, Arc<Stream>> = HashMap::new();
        let mut replayed = Replayed::default();
        let mut shards = Vec::new();
        let hook = subscription::Hook::new();
        let counters = Arc::new(Counters::default());
        for id in 0..options.journal_shards {
            let jdir = root.join("journal").join(format!("{id:02}"));
            fs::create_dir_all(&jdir)?;
            let records_before = replayed.records;
            let images = Arc::new(Images::open(&jdir, id, !has_tier)?);
            if has_tier {
                let n = images.write_into_sidecars(&root)?;
                if n > 0 {
                    tracing::info!(
                        shard = id,
                        sidecars = n,
                        "a cold tier reads sidecars: checkpoint files written into them"
                    );
                }
            }
            let end = replay_shard(
                &root,
                &options,
                &images,
                &jdir,
                &mut registry,
                &names,
                &mut replayed,
            )?;
            prepared::remove_leftover(&jdir)?;
            let file = new_journal_file(&jdir, id, end)?;
            let shard = Arc::new(Shard::new(
                id,
                jdir.clone(),
                root.clone(),
                &options,
                (file, end),
                hook.clone(),
                (counters.clone(), names.clone(), images),
            ));
            // Streams replayed from this shard's journal are dirty until the first checkpoint.
            {
                let mut dirty = shard.dirty.lock();
                for (name, s) in &registry {
                    let dirty_now = s.shard == id && {
                        let mut d = s.data.lock();
                        d.in_dirty = d.applied_lsn > d.checkpointed_lsn;
                        d.in_dirty
                    };
                    if dirty_now {
                        dirty.insert(name.clone(), s.clone());
                    }
                }
            }
            // Make the replayed state a checkpoint right away, so the old journal can go.
            #[cfg(feature = "tier")]
            if let Some(t) = &tier.0 {
                let _ = shard.tier.set(t.clone());
            }
            if replayed.records == records_before
                && replayed.reclaim.is_empty()
                && shard.dirty.lock().is_empty()
            {
                // The journal held no record (a clean shutdown's last checkpoint, or nothing
                // written since one): that checkpoint made everything durable, so only its
                // empty files go, without the checkpoint's two `syncfs` (whose time is the
                // whole file system's writeback, not this store's).
                shard.drop_journal_before(end)?;
            } else {
                let job = shard.rotate(&mut shard.writer.lock(), 0)?;
                shard.checkpoint(&File::open(&jdir)?, &job)?;
                recovery::reclaim(std::mem::take(&mut replayed.reclaim));
            }
            shards.push(shard);
        }
        registry.retain(|_, s| !s.data.lock().deleted);
        for s in registry.values() {
            if let Some(segs) = s.data.lock().segs.as_mut() {
                segs.end_replay()?;
                segs.count_in(&counters.stream_files);
            }
        }
        recovery::end_spilled(&registry, std::mem::take(&mut replayed.spilled))?;
        names.compact_if_needed()?;
        tracing::info!(
            journal_bytes = replayed.bytes,
            records = replayed.records,
            streams = replayed.streams.len(),
            elapsed = ?started.elapsed(),
            "recovered store"
        );
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
        let stream_file_budget = AtomicUsize::new(options.max_stream_files);
        let engine = Arc::new(Engine {
            root,
            options,
            _lock: lock,
            registry: Mutex::new(registry),
            registered: AtomicU64::new(0),
            registered_by_name: registry::Registrations::default(),
            loading: registry::Loading::default(),
            resident: resident::Residents::default(),
            short_scan: Mutex::new(None),
            stream_file_budget,
            open_file_limit,
            shards,
            threads: Mutex::new(threads),
            stopped: AtomicBool::new(false),
            counter: AtomicU64::new(0),
            reaper_stop: Arc::new((Mutex::new(false), Condvar::new())),
            subs: subscription::Subscriptions::new(hook),
            subs_thread: Mutex::new(None),
            names,
            counters,
            recovered: (
                replayed.bytes,
                replayed.streams.len() as u64,
                started.elapsed().as_secs_f64(),
            ),
            #[cfg(feature = "tier")]
            tier: tier.keep(),
            parts,
        });
        #[cfg(feature = "tier")]
        if let Some(t) = &engine.tier {
            t.attach(Arc::downgrade(&engine));
        }
        let weak = Arc::downgrade(&engine);
        let stop = engine.reaper_stop.clone();
        let reaper = std::thread::Builder::new()
            .name("brook-expiry".into())
            .spawn(move || reaper(&weak, &stop))?;
        engine.threads.lock().push(reaper);
        let (weak, stop) = (Arc::downgrade(&engine), engine.reaper_stop.clone());
        let every = engine.options.retention_interval;
        let enforcer = std::thread::Builder::new()
            .name("brook-retention".into())
            .spawn(move || retention::enforcer(&weak, &stop, every))?;
        engine.threads.lock().push(enforcer);
        let subs = engine.start_subscriptions(replayed.streams)?;
        *engine.subs_thread.lock() = Some(subs);
        Ok(engine)
    }

    /// The data directory (canonical).
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The options the store runs with (the shard count as the manifest fixed it).
    pub(crate) fn options(&self) -> &Options {
        &self.options
    }

    /// The descriptors the streams' segment files may hold now.
    pub(crate) fn max_stream_files(&self) -> usize {
        self.stream_file_budget.load(Ordering::Relaxed)
    }

    /// Sets the descriptors the streams' segment files may hold from now on: `n`, at least 16
    /// and at most the open-file limit less [`fs::DESCRIPTOR_RESERVE`] (the journals,
    /// snapshots and listeners) or half of it, whichever is more; returns the budget now in
    /// force. Streams over a lowered budget are put at rest by the next lookup, not here.
    pub(crate) fn set_max_stream_files(&self, n: usize) -> usize {
        let ceiling = self.open_file_limit.map_or(usize::MAX, |l| {
            let l = l.saturating_sub(fs::DESCRIPTOR_RESERVE).max(l / 2);
            usize::try_from(l).unwrap_or(usize::MAX)
        });
        let n = n.min(ceiling).max(16);
        self.stream_file_budget.store(n, Ordering::Relaxed);
        n
    }

    /// The store's figures now: the counters, the open streams, poisoned shards and what the
    /// open's recovery did. Takes the registry lock once (to count the open streams).
    pub(crate) fn stats(&self) -> Stats {
        let (bytes, streams, seconds) = self.recovered;
        let (ckpt_files, ckpt_bytes) = self.shards.iter().fold((0, 0), |(n, b), s| {
            let (fs, fb) = s.images.files();
            (n + fs as u64, b + fb)
        });
        #[cfg_attr(
            not(feature = "tier"),
            expect(unused_mut, reason = "only the tier adds figures")
        )]
        let mut stats = Stats {
            open_streams: self.registry.lock().len() as u64,
            resident_streams: self.resident.len() as u64,
            checkpoint_files: ckpt_files,
            checkpoint_file_bytes: ckpt_bytes,
            checkpoint_images: self.counters.checkpoint_images.load(Ordering::Relaxed),
            stream_files: self.counters.stream_files.get() as u64,
            stream_file_budget: self.max_stream_files() as u64,
            journal_shards: self.shards.len() as u64,
            poisoned_shards: self.poisoned_shards(),
            recovered_journal_bytes: bytes,
            recovered_streams: streams,
            recovery_seconds: seconds,
            ..self.counters.snapshot()
        };
        #[cfg(feature = "tier")]
        if let Some(t) = &self.tier {
            t.fill_stats(&mut stats);
        }
        stats
    }

    /// How many journal shards are poisoned now (their writes fail until the store is
    /// reopened). No lock.
    pub(crate) fn poisoned_shards(&self) -> u64 {
        self.shards
            .iter()
            .filter(|s| s.poisoned().is_some())
            .count() as u64
    }

    /// Poisons the first journal shard as a failed sync would (a test's fault injection).
    #[cfg(test)]
    pub(crate) fn poison_for_test(&self) {
        self.shards[0].poison(crate::Error::Io(std::io::Error::other("injected fault")));
    }

    /// The shard a stream's records go to: by the hash of its name, so it never changes.
    fn shard_of(&self, name: &str) -> usize {
        let k = fs::key(name);
        (u64::from_le_bytes([k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]])
            % self.shards.len() as u64) as usize
    }

    /// A new incarnation token for `name`: the creation time in ms (hex), then 80 bits of a hash
    /// of the time, a process-wide counter, the process id and the name (unique in practice).
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
        format!("{:x}-{}", t / 1_000_000, hex(&d[..10]))
    }

    /// Stops the store: stops the reaper, lets each shard thread commit what is queued and run
    /// a last checkpoint, and joins the threads. Idempotent. Fails with a poisoned shard's
    /// error (and its cause) if any shard is poisoned.
    pub(crate) fn shutdown(&self) -> Result<()> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        {
            let (m, cv) = &*self.reaper_stop;
            *m.lock() = true;
            cv.notify_all();
        }
        self.subs.hook.stop();
        #[cfg(feature = "tier")]
        if let Some(t) = &self.tier {
            t.stop();
        }
        if let Some(t) = self.subs_thread.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
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
        match self.shards.iter().find_map(|s| s.poisoned()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}
