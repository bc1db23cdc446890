//! The stream registry: a bounded cache of open streams by name. Lookup (loading a stream from
//! its sidecar on first use), the live-stream check every client request starts with, eviction
//! of idle streams, and listing.
//!
//! The registry lock is the first in the lock order (registry → `core` → ...). A deleted stream
//! stays in the registry as a tombstone (`Core::gone`) until its delete is applied, so its files
//! are never loaded again in between.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use parking_lot::MutexGuard;

use crate::error::{Error, Result};
use crate::fs;
use crate::listing::{ListPage, StreamListing};
use crate::name::StreamName;
use crate::state::now_ms;
use crate::types::Expiry;

use super::Engine;
use super::stream::Stream;

/// How long opening a closed stream waits, at a full registry, for a checkpoint to make its
/// streams closable before it is refused.
const ROOM_WAIT: Duration = Duration::from_secs(2);

/// The names being loaded without the registry lock (see `Engine::lookup_within`).
#[derive(Default)]
pub(super) struct Loading {
    names: parking_lot::Mutex<std::collections::HashSet<Box<str>>>,
    done: parking_lot::Condvar,
}

/// A name's turn to load, given back when dropped.
pub(super) struct LoadTurn<'a> {
    loading: &'a Loading,
    name: &'a str,
}

impl Loading {
    /// Waits until no other thread loads `name`, then takes the turn. Takes no other lock.
    fn enter<'a>(&'a self, name: &'a str) -> LoadTurn<'a> {
        let mut names = self.names.lock();
        while names.contains(name) {
            self.done.wait(&mut names);
        }
        names.insert(name.into());
        LoadTurn {
            loading: self,
            name,
        }
    }
}

impl Drop for LoadTurn<'_> {
    fn drop(&mut self) {
        self.loading.names.lock().remove(self.name);
        self.loading.done.notify_all();
    }
}

/// How many registrations each slot of names has seen: a load that finds its slot's count
/// unchanged knows that no stream of its name was registered while it read (see
/// `Engine::lookup_within`). Names share a slot by a hash, so a registration of another name
/// in the same slot only costs a second load, one in `SLOTS` of them.
pub(super) struct Registrations {
    slots: Box<[AtomicU64]>,
}

/// Slots of [`Registrations`]: 32 KiB, so that 64 writers each registering a stream during
/// another's load collide about once in 64 loads.
const SLOTS: usize = 4096;

impl Default for Registrations {
    fn default() -> Self {
        Registrations {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Registrations {
    /// The slot counter of `name` (FNV-1a over its bytes).
    fn slot(&self, name: &str) -> &AtomicU64 {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        &self.slots[(h % SLOTS as u64) as usize]
    }

    /// Notes a registration of `name`.
    fn note(&self, name: &str) {
        self.slot(name).fetch_add(1, Ordering::Release);
    }

    /// The registrations of `name`'s slot so far.
    fn of(&self, name: &str) -> u64 {
        self.slot(name).load(Ordering::Acquire)
    }
}

impl Engine {
    /// Looks a stream up, loading it from disk if needed. Includes soft-deleted and expired
    /// streams; `None` for a name with no stream or a tombstone. A stream directory holding
    /// another name's sidecar (a hash collision) is `Corrupt`.
    ///
    /// A closed stream is loaded without the registry lock, so one cold open does not hold up
    /// every other request, one load of a name at a time (`Loading`). The load is kept only if
    /// no stream of its name was registered meanwhile (its `Registrations` slot unchanged):
    /// every stream enters the registry through `register`, so an unchanged count means no
    /// entry of this name came (or, having come, went) while its files were read, and the
    /// loaded state is the stream's. Otherwise the registry's entry wins, or, with none, the
    /// stream is loaded again under the lock, as it is when the unlocked load failed or a cold
    /// tier (which turns segments cold under the registry lock) is configured. A load kept
    /// while the registry is full waits for room with it (`register_when_room`).
    pub(super) fn lookup(&self, name: &str) -> Result<Option<Arc<Stream>>> {
        self.lookup_within(name, true)
    }

    /// [`Engine::lookup`] for a fork's source, which opens even past [`Engine::open_limit`]:
    /// reading a fork holds its whole chain open, so refusing a source midway would make a
    /// deep fork unreadable at a small cache. The overshoot is bounded by the chain's depth
    /// (`MAX_FORK_DEPTH`) per read in progress.
    pub(super) fn lookup_source(&self, name: &str) -> Result<Option<Arc<Stream>>> {
        self.lookup_within(name, false)
    }

    /// [`Engine::lookup`], keeping to [`Engine::open_limit`] when `bounded`.
    fn lookup_within(&self, name: &str, bounded: bool) -> Result<Option<Arc<Stream>>> {
        {
            let mut reg = self.registry.lock();
            self.rest_if_over(&reg);
            if let Some(found) = open_entry(&mut reg, name) {
                return Ok(found);
            }
            if self.has_tier() {
                return self.load_and_register(&mut reg, name, bounded);
            }
        }
        // One unlocked load of a name at a time, and none while the name is registered: an
        // open of a stream's files may remove files it finds no use for (a roll ahead whose
        // record never became durable), which a registered copy of the stream may have just
        // made. The loader registers before it lets the next one in, so looking again once
        // in finds its stream.
        let _turn = self.loading.enter(name);
        let before = {
            let mut reg = self.registry.lock();
            if let Some(found) = open_entry(&mut reg, name) {
                return Ok(found);
            }
            self.registered_by_name.of(name)
        };
        let loaded = self.load(name);
        let mut reg = self.registry.lock();
        if let Some(found) = open_entry(&mut reg, name) {
            return Ok(found);
        }
        match loaded {
            Ok(loaded) if self.registered_by_name.of(name) == before => {
                match loaded {
                    Some(s) if bounded && reg.len() >= self.open_limit() => {
                        // Loaded, but no room yet: what was read is the stream's (nothing of
                        // its name came meanwhile, and the turn keeps it so), so it waits for
                        // room rather than being read again.
                        self.register_when_room(&mut reg, name, s)
                    }
                    Some(s) => {
                        self.register(&mut reg, name, s.clone());
                        Ok(Some(s))
                    }
                    None => Ok(None),
                }
            }
            _ => self.load_and_register(&mut reg, name, bounded),
        }
    }

    /// The open stream `name` (or tombstone), if the registry holds it: nothing loaded. Every
    /// request's lookup passes here or through [`Engine::lookup`], which keep the stream files
    /// within their budget ([`Engine::rest_if_over`]).
    pub(super) fn in_memory(&self, name: &str) -> Option<Arc<Stream>> {
        let reg = self.registry.lock();
        self.rest_if_over(&reg);
        reg.get(name).cloned()
    }

    /// Keeps the descriptors the streams' segment files hold within `max_stream_files`: once
    /// over, puts the least recently used idle streams at rest (their files closed, reopened by
    /// their next use: `SegmentSet::rest`) until the count is 7/8 of the budget. Idle means its
    /// locks are free and nothing of it is enqueued and unapplied (a batch between making room
    /// in its files and applying to them keeps them open); a stream written since the last
    /// checkpoint can rest, as its journal records hold what the files do not yet. Held as
    /// `reg`, the registry; the stream locks are only tried, in the usual order.
    pub(super) fn rest_if_over(&self, reg: &HashMap<String, Arc<Stream>>) {
        let files = &self.counters.stream_files;
        let budget = self.max_stream_files();
        if files.get() <= budget {
            return;
        }
        self.rest_down_to(reg, budget - budget / 8);
    }

    /// Puts the least recently used idle streams at rest until the store's segment files hold
    /// `n` fewer descriptors, or none is idle (see [`Engine::rest_if_over`]); returns how many
    /// were closed. For a program that ran out of descriptors elsewhere.
    pub(crate) fn shed_stream_files(&self, n: usize) -> usize {
        let reg = self.registry.lock();
        let before = self.counters.stream_files.get();
        self.rest_down_to(&reg, before.saturating_sub(n));
        before.saturating_sub(self.counters.stream_files.get())
    }

    /// Puts the least recently used idle streams at rest until the segment files hold
    /// `target` descriptors or fewer; `reg` is the registry, held.
    fn rest_down_to(&self, reg: &HashMap<String, Arc<Stream>>, target: usize) {
        let files = &self.counters.stream_files;
        let mut awake: Vec<(u64, &Arc<Stream>)> = reg
            .values()
            .filter(|s| {
                s.data
                    .try_lock()
                    .is_some_and(|d| d.segs.as_ref().is_some_and(|g| g.files_held() > 0))
            })
            .map(|s| (s.last_used.load(Ordering::Relaxed), s))
            .collect();
        awake.sort_unstable_by_key(|(used, _)| *used);
        for (_, s) in awake {
            if files.get() <= target {
                break;
            }
            let Some(core) = s.core.try_lock() else {
                continue;
            };
            let Some(mut d) = s.data.try_lock() else {
                continue;
            };
            if core.last_lsn > d.applied_lsn {
                continue;
            }
            drop(core);
            if let Some(segs) = d.segs.as_mut()
                && let Err(e) = segs.rest()
            {
                tracing::warn!(stream = s.name.as_str(), error = %e, "could not put a stream at rest");
            }
        }
    }

    /// The most streams kept open at once: `max_open_streams` and a half (at least 32 more).
    /// Idle clean streams close beyond `max_open_streams`; streams in use or written since the
    /// last checkpoint cannot, and may take the registry up to this limit, never past it, but
    /// for the sources a fork's read opens ([`Engine::lookup_source`]).
    pub(super) fn open_limit(&self) -> usize {
        let cap = self.options.max_open_streams;
        cap.saturating_add((cap / 2).max(32))
    }

    /// Makes room in the registry (held as `reg`) for one more open stream. Below
    /// [`Engine::open_limit`] there is room. At it, idle clean streams are closed; when too
    /// few are (the rest in use or written since the last checkpoint), it waits (the lock
    /// released) for a checkpoint, at most [`ROOM_WAIT`], and closes again. Still full, the
    /// open is refused with `TooManyOpenStreams` (retryable) rather than exceed the limit,
    /// which sizes the store's descriptors: past it, the next file the journal or a segment
    /// needs could fail with EMFILE.
    pub(super) fn room_for_one(
        &self,
        reg: &mut MutexGuard<'_, HashMap<String, Arc<Stream>>>,
    ) -> Result<()> {
        let (cap, limit) = (self.options.max_open_streams, self.open_limit());
        if reg.len() < limit {
            return Ok(());
        }
        self.evict(reg, cap);
        if reg.len() < limit {
            return Ok(());
        }
        MutexGuard::unlocked(reg, || self.checkpoint_by(Instant::now() + ROOM_WAIT));
        self.evict(reg, cap);
        if reg.len() < limit {
            return Ok(());
        }
        Err(Error::TooManyOpenStreams { open: reg.len() })
    }

    /// Whether a cold tier is configured.
    #[cfg(feature = "tier")]
    fn has_tier(&self) -> bool {
        self.options.tier.is_some()
    }

    /// Whether a cold tier is configured: never, without the `tier` feature.
    #[cfg(not(feature = "tier"))]
    fn has_tier(&self) -> bool {
        let _ = self;
        false
    }

    /// Loads `name` from disk and registers it in `reg` (held), for a lookup that holds the
    /// registry lock throughout, except while it waits for room (see `room_for_one`).
    fn load_and_register(
        &self,
        reg: &mut MutexGuard<'_, HashMap<String, Arc<Stream>>>,
        name: &str,
        bounded: bool,
    ) -> Result<Option<Arc<Stream>>> {
        let Some(s) = self.load(name)? else {
            return Ok(None);
        };
        if !bounded {
            self.register(reg, name, s.clone());
            return Ok(Some(s));
        }
        self.register_when_room(reg, name, s)
    }

    /// Registers `s`, just loaded as `name` by the caller, which holds the registry (`reg`) or
    /// the name's load turn, once there is room: at once if closing idle streams makes it.
    /// Otherwise `s` is closed again (its record kept, so the next load reads no file), and
    /// the stream is loaded afresh once [`Engine::room_for_one`] has made room: the lock is
    /// released while it waits, so the name may have been opened, or changed and closed.
    fn register_when_room(
        &self,
        reg: &mut MutexGuard<'_, HashMap<String, Arc<Stream>>>,
        name: &str,
        s: Arc<Stream>,
    ) -> Result<Option<Arc<Stream>>> {
        let (cap, limit) = (self.options.max_open_streams, self.open_limit());
        if reg.len() >= limit {
            self.evict(reg, cap);
        }
        if reg.len() < limit {
            self.register(reg, name, s.clone());
            return Ok(Some(s));
        }
        if !self.has_tier() {
            self.resident.keep(&s);
        }
        drop(s);
        self.room_for_one(reg)?;
        if let Some(found) = open_entry(reg, name) {
            return Ok(found);
        }
        let loaded = self.load(name)?;
        if let Some(s) = &loaded {
            self.register(reg, name, s.clone());
        }
        Ok(loaded)
    }

    /// The stream `name` as its resident record or else its files hold it, or `None` if it
    /// has neither.
    fn load(&self, name: &str) -> Result<Option<Arc<Stream>>> {
        let shard = self.shard_of(name);
        match self
            .resident
            .open(&self.root, name, shard, self.options.segment_bytes)
        {
            Some(Ok(s)) => {
                if let Some(segs) = s.data.lock().segs.as_mut() {
                    segs.count_in(&self.counters.stream_files);
                }
                return Ok(Some(s));
            }
            Some(Err(e)) => {
                tracing::debug!(stream = name, error = %e, "opening from the resident record failed: opening from the files");
            }
            None => {}
        }
        let dir = fs::stream_dir(&self.root, name);
        let loaded = Stream::load(
            dir.clone(),
            &self.shards[shard].images,
            self.options.segment_bytes,
            false,
            |sc| {
                if sc.state.config.name == name {
                    Ok(true)
                } else {
                    Err(Error::corrupt(
                        &dir,
                        "stream directory belongs to another name (hash collision)",
                    ))
                }
            },
        )
        .map_err(|e| {
            if e.is_out_of_descriptors() {
                Error::TooManyOpenFiles
            } else {
                e
            }
        })?;
        if loaded.is_none() && dir.exists() {
            // Segments without a sidecar: a create that never became durable (its files
            // outran its record before a power loss), or a sidecar lost to damage. Either
            // way no stream is known here; a create of the name clears the directory.
            tracing::warn!(
                stream = name,
                dir = %dir.display(),
                "stream directory has no sidecar: answering as if the stream did not exist"
            );
        }
        // Its files count against `max_stream_files` from now on, registered or not (a load
        // that loses its race is dropped, and leaves the count).
        if let Some(s) = &loaded {
            self.counters.stream_loads.fetch_add(1, Ordering::Relaxed);
            if let Some(segs) = s.data.lock().segs.as_mut() {
                segs.count_in(&self.counters.stream_files);
            }
        }
        Ok(loaded)
    }

    /// Adds `s` to the registry (held as `reg`) under `name`, evicting idle streams when the
    /// registry is over `max_open_streams` and a scan may find some ([`Engine::scan_futile`]).
    pub(super) fn register(
        &self,
        reg: &mut HashMap<String, Arc<Stream>>,
        name: &str,
        s: Arc<Stream>,
    ) {
        reg.insert(name.to_owned(), s);
        self.registered.fetch_add(1, Ordering::Release);
        self.registered_by_name.note(name);
        let cap = self.options.max_open_streams;
        if reg.len() > cap && !self.scan_futile(cap) {
            self.evict(reg, cap);
        }
    }

    /// [`close_idle`] down from `cap`, noting whether the scan fell short of its target.
    fn evict(&self, reg: &mut HashMap<String, Arc<Stream>>, cap: usize) {
        let sidecars = self.counters.sidecars_written.load(Ordering::Acquire);
        let closed = close_idle(reg, cap);
        if !self.has_tier() {
            for s in &closed {
                self.resident.keep(s);
            }
        }
        *self.short_scan.lock() = (reg.len() > cap - cap / 8).then(|| ShortScan {
            registered: self.registered.load(Ordering::Relaxed),
            sidecars,
        });
    }

    /// Whether an eviction scan over `cap` now would find nothing the last one did not: it
    /// fell short of its target, no checkpoint has written sidecars since, and fewer than
    /// `cap / 16` streams have been registered since. A written stream becomes closable only
    /// when a checkpoint records it, so with more streams written between checkpoints than
    /// the cap, scanning at every registration walks the whole registry per cold open and
    /// closes nothing (a fifth of the server's CPU at 100,000 streams). Skipped, the registry
    /// grows past the cap toward [`Engine::open_limit`], where [`Engine::room_for_one`] scans
    /// regardless and then waits for a checkpoint. The `cap / 16` registrations bound how long
    /// streams that were only busy at the last scan (in use, or a batch not yet applied) stay
    /// open past the cap.
    fn scan_futile(&self, cap: usize) -> bool {
        let Some(last) = *self.short_scan.lock() else {
            return false;
        };
        last.sidecars == self.counters.sidecars_written.load(Ordering::Acquire)
            && self.registered.load(Ordering::Relaxed) - last.registered < (cap / 16) as u64
    }

    /// A stream clients may address: it exists (`NotFound`), is not soft-deleted (`Gone`) and
    /// has not expired (`NotFound`, and the expired stream is deleted now). Soft-deletion is
    /// checked first, so a soft-deleted stream past its expiry answers `Gone`.
    pub(super) fn live(&self, name: &StreamName) -> Result<Arc<Stream>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired() {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    /// [`Engine::live`] without any blocking step, for the async paths: `None` when the stream
    /// is not open (opening reads its files) or has expired (deleting it is `live`'s work on a
    /// blocking thread); else the stream, marked used, or `NotFound` / `Gone` as `live` answers.
    pub(super) fn live_in_memory(&self, name: &StreamName) -> Option<Result<Arc<Stream>>> {
        let s = self.in_memory(name.as_str())?;
        {
            let core = s.core.lock();
            if core.gone {
                return Some(Err(Error::NotFound));
            }
            if core.state.soft_deleted {
                return Some(Err(Error::Gone));
            }
        }
        if s.expired() {
            return None;
        }
        s.mark_used();
        Some(Ok(s))
    }

    /// The names of the live streams starting with `prefix` (a leading `/` ignored), sorted:
    /// every page of [`Engine::list_page`].
    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<StreamName>> {
        let mut names = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.list_page(prefix, after.as_deref(), 1024)?;
            names.extend(page.streams.into_iter().map(|s| s.name));
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(names),
            }
        }
    }

    /// Up to `limit` (at least 1) live streams starting with `prefix` (a leading `/` ignored)
    /// after the name `after`, in name order, with the cursor of the next page.
    ///
    /// Candidates come from the name index; each is shown from memory when it is open, else
    /// from its sidecar (not opened: a sliding TTL is not checked for those, as their last
    /// access is not recorded). Names whose stream is missing, soft-deleted or expired are
    /// skipped.
    pub(crate) fn list_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        let limit = limit.max(1);
        let now = now_ms();
        let mut page = ListPage::default();
        let mut cursor = after.map(str::to_owned);
        loop {
            let want = limit - page.streams.len();
            let candidates = self.names.page(prefix, cursor.as_deref(), want);
            let exhausted = candidates.len() < want;
            for n in candidates {
                if let Some(entry) = self.listing_of(&n, now)? {
                    page.streams.push(entry);
                }
                cursor = Some(n);
            }
            if page.streams.len() == limit {
                // A next page exists if any name follows (it may turn out to be skipped).
                if !self.names.page(prefix, cursor.as_deref(), 1).is_empty() {
                    page.next = page.streams.last().map(|s| s.name.as_str().to_owned());
                }
                return Ok(page);
            }
            if exhausted {
                return Ok(page);
            }
        }
    }

    /// The listing entry of `name` at time `now` (ms), if it is a live stream.
    fn listing_of(&self, name: &str, now: u64) -> Result<Option<StreamListing>> {
        let open = self.registry.lock().get(name).cloned();
        if let Some(s) = open {
            let core = s.core.lock();
            if core.gone || core.state.soft_deleted || s.expired_at(now) {
                return Ok(None);
            }
            drop(core);
            let vis = s.visible.lock().clone();
            return Ok(StreamName::new(name).ok().map(|n| StreamListing {
                name: n,
                content_type: s.config.content_type.clone(),
                tail: vis.tail,
                closed: vis.closed,
            }));
        }
        let images = &self.shards[self.shard_of(name)].images;
        let Some(sc) = images.load(&fs::stream_dir(&self.root, name))? else {
            return Ok(None);
        };
        let st = sc.state;
        if st.config.name != name || st.soft_deleted {
            return Ok(None);
        }
        if let Expiry::At(t) = st.config.expiry {
            let at = t
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            if at <= now {
                return Ok(None);
            }
        }
        Ok(StreamName::new(name).ok().map(|n| StreamListing {
            name: n,
            content_type: st.config.content_type.clone(),
            tail: st.tail,
            closed: st.closed,
        }))
    }
}

/// What the registry (held as `reg`) answers for `name`: `None` with no entry (the stream is
/// not open), `Some(None)` for a tombstone (dropped once its delete is applied), else the open
/// stream, marked used.
#[allow(clippy::option_option)] // "not open", "deleted" and "open" are the three answers
fn open_entry(reg: &mut HashMap<String, Arc<Stream>>, name: &str) -> Option<Option<Arc<Stream>>> {
    let s = reg.get(name)?;
    if s.core.lock().gone {
        // A tombstone: deleted, and until the delete is applied its files must not be loaded
        // again. Once applied, the directory is gone and the entry can go too.
        if s.data.lock().deleted {
            reg.remove(name);
        }
        return Some(None);
    }
    s.mark_used();
    Some(Some(s.clone()))
}

/// What the registry saw at an eviction scan that fell short of its target: see
/// [`Engine::scan_futile`].
#[derive(Clone, Copy)]
pub(super) struct ShortScan {
    /// [`Engine::registered`] then.
    registered: u64,
    /// `Counters::sidecars_written` just before the scan.
    sidecars: u64,
}

/// Closes idle, clean streams beyond `cap`, least recently used first, down to 7/8 of `cap`;
/// returns them.
///
/// A stream qualifies only if nobody else holds it (no reader, writer or waiter), and it is
/// either deleted or has nothing unsynced or uncheckpointed (so closing it loses nothing and
/// reloading it from its sidecar gives the same state). Called under the registry lock; its
/// stream locks are only tried, never waited for, so the order `data` before `core` here cannot
/// deadlock.
fn close_idle(reg: &mut HashMap<String, Arc<Stream>>, cap: usize) -> Vec<Arc<Stream>> {
    let target = cap - cap / 8;
    let excess = reg.len().saturating_sub(target);
    if excess == 0 {
        return Vec::new();
    }
    let mut candidates: Vec<(u64, &String)> = reg
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
        .map(|(n, s)| (s.last_used.load(Ordering::Relaxed), n))
        .collect();
    // Only the `excess` least recently used go: partition around that rank, not sort.
    if candidates.len() > excess {
        candidates.select_nth_unstable(excess);
        candidates.truncate(excess);
    }
    let closing: Vec<String> = candidates.into_iter().map(|(_, n)| n.clone()).collect();
    closing.iter().filter_map(|n| reg.remove(n)).collect()
}
