//! The crate's error type: every refusal names what happened and carries what a caller needs.

use std::path::PathBuf;
use std::sync::Arc;

use crate::name::{Incarnation, Offset};

/// A result whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in brook.
///
/// Refusals of a request (`StreamSeqConflict`, `StreamClosed`, ...) change nothing: the stream is
/// exactly as it was before the call. I/O failures on the durability path poison the affected
/// journal shard (see [`Error::Poisoned`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No stream of that name exists (or it expired).
    #[error("stream not found")]
    NotFound,
    /// The stream was deleted while forks still read from it; it is gone for clients.
    #[error("stream is gone: it was deleted and is kept only for its forks")]
    Gone,
    /// A create found the stream with a different configuration.
    #[error("stream already exists with a different configuration ({0})")]
    ConfigMismatch(&'static str),
    /// The caller named an incarnation that is not the stream's current one.
    #[error("stream incarnation mismatch: the stream is now incarnation {current}")]
    IncarnationMismatch {
        /// The stream's current incarnation token.
        current: Incarnation,
    },
    /// The caller named an incarnation for a stream that does not exist (a PUT with the header).
    #[error("stream incarnation mismatch: no stream exists at this name")]
    IncarnationMissing,
    /// An append to a closed stream.
    #[error("stream is closed")]
    StreamClosed {
        /// The stream's final offset.
        tail: Offset,
    },
    /// The request's content type is not the stream's.
    #[error("content type mismatch: the stream's content type is {expected}")]
    ContentTypeMismatch {
        /// The stream's (normalized) content type.
        expected: String,
    },
    /// A Stream-Seq that is not strictly greater than the stored one.
    #[error("Stream-Seq conflict: the stream's last Stream-Seq is {last_seq:?}")]
    StreamSeqConflict {
        /// The stream's current tail.
        tail: Offset,
        /// The stream's last accepted Stream-Seq.
        last_seq: String,
    },
    /// A producer's sequence number skipped ahead of (or fell behind) the expected one.
    #[error("producer sequence gap: expected {expected}, received {received}")]
    ProducerSeqGap {
        /// The next sequence number the stream accepts from this producer.
        expected: u64,
        /// The sequence number that was sent.
        received: u64,
    },
    /// A producer epoch older than the stream's current epoch for that producer.
    #[error("stale producer epoch: the current epoch is {current}")]
    ProducerEpochStale {
        /// The producer's current epoch.
        current: u64,
    },
    /// A new producer epoch must start at sequence 0.
    #[error("a new producer epoch must start at Producer-Seq 0")]
    ProducerEpochSeqNotZero,
    /// A write under a producer key that holds a write with another identity (Ursula 0.11's
    /// `Producer-Digest`: another digest, or a digest where none was kept, or none where one
    /// was). This write applied nothing and never will under this key.
    #[error("producer epoch {epoch} holds a write with another identity under this key")]
    ProducerKeyConflict {
        /// The producer's current epoch.
        epoch: u64,
    },
    /// A producer write that would apply, whose body does not hash to its `Producer-Digest`.
    #[error("the body does not match its Producer-Digest")]
    ProducerDigestMismatch,
    /// The stream's tail is not the one an append's tail precondition named ([`TailMatch`]).
    ///
    /// [`TailMatch`]: crate::TailMatch
    #[error("the stream's tail moved: it is now {tail} of incarnation {incarnation}")]
    TailMoved {
        /// The stream's current incarnation.
        incarnation: Incarnation,
        /// The stream's current tail.
        tail: Offset,
        /// Whether the stream is closed.
        closed: bool,
    },
    /// An append body that is not valid JSON on a JSON stream.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// An append of an empty JSON array.
    #[error("empty JSON array: an append must carry at least one message")]
    EmptyJsonArray,
    /// An append with no data that does not close the stream.
    #[error("empty append: a body is required unless the append closes the stream")]
    EmptyAppend,
    /// An argument the engine cannot accept (a malformed name, value or option).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A name or value larger than brook's documented limit.
    #[error("too large: {0}")]
    TooLarge(String),
    /// A read below the earliest retained offset.
    #[error("offset is before the earliest retained offset {earliest}")]
    OffsetGone {
        /// The earliest readable offset.
        earliest: Offset,
    },
    /// A read or position past the stream's tail.
    #[error("offset is beyond the tail {tail}")]
    OffsetBeyondTail {
        /// The stream's current tail.
        tail: Offset,
    },
    /// The fork's source does not exist.
    #[error("fork source stream not found")]
    ForkSourceNotFound,
    /// The fork's source was deleted and is kept only for its forks.
    #[error("fork source stream is deleted")]
    ForkSourceGone,
    /// The store has `max_open_streams` streams open and none can be closed yet (each has
    /// changes a checkpoint has not recorded): a transient refusal that changed nothing.
    #[error("too many streams open to create another now ({open}); retry shortly")]
    TooManyOpenStreams {
        /// Streams open when the create was refused.
        open: usize,
    },
    /// Opening a stream's files failed because the process (`EMFILE`) or the system
    /// (`ENFILE`) has no descriptor left: a transient refusal that wrote nothing and affects
    /// nothing else; the same request succeeds once descriptors free up.
    #[error("no file descriptor is free to open the stream's files; retry shortly")]
    TooManyOpenFiles,
    /// The fork's source is already [`MAX_FORK_DEPTH`](crate::MAX_FORK_DEPTH) forks deep.
    #[error("fork source is already {max} forks deep; fork a stream nearer the root")]
    ForkTooDeep {
        /// The deepest chain brook keeps.
        max: usize,
    },
    /// A fork position that is not a valid position in the source.
    #[error("invalid fork position: {0}")]
    InvalidForkPosition(String),
    /// No snapshot at that offset (or none at all).
    #[error("snapshot not found")]
    SnapshotNotFound,
    /// A different snapshot is already published at that offset.
    #[error("a different snapshot is already published at this offset")]
    SnapshotConflict,
    /// A snapshot offset older than the latest published snapshot.
    #[error("a newer snapshot is already published at {latest}")]
    SnapshotStale {
        /// The latest snapshot's offset.
        latest: Offset,
    },
    /// `Stream-Snapshot-Match` named a digest that is not the latest snapshot's.
    #[error("snapshot digest mismatch")]
    SnapshotMatchFailed {
        /// The latest snapshot's digest, if any.
        current: Option<String>,
    },
    /// An offset whose two halves disagree: its message count is not the number of messages
    /// before its byte position, so it is not an offset this stream issued.
    #[error("invalid offset: {0}")]
    InvalidOffset(String),
    /// An offset that is not on a message boundary where one is required.
    #[error("offset {0} is not on a message boundary")]
    NotOnBoundary(Offset),
    /// Retention may only advance to a published snapshot's offset or older.
    #[error("retention may only advance to a published snapshot's offset or older")]
    RetentionBeyondSnapshot,
    /// The latest snapshot cannot be deleted; snapshots are immutable (the answer of the HTTP
    /// route `DELETE {s}/snapshot/{offset}`; older snapshots go only with retention).
    #[error("the latest snapshot cannot be deleted")]
    SnapshotDeleteRefused,
    /// A snapshot assembled from staged parts does not have the digest its commit named
    /// (`Store::publish_snapshot_parts`); nothing was published.
    #[error("the assembled snapshot's digest {assembled} differs from the one the commit names")]
    SnapshotDigestMismatch {
        /// The digest of what the parts assemble.
        assembled: String,
    },
    /// A snapshot commit names a part that is not staged for this incarnation of this stream
    /// (never staged, discarded, spent by an earlier commit, or left by a restart).
    #[error("part {part:?} is not a staged snapshot part of this stream")]
    UnknownPart {
        /// The part id.
        part: String,
    },
    /// The stream, or the whole store, holds as many staged snapshot parts as it may; a commit
    /// or a discard of them (or their expiry) makes room, waiting does not.
    #[error("too many staged snapshot parts: {limit}")]
    StagedPartsLimit {
        /// Which bound was reached.
        limit: StagedLimit,
    },
    /// Another commit or discard of this stream's staged parts is running; repeat the request
    /// once it ends.
    #[error("a commit or discard of this stream's snapshot parts is running; repeat it")]
    SnapshotCommitInProgress,
    /// Another process holds the store's directory.
    #[error("the data directory {0} is in use by another process")]
    Locked(PathBuf),
    /// On-disk data failed validation.
    #[error("corrupt data in {path}: {reason}")]
    Corrupt {
        /// The file that failed validation.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The cold tier (object storage) could not serve or take what was asked: a read of a
    /// range that is only in the tier while the tier is unreachable, or a tier sync that
    /// failed. Appends never wait on the tier and never fail with this.
    #[error("the cold tier is unavailable: {reason}")]
    TierUnavailable {
        /// What failed, as the object store reported it.
        reason: String,
    },
    /// An I/O failure on the durability path; this write was not stored.
    ///
    /// After a failure whose outcome is unknown (a failed sync) the shard is poisoned: nothing
    /// more is acknowledged on it until the store is reopened. After one that stored nothing (a
    /// full disk, `source` of kind `StorageFull`) the shard heals by itself once the cause is
    /// gone, and a retry may succeed. Every write refused for the same failure carries the same
    /// `source` (a failure that was not an I/O error, such as corruption found while applying a
    /// record, is wrapped as an [`std::io::Error`] of kind `Other`).
    #[error(
        "the store refuses writes after an I/O failure on the durability path (it heals once a full disk has space again; after a failed sync, reopen it)"
    )]
    Poisoned {
        /// The failure that poisoned the shard.
        source: Arc<std::io::Error>,
    },
    /// The write reached the journal file, but a later step of its commit (applying it to the
    /// stream's files, or the sync) failed: it may or may not survive a restart, so it was not
    /// acknowledged, and the shard is poisoned with `source`. Retrying a plain append may
    /// duplicate it; a retry with the same producer headers (or Stream-Seq) is safe.
    #[error(
        "the write's outcome is unknown: it reached the journal, then the commit failed; reopen the store"
    )]
    OutcomeUnknown {
        /// The failure after the journal write.
        source: Arc<std::io::Error>,
    },
    /// The store was shut down.
    #[error("the store is shut down")]
    ShutDown,
    /// No subscription has that id under that root (or it was deleted).
    #[error("subscription not found")]
    SubscriptionNotFound,
    /// A subscription with that id exists under that root with a different configuration.
    #[error("a subscription with this id exists with a different configuration")]
    SubscriptionExists,
    /// The subscription's root holds as many subscriptions as it may
    /// ([`Options::with_max_subscriptions_per_root`](crate::Options::with_max_subscriptions_per_root));
    /// deleting one makes room, waiting does not. Nothing was created.
    #[error("the root holds {limit} subscriptions, as many as it may")]
    SubscriptionLimit {
        /// Subscriptions one root may hold.
        limit: usize,
    },
    /// The subscription would link more streams than it may
    /// ([`Options::with_max_links_per_subscription`](crate::Options::with_max_links_per_subscription)):
    /// a create whose pattern and streams match more, or a link past it. Nothing was linked.
    #[error("a subscription links at most {limit} streams")]
    LinkLimit {
        /// Streams one subscription may link.
        limit: usize,
    },
    /// Another worker holds the subscription's lease.
    #[error("the subscription is claimed by {holder} (generation {generation})")]
    AlreadyClaimed {
        /// The worker holding the lease.
        holder: String,
        /// The current generation.
        generation: u64,
    },
    /// Every linked stream is acknowledged up to its tail: there is nothing to claim.
    #[error("the subscription has no pending work")]
    NoPendingWork,
    /// The wake named (generation, wake id) is not the subscription's current one.
    #[error("fenced: the wake is not the subscription's current one")]
    Fenced,
    /// An acknowledged offset for a stream that is not linked, behind the acknowledged offset or
    /// past the tail.
    #[error("invalid ack offset: {0}")]
    InvalidAckOffset(String),
    /// An I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// An `Error::Corrupt` for `path`: on-disk data failed validation for `reason`.
    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Whether this is an I/O error for want of a file descriptor (`EMFILE` or `ENFILE`).
    pub(crate) fn is_out_of_descriptors(&self) -> bool {
        matches!(self, Error::Io(e) if io_out_of_descriptors(e))
    }

    /// `TooManyOpenFiles` for an error of [`Error::is_out_of_descriptors`], this error otherwise.
    pub(crate) fn or_out_of_descriptors(self) -> Self {
        if self.is_out_of_descriptors() {
            Error::TooManyOpenFiles
        } else {
            self
        }
    }

    /// This error as an [`std::io::Error`], for recording as the cause of a poisoned shard: an
    /// I/O error is kept as it is, anything else is wrapped.
    pub(crate) fn into_io(self) -> std::io::Error {
        match self {
            Error::Io(e) => e,
            other => std::io::Error::other(other),
        }
    }

    /// A stable, upper-snake-case code naming the error, as used in problem+json bodies.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound => "STREAM_NOT_FOUND",
            Error::Gone => "STREAM_GONE",
            Error::ConfigMismatch(_) => "STREAM_CONFIG_MISMATCH",
            Error::IncarnationMismatch { .. } | Error::IncarnationMissing => "INCARNATION_MISMATCH",
            Error::StreamClosed { .. } => "STREAM_CLOSED",
            Error::ContentTypeMismatch { .. } => "CONTENT_TYPE_MISMATCH",
            Error::StreamSeqConflict { .. } => "STREAM_SEQ_CONFLICT",
            Error::ProducerSeqGap { .. } => "PRODUCER_SEQ_GAP",
            Error::ProducerEpochStale { .. } => "PRODUCER_EPOCH_STALE",
            Error::ProducerEpochSeqNotZero => "PRODUCER_EPOCH_SEQ_NOT_ZERO",
            Error::ProducerKeyConflict { .. } => "PRODUCER_KEY_CONFLICT",
            Error::ProducerDigestMismatch => "PRODUCER_DIGEST_MISMATCH",
            Error::TailMoved { .. } => "TAIL_MOVED",
            Error::InvalidJson(_) => "INVALID_JSON",
            Error::EmptyJsonArray => "EMPTY_JSON_ARRAY",
            Error::EmptyAppend => "EMPTY_BODY",
            Error::InvalidArgument(_) => "INVALID_ARGUMENT",
            Error::TooLarge(_) => "PAYLOAD_TOO_LARGE",
            Error::OffsetGone { .. } => "OFFSET_GONE",
            Error::OffsetBeyondTail { .. } => "OFFSET_BEYOND_TAIL",
            Error::ForkSourceNotFound => "FORK_SOURCE_NOT_FOUND",
            Error::ForkSourceGone => "FORK_SOURCE_GONE",
            Error::ForkTooDeep { .. } => "FORK_TOO_DEEP",
            Error::TooManyOpenStreams { .. } => "TOO_MANY_OPEN_STREAMS",
            Error::TooManyOpenFiles => "TOO_MANY_OPEN_FILES",
            Error::InvalidForkPosition(_) => "INVALID_FORK_OFFSET",
            Error::SnapshotNotFound => "SNAPSHOT_NOT_FOUND",
            Error::SnapshotConflict => "SNAPSHOT_CONFLICT",
            Error::SnapshotStale { .. } => "SNAPSHOT_STALE",
            Error::SnapshotMatchFailed { .. } => "SNAPSHOT_MATCH_FAILED",
            Error::InvalidOffset(_) => "INVALID_OFFSET",
            Error::NotOnBoundary(_) => "OFFSET_NOT_ON_BOUNDARY",
            Error::RetentionBeyondSnapshot => "RETENTION_BEYOND_SNAPSHOT",
            Error::SnapshotDeleteRefused => "SNAPSHOT_DELETE_REFUSED",
            Error::SnapshotDigestMismatch { .. } => "SNAPSHOT_DIGEST_MISMATCH",
            Error::UnknownPart { .. } => "UNKNOWN_PART",
            Error::StagedPartsLimit { .. } => "STAGED_PARTS_LIMIT",
            Error::SnapshotCommitInProgress => "SNAPSHOT_COMMIT_IN_PROGRESS",
            Error::Locked(_) => "STORE_LOCKED",
            Error::Corrupt { .. } => "CORRUPT",
            Error::TierUnavailable { .. } => "TIER_UNAVAILABLE",
            Error::Poisoned { source } if source.kind() == std::io::ErrorKind::StorageFull => {
                "INSUFFICIENT_STORAGE"
            }
            Error::Poisoned { .. } => "POISONED",
            Error::OutcomeUnknown { .. } => "OUTCOME_UNKNOWN",
            Error::ShutDown => "SHUT_DOWN",
            Error::SubscriptionNotFound => "SUBSCRIPTION_NOT_FOUND",
            Error::SubscriptionExists => "SUBSCRIPTION_ALREADY_EXISTS",
            Error::SubscriptionLimit { .. } => "SUBSCRIPTION_LIMIT",
            Error::LinkLimit { .. } => "LINK_LIMIT",
            Error::AlreadyClaimed { .. } => "ALREADY_CLAIMED",
            Error::NoPendingWork => "NO_PENDING_WORK",
            Error::Fenced => "FENCED",
            Error::InvalidAckOffset(_) => "INVALID_OFFSET",
            Error::Io(_) => "IO_ERROR",
        }
    }
}

/// The bound a staged snapshot part reached ([`Error::StagedPartsLimit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StagedLimit {
    /// The stream holds this many unused parts.
    Parts(u64),
    /// The part would take the stream's unused parts above this many bytes.
    Bytes(u64),
    /// The part would take every stream's unused parts together above this many bytes.
    StoreBytes(u64),
    /// The part would take its tenant's unused parts above this many bytes
    /// ([`Options::with_max_staged_bytes_per_tenant`](crate::Options::with_max_staged_bytes_per_tenant)).
    TenantBytes(u64),
}

impl std::fmt::Display for StagedLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StagedLimit::Parts(n) => write!(f, "the stream holds {n} unused parts"),
            StagedLimit::Bytes(n) => write!(f, "the stream's unused parts would pass {n} bytes"),
            StagedLimit::StoreBytes(n) => {
                write!(f, "the store's unused parts would pass {n} bytes")
            }
            StagedLimit::TenantBytes(n) => {
                write!(f, "the tenant's unused parts would pass {n} bytes")
            }
        }
    }
}

/// Whether `e` is `EMFILE` or `ENFILE`: the process or the system ran out of descriptors.
pub(crate) fn io_out_of_descriptors(e: &std::io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}
