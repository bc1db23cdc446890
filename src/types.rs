//! The requests a store takes and the outcomes it answers with.

use std::fmt;
use std::io::Read;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::digest::{BodyDigest, TailMatch};
use crate::name::{Incarnation, Offset, ReadFrom, StreamName};

/// The preconditions of an operation that carries nothing else ([`Store::head`],
/// [`Store::close`], [`Store::delete`]).
///
/// With `expect` set, the operation applies only if the stream is that incarnation; otherwise it
/// fails with [`Error::IncarnationMismatch`] naming the current one and applies nothing.
/// [`Guard::NONE`] requires nothing.
///
/// [`Store::head`]: crate::Store::head
/// [`Store::close`]: crate::Store::close
/// [`Store::delete`]: crate::Store::delete
/// [`Error::IncarnationMismatch`]: crate::Error::IncarnationMismatch
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Guard {
    /// Apply only if the stream is this incarnation.
    pub expect: Option<Incarnation>,
}

impl Guard {
    /// No precondition.
    pub const NONE: Guard = Guard { expect: None };

    /// Apply only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(incarnation: Incarnation) -> Guard {
        Guard {
            expect: Some(incarnation),
        }
    }
}

impl From<Incarnation> for Guard {
    fn from(incarnation: Incarnation) -> Guard {
        Guard::expect(incarnation)
    }
}

impl From<Option<Incarnation>> for Guard {
    fn from(expect: Option<Incarnation>) -> Guard {
        Guard { expect }
    }
}

/// A request to read a snapshot ([`Store::snapshot`](crate::Store::snapshot)): the latest, or
/// the one at an offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotRequest {
    /// The snapshot's offset; the latest snapshot when `None`.
    pub offset: Option<Offset>,
    /// Answer only if the stream is this incarnation
    /// ([`IncarnationMismatch`](crate::Error::IncarnationMismatch) otherwise).
    pub expect: Option<Incarnation>,
}

impl SnapshotRequest {
    /// The latest snapshot.
    #[must_use]
    pub fn latest() -> Self {
        SnapshotRequest::default()
    }

    /// The snapshot published at `offset`.
    #[must_use]
    pub fn at(offset: Offset) -> Self {
        SnapshotRequest {
            offset: Some(offset),
            expect: None,
        }
    }

    /// Answer only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

/// A request to advance a stream's earliest readable offset
/// ([`Store::set_retention`](crate::Store::set_retention)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionRequest {
    /// The new earliest readable offset: a message boundary at or before the latest snapshot.
    pub offset: Offset,
    /// Apply only if the stream is this incarnation
    /// ([`IncarnationMismatch`](crate::Error::IncarnationMismatch) otherwise, applying nothing).
    pub expect: Option<Incarnation>,
}

impl RetentionRequest {
    /// Retain the stream from `offset` on.
    #[must_use]
    pub fn to(offset: Offset) -> Self {
        RetentionRequest {
            offset,
            expect: None,
        }
    }

    /// Apply only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

/// A request to publish a snapshot ([`Store::publish_snapshot`](crate::Store::publish_snapshot)):
/// a blob, read from `blob` as it is written to disk (never held whole), that represents the
/// stream up to `offset`.
#[non_exhaustive]
pub struct PublishSnapshot<'a> {
    /// The stream offset the snapshot represents: a message boundary or the tail.
    pub offset: Offset,
    /// The blob's media type; `application/octet-stream` when `None`.
    pub content_type: Option<String>,
    /// Where the blob is read from, to its end, as it is written; at most the store's
    /// `max_snapshot_bytes`.
    pub blob: Box<dyn Read + 'a>,
    /// Publish only if the latest snapshot's digest is this value (`Stream-Snapshot-Match`);
    /// [`SnapshotMatchFailed`](crate::Error::SnapshotMatchFailed) otherwise.
    pub if_digest: Option<String>,
    /// Apply only if the stream is this incarnation
    /// ([`IncarnationMismatch`](crate::Error::IncarnationMismatch) otherwise, applying nothing).
    pub expect: Option<Incarnation>,
}

impl<'a> PublishSnapshot<'a> {
    /// A snapshot at `offset` whose blob is read from `blob` (a file, a byte slice, `&mut`
    /// any reader), with no preconditions.
    #[must_use]
    pub fn new(offset: Offset, blob: impl Read + 'a) -> Self {
        PublishSnapshot {
            offset,
            content_type: None,
            blob: Box::new(blob),
            if_digest: None,
            expect: None,
        }
    }

    /// The blob's media type.
    #[must_use]
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Publish only if the latest snapshot's digest is `digest`.
    #[must_use]
    pub fn if_digest(mut self, digest: impl Into<String>) -> Self {
        self.if_digest = Some(digest.into());
        self
    }

    /// Apply only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

impl fmt::Debug for PublishSnapshot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishSnapshot")
            .field("offset", &self.offset)
            .field("content_type", &self.content_type)
            .field("if_digest", &self.if_digest)
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

/// A snapshot part staged by [`Store::stage_snapshot_part`](crate::Store::stage_snapshot_part).
/// Parts are scratch: they are not durable, and opening the store removes any left behind.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StagedPart {
    /// The part's id, which a commit lists: 1 to 64 visible ASCII characters.
    pub id: String,
    /// Its length in bytes.
    pub len: u64,
    /// The incarnation of the stream it was staged for; only a commit on it finds the part.
    pub incarnation: Incarnation,
}

/// A commit of staged parts as one snapshot ([`Store::publish_snapshot_parts`](
/// crate::Store::publish_snapshot_parts)).
#[derive(Clone, Debug)]
pub struct PublishParts {
    /// The stream offset the snapshot represents: a message boundary or the tail.
    pub offset: Offset,
    /// The blob's media type; `application/octet-stream` when `None`.
    pub content_type: Option<String>,
    /// The part ids, in the snapshot's order, each listed once; at most 4096.
    pub parts: Vec<String>,
    /// The digest the assembled snapshot must have (as [`SnapshotInfo::digest`] is computed:
    /// `sha256:` and the hex SHA-256 of the content type, a NUL and the blob).
    pub digest: String,
    /// Apply only if the stream is this incarnation
    /// ([`IncarnationMismatch`](crate::Error::IncarnationMismatch) otherwise, applying nothing).
    pub expect: Option<Incarnation>,
}

/// The outcome of a snapshot publication; durable when it is returned.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Published {
    /// The published snapshot (at the canonical offset).
    pub snapshot: SnapshotInfo,
    /// The stream's state after the call.
    pub stream: StreamInfo,
}

/// When a stream expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Expiry {
    /// Never.
    #[default]
    Never,
    /// After this many whole seconds without a read or a write (HEAD does not count).
    Ttl(u64),
    /// At this instant (kept to the millisecond).
    At(SystemTime),
}

/// Where a fork branches off its source.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForkFrom {
    /// The source stream.
    pub source: StreamName,
    /// The divergence point; the source's tail when `None`.
    pub offset: Option<Offset>,
    /// How far past `offset` the fork still inherits: whole messages on JSON streams, bytes
    /// otherwise. It may not reach past the end of the message that `offset` starts.
    pub sub_offset: u64,
}

impl ForkFrom {
    /// A fork of `source` that diverges at `offset`.
    #[must_use]
    pub fn at(source: StreamName, offset: Offset) -> Self {
        ForkFrom {
            source,
            offset: Some(offset),
            sub_offset: 0,
        }
    }

    /// A fork of `source` that diverges at its tail.
    #[must_use]
    pub fn tail(source: StreamName) -> Self {
        ForkFrom {
            source,
            offset: None,
            sub_offset: 0,
        }
    }

    /// Inherit `n` more messages (JSON) or bytes past the divergence point.
    #[must_use]
    pub fn sub_offset(mut self, n: u64) -> Self {
        self.sub_offset = n;
        self
    }
}

/// A request to create a stream (or fork one). Build it with [`CreateOptions::new`] (a byte
/// stream), [`CreateOptions::json`] or [`CreateOptions::with_content_type`], then the builder
/// methods:
///
/// ```
/// use brook::CreateOptions;
///
/// let req = CreateOptions::json().data("[1,2]").ttl(3600);
/// assert_eq!(req.content_type.as_deref(), Some("application/json"));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Media type; normalized on create. `None` means `application/octet-stream`, or the
    /// source's type for a fork.
    pub content_type: Option<String>,
    /// Expiry; a fork without one inherits its source's.
    pub expiry: Expiry,
    /// Create the stream already closed (with `data` as its whole content).
    pub closed: bool,
    /// Initial content. A JSON array on a JSON stream is flattened one level; `[]` is allowed.
    pub data: Bytes,
    /// Starting Stream-Seq, stored without any check. Ignored when the stream already exists.
    pub stream_seq: Option<String>,
    /// Create a fork of another stream.
    pub fork: Option<ForkFrom>,
    /// Succeed only if the stream exists and is this incarnation (a PUT with Stream-Incarnation).
    pub expect: Option<Incarnation>,
    /// The stream's own retention policy (each unset limit follows the store's default).
    pub retention: crate::RetentionPolicy,
}

impl CreateOptions {
    /// A byte stream (`application/octet-stream`), empty, open, never expiring.
    #[must_use]
    pub fn new() -> Self {
        CreateOptions::default()
    }

    /// An `application/json` stream.
    #[must_use]
    pub fn json() -> Self {
        CreateOptions::with_content_type("application/json")
    }

    /// A stream of media type `content_type` (normalized on create).
    #[must_use]
    pub fn with_content_type(content_type: impl Into<String>) -> Self {
        CreateOptions {
            content_type: Some(content_type.into()),
            ..CreateOptions::default()
        }
    }

    /// Initial content (a JSON array on a JSON stream is flattened one level).
    #[must_use]
    pub fn data(mut self, data: impl Into<Bytes>) -> Self {
        self.data = data.into();
        self
    }

    /// Create the stream already closed.
    #[must_use]
    pub fn closed(mut self) -> Self {
        self.closed = true;
        self
    }

    /// The stream's own retention policy: the store drops its oldest sealed segments past
    /// these limits (see [`RetentionPolicy`](crate::RetentionPolicy)).
    #[must_use]
    pub fn retention(mut self, policy: crate::RetentionPolicy) -> Self {
        self.retention = policy;
        self
    }

    /// Expire after `seconds` without a read or a write.
    #[must_use]
    pub fn ttl(self, seconds: u64) -> Self {
        self.expiry(Expiry::Ttl(seconds))
    }

    /// Expire at the instant `at`.
    #[must_use]
    pub fn expires_at(self, at: SystemTime) -> Self {
        self.expiry(Expiry::At(at))
    }

    /// Expire as `expiry` says.
    #[must_use]
    pub fn expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = expiry;
        self
    }

    /// The starting Stream-Seq.
    #[must_use]
    pub fn stream_seq(mut self, seq: impl Into<String>) -> Self {
        self.stream_seq = Some(seq.into());
        self
    }

    /// Create a fork of another stream.
    #[must_use]
    pub fn fork(mut self, from: ForkFrom) -> Self {
        self.fork = Some(from);
        self
    }

    /// Succeed only if the stream exists and is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

/// The outcome of a create.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Created {
    /// `true` when this call created the stream; `false` when it already existed as requested.
    pub created: bool,
    /// The stream's state after the call.
    pub info: StreamInfo,
}

/// An idempotent producer's identity and position (the Producer-Id/-Epoch/-Seq headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Producer {
    /// Stable producer id, 1 to 256 bytes.
    pub id: String,
    /// Epoch; a higher one fences older ones.
    pub epoch: u64,
    /// Sequence number within the epoch, from 0, one per append.
    pub seq: u64,
}

impl Producer {
    /// Producer `id` at `epoch`, sending its append number `seq` of that epoch.
    #[must_use]
    pub fn new(id: impl Into<String>, epoch: u64, seq: u64) -> Self {
        Producer {
            id: id.into(),
            epoch,
            seq,
        }
    }
}

/// A request to append (and/or close). Build it with [`AppendRequest::new`] or
/// [`AppendRequest::close`], then the builder methods:
///
/// ```
/// use brook::{AppendRequest, Producer};
///
/// let req = AppendRequest::new("hello")
///     .stream_seq("00000000000000000001")
///     .producer(Producer::new("writer-1", 0, 0));
/// assert!(!req.close);
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct AppendRequest {
    /// The bytes (or JSON text) to append. Empty only together with `close`.
    pub data: Bytes,
    /// The request's media type; checked against the stream's when `data` is not empty.
    pub content_type: Option<String>,
    /// Close the stream atomically after this append.
    pub close: bool,
    /// Compare-and-set value: accepted only if bytewise greater than the stored one. Values with
    /// bytes outside printable ASCII are ignored, as if absent; longer than 256 bytes is refused.
    pub stream_seq: Option<String>,
    /// Exactly-once producer identity.
    pub producer: Option<Producer>,
    /// The digest of `data` the producer sent with its key (Ursula 0.11's `Producer-Digest`):
    /// kept with the producer's claim (seq 0) and newest write, so that a retry under the same
    /// key with another digest, or with none where one was kept (and the reverse), is refused
    /// with [`Error::ProducerKeyConflict`] instead of answered as a duplicate; a write that would
    /// apply is refused with [`Error::ProducerDigestMismatch`] when `data` does not hash to it.
    /// Needs `producer`.
    ///
    /// [`Error::ProducerKeyConflict`]: crate::Error::ProducerKeyConflict
    /// [`Error::ProducerDigestMismatch`]: crate::Error::ProducerDigestMismatch
    pub producer_digest: Option<BodyDigest>,
    /// Apply only if the stream is this incarnation.
    pub expect: Option<Incarnation>,
    /// Apply only if the stream's tail is this one (brook's extension; see [`TailMatch`]).
    pub expect_tail: Option<TailMatch>,
}

impl AppendRequest {
    /// An append of `data` (bytes, or JSON text on a JSON stream).
    #[must_use]
    pub fn new(data: impl Into<Bytes>) -> Self {
        AppendRequest {
            data: data.into(),
            ..AppendRequest::default()
        }
    }

    /// A request that only closes the stream (idempotent).
    #[must_use]
    pub fn close() -> Self {
        AppendRequest {
            close: true,
            ..AppendRequest::default()
        }
    }

    /// Close the stream atomically after this append.
    #[must_use]
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// The request's media type, checked against the stream's.
    #[must_use]
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Append only if `seq` is bytewise greater than the stream's last Stream-Seq.
    #[must_use]
    pub fn stream_seq(mut self, seq: impl Into<String>) -> Self {
        self.stream_seq = Some(seq.into());
        self
    }

    /// Append as this idempotent producer (retries are answered as duplicates).
    #[must_use]
    pub fn producer(mut self, producer: Producer) -> Self {
        self.producer = Some(producer);
        self
    }

    /// Send `digest` as the producer write's identity (see [`AppendRequest::producer_digest`]).
    #[must_use]
    pub fn producer_digest(mut self, digest: BodyDigest) -> Self {
        self.producer_digest = Some(digest);
        self
    }

    /// Apply only if the stream's tail is as `tail` says (see [`TailMatch`]).
    #[must_use]
    pub fn expect_tail(mut self, tail: TailMatch) -> Self {
        self.expect_tail = Some(tail);
        self
    }

    /// Apply only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

/// What an accepted append did. More outcomes may be added: match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendStatus {
    /// The data (and/or close) was appended.
    Appended,
    /// A retry of a write this producer already made: nothing was appended.
    Duplicate {
        /// The original write's tail, when the retry repeats the producer's newest write.
        original_tail: Option<Offset>,
    },
    /// A close-only request on a stream that was already closed.
    AlreadyClosed,
}

/// The outcome of an accepted append. When it is returned the append is durable as the store's
/// [`Durability`](crate::Durability) promises.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AppendOutcome {
    /// What happened.
    pub status: AppendStatus,
    /// The stream's tail after the call.
    pub tail: Offset,
    /// Whether the stream is closed after the call.
    pub closed: bool,
    /// For a producer append: its epoch and the highest sequence accepted in it.
    pub producer: Option<(u64, u64)>,
    /// The stream's incarnation.
    pub incarnation: Incarnation,
}

/// A read request: [`ReadRequest::from`] a start, then the builder methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadRequest {
    /// Where to start.
    pub from: ReadFrom,
    /// Upper bound on the body; the store's `max_read_bytes` when `None`.
    pub max_bytes: Option<u64>,
    /// Answer only if the stream is this incarnation.
    pub expect: Option<Incarnation>,
    /// End on a message boundary (at least one whole message) in a byte stream too, as every
    /// JSON read does: with `max_bytes` of 1, the read returns exactly one message.
    pub whole_messages: bool,
}

impl ReadRequest {
    /// A read from `from` with default bounds.
    #[must_use]
    pub fn from(from: ReadFrom) -> Self {
        ReadRequest {
            from,
            max_bytes: None,
            expect: None,
            whole_messages: false,
        }
    }

    /// End on a message boundary in a byte stream too (see [`ReadRequest::whole_messages`]).
    #[must_use]
    pub fn whole_messages(mut self) -> Self {
        self.whole_messages = true;
        self
    }

    /// Return at most about `n` body bytes (a JSON read returns at least one whole message).
    #[must_use]
    pub fn max_bytes(mut self, n: u64) -> Self {
        self.max_bytes = Some(n);
        self
    }

    /// Answer only if the stream is `incarnation`.
    #[must_use]
    pub fn expect(mut self, incarnation: Incarnation) -> Self {
        self.expect = Some(incarnation);
        self
    }
}

/// A chunk of a stream, as a read answers it. Only durable data is ever returned.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadChunk {
    /// Where the chunk starts.
    pub start: Offset,
    /// Where the next read continues.
    pub next: Offset,
    /// The body, in pieces that are views of the stream's files (no copy). For JSON streams it is
    /// the JSON array of the messages in the chunk (`[]` when there are none).
    pub body: Vec<Bytes>,
    /// Data bytes covered (excluding JSON brackets).
    pub data_len: u64,
    /// Whether `next` is the tail when the chunk was read.
    pub up_to_date: bool,
    /// Whether the stream is closed and `next` is its final offset.
    pub closed: bool,
    /// The stream's content type.
    pub content_type: String,
    /// The stream's incarnation.
    pub incarnation: Incarnation,
}

impl ReadChunk {
    /// Total body length in bytes.
    pub fn body_len(&self) -> usize {
        self.body.iter().map(Bytes::len).sum()
    }

    /// The body in one buffer (copies when it has several pieces).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.body_len());
        for b in &self.body {
            v.extend_from_slice(b);
        }
        v
    }
}

/// A stream's metadata, as HEAD answers it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StreamInfo {
    /// The stream's name.
    pub name: StreamName,
    /// Normalized content type.
    pub content_type: String,
    /// Tail offset (durable).
    pub tail: Offset,
    /// Whether the stream is closed.
    pub closed: bool,
    /// The stream's expiry setting.
    pub expiry: Expiry,
    /// When the stream expires if nothing touches it (TTL) or at all (absolute).
    pub expires_at: Option<SystemTime>,
    /// The incarnation token.
    pub incarnation: Incarnation,
    /// Earliest readable offset (moves with retention).
    pub earliest: Offset,
    /// The stream's own retention policy, as created (the store's default is not merged in:
    /// see [`Options::retention_default`](crate::Options::retention_default)).
    pub retention: crate::RetentionPolicy,
    /// The latest published snapshot.
    pub snapshot: Option<SnapshotInfo>,
    /// The source and divergence point, for a fork.
    pub fork: Option<(StreamName, Offset)>,
    /// The last accepted Stream-Seq.
    pub stream_seq: Option<String>,
}

impl StreamInfo {
    /// The TTL in seconds, for a TTL stream.
    pub fn ttl(&self) -> Option<Duration> {
        match self.expiry {
            Expiry::Ttl(s) => Some(Duration::from_secs(s)),
            _ => None,
        }
    }
}

/// A published snapshot's description.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The stream offset the snapshot represents (a message boundary).
    pub offset: Offset,
    /// `sha256:` and the hex SHA-256 of the content type, a NUL, and the blob.
    pub digest: String,
    /// The blob's media type.
    pub content_type: String,
    /// The blob's length in bytes.
    pub len: u64,
}

/// A snapshot with its blob.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Snapshot {
    /// Its description.
    pub info: SnapshotInfo,
    /// The blob (a view of the snapshot's file).
    pub data: Bytes,
    /// The stream's tail when it was read.
    pub tail: Offset,
    /// Whether the stream is closed.
    pub closed: bool,
    /// The stream's incarnation.
    pub incarnation: Incarnation,
}

/// One message of a stream with the offsets around it, as bootstrap uses them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Message {
    /// Offset where the message starts.
    pub start: Offset,
    /// The message: one append's bytes, or one JSON value's text.
    pub data: Bytes,
}
