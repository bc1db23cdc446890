//! The protocol's header names as [`HeaderName`] constants (built at compile time from the
//! lower-case names of [`crate::headers`]), so neither a request lookup nor a response insert
//! parses a name; and the static header values every response shares.

use axum::http::{HeaderName, HeaderValue};

use crate::headers;

/// [`headers::STREAM_NEXT_OFFSET`].
pub(crate) const STREAM_NEXT_OFFSET: HeaderName =
    HeaderName::from_static(headers::STREAM_NEXT_OFFSET);
/// [`headers::STREAM_UP_TO_DATE`].
pub(crate) const STREAM_UP_TO_DATE: HeaderName =
    HeaderName::from_static(headers::STREAM_UP_TO_DATE);
/// [`headers::STREAM_CLOSED`].
pub(crate) const STREAM_CLOSED: HeaderName = HeaderName::from_static(headers::STREAM_CLOSED);
/// [`headers::STREAM_CURSOR`].
pub(crate) const STREAM_CURSOR: HeaderName = HeaderName::from_static(headers::STREAM_CURSOR);
/// [`headers::STREAM_LAST_SEQ`].
pub(crate) const STREAM_LAST_SEQ: HeaderName = HeaderName::from_static(headers::STREAM_LAST_SEQ);
/// [`headers::STREAM_INCARNATION`].
pub(crate) const STREAM_INCARNATION: HeaderName =
    HeaderName::from_static(headers::STREAM_INCARNATION);
/// [`headers::STREAM_TTL`].
pub(crate) const STREAM_TTL: HeaderName = HeaderName::from_static(headers::STREAM_TTL);
/// [`headers::STREAM_EXPIRES_AT`].
pub(crate) const STREAM_EXPIRES_AT: HeaderName =
    HeaderName::from_static(headers::STREAM_EXPIRES_AT);
/// [`headers::STREAM_FORKED_FROM`].
pub(crate) const STREAM_FORKED_FROM: HeaderName =
    HeaderName::from_static(headers::STREAM_FORKED_FROM);
/// [`headers::STREAM_FORK_OFFSET`].
pub(crate) const STREAM_FORK_OFFSET: HeaderName =
    HeaderName::from_static(headers::STREAM_FORK_OFFSET);
/// [`headers::STREAM_FORK_SUB_OFFSET`].
pub(crate) const STREAM_FORK_SUB_OFFSET: HeaderName =
    HeaderName::from_static(headers::STREAM_FORK_SUB_OFFSET);
/// [`headers::STREAM_SSE_DATA_ENCODING`].
pub(crate) const STREAM_SSE_DATA_ENCODING: HeaderName =
    HeaderName::from_static(headers::STREAM_SSE_DATA_ENCODING);
/// [`headers::STREAM_EARLIEST_OFFSET`].
pub(crate) const STREAM_EARLIEST_OFFSET: HeaderName =
    HeaderName::from_static(headers::STREAM_EARLIEST_OFFSET);
/// [`headers::STREAM_SNAPSHOT_OFFSET`].
pub(crate) const STREAM_SNAPSHOT_OFFSET: HeaderName =
    HeaderName::from_static(headers::STREAM_SNAPSHOT_OFFSET);
/// [`headers::STREAM_SNAPSHOT_DIGEST`].
pub(crate) const STREAM_SNAPSHOT_DIGEST: HeaderName =
    HeaderName::from_static(headers::STREAM_SNAPSHOT_DIGEST);
/// [`headers::STREAM_SNAPSHOT_MATCH`].
pub(crate) const STREAM_SNAPSHOT_MATCH: HeaderName =
    HeaderName::from_static(headers::STREAM_SNAPSHOT_MATCH);
/// [`headers::PRODUCER_EPOCH`].
pub(crate) const PRODUCER_EPOCH: HeaderName = HeaderName::from_static(headers::PRODUCER_EPOCH);
/// [`headers::PRODUCER_SEQ`].
pub(crate) const PRODUCER_SEQ: HeaderName = HeaderName::from_static(headers::PRODUCER_SEQ);
/// [`headers::PRODUCER_EXPECTED_SEQ`].
pub(crate) const PRODUCER_EXPECTED_SEQ: HeaderName =
    HeaderName::from_static(headers::PRODUCER_EXPECTED_SEQ);
/// [`headers::PRODUCER_RECEIVED_SEQ`].
pub(crate) const PRODUCER_RECEIVED_SEQ: HeaderName =
    HeaderName::from_static(headers::PRODUCER_RECEIVED_SEQ);
/// [`headers::PRODUCER_OUTCOME`].
pub(crate) const PRODUCER_OUTCOME: HeaderName = HeaderName::from_static(headers::PRODUCER_OUTCOME);

/// `X-Content-Type-Options` (PROTOCOL.md 12.7).
pub(crate) const X_CONTENT_TYPE_OPTIONS: HeaderName =
    HeaderName::from_static("x-content-type-options");
/// `Cross-Origin-Resource-Policy` (PROTOCOL.md 12.7).
pub(crate) const CROSS_ORIGIN_RESOURCE_POLICY: HeaderName =
    HeaderName::from_static("cross-origin-resource-policy");

/// `true`, the value of every flag header.
pub(crate) const TRUE: HeaderValue = HeaderValue::from_static("true");
/// `X-Accel-Buffering: no` on SSE responses (nginx must not buffer them).
pub(crate) const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// `Stream-Immutable: true`: an answer of an incarnation's chunk or snapshot that never
/// changes (Ursula 0.11).
pub(crate) const STREAM_IMMUTABLE: HeaderName = HeaderName::from_static("stream-immutable");
/// `Stream-Offset`: the first offset an incarnation chunk's body holds (Ursula 0.11).
pub(crate) const STREAM_OFFSET: HeaderName = HeaderName::from_static("stream-offset");
/// `Stream-Snapshot-Part`: the id of a staged snapshot part (Ursula 0.11).
pub(crate) const STREAM_SNAPSHOT_PART: HeaderName = HeaderName::from_static("stream-snapshot-part");
/// `Stream-Snapshot-Parts`: how many parts a snapshot commit lists (Ursula 0.11).
pub(crate) const STREAM_SNAPSHOT_PARTS: HeaderName =
    HeaderName::from_static("stream-snapshot-parts");
/// `Ursula-Max-Staged-Parts`: the staged-parts bound a 429 names (Ursula 0.11).
pub(crate) const URSULA_MAX_STAGED_PARTS: HeaderName =
    HeaderName::from_static("ursula-max-staged-parts");
/// `Ursula-Max-Staged-Bytes`: the staged-bytes bound a 429 names (Ursula 0.11).
pub(crate) const URSULA_MAX_STAGED_BYTES: HeaderName =
    HeaderName::from_static("ursula-max-staged-bytes");
