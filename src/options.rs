//! `Options`: every tunable of a store, with its default and bounds, validated once at open.

use crate::error::{Error, Result};

/// What an acknowledged write survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// An acknowledged write is on stable storage (its journal record was `fdatasync`ed): it
    /// survives a process crash and a power loss. Concurrent writes share syncs (group commit).
    #[default]
    Sync,
    /// An acknowledged write has reached the operating system (written to the journal file, not
    /// synced): it survives a crash of the process, not a crash of the machine. The journal is
    /// synced at every checkpoint and on a clean shutdown.
    Buffered,
}

/// Options for [`Store::open`](crate::Store::open). Build with `Options::default()` and
/// the `with_*` setters; each getter is named after its option.
///
/// ```
/// use brook::{Durability, Options};
///
/// let options = Options::default().with_durability(Durability::Buffered).with_journal_shards(4);
/// assert_eq!(options.journal_shards(), 4);
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    pub(crate) durability: Durability,
    pub(crate) journal_shards: usize,
    pub(crate) segment_bytes: u64,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) max_open_streams: usize,
    pub(crate) max_stream_files: usize,
    pub(crate) max_append_bytes: usize,
    pub(crate) max_append_messages: usize,
    pub(crate) max_read_bytes: u64,
    pub(crate) max_snapshot_bytes: u64,
    pub(crate) max_staged_bytes_per_tenant: Option<u64>,
    pub(crate) retention_default: crate::RetentionPolicy,
    pub(crate) retention_interval: std::time::Duration,
    pub(crate) max_subscriptions_per_root: usize,
    pub(crate) max_links_per_subscription: usize,
    #[cfg(feature = "tier")]
    pub(crate) tier: Option<crate::tier::TierOptions>,
}

/// The journal shard count a store gets unless one is set: one per two CPUs this process may
/// run on (its affinity mask, so a server pinned to one CPU gets one shard), at least 1 and at
/// most 8.
///
/// A second shard costs a committer, a checkpoint thread and a journal file, and halves each
/// shard's group commits and the streams each checkpoint covers. It pays when there are CPUs to
/// run two committers at once and a device that takes their syncs in parallel. On a two-CPU
/// machine one shard did less work per append than two, pinned or not (docs/benchmarks/history.md,
/// "The ninth pass").
fn default_journal_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 8))
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            journal_shards: default_journal_shards(),
            segment_bytes: 64 << 20,
            checkpoint_bytes: 64 << 20,
            max_open_streams: 4096,
            max_stream_files: 8192,
            max_append_bytes: 64 << 20,
            max_append_messages: 100_000,
            max_read_bytes: 8 << 20,
            max_snapshot_bytes: 128 << 20,
            max_staged_bytes_per_tenant: None,
            retention_default: crate::RetentionPolicy::default(),
            retention_interval: std::time::Duration::from_secs(10),
            max_subscriptions_per_root: 1000,
            max_links_per_subscription: 100_000,
            #[cfg(feature = "tier")]
            tier: None,
        }
    }
}

impl Options {
    /// What an acknowledged write survives. Default [`Durability::Sync`].
    #[must_use]
    pub fn with_durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// A cold tier on object storage (feature `tier`): sealed segments, their indexes and
    /// snapshots are uploaded in the background and may then leave the local disk. Default
    /// none. See [`TierOptions`](crate::TierOptions).
    #[cfg(feature = "tier")]
    #[must_use]
    pub fn with_tier(mut self, tier: crate::tier::TierOptions) -> Self {
        self.tier = Some(tier);
        self
    }

    /// The cold tier's options, if one is set.
    #[cfg(feature = "tier")]
    pub fn tier(&self) -> Option<&crate::tier::TierOptions> {
        self.tier.as_ref()
    }

    /// Number of journal shards, each with its own file and sync thread, so several syncs are in
    /// flight at once. Default: one per two CPUs this process may run on (its affinity mask), at
    /// least 1 and at most 8; 1 to 64. Fixed when a store is created: reopening with
    /// another value keeps the stored one.
    #[must_use]
    pub fn with_journal_shards(mut self, n: usize) -> Self {
        self.journal_shards = n;
        self
    }

    /// Size at which a stream's segment file is rolled. Default 64 MiB, 4 KiB to 1 GiB. Retention
    /// reclaims disk space a whole segment at a time.
    #[must_use]
    pub fn with_segment_bytes(mut self, n: u64) -> Self {
        self.segment_bytes = n;
        self
    }

    /// Journal size that triggers a checkpoint (stream files synced, sidecars written, journal
    /// truncated). Bounds recovery work after a crash. Default 64 MiB, 64 KiB to 16 GiB.
    #[must_use]
    pub fn with_checkpoint_bytes(mut self, n: u64) -> Self {
        self.checkpoint_bytes = n;
        self
    }

    /// Streams kept open (in memory: their state and the maps of their indexes) at once; idle
    /// streams with nothing left to checkpoint beyond it are closed, least recently used first.
    /// Default 4096, at least 16. An open stream's files are a separate budget
    /// ([`Options::with_max_stream_files`]). Each open stream holds a memory map per segment:
    /// at open the store lowers this to a third of `vm.max_map_count` if it is larger (logged).
    #[must_use]
    pub fn with_max_open_streams(mut self, n: usize) -> Self {
        self.max_open_streams = n;
        self
    }

    /// Descriptors the open streams' segment files may hold at once (one per segment in use: its
    /// log; the index is only mapped, and opened while entries are written). Over it, the least
    /// recently used idle streams are put at rest: their logs closed, their state and index maps
    /// kept, the logs reopened (one `open`, nothing read) by their next append or read. Default
    /// 8192, at least 16. At open the store raises the soft open-file limit to the hard one and
    /// lowers this to half of that limit if it is larger (logged);
    /// [`Store::set_max_stream_files`](crate::Store::set_max_stream_files) changes it later.
    #[must_use]
    pub fn with_max_stream_files(mut self, n: usize) -> Self {
        self.max_stream_files = n;
        self
    }

    /// Largest append (or create) body. Default 64 MiB, 1 byte to 1 GiB.
    #[must_use]
    pub fn with_max_append_bytes(mut self, n: usize) -> Self {
        self.max_append_bytes = n;
        self
    }

    /// Most messages one JSON append (or create) may carry: a top-level array is split into
    /// this many messages at most, and a longer one is refused
    /// ([`TooLarge`](crate::Error::TooLarge)) before anything is written. Every message costs a
    /// 16-byte index entry whatever its size, and the split holds 4 bytes per message besides
    /// the body, so this bounds both. Default 100,000, 1 to 16,777,216.
    #[must_use]
    pub fn with_max_append_messages(mut self, n: usize) -> Self {
        self.max_append_messages = n;
        self
    }

    /// Largest body one read returns when the caller sets no smaller bound. Default 8 MiB, at
    /// least 1 KiB. A JSON read always returns at least one whole message.
    #[must_use]
    pub fn with_max_read_bytes(mut self, n: u64) -> Self {
        self.max_read_bytes = n;
        self
    }

    /// Largest snapshot blob. Default 128 MiB, 0 to 4 GiB.
    #[must_use]
    pub fn with_max_snapshot_bytes(mut self, n: u64) -> Self {
        self.max_snapshot_bytes = n;
        self
    }

    /// Most bytes of unused staged snapshot parts one tenant may hold
    /// ([`Store::stage_snapshot_part`](crate::Store::stage_snapshot_part)): a tenant is the
    /// first segment of the stream names its parts are staged under. Default `2 ×
    /// max_snapshot_bytes` (256 MiB), a quarter of the store's `8 × max_snapshot_bytes`: one
    /// tenant can always stage one stream's worth (an abandoned upload and its retry) and never
    /// fill the store's pool.
    #[must_use]
    pub fn with_max_staged_bytes_per_tenant(mut self, n: u64) -> Self {
        self.max_staged_bytes_per_tenant = Some(n);
        self
    }

    /// Most bytes of unused staged snapshot parts one tenant may hold (see
    /// [`Options::with_max_staged_bytes_per_tenant`]).
    pub fn max_staged_bytes_per_tenant(&self) -> u64 {
        self.max_staged_bytes_per_tenant
            .unwrap_or_else(|| self.max_snapshot_bytes.saturating_mul(2))
    }

    /// The retention policy of every stream that sets no limit of its own: each limit a
    /// stream's policy leaves unset is taken from here when the enforcer runs, so changing it
    /// applies to existing streams at the next open. Default none (streams are kept whole).
    /// See [`RetentionPolicy`](crate::RetentionPolicy).
    #[must_use]
    pub fn with_retention_default(mut self, policy: crate::RetentionPolicy) -> Self {
        self.retention_default = policy;
        self
    }

    /// How often the retention enforcer looks at the streams. Default 10 s, 10 ms to 1 hour.
    #[must_use]
    pub fn with_retention_interval(mut self, every: std::time::Duration) -> Self {
        self.retention_interval = every;
        self
    }

    /// Subscriptions one root may hold (a root is the prefix a subscription's paths are
    /// relative to: a tenant's, over HTTP). A create past it is refused with
    /// [`Error::SubscriptionLimit`](crate::Error::SubscriptionLimit). Default 1000, at least 1.
    ///
    /// Each subscription is looked at by every pass of the subscription thread whose published
    /// streams could concern it, so the bound keeps one tenant from slowing every wake; 1000 is
    /// far more than a root needs for its kinds of work (one subscription serves any number of
    /// streams through its pattern).
    #[must_use]
    pub fn with_max_subscriptions_per_root(mut self, n: usize) -> Self {
        self.max_subscriptions_per_root = n;
        self
    }

    /// Streams one subscription may link. A create whose pattern and streams match more, or a
    /// link past it, is refused with [`Error::LinkLimit`](crate::Error::LinkLimit); a stream
    /// created later that matches the pattern of a subscription at its limit is not linked
    /// (logged), and is linked at its next append once there is room. Default 100 000, at
    /// least 1.
    ///
    /// A link costs about 150 bytes of memory and of the subscription's create record and
    /// snapshot, so the default bounds one subscription to about 15 MB; a change costs what it
    /// changes whatever the number of links.
    #[must_use]
    pub fn with_max_links_per_subscription(mut self, n: usize) -> Self {
        self.max_links_per_subscription = n;
        self
    }

    /// Subscriptions one root may hold.
    pub fn max_subscriptions_per_root(&self) -> usize {
        self.max_subscriptions_per_root
    }

    /// Streams one subscription may link.
    pub fn max_links_per_subscription(&self) -> usize {
        self.max_links_per_subscription
    }

    /// The store's default retention policy.
    pub fn retention_default(&self) -> crate::RetentionPolicy {
        self.retention_default
    }

    /// How often the retention enforcer runs.
    pub fn retention_interval(&self) -> std::time::Duration {
        self.retention_interval
    }

    /// What an acknowledged write survives.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The number of journal shards asked for (a reopened store keeps the number it was
    /// created with).
    pub fn journal_shards(&self) -> usize {
        self.journal_shards
    }

    /// The size at which a segment file is rolled.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// The journal size that triggers a checkpoint.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.checkpoint_bytes
    }

    /// The number of streams kept open at once.
    pub fn max_open_streams(&self) -> usize {
        self.max_open_streams
    }

    /// The descriptors the open streams' segment files may hold at once.
    pub fn max_stream_files(&self) -> usize {
        self.max_stream_files
    }

    /// The largest append (or create) body.
    pub fn max_append_bytes(&self) -> usize {
        self.max_append_bytes
    }

    /// The most messages one JSON append carries.
    pub fn max_append_messages(&self) -> usize {
        self.max_append_messages
    }

    /// The largest body one read returns.
    pub fn max_read_bytes(&self) -> u64 {
        self.max_read_bytes
    }

    /// The largest snapshot blob.
    pub fn max_snapshot_bytes(&self) -> u64 {
        self.max_snapshot_bytes
    }

    /// Checks every option against its bounds; the error names the option, its bounds and the
    /// value given (`checkpoint_bytes must be between 65536 and 17179869184 (got 10)`).
    pub(crate) fn validate(&self) -> Result<()> {
        #[cfg(feature = "tier")]
        if let Some(t) = &self.tier {
            t.validate()?;
        }
        check("journal_shards", self.journal_shards as u64, 1, Some(64))?;
        check("segment_bytes", self.segment_bytes, 4096, Some(1 << 30))?;
        check(
            "checkpoint_bytes",
            self.checkpoint_bytes,
            64 << 10,
            Some(16 << 30),
        )?;
        check("max_open_streams", self.max_open_streams as u64, 16, None)?;
        check("max_stream_files", self.max_stream_files as u64, 16, None)?;
        check(
            "max_append_bytes",
            self.max_append_bytes as u64,
            1,
            Some(1 << 30),
        )?;
        check(
            "max_append_messages",
            self.max_append_messages as u64,
            1,
            Some(1 << 24),
        )?;
        check("max_read_bytes", self.max_read_bytes, 1024, None)?;
        check(
            "max_snapshot_bytes",
            self.max_snapshot_bytes,
            0,
            Some(4 << 30),
        )?;
        check(
            "retention_interval_ms",
            self.retention_interval
                .as_millis()
                .min(u128::from(u64::MAX)) as u64,
            10,
            Some(3_600_000),
        )?;
        check(
            "max_subscriptions_per_root",
            self.max_subscriptions_per_root as u64,
            1,
            None,
        )?;
        check(
            "max_links_per_subscription",
            self.max_links_per_subscription as u64,
            1,
            None,
        )?;
        self.retention_default.validate()?;
        Ok(())
    }
}

/// `Ok` when `value` is within `min..=max` (no upper bound when `max` is `None`); otherwise an
/// [`Error::InvalidArgument`] that names the option, its bounds and the value.
fn check(option: &str, value: u64, min: u64, max: Option<u64>) -> Result<()> {
    let ok = value >= min && max.is_none_or(|max| value <= max);
    if ok {
        return Ok(());
    }
    let bounds = match max {
        Some(max) if min == 0 => format!("at most {max}"),
        Some(max) => format!("between {min} and {max}"),
        None => format!("at least {min}"),
    };
    Err(Error::InvalidArgument(format!(
        "{option} must be {bounds} (got {value})"
    )))
}

#[cfg(test)]
mod tests {
    use super::Options;

    #[test]
    fn validation_names_the_option_its_bounds_and_the_value() {
        let message = |o: Options| o.validate().map_err(|e| e.to_string()).err();
        assert_eq!(message(Options::default()), None);
        assert_eq!(
            message(Options::default().with_checkpoint_bytes(10)).as_deref(),
            Some(
                "invalid argument: checkpoint_bytes must be between 65536 and 17179869184 (got 10)"
            )
        );
        assert_eq!(
            message(Options::default().with_max_open_streams(3)).as_deref(),
            Some("invalid argument: max_open_streams must be at least 16 (got 3)")
        );
        assert_eq!(
            message(Options::default().with_max_snapshot_bytes(5 << 30)).as_deref(),
            Some(
                "invalid argument: max_snapshot_bytes must be at most 4294967296 (got 5368709120)"
            )
        );
    }
}
