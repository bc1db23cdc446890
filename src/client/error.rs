//! The client's one error type, and the one place that turns a refusal response into it.

use crate::Incarnation;
use crate::headers::{
    PRODUCER_EPOCH, PRODUCER_EXPECTED_SEQ, PRODUCER_RECEIVED_SEQ, STREAM_CLOSED,
    STREAM_EARLIEST_OFFSET, STREAM_INCARNATION, STREAM_NEXT_OFFSET, StreamSeqConflict,
    parse_closed, parse_safe_integer,
};

use super::types::Position;

/// A result whose error is the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error from a caller's callback.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything a request or a recipe can end with besides success.
///
/// The 409s are told apart the way the seed says: only a 409 that carries `Stream-Last-Seq` is a
/// [`StreamSeqConflict`](Error::StreamSeqConflict); a closed stream, a producer sequence gap and a
/// content-type mismatch are their own variants, and a recipe never skips on them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 409 with `Stream-Last-Seq`: the stream's stored Stream-Seq is not below the one sent.
    /// Nothing from the request was committed.
    #[error("Stream-Seq conflict: the stream's last accepted Stream-Seq is \"{last_seq}\"")]
    StreamSeqConflict {
        /// `Stream-Next-Offset`: the stream's tail when it refused.
        tail: Option<Position>,
        /// `Stream-Last-Seq`: the stream's last accepted Stream-Seq.
        last_seq: String,
    },
    /// 412: the stream is not the incarnation this handle knew (it was deleted and recreated,
    /// or, with `current` `None`, it no longer exists). Nothing was applied.
    #[error("{}", incarnation_changed(current.as_ref()))]
    IncarnationChanged {
        /// The stream's current incarnation token, from the 412.
        current: Option<Incarnation>,
    },
    /// 409 with `Stream-Closed: true`: the stream is closed.
    #[error("the stream is closed")]
    StreamClosed {
        /// The stream's final offset.
        tail: Option<Position>,
    },
    /// 409 with `Producer-Expected-Seq`: the producer's sequence number is not the next one.
    #[error("producer sequence gap: the stream expects Producer-Seq {expected}")]
    ProducerSeqGap {
        /// The sequence number the stream accepts next from this producer (and epoch).
        expected: u64,
        /// The sequence number that was sent, when the server said.
        received: Option<u64>,
    },
    /// 403 with `Producer-Epoch`: a newer epoch of this producer id has appended; this writer
    /// is fenced.
    #[error("fenced: producer epoch {current} has taken over this producer id")]
    ProducerEpochStale {
        /// The producer's current epoch.
        current: u64,
    },
    /// 409 `CONTENT_TYPE_MISMATCH`: the request's content type is not the stream's.
    #[error("content type mismatch{}", detail_suffix(detail.as_deref()))]
    ContentTypeMismatch {
        /// The server's explanation.
        detail: Option<String>,
    },
    /// 404: no stream at this URL.
    #[error("stream not found")]
    NotFound,
    /// 410: the stream is gone, or the offset read is before the earliest retained one.
    #[error("gone: the stream was deleted, or the offset is before the earliest retained one")]
    Gone {
        /// `Stream-Earliest-Offset`, when the 410 is for a trimmed offset.
        earliest: Option<Position>,
    },
    /// Any other refusal.
    #[error("the server answered {status}{}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default(), detail_suffix(detail.as_deref()))]
    Http {
        /// The HTTP status.
        status: u16,
        /// The problem+json `code`, if the body had one.
        code: Option<String>,
        /// The problem+json `detail`, if the body had one.
        detail: Option<String>,
    },
    /// The request failed without a complete response (connection refused or reset, timeout,
    /// a body cut short). A write may or may not have been applied.
    #[error("the request failed without a complete response: {0}")]
    Transport(#[source] reqwest::Error),
    /// The server's response does not follow the protocol (a missing `Stream-Next-Offset`, a
    /// JSON body that is not an array, ...).
    #[error("invalid response from the server: {0}")]
    InvalidResponse(String),
    /// The caller passed something the client cannot send.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A recipe was asked to act on a count that was not taken at the tail (a read bounded
    /// short of it). The prefix-count recipe never appends from such a count.
    #[error(
        "refused: the read did not reach the tail (no Stream-Up-To-Date), so its count cannot be trusted"
    )]
    NotAtTail,
    /// A commit with no events: never appended (it would not advance the prefix count).
    #[error("refused: a commit must hold at least one event")]
    EmptyCommit,
    /// The caller's validation callback refused the commit.
    #[error("the commit was refused by its validation: {0}")]
    Rejected(#[source] BoxError),
    /// The stream's stored Stream-Seq is at or above the writer's true count (a seeding PUT or a
    /// counting bug): every retry would answer 409, so the recipe stops.
    #[error(
        "the stream's Stream-Seq \"{last_seq}\" is not below the true count \"{count}\": every commit would be refused"
    )]
    StreamSeqAhead {
        /// The count the writer read (zero-padded, as it would send it).
        count: String,
        /// The stream's last accepted Stream-Seq.
        last_seq: String,
    },
    /// The commit lost the race more times than the recipe allows.
    #[error("gave up after {attempts} attempts lost the race to other writers")]
    TooManyAttempts {
        /// How many appends were refused.
        attempts: u32,
    },
}

fn incarnation_changed(current: Option<&Incarnation>) -> String {
    match current {
        Some(c) => format!("the stream was recreated: its incarnation is now {c}"),
        None => "the stream incarnation this handle knew no longer exists".to_owned(),
    }
}

fn detail_suffix(detail: Option<&str>) -> String {
    detail.map(|d| format!(": {d}")).unwrap_or_default()
}

impl Error {
    /// Whether a write that ended with this error may have been applied: the response was lost
    /// (transport failure) or the server failed (5xx). Retry it with the same guards (the
    /// producer tuple makes the retry a duplicate) or, for a prefix-count commit, read the new
    /// events and look for its operation id first.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            // A request that never reached the server (no connection, unbuildable) did nothing.
            Error::Transport(e) => !(e.is_connect() || e.is_builder()),
            Error::Http { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// [`Error::from_response`] over a response's own headers.
    pub(crate) fn from_reply(
        status: u16,
        headers: &reqwest::header::HeaderMap,
        body: &[u8],
    ) -> Error {
        Error::from_response(
            status,
            |n| {
                headers
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            },
            body,
        )
    }

    /// The refusal a response describes, from its status, a case-insensitive header lookup
    /// and its body (an RFC 9457 problem, when the server sends one).
    pub(crate) fn from_response(
        status: u16,
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> Error {
        let problem: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let member =
            |name: &str| -> Option<serde_json::Value> { problem.as_ref()?.get(name).cloned() };
        let text_member = |name: &str| member(name).and_then(|v| v.as_str().map(str::to_owned));
        let int_member = |name: &str| member(name).and_then(|v| v.as_u64());
        let int_header =
            |name: &str| header(name).and_then(|v| parse_safe_integer(v.trim().as_bytes()));
        let code = text_member("code");
        let detail = text_member("detail");
        match status {
            409 => {
                if let Some(c) = StreamSeqConflict::from_response(status, &header, body) {
                    return Error::StreamSeqConflict {
                        tail: c.tail.map(Position::new),
                        last_seq: c.last_seq,
                    };
                }
                let tail = || {
                    header(STREAM_NEXT_OFFSET)
                        .or_else(|| text_member("tail"))
                        .map(Position::new)
                };
                if parse_closed(header(STREAM_CLOSED).as_deref().map(str::as_bytes))
                    || code.as_deref() == Some("STREAM_CLOSED")
                {
                    return Error::StreamClosed { tail: tail() };
                }
                let expected =
                    int_header(PRODUCER_EXPECTED_SEQ).or_else(|| int_member("expectedSeq"));
                if let Some(expected) = expected {
                    let received =
                        int_header(PRODUCER_RECEIVED_SEQ).or_else(|| int_member("receivedSeq"));
                    return Error::ProducerSeqGap { expected, received };
                }
                if code.as_deref() == Some("CONTENT_TYPE_MISMATCH") {
                    return Error::ContentTypeMismatch { detail };
                }
                Error::Http {
                    status,
                    code,
                    detail,
                }
            }
            412 => {
                let current = header(STREAM_INCARNATION)
                    .or_else(|| text_member("incarnation"))
                    .and_then(|t| Incarnation::new(t.trim()).ok());
                Error::IncarnationChanged { current }
            }
            403 => match int_header(PRODUCER_EPOCH).or_else(|| int_member("currentEpoch")) {
                Some(current) => Error::ProducerEpochStale { current },
                None => Error::Http {
                    status,
                    code,
                    detail,
                },
            },
            404 => Error::NotFound,
            410 => Error::Gone {
                earliest: header(STREAM_EARLIEST_OFFSET)
                    .or_else(|| text_member("earliest"))
                    .map(Position::new),
            },
            _ => Error::Http {
                status,
                code,
                detail,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::STREAM_LAST_SEQ;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn only_a_409_with_last_seq_is_a_stream_seq_conflict() {
        let e = Error::from_response(
            409,
            headers(&[
                (STREAM_NEXT_OFFSET, "0000000000000003_0000000000000030"),
                (STREAM_LAST_SEQ, "00000000000000000002"),
            ]),
            br#"{"code":"STREAM_SEQ_CONFLICT"}"#,
        );
        assert!(
            matches!(&e, Error::StreamSeqConflict { tail: Some(t), last_seq } if last_seq == "00000000000000000002" && t.as_str() == "0000000000000003_0000000000000030"),
            "{e:?}"
        );
        let e = Error::from_response(
            409,
            headers(&[(STREAM_CLOSED, "true")]),
            br#"{"code":"STREAM_CLOSED"}"#,
        );
        assert!(matches!(e, Error::StreamClosed { .. }), "{e:?}");
        let e = Error::from_response(
            409,
            headers(&[(PRODUCER_EXPECTED_SEQ, "4"), (PRODUCER_RECEIVED_SEQ, "6")]),
            b"",
        );
        assert!(
            matches!(
                e,
                Error::ProducerSeqGap {
                    expected: 4,
                    received: Some(6)
                }
            ),
            "{e:?}"
        );
        let e = Error::from_response(
            409,
            headers(&[]),
            br#"{"code":"CONTENT_TYPE_MISMATCH","detail":"d"}"#,
        );
        assert!(matches!(e, Error::ContentTypeMismatch { .. }), "{e:?}");
        // A 409 of any other kind is never taken for a Stream-Seq conflict.
        let e = Error::from_response(409, headers(&[]), br#"{"code":"STREAM_CONFIG_MISMATCH"}"#);
        assert!(
            matches!(e, Error::Http { status: 409, code: Some(ref c), .. } if c == "STREAM_CONFIG_MISMATCH"),
            "{e:?}"
        );
    }

    #[test]
    fn other_statuses_map_to_their_variants() {
        let e = Error::from_response(412, headers(&[(STREAM_INCARNATION, "abc123")]), b"");
        assert!(
            matches!(&e, Error::IncarnationChanged { current: Some(c) } if c.as_str() == "abc123"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "the stream was recreated: its incarnation is now abc123"
        );
        let e = Error::from_response(412, headers(&[]), b"");
        assert!(
            matches!(e, Error::IncarnationChanged { current: None }),
            "{e:?}"
        );
        let e = Error::from_response(403, headers(&[(PRODUCER_EPOCH, "3")]), b"");
        assert!(
            matches!(e, Error::ProducerEpochStale { current: 3 }),
            "{e:?}"
        );
        // A 403 without Producer-Epoch (say, from an auth proxy) is not a fence.
        let e = Error::from_response(403, headers(&[]), b"forbidden");
        assert!(matches!(e, Error::Http { status: 403, .. }), "{e:?}");
        assert!(matches!(
            Error::from_response(404, headers(&[]), b""),
            Error::NotFound
        ));
        let e = Error::from_response(410, headers(&[(STREAM_EARLIEST_OFFSET, "x")]), b"");
        assert!(matches!(e, Error::Gone { earliest: Some(_) }), "{e:?}");
        let e = Error::from_response(503, headers(&[]), br#"{"code":"SHUT_DOWN","detail":"bye"}"#);
        assert!(e.outcome_unknown());
        assert_eq!(e.to_string(), "the server answered 503 SHUT_DOWN: bye");
        let e = Error::from_response(400, headers(&[]), b"");
        assert!(!e.outcome_unknown());
    }
}
