//! The wire: Durable Streams header and query names, and typed parsers for their values.
//!
//! Shared by the server (`http` feature) and the client (`client` feature), so nothing here
//! depends on an HTTP library: parsers take the raw value as `&[u8]` or `&str` and return brook
//! types. Header names are lower-case, as HTTP/2 sends them and `http::HeaderName` wants them;
//! HTTP/1 compares them case-insensitively.
//!
//! Parsing rules follow the Durable Streams protocol and the seed's conditional-write contract:
//!
//! | header | accepted | otherwise |
//! |---|---|---|
//! | `Stream-Seq` | printable ASCII (0x20..=0x7E), at most 256 bytes | other bytes: ignored (as if absent); longer: error |
//! | `Producer-Id/-Epoch/-Seq` | all three or none; id 1..=256 bytes of UTF-8; integers ≤ 2^53-1 | error |
//! | `Stream-TTL`, `Stream-Fork-Sub-Offset` | `0` or a decimal without leading zeros, sign, dot or exponent | error |
//! | `Stream-Expires-At` | an RFC 3339 timestamp | error |
//! | `Stream-Closed` | `true`, any case | anything else: absent, never an error |
//! | offsets | `-1`, `now`, or brook's `%016d_%016d` | error |

use std::time::SystemTime;

use crate::name::{Offset, ReadFrom};
use crate::types::Producer;

/// `Stream-Next-Offset`: the tail (or where the next read continues).
pub const STREAM_NEXT_OFFSET: &str = "stream-next-offset";
/// `Stream-Up-To-Date: true`: the response reaches the tail as it was when answered.
pub const STREAM_UP_TO_DATE: &str = "stream-up-to-date";
/// `Stream-Closed: true`: the stream is closed (on a read: and the response reaches its end).
pub const STREAM_CLOSED: &str = "stream-closed";
/// `Stream-Cursor`: the CDN-collapsing cursor of live reads.
pub const STREAM_CURSOR: &str = "stream-cursor";
/// `Stream-Seq`: the writer's compare-and-set value.
pub const STREAM_SEQ: &str = "stream-seq";
/// `Stream-Last-Seq`: the stream's last accepted `Stream-Seq`, on a Stream-Seq 409 only.
pub const STREAM_LAST_SEQ: &str = "stream-last-seq";
/// `Stream-Incarnation`: the token of one incarnation of a stream (request and response).
pub const STREAM_INCARNATION: &str = "stream-incarnation";
/// `Stream-TTL`: sliding time-to-live in seconds.
pub const STREAM_TTL: &str = "stream-ttl";
/// `Stream-Expires-At`: absolute expiry, RFC 3339.
pub const STREAM_EXPIRES_AT: &str = "stream-expires-at";
/// `Stream-Forked-From`: the source path of a fork.
pub const STREAM_FORKED_FROM: &str = "stream-forked-from";
/// `Stream-Fork-Offset`: the fork's divergence point in its source.
pub const STREAM_FORK_OFFSET: &str = "stream-fork-offset";
/// `Stream-Fork-Sub-Offset`: messages (JSON) or bytes inherited past `Stream-Fork-Offset`.
pub const STREAM_FORK_SUB_OFFSET: &str = "stream-fork-sub-offset";
/// `Stream-SSE-Data-Encoding: base64`: SSE data events of a binary stream are base64.
pub const STREAM_SSE_DATA_ENCODING: &str = "stream-sse-data-encoding";
/// `Stream-Earliest-Offset`: the earliest readable offset (on a 410 for a trimmed offset).
pub const STREAM_EARLIEST_OFFSET: &str = "stream-earliest-offset";
/// `Stream-Retention-Max-Age` (brook's extension): seconds after which a sealed segment is
/// dropped from the stream's start (on a create, and on HEAD as the policy in force).
pub const STREAM_RETENTION_MAX_AGE: &str = "stream-retention-max-age";
/// `Stream-Retention-Max-Bytes` (brook's extension): the most bytes the stream retains before
/// its oldest sealed segments are dropped.
pub const STREAM_RETENTION_MAX_BYTES: &str = "stream-retention-max-bytes";
/// `Stream-Snapshot-Offset`: the offset a snapshot represents (`-1` in a bootstrap without one).
pub const STREAM_SNAPSHOT_OFFSET: &str = "stream-snapshot-offset";
/// `Stream-Snapshot-Digest`: `sha256:<hex>` of a snapshot's content type, a NUL, and its blob.
pub const STREAM_SNAPSHOT_DIGEST: &str = "stream-snapshot-digest";
/// `Stream-Snapshot-Match`: publish a snapshot only if the latest one has this digest.
pub const STREAM_SNAPSHOT_MATCH: &str = "stream-snapshot-match";
/// `Producer-Id`: an idempotent producer's stable id.
pub const PRODUCER_ID: &str = "producer-id";
/// `Producer-Epoch`: the producer's epoch (echoed on success, the current one on a 403).
pub const PRODUCER_EPOCH: &str = "producer-epoch";
/// `Producer-Seq`: the producer's sequence number (on success: the highest accepted).
pub const PRODUCER_SEQ: &str = "producer-seq";
/// `Producer-Expected-Seq`: on a sequence-gap 409, the sequence number the stream expects.
pub const PRODUCER_EXPECTED_SEQ: &str = "producer-expected-seq";
/// `Producer-Received-Seq`: on a sequence-gap 409, the sequence number that was sent.
pub const PRODUCER_RECEIVED_SEQ: &str = "producer-received-seq";
/// `Producer-Digest` (Ursula 0.11): the BLAKE3-256 digest of the request body, 64 lowercase
/// hex digits, the identity of a producer's write.
pub const PRODUCER_DIGEST: &str = "producer-digest";
/// `Producer-Outcome` (Ursula 0.11): on a producer's 403 `PRODUCER_KEY_CONFLICT`, `key-conflict`.
pub const PRODUCER_OUTCOME: &str = "producer-outcome";

/// Query parameter: where a read starts (`-1`, `now` or an offset).
pub const QUERY_OFFSET: &str = "offset";
/// Query parameter: `long-poll` or `sse`.
pub const QUERY_LIVE: &str = "live";
/// Query parameter: the echoed `Stream-Cursor`.
pub const QUERY_CURSOR: &str = "cursor";
/// Query parameter: an upper bound on the bytes one read returns.
pub const QUERY_MAX_BYTES: &str = "max_bytes";
/// Query parameter: `leader` (accepted; brook is always its own leader).
pub const QUERY_CONSISTENCY: &str = "consistency";

// The limits are the engine's (`crate::state`), which checks them again on every write: the wire
// publishes them under these names and never defines its own, so the two cannot disagree.

/// Longest `Stream-Seq` value accepted, in bytes (256).
pub const MAX_STREAM_SEQ_LEN: usize = crate::state::MAX_STREAM_SEQ;
/// Longest `Producer-Id` accepted, in bytes (256).
pub const MAX_PRODUCER_ID_LEN: usize = crate::state::MAX_PRODUCER_ID;
/// Largest producer epoch or sequence number, and largest `Stream-TTL`: 2^53-1, the largest
/// integer JavaScript represents exactly.
pub const MAX_SAFE_INTEGER: u64 = crate::state::MAX_PRODUCER_NUM;

/// A header (or query) value that brook refuses: the request is answered 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {name}: {reason}")]
pub struct InvalidHeader {
    /// The header (or query parameter) name.
    pub name: &'static str,
    /// Why it was refused.
    pub reason: &'static str,
}

/// The refusal of header (or query parameter) `name`, for `reason`.
fn invalid(name: &'static str, reason: &'static str) -> InvalidHeader {
    InvalidHeader { name, reason }
}

/// `Stream-Seq`: `Ok(None)` when the header should be ignored (absent, empty, or with a byte
/// outside printable ASCII, as the seed says), the value otherwise; longer than
/// [`MAX_STREAM_SEQ_LEN`] bytes is an error.
pub fn parse_stream_seq(value: Option<&[u8]>) -> Result<Option<String>, InvalidHeader> {
    let Some(v) = value else { return Ok(None) };
    if v.is_empty() || !v.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Ok(None);
    }
    if v.len() > MAX_STREAM_SEQ_LEN {
        return Err(invalid("Stream-Seq", "longer than 256 bytes"));
    }
    // Printable ASCII is valid UTF-8.
    Ok(std::str::from_utf8(v).ok().map(str::to_owned))
}

/// A non-negative integer of at most 2^53-1 in plain decimal digits (no sign, dot or exponent).
pub fn parse_safe_integer(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 16 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    (n <= MAX_SAFE_INTEGER).then_some(n)
}

/// `Producer-Id`, `Producer-Epoch` and `Producer-Seq` together: `Ok(None)` when all three are
/// absent; an error when only some are present, the id is empty, too long or not UTF-8, or a
/// number is not a plain decimal ≤ 2^53-1.
pub fn parse_producer(
    id: Option<&[u8]>,
    epoch: Option<&[u8]>,
    seq: Option<&[u8]>,
) -> Result<Option<Producer>, InvalidHeader> {
    let (id, epoch, seq) = match (id, epoch, seq) {
        (None, None, None) => return Ok(None),
        (Some(i), Some(e), Some(s)) => (i, e, s),
        _ => {
            return Err(invalid(
                "producer headers",
                "Producer-Id, Producer-Epoch and Producer-Seq must be sent together",
            ));
        }
    };
    if id.is_empty() {
        return Err(invalid("Producer-Id", "empty"));
    }
    if id.len() > MAX_PRODUCER_ID_LEN {
        return Err(invalid("Producer-Id", "longer than 256 bytes"));
    }
    let id = std::str::from_utf8(id).map_err(|_| invalid("Producer-Id", "not UTF-8"))?;
    let epoch = parse_safe_integer(epoch).ok_or(invalid(
        "Producer-Epoch",
        "not a non-negative integer ≤ 2^53-1",
    ))?;
    let seq = parse_safe_integer(seq).ok_or(invalid(
        "Producer-Seq",
        "not a non-negative integer ≤ 2^53-1",
    ))?;
    Ok(Some(Producer {
        id: id.to_owned(),
        epoch,
        seq,
    }))
}

/// A canonical non-negative decimal: `0`, or digits without a leading zero; no sign, dot or
/// exponent. Used by `Stream-TTL` and `Stream-Fork-Sub-Offset`.
pub fn parse_canonical_u64(value: &[u8]) -> Option<u64> {
    match value {
        [b'0'] => Some(0),
        [b'1'..=b'9', ..] if value.len() <= 19 && value.iter().all(u8::is_ascii_digit) => {
            value.iter().try_fold(0u64, |n, d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
        }
        _ => None,
    }
}

/// `Stream-TTL`: whole seconds, canonical decimal (see [`parse_canonical_u64`]), ≤ 2^53-1.
pub fn parse_ttl(value: &[u8]) -> Result<u64, InvalidHeader> {
    parse_canonical_u64(value)
        .filter(|n| *n <= MAX_SAFE_INTEGER)
        .ok_or(invalid(
            "Stream-TTL",
            "not a non-negative integer without leading zeros",
        ))
}

/// `Stream-Fork-Sub-Offset`: canonical decimal (see [`parse_canonical_u64`]).
pub fn parse_sub_offset(value: &[u8]) -> Result<u64, InvalidHeader> {
    parse_canonical_u64(value).ok_or(invalid(
        "Stream-Fork-Sub-Offset",
        "not a non-negative integer without leading zeros",
    ))
}

/// `Stream-Expires-At`: an RFC 3339 timestamp (`Z` or a numeric offset, optional fraction).
pub fn parse_expires_at(value: &[u8]) -> Result<SystemTime, InvalidHeader> {
    let bad = || invalid("Stream-Expires-At", "not an RFC 3339 timestamp");
    let s = std::str::from_utf8(value).map_err(|_| bad())?;
    let t = time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .map_err(|_| bad())?;
    Ok(SystemTime::from(t))
}

/// Formats an instant as RFC 3339 in UTC with milliseconds, e.g. `2026-01-02T03:04:05.678Z`.
pub fn format_expires_at(at: SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// `Stream-Closed`: present only when the value is `true` in any case; anything else (including
/// absence) is `false`, never an error.
pub fn parse_closed(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"true"))
}

/// A read's `offset`: `-1`, `now`, or an offset brook returned.
pub fn parse_read_from(value: &str) -> Result<ReadFrom, InvalidHeader> {
    value
        .parse()
        .map_err(|_| invalid("offset", "not -1, now, or an offset this server returned"))
}

/// An offset brook returned (`%016d_%016d`), e.g. in `Stream-Fork-Offset` or a snapshot route.
pub fn parse_offset(value: &str) -> Result<Offset, InvalidHeader> {
    value
        .parse()
        .map_err(|_| invalid("offset", "not an offset this server returned"))
}

/// A Stream-Seq refusal, parsed from a 409 response.
///
/// Per the seed, only the Stream-Seq check answers a 409 with `Stream-Last-Seq`: a closed stream,
/// a producer sequence gap and a content-type mismatch all answer 409 without it. So a 409 is a
/// Stream-Seq conflict exactly when it carries `Stream-Last-Seq` (or, if a proxy dropped the
/// header, when its problem+json body has `code` `STREAM_SEQ_CONFLICT` and a `lastSeq` member).
/// Every other 409 is an error that a writer must not skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSeqConflict {
    /// `Stream-Next-Offset`: the stream's tail when it refused, as sent (any server's format).
    pub tail: Option<String>,
    /// `Stream-Last-Seq`: the stream's last accepted Stream-Seq.
    pub last_seq: String,
}

impl StreamSeqConflict {
    /// Parses a response: `status`, a case-insensitive header lookup, and the body. `None` when
    /// the response is not a Stream-Seq 409 (another status, or another kind of 409).
    pub fn from_response(
        status: u16,
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> Option<StreamSeqConflict> {
        if status != 409 {
            return None;
        }
        let tail = header(STREAM_NEXT_OFFSET);
        if let Some(last_seq) = header(STREAM_LAST_SEQ) {
            return Some(StreamSeqConflict { tail, last_seq });
        }
        let problem: serde_json::Value = serde_json::from_slice(body).ok()?;
        if problem.get("code")?.as_str()? != "STREAM_SEQ_CONFLICT" {
            return None;
        }
        let last_seq = problem.get("lastSeq")?.as_str()?.to_owned();
        let tail = tail.or_else(|| problem.get("tail")?.as_str().map(str::to_owned));
        Some(StreamSeqConflict { tail, last_seq })
    }

    /// The tail as a brook offset, when the server is brook (or uses brook's offset shape).
    pub fn tail_offset(&self) -> Option<Offset> {
        self.tail.as_deref()?.parse().ok()
    }
}

/// The `code` member of an RFC 9457 problem+json body, if it has one.
pub fn problem_code(body: &[u8]) -> Option<String> {
    let problem: serde_json::Value = serde_json::from_slice(body).ok()?;
    problem.get("code")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// `Stream-Seq` outside printable ASCII is ignored; printable and longer than 256 bytes is refused.
    #[test]
    fn stream_seq_ignores_non_printable_and_refuses_long_values() {
        assert_eq!(parse_stream_seq(None), Ok(None));
        assert_eq!(parse_stream_seq(Some(b"")), Ok(None));
        assert_eq!(
            parse_stream_seq(Some(b"00000000000000000003")),
            Ok(Some("00000000000000000003".into()))
        );
        assert_eq!(parse_stream_seq(Some(b"a b~")), Ok(Some("a b~".into())));
        assert_eq!(parse_stream_seq(Some(b"caf\xc3\xa9")), Ok(None));
        assert_eq!(parse_stream_seq(Some(b"tab\there")), Ok(None));
        assert_eq!(parse_stream_seq(Some(b"del\x7f")), Ok(None));
        assert!(parse_stream_seq(Some(&[b'x'; 256])).is_ok_and(|v| v.is_some()));
        assert_eq!(
            parse_stream_seq(Some(&[b'x'; 257])).map_err(|e| e.name),
            Err("Stream-Seq")
        );
        // A long value with a non-printable byte is ignored, not refused.
        let mut long = vec![b'x'; 300];
        long[0] = 0x01;
        assert_eq!(parse_stream_seq(Some(&long)), Ok(None));
    }

    /// The producer headers come all three or none, with an id of 1 to 256 bytes and plain decimals
    /// up to 2^53-1.
    #[test]
    fn producer_headers_come_together_and_are_safe_integers() {
        // The header a refusal names, or `None` when the headers are accepted.
        let refused = |id: Option<&[u8]>, epoch: Option<&[u8]>, seq: Option<&[u8]>| {
            parse_producer(id, epoch, seq).err().map(|e| e.name)
        };
        assert_eq!(parse_producer(None, None, None), Ok(None));
        let p = parse_producer(Some(b"p"), Some(b"1"), Some(b"0"))
            .unwrap()
            .unwrap();
        assert_eq!(
            p,
            Producer {
                id: "p".into(),
                epoch: 1,
                seq: 0
            }
        );
        assert_eq!(refused(Some(b"p"), None, None), Some("producer headers"));
        assert_eq!(refused(None, Some(b"0"), None), Some("producer headers"));
        assert_eq!(
            refused(Some(b"p"), Some(b"0"), None),
            Some("producer headers")
        );
        assert_eq!(
            refused(Some(b""), Some(b"0"), Some(b"0")),
            Some("Producer-Id")
        );
        assert_eq!(
            refused(Some(&[b'i'; 257]), Some(b"0"), Some(b"0")),
            Some("Producer-Id")
        );
        for bad in [
            &b"1abc"[..],
            b"0xyz",
            b"1e3",
            b"-1",
            b"+1",
            b"1.0",
            b"",
            b" 1",
            b"9007199254740992",
        ] {
            assert_eq!(
                refused(Some(b"p"), Some(bad), Some(b"0")),
                Some("Producer-Epoch"),
                "{bad:?}"
            );
            assert_eq!(
                refused(Some(b"p"), Some(b"0"), Some(bad)),
                Some("Producer-Seq"),
                "{bad:?}"
            );
        }
        let max = parse_producer(Some(b"p"), Some(b"9007199254740991"), Some(b"0"))
            .unwrap()
            .unwrap();
        assert_eq!(max.epoch, MAX_SAFE_INTEGER);
    }

    /// `Stream-TTL` and `Stream-Fork-Sub-Offset` are canonical decimals.
    #[test]
    fn ttl_is_canonical_decimal() {
        assert_eq!(parse_ttl(b"0"), Ok(0));
        assert_eq!(parse_ttl(b"3600"), Ok(3600));
        for bad in [
            &b"abc"[..],
            b"-1",
            b"00060",
            b"+60",
            b"60.5",
            b"1e3",
            b"",
            b"01",
            b" 1",
            b"99999999999999999999",
        ] {
            assert_eq!(
                parse_ttl(bad).map_err(|e| e.name),
                Err("Stream-TTL"),
                "{bad:?}"
            );
        }
        assert_eq!(parse_sub_offset(b"5"), Ok(5));
        for bad in [&b"-1"[..], b"abc", b"1.5", b"05", b"+1"] {
            assert_eq!(
                parse_sub_offset(bad).map_err(|e| e.name),
                Err("Stream-Fork-Sub-Offset"),
                "{bad:?}"
            );
        }
    }

    /// `Stream-Expires-At` parses RFC 3339 with any offset and formats UTC to the millisecond.
    #[test]
    fn expires_at_is_rfc3339_to_the_millisecond() {
        let t = parse_expires_at(b"2026-01-02T03:04:05.678Z").unwrap();
        assert_eq!(t, UNIX_EPOCH + Duration::from_millis(1_767_323_045_678));
        assert_eq!(
            parse_expires_at(b"2026-01-02T04:04:05.678+01:00").unwrap(),
            t
        );
        assert_eq!(format_expires_at(t), "2026-01-02T03:04:05.678Z");
        for bad in [&b"not-a-timestamp"[..], b"2026-01-02", b"\xff"] {
            assert_eq!(
                parse_expires_at(bad).map_err(|e| e.name),
                Err("Stream-Expires-At"),
                "{bad:?}"
            );
        }
    }

    /// `Stream-Closed` is `true` in any case; every other value is absence.
    #[test]
    fn closed_is_true_in_any_case_and_nothing_else() {
        assert!(parse_closed(Some(b"true")));
        assert!(parse_closed(Some(b"TRUE")));
        assert!(parse_closed(Some(b"True")));
        for other in [&b"false"[..], b"yes", b"1", b"", b"truee"] {
            assert!(!parse_closed(Some(other)), "{other:?}");
        }
        assert!(!parse_closed(None));
    }

    /// A read offset is `-1`, `now` or brook's `%016d_%016d`, nothing else.
    #[test]
    fn offsets_are_sentinels_or_brook_offsets() {
        assert_eq!(parse_read_from("-1"), Ok(ReadFrom::Start));
        assert_eq!(parse_read_from("now"), Ok(ReadFrom::Tail));
        assert_eq!(
            parse_read_from("0000000000000001_0000000000000005"),
            Ok(ReadFrom::At(Offset::new(1, 5)))
        );
        assert_eq!(
            parse_offset("9999999999999999_9999999999999999"),
            Ok(Offset::new(Offset::MAX_PART, Offset::MAX_PART))
        );
        for bad in [
            "",
            "0,1",
            "0 1",
            "../x",
            "x/..",
            "a\n",
            "-2",
            "NOW",
            "0000000000000000_000000000000000",
        ] {
            assert_eq!(
                parse_read_from(bad).map_err(|e| e.name),
                Err("offset"),
                "{bad:?}"
            );
        }
    }

    /// A Stream-Seq 409 is told from other 409s by `Stream-Last-Seq`, or by its problem body when a
    /// proxy dropped the header.
    #[test]
    fn stream_seq_conflict_is_told_from_other_409s() {
        let seq409 = |n: &str| match n {
            STREAM_NEXT_OFFSET => Some("0000000000000003_0000000000000030".to_owned()),
            STREAM_LAST_SEQ => Some("00000000000000000003".to_owned()),
            _ => None,
        };
        let c = StreamSeqConflict::from_response(409, seq409, b"").unwrap();
        assert_eq!(c.last_seq, "00000000000000000003");
        assert_eq!(c.tail_offset(), Some(Offset::new(3, 30)));
        assert_eq!(StreamSeqConflict::from_response(412, seq409, b""), None);

        let closed409 = |n: &str| match n {
            STREAM_NEXT_OFFSET => Some("0000000000000003_0000000000000030".to_owned()),
            STREAM_CLOSED => Some("true".to_owned()),
            _ => None,
        };
        let body =
            br#"{"type":"about:blank","title":"Conflict","status":409,"code":"STREAM_CLOSED"}"#;
        assert_eq!(StreamSeqConflict::from_response(409, closed409, body), None);
        let ct = br#"{"code":"CONTENT_TYPE_MISMATCH"}"#;
        assert_eq!(StreamSeqConflict::from_response(409, |_| None, ct), None);
        assert_eq!(
            StreamSeqConflict::from_response(409, |_| None, b"not json"),
            None
        );

        // A proxy dropped the header: the problem body still identifies it.
        let body = br#"{"code":"STREAM_SEQ_CONFLICT","lastSeq":"7","tail":"0000000000000001_0000000000000001"}"#;
        let c = StreamSeqConflict::from_response(409, |_| None, body).unwrap();
        assert_eq!(c.last_seq, "7");
        assert_eq!(c.tail_offset(), Some(Offset::new(1, 1)));
        assert_eq!(problem_code(body).as_deref(), Some("STREAM_SEQ_CONFLICT"));
    }
}
