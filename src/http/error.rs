//! Every refusal as an RFC 9457 `application/problem+json` response; the one place that maps an
//! engine [`Error`] to an HTTP status and the headers the protocol names for it.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Error;
use crate::headers::InvalidHeader;

use super::names::{
    PRODUCER_EPOCH, PRODUCER_EXPECTED_SEQ, PRODUCER_OUTCOME, PRODUCER_RECEIVED_SEQ, STREAM_CLOSED,
    STREAM_EARLIEST_OFFSET, STREAM_INCARNATION, STREAM_LAST_SEQ, STREAM_NEXT_OFFSET,
    STREAM_SNAPSHOT_DIGEST, URSULA_MAX_STAGED_BYTES, URSULA_MAX_STAGED_PARTS,
};
use super::reply::{problem, set_header};

/// What the request was doing when the engine refused it: a few errors answer differently
/// depending on the operation (a `Gone` stream is 410 for a read but 409 for a re-creating PUT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// GET of a stream, HEAD, DELETE, bootstrap, snapshot reads.
    Read,
    /// PUT of a stream (create or fork).
    Create,
    /// POST (append or close).
    Append,
    /// Snapshot publish or delete, retention.
    Snapshot,
}

/// A refused request.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The engine refused it.
    Store(Error, Op),
    /// The HTTP layer refused it before it reached the engine.
    Http {
        /// The status.
        status: StatusCode,
        /// The problem's `code` member.
        code: &'static str,
        /// The problem's `detail` member.
        detail: String,
    },
    /// 503 with `Retry-After`: a limit of the server's is reached (`limits.rs`).
    Unavailable {
        /// The problem's `code` member.
        code: &'static str,
        /// The problem's `detail` member.
        detail: String,
        /// Seconds to wait, for `Retry-After`.
        retry_after: u32,
    },
    /// The method is not served on this route; `allow` lists the ones that are.
    MethodNotAllowed {
        /// The `Allow` header's value.
        allow: &'static str,
    },
}

impl ApiError {
    /// 400 with `code`.
    pub(crate) fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        ApiError::Http {
            status: StatusCode::BAD_REQUEST,
            code,
            detail: detail.into(),
        }
    }

    /// 413: a body over the configured limit.
    pub(crate) fn too_large(limit: u64) -> Self {
        ApiError::Http {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "PAYLOAD_TOO_LARGE",
            detail: format!("the request body is larger than this server's limit of {limit} bytes"),
        }
    }

    /// 408 `REQUEST_TIMEOUT`: the request body delivered nothing for `idle`.
    pub(crate) fn body_timeout(idle: std::time::Duration) -> Self {
        ApiError::Http {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "REQUEST_TIMEOUT",
            detail: format!(
                "the request body delivered no bytes for {} ms; nothing was written",
                idle.as_millis()
            ),
        }
    }

    /// 408 `BODY_TOO_SLOW`: the request body delivered less than `rate` bytes per second over
    /// its last `window` once its grace period had passed (`pace.rs`).
    pub(crate) fn body_too_slow(rate: u64, window: std::time::Duration) -> Self {
        ApiError::Http {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "BODY_TOO_SLOW",
            detail: format!(
                "the request body delivered less than {rate} bytes per second over its last {} \
                 ms; nothing was written",
                window.as_millis()
            ),
        }
    }

    /// 408 `BODY_DEADLINE`: the request body was still arriving `deadline` after it began.
    pub(crate) fn body_deadline(deadline: std::time::Duration) -> Self {
        ApiError::Http {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "BODY_DEADLINE",
            detail: format!(
                "the request body was not whole {} ms after it began; nothing was written",
                deadline.as_millis()
            ),
        }
    }

    /// 404 `NOT_FOUND` for a path under a reserved prefix that no route serves.
    pub(crate) fn no_such_route(path: &str) -> Self {
        ApiError::Http {
            status: StatusCode::NOT_FOUND,
            code: "NOT_FOUND",
            detail: format!("no route serves {path}"),
        }
    }

    /// 500 for a failure inside the server (a panicked worker), without internals.
    pub(crate) fn internal(what: &str) -> Self {
        tracing::error!("internal error: {what}");
        ApiError::Http {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "INTERNAL_ERROR",
            detail: "the server failed to process the request".into(),
        }
    }
}

impl From<InvalidHeader> for ApiError {
    /// A refused header is 400: `INVALID_OFFSET` for an `offset`, `INVALID_ARGUMENT` otherwise.
    fn from(e: InvalidHeader) -> Self {
        let code = if e.name == "offset" {
            "INVALID_OFFSET"
        } else {
            "INVALID_ARGUMENT"
        };
        ApiError::bad_request(code, e.to_string())
    }
}

/// The status for an engine error, given what the request was doing.
pub(crate) fn status_of(err: &Error, op: Op) -> StatusCode {
    use StatusCode as S;
    match err {
        Error::NotFound => S::NOT_FOUND,
        // A soft-deleted stream is 410 for every operation on it, but its path cannot be
        // re-created: a PUT answers 409 (PROTOCOL.md 4.2).
        Error::Gone if op == Op::Create => S::CONFLICT,
        Error::Gone => S::GONE,
        Error::ConfigMismatch(_) => S::CONFLICT,
        Error::IncarnationMismatch { .. } | Error::IncarnationMissing => S::PRECONDITION_FAILED,
        Error::StreamClosed { .. } => S::CONFLICT,
        Error::ContentTypeMismatch { .. } => S::CONFLICT,
        Error::StreamSeqConflict { .. } => S::CONFLICT,
        Error::ProducerSeqGap { .. } => S::CONFLICT,
        Error::ProducerEpochStale { .. } => S::FORBIDDEN,
        Error::ProducerEpochSeqNotZero => S::BAD_REQUEST,
        Error::ProducerKeyConflict { .. } => S::FORBIDDEN,
        Error::ProducerDigestMismatch => S::BAD_REQUEST,
        // Only with `--append-if-match`: a 412 that is not the seed's incarnation 412, told apart
        // by its code (docs/http.md, "If-Match on appends").
        Error::TailMoved { .. } => S::PRECONDITION_FAILED,
        Error::InvalidJson(_) | Error::EmptyJsonArray | Error::EmptyAppend => S::BAD_REQUEST,
        Error::InvalidArgument(_) => S::BAD_REQUEST,
        Error::TooLarge(_) => S::PAYLOAD_TOO_LARGE,
        Error::OffsetGone { .. } => S::GONE,
        // Past the tail: 416 for a read; a fork position is a bad argument (400, PROTOCOL.md
        // 5.1); a snapshot or retention offset is out of the stream's range (409, as Ursula).
        Error::OffsetBeyondTail { .. } => match op {
            Op::Read => S::RANGE_NOT_SATISFIABLE,
            Op::Create | Op::Append => S::BAD_REQUEST,
            Op::Snapshot => S::CONFLICT,
        },
        Error::ForkSourceNotFound => S::NOT_FOUND,
        Error::ForkSourceGone | Error::ForkTooDeep { .. } => S::CONFLICT,
        Error::InvalidForkPosition(_) => S::BAD_REQUEST,
        Error::SnapshotNotFound => S::NOT_FOUND,
        Error::SnapshotConflict | Error::SnapshotStale { .. } => S::CONFLICT,
        Error::SnapshotMatchFailed { .. } => S::CONFLICT,
        Error::NotOnBoundary(_) | Error::InvalidOffset(_) => S::BAD_REQUEST,
        Error::RetentionBeyondSnapshot => S::CONFLICT,
        Error::SnapshotDeleteRefused => S::CONFLICT,
        Error::SnapshotDigestMismatch { .. } | Error::UnknownPart { .. } => S::BAD_REQUEST,
        Error::StagedPartsLimit { .. } => S::TOO_MANY_REQUESTS,
        Error::SnapshotCommitInProgress => S::SERVICE_UNAVAILABLE,
        Error::Poisoned { source } if source.kind() == std::io::ErrorKind::StorageFull => {
            S::INSUFFICIENT_STORAGE
        }
        Error::Locked(_)
        | Error::Poisoned { .. }
        | Error::OutcomeUnknown { .. }
        | Error::ShutDown
        | Error::TierUnavailable { .. }
        | Error::TooManyOpenStreams { .. }
        | Error::TooManyOpenFiles => S::SERVICE_UNAVAILABLE,
        Error::Corrupt { .. } | Error::Io(_) => S::INTERNAL_SERVER_ERROR,
        Error::SubscriptionNotFound => S::NOT_FOUND,
        // As `STAGED_PARTS_LIMIT`: a bound on what a tenant holds, which deleting frees.
        Error::SubscriptionLimit { .. } | Error::LinkLimit { .. } => S::TOO_MANY_REQUESTS,
        Error::SubscriptionExists
        | Error::AlreadyClaimed { .. }
        | Error::NoPendingWork
        | Error::Fenced
        | Error::InvalidAckOffset(_) => S::CONFLICT,
    }
}

/// The protocol headers an engine error answers with, and the extension members of its problem
/// body (so a client behind a header-stripping proxy can still act on it).
fn error_details(
    err: &Error,
    headers: &mut HeaderMap,
    extra: &mut serde_json::Map<String, serde_json::Value>,
) {
    use serde_json::Value;
    match err {
        // Both pass as soon as a stream closes or a descriptor frees: a second or so.
        Error::TooManyOpenStreams { .. } | Error::TooManyOpenFiles => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(1u32));
        }
        Error::IncarnationMismatch { current } => {
            set_header(headers, STREAM_INCARNATION, current.as_str());
            extra.insert("incarnation".into(), Value::from(current.as_str()));
        }
        Error::StreamClosed { tail } => {
            set_header(headers, STREAM_CLOSED, "true");
            set_header(headers, STREAM_NEXT_OFFSET, &tail.to_string());
            extra.insert("tail".into(), Value::from(tail.to_string()));
        }
        // The seed: a Stream-Seq 409 carries Stream-Next-Offset and Stream-Last-Seq, and neither
        // Stream-Closed nor Producer-Expected-Seq.
        Error::StreamSeqConflict { tail, last_seq } => {
            set_header(headers, STREAM_NEXT_OFFSET, &tail.to_string());
            set_header(headers, STREAM_LAST_SEQ, last_seq);
            extra.insert("tail".into(), Value::from(tail.to_string()));
            extra.insert("lastSeq".into(), Value::from(last_seq.as_str()));
        }
        Error::ProducerSeqGap { expected, received } => {
            set_header(headers, PRODUCER_EXPECTED_SEQ, &expected.to_string());
            set_header(headers, PRODUCER_RECEIVED_SEQ, &received.to_string());
            extra.insert("expectedSeq".into(), Value::from(*expected));
            extra.insert("receivedSeq".into(), Value::from(*received));
        }
        Error::ProducerEpochStale { current } => {
            set_header(headers, PRODUCER_EPOCH, &current.to_string());
            extra.insert("currentEpoch".into(), Value::from(*current));
        }
        // Ursula 0.11: a key conflict names the producer's epoch and its outcome.
        Error::ProducerKeyConflict { epoch } => {
            set_header(headers, PRODUCER_EPOCH, &epoch.to_string());
            set_header(headers, PRODUCER_OUTCOME, "key-conflict");
            extra.insert("currentEpoch".into(), Value::from(*epoch));
        }
        // The tail's entity tag, which a retry sends back as its `If-Match`.
        Error::TailMoved {
            incarnation,
            tail,
            closed,
        } => {
            let tag = super::if_match::tail_tag(incarnation, *tail, *closed);
            set_header(headers, header::ETAG, &tag);
            set_header(headers, STREAM_NEXT_OFFSET, &tail.to_string());
            if *closed {
                set_header(headers, STREAM_CLOSED, "true");
            }
            extra.insert("etag".into(), Value::from(tag));
            extra.insert("tail".into(), Value::from(tail.to_string()));
        }
        Error::OffsetGone { earliest } => {
            set_header(headers, STREAM_EARLIEST_OFFSET, &earliest.to_string());
            extra.insert("earliest".into(), Value::from(earliest.to_string()));
        }
        Error::OffsetBeyondTail { tail } => {
            set_header(headers, STREAM_NEXT_OFFSET, &tail.to_string());
            extra.insert("tail".into(), Value::from(tail.to_string()));
        }
        Error::SnapshotMatchFailed {
            current: Some(digest),
        } => {
            set_header(headers, STREAM_SNAPSHOT_DIGEST, digest);
        }
        Error::SnapshotDigestMismatch { assembled } => {
            extra.insert("assembled".into(), Value::from(assembled.as_str()));
        }
        Error::UnknownPart { part } => {
            extra.insert("part".into(), Value::from(part.as_str()));
        }
        // Ursula's headers name the bound; no Retry-After, since waiting does not free it.
        // `scope` says whose bound it is: the stream's, the tenant's or the store's.
        Error::StagedPartsLimit { limit } => {
            let (name, n, scope) = match *limit {
                crate::StagedLimit::Parts(n) => (URSULA_MAX_STAGED_PARTS, n, "stream"),
                crate::StagedLimit::Bytes(n) => (URSULA_MAX_STAGED_BYTES, n, "stream"),
                crate::StagedLimit::TenantBytes(n) => (URSULA_MAX_STAGED_BYTES, n, "tenant"),
                crate::StagedLimit::StoreBytes(n) => (URSULA_MAX_STAGED_BYTES, n, "store"),
            };
            set_header(headers, name, &n.to_string());
            extra.insert("scope".into(), Value::from(scope));
        }
        Error::SnapshotCommitInProgress => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(1u32));
        }
        // The bound, so a client can tell it from a rate limit; no Retry-After, since waiting
        // does not free it.
        Error::SubscriptionLimit { limit } | Error::LinkLimit { limit } => {
            extra.insert("limit".into(), Value::from(*limit));
        }
        // PROTOCOL.md 7.2: the holder and generation go in the `error` member.
        Error::AlreadyClaimed { holder, generation } => {
            extra.insert(
                "error".into(),
                serde_json::json!({
                    "code": err.code(),
                    "current_holder": holder,
                    "generation": generation,
                }),
            );
        }
        _ => {}
    }
}

/// Whether the error is the server's own failure: its detail is logged, never sent.
fn is_internal(err: &Error) -> bool {
    !matches!(err, Error::SnapshotCommitInProgress) && status_of(err, Op::Read).is_server_error()
}

/// The problem `code` of an engine refusal during `op`.
fn store_code(err: &Error, op: Op) -> &'static str {
    match (err, op) {
        (Error::OffsetBeyondTail { .. }, Op::Create) => "INVALID_FORK_OFFSET",
        _ => err.code(),
    }
}

impl ApiError {
    /// The problem body's `code` member.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            ApiError::Store(err, op) => store_code(err, *op),
            ApiError::Http { code, .. } | ApiError::Unavailable { code, .. } => code,
            ApiError::MethodNotAllowed { .. } => "METHOD_NOT_ALLOWED",
        }
    }
}

impl IntoResponse for ApiError {
    /// The problem+json response, with the headers the protocol names for the error; a server
    /// failure's detail is logged, never sent.
    fn into_response(self) -> Response {
        match self {
            ApiError::Store(err, op) => {
                let status = status_of(&err, op);
                let mut headers = HeaderMap::new();
                let mut extra = serde_json::Map::new();
                error_details(&err, &mut headers, &mut extra);
                let detail = if is_internal(&err) {
                    tracing::error!(error = %err, "storage failure");
                    "the server could not complete the request because of a storage failure"
                        .to_owned()
                } else {
                    err.to_string()
                };
                problem(status, store_code(&err, op), &detail, headers, extra)
            }
            ApiError::Http {
                status,
                code,
                detail,
            } => problem(
                status,
                code,
                &detail,
                HeaderMap::new(),
                serde_json::Map::new(),
            ),
            ApiError::Unavailable {
                code,
                detail,
                retry_after,
            } => {
                let mut headers = HeaderMap::new();
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code,
                    &detail,
                    headers,
                    serde_json::Map::new(),
                )
            }
            ApiError::MethodNotAllowed { allow } => {
                let mut headers = HeaderMap::new();
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
                problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "METHOD_NOT_ALLOWED",
                    &format!("this route serves only {allow}"),
                    headers,
                    serde_json::Map::new(),
                )
            }
        }
    }
}
