//! The cold tier: a stream's sealed segments, their indexes and its snapshots copied to object
//! storage in the background, verified, recorded in the stream's tier manifest, and then allowed
//! to leave the local disk under a budget; cold ranges are read back by range request through a
//! bounded cache. DESIGN.md section 16 has the protocol, the files and the durability boundary.
//!
//! | file | what |
//! |---|---|
//! | `manifest.rs` | the per-stream manifest `tier` (always compiled: a store opened without the feature still reads it) |
//! | `mod.rs` | [`TierOptions`], `Tier`: the object store, its runtime, the counters, cold block reads |
//! | `cache.rs` | the in-memory LRU of cold blocks |
//! | `worker.rs` | the tier thread: uploads, verification, manifests, eviction, deletes, retries |
//!
//! Nothing here runs on the append path: the engine hands the tier the streams each checkpoint
//! made durable, and the tier thread does the rest.

pub(crate) mod manifest;

#[cfg(feature = "tier")]
mod cache;
#[cfg(feature = "tier")]
mod worker;

#[cfg(feature = "tier")]
pub use self::options::TierOptions;
#[cfg(feature = "tier")]
pub(crate) use self::running::Tier;
#[cfg(feature = "tier")]
pub(crate) use self::worker::GONE_DIR;

#[cfg(feature = "tier")]
mod options {
    use std::time::Duration;

    use crate::error::{Error, Result};

    /// Where and how a store keeps its cold tier (feature `tier`): given to
    /// [`Options::with_tier`](crate::Options::with_tier).
    ///
    /// ```
    /// use brook::{Options, TierOptions};
    ///
    /// let tier = TierOptions::new("s3://my-bucket/brook").with_local_budget(10 << 30);
    /// let options = Options::default().with_tier(tier);
    /// assert!(options.tier().is_some());
    /// ```
    #[derive(Clone, Debug)]
    pub struct TierOptions {
        pub(crate) url: String,
        pub(crate) endpoint: Option<String>,
        pub(crate) local_budget: u64,
        pub(crate) cache_bytes: u64,
        pub(crate) retry_min: Duration,
        pub(crate) retry_max: Duration,
    }

    impl TierOptions {
        /// A tier at `url`: `s3://bucket/prefix` (credentials, region and endpoint from the
        /// standard `AWS_*` environment variables) or `file:///absolute/dir` (a local
        /// directory, created if missing: for tests and for a mounted remote file system).
        pub fn new(url: impl Into<String>) -> TierOptions {
            TierOptions {
                url: url.into(),
                endpoint: None,
                local_budget: 8 << 30,
                cache_bytes: 64 << 20,
                retry_min: Duration::from_millis(200),
                retry_max: Duration::from_secs(30),
            }
        }

        /// The S3 endpoint, for S3-compatible servers (`http://127.0.0.1:9000`); plain `http`
        /// is allowed. Default: `AWS_ENDPOINT_URL` or Amazon's.
        #[must_use]
        pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
            self.endpoint = Some(url.into());
            self
        }

        /// How many bytes of sealed segment logs that the tier holds may stay on the local disk
        /// over all streams; past it, the oldest leave (their indexes stay). Segments not yet
        /// uploaded never leave, whatever the budget. Default 8 GiB, any value (0: every
        /// uploaded segment leaves).
        #[must_use]
        pub fn with_local_budget(mut self, bytes: u64) -> Self {
            self.local_budget = bytes;
            self
        }

        /// The memory the cache of cold blocks may take (blocks of about 1 MiB, least recently
        /// used first out). Default 64 MiB, 0 (no cache: every cold read fetches) to 64 GiB.
        #[must_use]
        pub fn with_cache_bytes(mut self, bytes: u64) -> Self {
            self.cache_bytes = bytes;
            self
        }

        /// The backoff between passes that failed: from `min`, doubling to `max`. Default 200 ms
        /// to 30 s; `min` at least 1 ms, `max` at least `min` and at most an hour.
        #[must_use]
        pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
            self.retry_min = min;
            self.retry_max = max;
            self
        }

        /// The tier's URL.
        pub fn url(&self) -> &str {
            &self.url
        }

        /// The local budget in bytes.
        pub fn local_budget(&self) -> u64 {
            self.local_budget
        }

        /// The cache's bound in bytes.
        pub fn cache_bytes(&self) -> u64 {
            self.cache_bytes
        }

        /// Checks the bounds documented on each setter.
        pub(crate) fn validate(&self) -> Result<()> {
            if !(self.url.starts_with("s3://") || self.url.starts_with("file:///")) {
                return Err(Error::InvalidArgument(format!(
                    "tier url {:?}: expected s3://bucket/prefix or file:///absolute/dir",
                    self.url
                )));
            }
            if self.cache_bytes > 64 << 30 {
                return Err(Error::InvalidArgument(
                    "tier cache_bytes must be at most 64 GiB".into(),
                ));
            }
            if self.retry_min < Duration::from_millis(1)
                || self.retry_max < self.retry_min
                || self.retry_max > Duration::from_hours(1)
            {
                return Err(Error::InvalidArgument(
                    "tier retry: min at least 1 ms, max between min and an hour".into(),
                ));
            }
            Ok(())
        }
    }
}

#[cfg(feature = "tier")]
mod running {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    use bytes::Bytes;
    use object_store::ObjectStore;
    use object_store::path::Path as ObjectPath;
    use parking_lot::Mutex;

    use super::TierOptions;
    use super::cache::Cache;
    use super::worker::Work;
    use crate::engine::Engine;
    use crate::error::{Error, Result};
    use crate::segment::ColdPiece;

    /// How long one object operation may take (each try of a request, and all of a cold read).
    const OP_TIMEOUT: Duration = Duration::from_secs(30);

    /// The tier's running figures (relaxed atomics), reported in [`Stats`](crate::Stats).
    #[derive(Default)]
    pub(crate) struct TierCounters {
        pub(crate) uploads: AtomicU64,
        pub(crate) upload_bytes: AtomicU64,
        pub(crate) failures: AtomicU64,
        pub(crate) evictions: AtomicU64,
        pub(crate) evicted_bytes: AtomicU64,
        pub(crate) cache_hits: AtomicU64,
        pub(crate) cache_misses: AtomicU64,
        pub(crate) fetch_bytes: AtomicU64,
        pub(crate) deletes: AtomicU64,
        pub(crate) pending: AtomicU64,
        pub(crate) local_bytes: AtomicU64,
    }

    /// An open cold tier: the object store, the runtime its requests run on, the block cache
    /// and the tier thread's work queue.
    pub(crate) struct Tier {
        /// The data directory.
        pub(super) root: PathBuf,
        pub(super) options: TierOptions,
        pub(super) store: Arc<dyn ObjectStore>,
        /// The prefix every object name starts with (the URL's path).
        pub(super) prefix: ObjectPath,
        /// The runtime object requests run on (one thread); shut down in the background on drop.
        runtime: Mutex<Option<tokio::runtime::Runtime>>,
        handle: tokio::runtime::Handle,
        cache: Mutex<Cache>,
        pub(crate) counters: TierCounters,
        pub(super) work: Work,
        /// The engine, for turning segments cold in memory (set once the engine exists).
        pub(super) engine: Mutex<Weak<Engine>>,
        thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    }

    impl Drop for Tier {
        fn drop(&mut self) {
            if let Some(rt) = self.runtime.lock().take() {
                rt.shutdown_background();
            }
        }
    }

    /// The object store and the prefix for a tier URL.
    fn open_store(options: &TierOptions) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        let bad = |e: &dyn std::fmt::Display| {
            Error::InvalidArgument(format!("tier url {:?}: {e}", options.url))
        };
        let url = url::Url::parse(&options.url).map_err(|e| bad(&e))?;
        if url.scheme() == "file" {
            let dir = url.to_file_path().map_err(|()| bad(&"not a local path"))?;
            std::fs::create_dir_all(&dir)?;
            let fs =
                object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|e| bad(&e))?;
            return Ok((Arc::new(fs), ObjectPath::default()));
        }
        let bucket = url.host_str().ok_or_else(|| bad(&"no bucket"))?;
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(object_store::RetryConfig {
                max_retries: 2,
                retry_timeout: OP_TIMEOUT,
                ..object_store::RetryConfig::default()
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_timeout(OP_TIMEOUT)
                    .with_connect_timeout(Duration::from_secs(5)),
            );
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
        if let Some(e) = endpoint {
            b = b.with_allow_http(e.starts_with("http://")).with_endpoint(e);
        }
        let s3 = b.build().map_err(|e| bad(&e))?;
        let prefix = ObjectPath::from(url.path().trim_matches('/'));
        Ok((Arc::new(s3), prefix))
    }

    /// An object store failure as brook's error.
    pub(super) fn unavailable(e: impl std::fmt::Display) -> Error {
        Error::TierUnavailable {
            reason: e.to_string(),
        }
    }

    impl Tier {
        /// Opens the tier of the store in `root` and starts its thread, which first looks at
        /// every stream (uploads cut short by a crash resume) and at pending deletes.
        pub(crate) fn start(root: &Path, options: TierOptions) -> Result<Arc<Tier>> {
            let (store, prefix) = open_store(&options)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("brook-tier-io")
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let tier = Arc::new(Tier {
                root: root.to_path_buf(),
                cache: Mutex::new(Cache::new(options.cache_bytes)),
                options,
                store,
                prefix,
                runtime: Mutex::new(Some(runtime)),
                handle,
                counters: TierCounters::default(),
                work: Work::default(),
                engine: Mutex::new(Weak::new()),
                thread: Mutex::new(None),
            });
            let t = tier.clone();
            let thread = std::thread::Builder::new()
                .name("brook-tier".into())
                .spawn(move || t.run())?;
            *tier.thread.lock() = Some(thread);
            Ok(tier)
        }

        /// Gives the tier the engine it serves (for turning evicted segments cold in memory).
        pub(crate) fn attach(&self, engine: Weak<Engine>) {
            *self.engine.lock() = engine;
            self.work.note_evict();
        }

        /// Stops the tier thread (after the object operation it is in) and joins it, unless
        /// this is the tier thread: an eviction holds the engine, and when the store is dropped
        /// meanwhile the engine's last reference (and its shutdown) goes on that thread, which
        /// ends after this pass.
        pub(crate) fn stop(&self) {
            self.work.stop();
            if let Some(t) = self.thread.lock().take()
                && t.thread().id() != std::thread::current().id()
            {
                let _ = t.join();
            }
        }

        /// Runs `fut` on the tier's runtime and waits for it on this thread (any thread: the
        /// future runs on the runtime's own), for at most [`OP_TIMEOUT`]; a shutdown stops the
        /// wait (`ShutDown`) so it never waits on a store that does not answer.
        pub(super) fn wait<T: Send + 'static>(
            &self,
            fut: impl std::future::Future<Output = object_store::Result<T>> + Send + 'static,
        ) -> Result<T> {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let task = self.handle.spawn(async move {
                let r = tokio::time::timeout(OP_TIMEOUT, fut).await;
                let _ = tx.send(r);
            });
            loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(Ok(r)) => return r.map_err(unavailable),
                    Ok(Err(_)) => {
                        return Err(unavailable("the object store did not answer in time"));
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) if self.work.stopping() => {
                        task.abort();
                        return Err(Error::ShutDown);
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        return Err(unavailable("the tier is shut down"));
                    }
                }
            }
        }

        /// The object name of file `file` (`{base:020}.log`, `.idx`, `snap-*.blob`) of the
        /// stream in directory `dir`, incarnation `incarnation`:
        /// `{prefix}/{key}/{incarnation}/{file}`.
        pub(crate) fn object(&self, dir: &Path, incarnation: &str, file: &str) -> ObjectPath {
            self.stream_prefix(dir, incarnation).child(file)
        }

        /// `{prefix}/{key}/{incarnation}`: every object of one incarnation of a stream.
        pub(super) fn stream_prefix(&self, dir: &Path, incarnation: &str) -> ObjectPath {
            let key = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("unknown");
            self.prefix.child(key).child(incarnation)
        }

        /// Asks the tier thread to look at the streams in `dirs` (a checkpoint made their state
        /// durable: sealed segments, snapshots or retention to act on). Never blocks.
        pub(crate) fn note(&self, dirs: impl IntoIterator<Item = PathBuf>) {
            self.work.note(dirs);
        }

        /// Asks the tier thread to delete what deleted streams left (their `tier-gone/` markers).
        pub(crate) fn note_gone(&self) {
            self.work.note_gone();
        }

        /// Asks the tier thread for a pass over every stream and waits for it: `Ok` once every
        /// sealed, checkpointed segment and snapshot is uploaded and verified, the local disk is
        /// within its budget and pending deletes are done; the pass's first failure otherwise
        /// (the thread keeps retrying it with backoff).
        pub(crate) fn sync(&self) -> Result<()> {
            self.work.sync()
        }

        /// Reads the part `c` of a cold block of the segment of the stream in `dir`: from the
        /// cache, or fetched by range request, checked by `check` (against the index) and then
        /// cached. Blocks this thread for the fetch: never called with a stream lock held.
        pub(crate) fn read_cold(
            &self,
            dir: &Path,
            incarnation: &str,
            c: &ColdPiece,
            check: impl FnOnce(&[u8]) -> Result<()>,
        ) -> Result<Bytes> {
            let object = self.object(dir, incarnation, &format!("{:020}.log", c.seg_base));
            let key = (object.to_string(), c.block.0);
            let cached = self.cache.lock().get(&key);
            let block = if let Some(b) = cached {
                self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                b
            } else {
                self.counters.cache_misses.fetch_add(1, Ordering::Relaxed);
                let store = self.store.clone();
                let range = (c.block.0 - c.seg_base)..(c.block.1 - c.seg_base);
                let fetched = self.wait(async move { store.get_range(&object, range).await });
                let b = fetched.inspect_err(|e| {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, dir = %dir.display(), "cold read failed");
                })?;
                self.counters
                    .fetch_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                check(&b)?;
                self.cache.lock().insert(key, b.clone());
                b
            };
            let (a, z) = (
                (c.want.0 - c.block.0) as usize,
                (c.want.1 - c.block.0) as usize,
            );
            if z > block.len() || a > z {
                return Err(Error::corrupt(
                    dir,
                    "a cold block is shorter than its index",
                ));
            }
            Ok(block.slice(a..z))
        }

        /// Fetches a whole object into local file `path` (written to a temporary name, synced,
        /// renamed), checking its length and crc32 against the manifest's.
        pub(crate) fn restore_file(
            &self,
            object: ObjectPath,
            path: &Path,
            len: u64,
            crc: u32,
        ) -> Result<()> {
            let store = self.store.clone();
            let bytes = self.wait(async move { store.get(&object).await?.bytes().await })?;
            if bytes.len() as u64 != len || crc32fast::hash(&bytes) != crc {
                return Err(Error::corrupt(path, "the tier's copy fails its checksum"));
            }
            let tmp = path.with_extension("restore");
            let mut f = crate::fs::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            crate::fs::sync_all(&f, &tmp)?;
            drop(f);
            crate::fs::rename(&tmp, path)?;
            Ok(())
        }

        /// Drops the cached blocks of a stream incarnation's objects.
        pub(super) fn forget(&self, prefix: &ObjectPath) {
            self.cache.lock().forget(&format!("{prefix}/"));
        }

        /// Copies the tier's figures into `stats`.
        pub(crate) fn fill_stats(&self, stats: &mut crate::stats::Stats) {
            let c = &self.counters;
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
            stats.tier_uploads = get(&c.uploads);
            stats.tier_upload_bytes = get(&c.upload_bytes);
            stats.tier_failures = get(&c.failures);
            stats.tier_evictions = get(&c.evictions);
            stats.tier_evicted_bytes = get(&c.evicted_bytes);
            stats.tier_cache_hits = get(&c.cache_hits);
            stats.tier_cache_misses = get(&c.cache_misses);
            stats.tier_fetch_bytes = get(&c.fetch_bytes);
            stats.tier_deletes = get(&c.deletes);
            stats.tier_pending_streams = get(&c.pending);
            stats.tier_local_bytes = get(&c.local_bytes);
            stats.tier_cache_bytes = self.cache.lock().bytes();
        }
    }
}
