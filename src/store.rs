//! `Store`: a directory of streams: open, create, append, read, wait, delete, fork, snapshots,
//! retention, listing and expiry.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::listing::{CheckReport, ListPage};
use crate::name::{Incarnation, Offset, ReadFrom, StreamName};
use crate::options::Options;
use crate::stats::Stats;
use crate::subscription::{
    AckOutcome, SubscriptionConfig, SubscriptionInfo, Wake, WakeRef, WebhookJob, WebhookResult,
};
use crate::types::{
    AppendOutcome, AppendRequest, CreateOptions, Created, Guard, Message, PublishParts,
    PublishSnapshot, Published, ReadChunk, ReadRequest, RetentionRequest, Snapshot,
    SnapshotRequest, StagedPart, StreamInfo,
};

pub use crate::engine::Watch;

/// A store of durable streams in one directory. Cheap to clone; all clones share the store.
///
/// Only one process may open a directory at a time ([`Error::Locked`](crate::Error::Locked)).
#[derive(Clone)]
pub struct Store {
    inner: Arc<crate::engine::Engine>,
}

/// An accepted operation whose durability is still pending. [`Pending::wait`] (blocking) or
/// [`Pending::wait_async`] return the outcome once it is durable as the store's mode promises.
///
/// The outcome may be a refusal ([`Store::try_append`]'s): a refusal that rests on staged
/// state (a closure, a producer's or a Stream-Seq's last write) is returned only once that
/// state is durable, so it never rests on state a crash could roll back.
#[must_use = "an append is acknowledged only once its Pending is waited on"]
pub struct Pending<T> {
    outcome: Result<T>,
    ticket: Option<crate::engine::Ticket>,
}

impl<T> Pending<T> {
    /// `value`, acknowledged once `ticket` is durable.
    pub(crate) fn new(value: T, ticket: crate::engine::Ticket) -> Pending<T> {
        Pending {
            outcome: Ok(value),
            ticket: Some(ticket),
        }
    }

    /// A refusal, answered once `ticket` (the state it rested on) is durable, or at once.
    pub(crate) fn refused(
        error: crate::Error,
        ticket: Option<crate::engine::Ticket>,
    ) -> Pending<T> {
        Pending {
            outcome: Err(error),
            ticket,
        }
    }

    /// Blocks until durable, then returns the outcome.
    pub fn wait(self) -> Result<T> {
        if let Some(t) = &self.ticket {
            t.wait()?;
        }
        self.outcome
    }

    /// What the outcome waits for, if anything: [`Pending::wait_async`] in two steps, for a
    /// caller that waits with the pending outcome in place (a future that moves it into
    /// `wait_async`'s holds it twice).
    #[cfg(feature = "http")]
    pub(crate) fn ticket(&self) -> Option<&crate::engine::Ticket> {
        self.ticket.as_ref()
    }

    /// The outcome, once [`Pending::ticket`] was waited on.
    #[cfg(feature = "http")]
    pub(crate) fn into_outcome(self) -> Result<T> {
        self.outcome
    }

    /// Waits (without blocking a thread) until durable, then returns the outcome.
    pub async fn wait_async(self) -> Result<T> {
        if let Some(t) = &self.ticket {
            t.wait_async().await?;
        }
        self.outcome
    }
}

/// What [`Store::try_append`] did.
#[must_use = "an append is acknowledged only once its Pending is waited on"]
pub enum TryAppend {
    /// The append was checked and, if accepted, ordered, without blocking: wait on the
    /// [`Pending`] for its outcome (or its refusal), as for [`Store::submit_append`]'s.
    Done(Pending<AppendOutcome>),
    /// It would have blocked (the stream is not open in memory, it has expired, or the body is
    /// large enough that converting it belongs on a blocking thread): the request, untouched
    /// but for its Stream-Seq's filtering, for [`Store::submit_append`] on a thread that may
    /// block. Nothing was written.
    WouldBlock(AppendRequest),
}

/// How a caller that waits on many appends at once on an async runtime should wait on one:
/// [`Store::commit_hint`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Wait on the [`Pending`] at once: nobody else is about to append (or the journal thread
    /// commits anyway, in [`Durability::Sync`](crate::Durability::Sync) mode).
    Now,
    /// Yield to the runtime once before waiting, so the other writers' appends that are ready
    /// enqueue first and one journal write (and one write per stream) carries them all: in
    /// [`Durability::Buffered`](crate::Durability::Buffered) mode the first waiter commits the
    /// whole queue on its own thread.
    Batch,
}

/// A handle on a [`Store`] that does not keep it open (as [`std::sync::Weak`] for an `Arc`):
/// for background tasks that should end when the store is dropped.
#[derive(Clone)]
pub struct WeakStore(std::sync::Weak<crate::engine::Engine>);

impl WeakStore {
    /// The store, while any [`Store`] clone keeps it open.
    pub fn upgrade(&self) -> Option<Store> {
        self.0.upgrade().map(|inner| Store { inner })
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, replaying its journal after a crash.
    ///
    /// Recovery reads only the journal written since the last checkpoint, not every stream.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Ok(Store {
            inner: crate::engine::Engine::open(dir.as_ref(), options)?,
        })
    }

    /// A handle that does not keep the store open: see [`WeakStore`].
    pub fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    /// The data directory, canonical (as the open resolved it).
    pub fn dir(&self) -> &Path {
        self.inner.root()
    }

    /// The options the store runs with.
    pub fn options(&self) -> &Options {
        self.inner.options()
    }

    /// Creates a stream, or confirms that it exists with the same configuration.
    ///
    /// Durable when it returns. A different configuration is
    /// [`ConfigMismatch`](crate::Error::ConfigMismatch); the Stream-Seq of a request that finds
    /// the stream is ignored.
    pub fn create(&self, name: &StreamName, req: CreateOptions) -> Result<Created> {
        self.inner.create(name, req)?.wait()
    }

    /// Like [`Store::create`], returning before the create is durable.
    pub fn submit_create(&self, name: &StreamName, req: CreateOptions) -> Result<Pending<Created>> {
        self.inner.create(name, req)
    }

    /// Appends (and/or closes), checking every guard atomically; durable when it returns.
    ///
    /// A refused append changes nothing.
    pub fn append(&self, name: &StreamName, req: AppendRequest) -> Result<AppendOutcome> {
        self.inner.append(name, req)?.wait()
    }

    /// Like [`Store::append`], returning once the append is accepted and ordered but before it is
    /// durable; wait on the [`Pending`] for the acknowledgement.
    pub fn submit_append(
        &self,
        name: &StreamName,
        req: AppendRequest,
    ) -> Result<Pending<AppendOutcome>> {
        self.inner.append(name, req)
    }

    /// [`Store::submit_append`] without blocking, for async callers that must not block their
    /// worker: answered from memory (the order of checks, and the record's enqueueing) when the
    /// stream is open and the body is at most 64 KiB, else handed back as
    /// [`TryAppend::WouldBlock`] with nothing written. Not durable when it returns: wait on
    /// the [`Pending`] (see [`Store::commit_hint`] for how).
    pub fn try_append(&self, name: &StreamName, req: AppendRequest) -> TryAppend {
        self.inner.try_append(name, req)
    }

    /// How to wait on an append's [`Pending`] from an async runtime when up to `writers` tasks
    /// (the caller included) may be appending at once: the store's group-commit policy. Never
    /// blocks (it reads an option); see [`Commit`].
    pub fn commit_hint(&self, writers: usize) -> Commit {
        self.inner.commit_hint(writers)
    }

    /// Closes the stream (idempotent) if `guard` holds; durable when it returns. The same as
    /// appending [`AppendRequest::close`] with the guard's expectation.
    pub fn close(&self, name: &StreamName, guard: &Guard) -> Result<AppendOutcome> {
        let mut req = AppendRequest::close();
        req.expect.clone_from(&guard.expect);
        self.append(name, req)
    }

    /// Reads a chunk of durable data. Renews a sliding TTL.
    pub fn read(&self, name: &StreamName, req: &ReadRequest) -> Result<ReadChunk> {
        self.inner.read(name, req)
    }

    /// [`Store::read`] without blocking, for async callers: `None` when it might block (the
    /// stream is not open, is a fork, has expired or is deleted, or the range holds messages
    /// not yet checked against their checksums since the store was opened), and the caller
    /// then reads with [`Store::read`] on a thread that may block. Otherwise the answer
    /// [`Store::read`] would give, from index lookups and views of the mapped segments.
    pub fn try_read(&self, name: &StreamName, req: &ReadRequest) -> Option<Result<ReadChunk>> {
        self.inner.try_read(name, req)
    }

    /// Reads whole messages one by one (for bootstrap), from `from` up to about `max_bytes`.
    pub fn read_messages(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Result<(Vec<Message>, ReadChunk)> {
        self.inner.read_messages(name, req)
    }

    /// The stream's metadata, if `guard` holds. Does not renew a sliding TTL.
    pub fn head(&self, name: &StreamName, guard: &Guard) -> Result<StreamInfo> {
        self.inner.head(name, guard.expect.as_ref())
    }

    /// [`Store::head`] without blocking: `None` when the stream is not open in memory or has
    /// expired (the caller then asks [`Store::head`] on a thread that may block).
    pub fn try_head(&self, name: &StreamName, guard: &Guard) -> Option<Result<StreamInfo>> {
        self.inner.try_head(name, guard.expect.as_ref())
    }

    /// Renews a sliding TTL as a read does, without reading.
    pub fn touch(&self, name: &StreamName) -> Result<()> {
        self.inner.touch(name)
    }

    /// Deletes the stream if `guard` holds; durable when it returns. A stream that live forks read from is
    /// soft-deleted: gone for clients ([`Error::Gone`](crate::Error::Gone)), kept for its forks.
    pub fn delete(&self, name: &StreamName, guard: &Guard) -> Result<()> {
        self.inner.delete(name, guard.expect.as_ref())?.wait()
    }

    /// Resolves once the stream's durable tail is past `after`, or it is closed, deleted or
    /// expired. Never polls; usable from any async runtime.
    pub async fn wait(&self, name: &StreamName, after: Offset) -> Result<()> {
        self.inner.wait(name, after).await
    }

    /// Holds the live stream for waiting on it again and again, without a lookup by name
    /// each time: see [`Watch`]. May block to open the stream.
    pub fn watch(&self, name: &StreamName) -> Result<Watch> {
        self.inner.watch(name)
    }

    /// Blocking form of [`Store::wait`]; `false` when `timeout` passed first.
    pub fn wait_blocking(
        &self,
        name: &StreamName,
        after: Offset,
        timeout: Duration,
    ) -> Result<bool> {
        self.inner.wait_blocking(name, after, timeout)
    }

    /// Publishes an immutable snapshot blob at a message boundary (or the tail), streaming it
    /// from `req.blob` to disk.
    ///
    /// The same blob and type again at the same offset is idempotent; other content there is
    /// [`SnapshotConflict`](crate::Error::SnapshotConflict). Snapshots are immutable: older ones
    /// go only with retention. Durable when it returns.
    pub fn publish_snapshot(
        &self,
        name: &StreamName,
        req: PublishSnapshot<'_>,
    ) -> Result<Published> {
        let PublishSnapshot {
            offset,
            content_type,
            mut blob,
            if_digest,
            expect,
        } = req;
        let (snapshot, stream) = self.inner.publish_snapshot(
            name,
            offset,
            content_type.as_deref(),
            &mut blob,
            if_digest.as_deref(),
            expect.as_ref(),
        )?;
        Ok(Published { snapshot, stream })
    }

    /// Stages one part of a snapshot of `name`, read from `blob` to its end (streamed to a file
    /// through a fixed buffer), for a later [`Store::publish_snapshot_parts`]. The part belongs
    /// to the stream's current incarnation (the one `guard` names, if any).
    ///
    /// A part is at most `max_snapshot_bytes` ([`TooLarge`](crate::Error::TooLarge)). A stream
    /// holds at most 8192 unused parts and `2 × max_snapshot_bytes` of them, a tenant (the
    /// stream name's first segment) `max_staged_bytes_per_tenant` of them
    /// ([`Options::with_max_staged_bytes_per_tenant`](crate::Options::with_max_staged_bytes_per_tenant)),
    /// the store `8 × max_snapshot_bytes` in all
    /// ([`StagedPartsLimit`](crate::Error::StagedPartsLimit), checked before `blob` is read);
    /// an unused part is removed after 24 hours. Nothing is durable: opening the store removes
    /// every staged part.
    pub fn stage_snapshot_part(
        &self,
        name: &StreamName,
        blob: &mut dyn std::io::Read,
        guard: &Guard,
    ) -> Result<StagedPart> {
        let tenant = crate::engine::parts::default_tenant(name);
        self.stage_snapshot_part_for(name, tenant, blob, guard)
    }

    /// [`Store::stage_snapshot_part`], the part counted to `tenant` (the HTTP server names the
    /// root of the grant that admitted the upload).
    pub(crate) fn stage_snapshot_part_for(
        &self,
        name: &StreamName,
        tenant: &str,
        blob: &mut dyn std::io::Read,
        guard: &Guard,
    ) -> Result<StagedPart> {
        let (id, len, incarnation) =
            self.inner
                .stage_snapshot_part(name, tenant, blob, guard.expect.as_ref())?;
        Ok(StagedPart {
            id,
            len,
            incarnation,
        })
    }

    /// Publishes staged parts of `name`, in the order `req.parts` lists them, as the snapshot
    /// at `req.offset`, as [`Store::publish_snapshot`] publishes a blob. Durable when it returns.
    ///
    /// The snapshot already published there with `req.digest` answers at once (a repeat of a
    /// commit whose parts are spent); another snapshot at or after the offset is refused before
    /// any part is read. Every part must be staged for the stream's current incarnation
    /// ([`UnknownPart`](crate::Error::UnknownPart)), listed once, and the assembled blob have
    /// `req.digest` ([`SnapshotDigestMismatch`](crate::Error::SnapshotDigestMismatch)). The
    /// parts are spent by every outcome except the server's own failures (I/O, poisoning,
    /// shutdown), after which the commit can be repeated. One commit or discard of a stream's
    /// parts runs at a time ([`SnapshotCommitInProgress`](crate::Error::SnapshotCommitInProgress)).
    pub fn publish_snapshot_parts(
        &self,
        name: &StreamName,
        req: &PublishParts,
    ) -> Result<Published> {
        let (snapshot, stream) = self.inner.publish_snapshot_parts(
            name,
            req.offset,
            req.content_type.as_deref(),
            &req.parts,
            &req.digest,
            req.expect.as_ref(),
        )?;
        Ok(Published { snapshot, stream })
    }

    /// Discards every unused staged part of `name` (in `guard`'s incarnation, if any, and its
    /// earlier ones) and returns the stream's incarnation.
    pub fn discard_snapshot_parts(&self, name: &StreamName, guard: &Guard) -> Result<Incarnation> {
        self.inner
            .discard_snapshot_parts(name, guard.expect.as_ref())
    }

    /// The latest snapshot, or the one at `req.offset`, with its blob.
    pub fn snapshot(&self, name: &StreamName, req: &SnapshotRequest) -> Result<Snapshot> {
        self.inner.snapshot(name, req.offset, req.expect.as_ref())
    }

    /// Refuses to delete a snapshot, as the protocol's `DELETE {stream}/snapshot/{offset}`
    /// answers: snapshots are immutable, so the latest one is
    /// [`SnapshotDeleteRefused`](crate::Error::SnapshotDeleteRefused) (if `guard` holds) and
    /// any other offset [`SnapshotNotFound`](crate::Error::SnapshotNotFound); older snapshots
    /// go only with retention ([`Store::set_retention`]). Never writes.
    pub fn delete_snapshot(&self, name: &StreamName, offset: Offset, guard: &Guard) -> Result<()> {
        self.inner
            .delete_snapshot(name, offset, guard.expect.as_ref())
    }

    /// Advances the earliest readable offset to `req.offset`, which must be a published
    /// snapshot's offset or older; data before it is reclaimed a whole segment at a time.
    /// Retention never moves back. Durable when it returns.
    pub fn set_retention(&self, name: &StreamName, req: &RetentionRequest) -> Result<StreamInfo> {
        self.inner
            .set_retention(name, req.offset, req.expect.as_ref())
    }

    /// Applies every stream's retention policy now (the enforcer thread does this every
    /// [`Options::retention_interval`]) and returns how many streams it trimmed; when it
    /// trimmed any, it checkpoints, so their dropped segments are gone from the disk when it
    /// returns. See [`RetentionPolicy`](crate::RetentionPolicy).
    pub fn enforce_retention(&self) -> Result<u64> {
        Ok(self.inner.enforce_retention()?.streams)
    }

    /// Names of the live streams whose names start with `prefix`, sorted (every page of
    /// [`Store::list_page`]).
    pub fn list(&self, prefix: &str) -> Result<Vec<StreamName>> {
        self.inner.list(prefix)
    }

    /// Up to `limit` (at least 1) live streams whose names start with `prefix`, in name order,
    /// after the cursor `after` (a page's `next`), each with its content type, tail and closure.
    ///
    /// Reads the store's name index and only the sidecars of the streams on the page (open
    /// streams from memory), so a page costs the same in a store of any size. Soft-deleted and
    /// expired streams are left out (a sliding TTL is checked only for open streams).
    pub fn list_page(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<ListPage> {
        self.inner.list_page(prefix, after, limit)
    }

    /// The descriptors the streams' segment files may hold now: see
    /// [`Store::set_max_stream_files`].
    pub fn max_stream_files(&self) -> usize {
        self.inner.max_stream_files()
    }

    /// Sets the descriptors the streams' segment files may hold from now on, for a program
    /// whose other use of descriptors changes while the store is open (`brook serve` gives the
    /// streams what its connections leave: docs/operations.md, "Limits and `ulimit`"). The
    /// value is kept between 16 and the open-file limit less a reserve of 256 for the journals,
    /// snapshots and listeners (or half the limit, if more), and returned. Over a lowered budget, the least recently used
    /// idle streams are put at rest by the next lookup; a raised one lets more stay open.
    /// [`Options::with_max_stream_files`](crate::Options::with_max_stream_files) sets the
    /// budget at the open, where the store, knowing nothing of the program's other
    /// descriptors, takes at most half the limit.
    pub fn set_max_stream_files(&self, n: usize) -> usize {
        self.inner.set_max_stream_files(n)
    }

    /// Puts the least recently used idle streams at rest until their segment files hold `n`
    /// fewer descriptors (or no idle stream is left awake), whatever the budget; returns how
    /// many descriptors were closed. For a program that ran out of descriptors elsewhere
    /// (`brook serve` calls it when accepting a connection fails with `EMFILE`). Takes the
    /// registry lock for a pass over the open streams.
    pub fn shed_stream_files(&self, n: usize) -> usize {
        self.inner.shed_stream_files(n)
    }

    /// The store's running figures: appends, reads, bytes, group-commit batch sizes, sync and
    /// checkpoint latencies since the open, and the open streams and poisoned shards now. Cheap
    /// (atomic loads and one lock to count the open streams); what `GET /__brook/metrics` shows.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// How many journal shards are poisoned now: a write or sync failed, and every write on
    /// the shard fails until the store is reopened. Atomic loads, no lock: cheap enough for a
    /// readiness probe.
    pub fn poisoned_shards(&self) -> u64 {
        self.inner.poisoned_shards()
    }

    /// Poisons the first journal shard as a failed sync would (a test's fault injection).
    #[cfg(test)]
    pub(crate) fn poison_for_test(&self) {
        self.inner.poison_for_test();
    }

    /// Checks the whole store: reads every stream from its earliest offset to its tail, so
    /// every message is checked against its index CRC (and every index against its log), and
    /// checks that each stream directory holds a valid sidecar of the name it is filed under and
    /// that the name index lists it. Opening the store already checked every journal frame
    /// (replaying those after the last checkpoint, as any open does). Damage is reported in
    /// [`CheckReport::damaged`](crate::CheckReport), never repaired; `progress` is called with
    /// the number of streams checked so far. Reads every byte: as slow as reading the store.
    pub fn check(&self, progress: &mut dyn FnMut(u64)) -> Result<CheckReport> {
        self.inner.check(progress)
    }

    /// Moves a damaged stream directory (one of [`CheckReport::damaged_dirs`]) out of the store
    /// into `quarantine/`, so its name answers as no stream and may be created again; its files
    /// are kept there, untouched, for whatever recovery by hand is possible. Everything
    /// acknowledged is checkpointed first. Returns the directory's new path.
    pub fn quarantine(&self, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        self.inner.quarantine(dir)
    }

    /// Writes every live stream, with its state, data and snapshot blobs, to `out` as one
    /// streamed archive (DESIGN.md 2.7); `progress` gets the number of streams written so far.
    /// Returns that number. Forks are written as independent streams (their inherited data
    /// copied); soft-deleted streams are left out.
    pub fn export(
        &self,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64> {
        self.inner.export(out, progress)
    }

    /// Reads an archive written by [`Store::export`] into this store: each stream gets the same
    /// offsets, data, incarnation, content type, closure, expiry, Stream-Seq, producer state,
    /// retention and snapshots. A name that exists here is refused. Durable when it returns;
    /// an import that fails midway leaves what it imported so far (import into a new store and
    /// start over). Returns the number of streams imported.
    pub fn import(
        &self,
        input: &mut dyn std::io::Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64> {
        self.inner.import(input, progress)
    }

    /// Forces a checkpoint: stream files synced, sidecars written, journals truncated.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Makes the cold tier (feature `tier`) catch up now: checkpoints, then waits for the tier
    /// thread's pass over every stream. On `Ok`, every sealed segment and snapshot up to the
    /// checkpoint is in the tier, verified and in its stream's manifest, the local disk is
    /// within the tier's budget, and deleted streams' objects are gone. A failure of the object
    /// store is `Error::TierUnavailable` (the tier keeps retrying by itself; appends go on).
    #[cfg(feature = "tier")]
    pub fn sync_tier(&self) -> Result<()> {
        self.inner.sync_tier()
    }

    /// Shuts the store down cleanly: drains pending writes and checkpoints, so the next open
    /// replays nothing. Dropping the last clone does the same.
    pub fn shutdown(&self) -> Result<()> {
        self.inner.shutdown()
    }

    /// The resolved read start for `from` without reading: convenience for servers.
    pub fn resolve(&self, name: &StreamName, from: ReadFrom) -> Result<Offset> {
        self.inner.resolve(name, from)
    }

    /// Creates the subscription `id` under `config.root`, or confirms an identical one: `true`
    /// when it was created. A different configuration under the same root and id is
    /// [`SubscriptionExists`](crate::Error::SubscriptionExists); the same id under another root
    /// is another subscription. Its path, which the other calls take, is the root followed by
    /// the id ([`SubscriptionInfo::path`]).
    ///
    /// Existing streams matching the pattern, and explicit streams, are linked at their tails
    /// (streams created later that match are linked at their start). Refused with
    /// [`SubscriptionLimit`](crate::Error::SubscriptionLimit) when the root holds
    /// [`Options::max_subscriptions_per_root`](crate::Options::max_subscriptions_per_root)
    /// subscriptions, and [`LinkLimit`](crate::Error::LinkLimit) when it would link more than
    /// [`Options::max_links_per_subscription`](crate::Options::max_links_per_subscription)
    /// streams. Durable when it returns.
    pub fn create_subscription(
        &self,
        id: &str,
        config: SubscriptionConfig,
    ) -> Result<(SubscriptionInfo, bool)> {
        self.inner.create_subscription(id, config)
    }

    /// The subscription at `path` (its root and id: `v1/orders`, or `orders` under the store's
    /// root) as it stands.
    pub fn subscription(&self, path: &str) -> Result<SubscriptionInfo> {
        self.inner.subscription(path)
    }

    /// The paths of every subscription, sorted.
    pub fn subscriptions(&self) -> Vec<String> {
        self.inner.subscriptions()
    }

    /// Deletes the subscription; acks, releases and callbacks for it fail from then on.
    /// Durable when it returns.
    pub fn delete_subscription(&self, path: &str) -> Result<()> {
        self.inner.delete_subscription(path)
    }

    /// Links streams to the subscription explicitly, at their tails (idempotent).
    /// [`LinkLimit`](crate::Error::LinkLimit), and nothing linked, when the subscription would
    /// pass [`Options::max_links_per_subscription`](crate::Options::max_links_per_subscription).
    /// Durable when it returns.
    pub fn link_streams(&self, path: &str, streams: &[StreamName]) -> Result<()> {
        self.inner.link_streams(path, streams)
    }

    /// Removes an explicit link (idempotent); a glob link to the stream stays. Durable when it
    /// returns.
    pub fn unlink_stream(&self, path: &str, stream: &StreamName) -> Result<()> {
        self.inner.unlink_stream(path, stream)
    }

    /// Claims a pull-wake subscription's pending work for `worker`, leasing it for the
    /// subscription's `lease_ttl`. [`AlreadyClaimed`](crate::Error::AlreadyClaimed) while
    /// another worker's lease runs; [`NoPendingWork`](crate::Error::NoPendingWork) when
    /// everything is acknowledged. The wake names the linked streams with pending work (at most
    /// 1000; the rest come with the next wake). Durable when it returns.
    pub fn claim(&self, path: &str, worker: &str) -> Result<Wake> {
        self.inner.claim(path, worker)
    }

    /// Acknowledges `acks` (stream, offset processed up to) for `wake` (a [`Wake`], or the
    /// [`WakeRef`] a callback token names). Without `done` it only extends the lease (a
    /// heartbeat); with `done` the wake ends and a new one is issued if work remains. A stale
    /// wake is [`Fenced`](crate::Error::Fenced); an offset for a stream not linked, behind the
    /// acknowledged one or past the tail is
    /// [`InvalidAckOffset`](crate::Error::InvalidAckOffset), and nothing is applied. Durable when
    /// it returns.
    pub fn ack<'a>(
        &self,
        wake: impl Into<WakeRef<'a>>,
        acks: &[(StreamName, Offset)],
        done: bool,
    ) -> Result<AckOutcome> {
        let w = wake.into();
        self.inner
            .ack(w.subscription, w.generation, w.wake_id, acks, done)
    }

    /// Gives `wake` back without acknowledging; if work remains a new wake is issued. A stale
    /// wake is [`Fenced`](crate::Error::Fenced). Durable when it returns.
    pub fn release<'a>(&self, wake: impl Into<WakeRef<'a>>) -> Result<()> {
        let w = wake.into();
        self.inner.release(w.subscription, w.generation, w.wake_id)
    }

    /// Blocks until the subscription has a wake nobody holds (so a claim can succeed), up to
    /// `timeout`; `false` on timeout.
    pub fn wait_for_work(&self, path: &str, timeout: Duration) -> Result<bool> {
        self.inner.wait_for_work(path, timeout)
    }

    // Webhook delivery: the store keeps each webhook subscription's wakes, leases and retry
    // schedule; a deliverer (`brook serve`'s) takes the due jobs, sends them and records how
    // each ended.

    /// Whether any subscription exists: one atomic load, never blocks (a deliverer skips
    /// [`Store::take_webhook_jobs`] while it is `false`).
    pub fn has_subscriptions(&self) -> bool {
        self.inner.has_subscriptions()
    }

    /// A future that resolves at the next change to the subscriptions: a wake issued,
    /// delivered, acknowledged, released or expired, a webhook result recorded, a subscription
    /// created or deleted. It is registered when this returns, so no later change is missed
    /// (look, then await it). A lease expiry or a retry coming due is not a change: poll for
    /// those too. Usable from any async runtime.
    pub fn subscription_change(&self) -> impl Future<Output = ()> + Send + Unpin + 'static {
        self.inner.subscription_change()
    }

    /// The webhook wakes due for a delivery attempt now, each marked as being sent (so it is
    /// not handed out again) until [`Store::record_webhook`] records its result; the marks are
    /// in memory only, so after a reopen every undelivered wake is due again. Blocks on the
    /// subscriptions' lock (held while a subscription change is made durable).
    pub fn take_webhook_jobs(&self) -> Vec<WebhookJob> {
        self.inner.take_webhook_jobs()
    }

    /// Whether `wake` is still its subscription's current wake (it was not acknowledged,
    /// released, expired or deleted meanwhile). Blocks on the subscriptions' lock.
    pub fn wake_is_current<'a>(&self, wake: impl Into<WakeRef<'a>>) -> bool {
        let w = wake.into();
        self.inner
            .wake_is_current(w.subscription, w.generation, w.wake_id)
    }

    /// Records how the delivery of a job's wake ended (see [`WebhookResult`]) and ends its
    /// being sent; ignored when the wake is no longer current. Durable when it returns.
    pub fn record_webhook(&self, wake: &Wake, result: WebhookResult) -> Result<()> {
        self.inner.webhook_result(wake, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateOptions, Options, StreamName};

    #[test]
    fn a_poisoned_shard_is_counted_and_refuses_writes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), Options::default().with_journal_shards(1))?;
        let name = StreamName::new("a")?;
        store.create(&name, CreateOptions::default())?;
        assert_eq!(store.poisoned_shards(), 0);
        store.poison_for_test();
        assert_eq!(store.poisoned_shards(), 1);
        assert_eq!(store.stats().poisoned_shards, 1);
        assert!(matches!(
            store.append(&name, AppendRequest::new("x")),
            Err(crate::Error::Poisoned { .. })
        ));
        Ok(())
    }
}
