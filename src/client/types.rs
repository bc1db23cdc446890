//! Requests and outcomes of the client: what a caller builds and what a response means.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use serde_json::Value;

use crate::{Incarnation, Offset};

use super::error::{Error, Result};

/// Width of the zero-padded counts and commit numbers the recipes send as `Stream-Seq`.
pub(crate) const SEQ_WIDTH: usize = 20;

/// `n` zero-padded to 20 digits, the fixed width the recipes use for `Stream-Seq`, so bytewise
/// order (the server's) is numeric order: `stream_seq(3)` is `"00000000000000000003"`.
pub fn stream_seq(n: u64) -> String {
    format!("{n:0SEQ_WIDTH$}")
}

/// The number a zero-padded `Stream-Seq` stands for, when it is one (`None` for values written
/// in another shape, e.g. by another kind of writer).
pub(crate) fn parse_stream_seq_number(s: &str) -> Option<u64> {
    (s.len() == SEQ_WIDTH && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// A position in a stream as the server spells it: an opaque offset string (brook's is
/// `%016d_%016d`), or the sentinels `-1` (the start) and `now` (the tail).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Position(String);

impl Position {
    /// The start of the stream (`offset=-1`).
    pub fn start() -> Position {
        Position("-1".to_owned())
    }

    /// The tail, with no existing data (`offset=now`).
    pub fn now() -> Position {
        Position("now".to_owned())
    }

    /// A position the server returned (`Stream-Next-Offset`, a control event).
    pub fn new(offset: impl Into<String>) -> Position {
        Position(offset.into().trim().to_owned())
    }

    /// The offset as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The position as a brook [`Offset`], when it is one (not a sentinel, and from brook).
    pub fn to_offset(&self) -> Option<Offset> {
        self.0.parse().ok()
    }
}

impl Default for Position {
    /// The start of the stream.
    fn default() -> Self {
        Position::start()
    }
}

impl From<Offset> for Position {
    fn from(o: Offset) -> Self {
        Position(o.to_string())
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Position({})", self.0)
    }
}

/// How a stream ends its life: a sliding TTL or an absolute time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    Ttl(u64),
    At(SystemTime),
}

/// A PUT that creates a stream (or confirms an existing one with the same configuration).
#[derive(Clone, Debug, Default)]
pub struct Create {
    pub(crate) content_type: Option<String>,
    pub(crate) expiry: Option<Expiry>,
    pub(crate) stream_seq: Option<String>,
    pub(crate) closed: bool,
    pub(crate) data: Bytes,
}

impl Create {
    /// A stream of `content_type` (the server's default, usually `application/octet-stream`,
    /// when none is set).
    pub fn new(content_type: &str) -> Create {
        Create {
            content_type: Some(content_type.to_owned()),
            ..Create::default()
        }
    }

    /// An `application/json` stream: every append is a JSON value or an array of them, one
    /// message per element.
    pub fn json() -> Create {
        Create::new("application/json")
    }

    /// A sliding time-to-live in seconds (`Stream-TTL`); replaces [`expires_at`](Self::expires_at).
    #[must_use]
    pub fn ttl(mut self, seconds: u64) -> Create {
        self.expiry = Some(Expiry::Ttl(seconds));
        self
    }

    /// An absolute expiry (`Stream-Expires-At`); replaces [`ttl`](Self::ttl).
    #[must_use]
    pub fn expires_at(mut self, at: SystemTime) -> Create {
        self.expiry = Some(Expiry::At(at));
        self
    }

    /// Seeds the stream's `Stream-Seq` (stored unchecked by a creating PUT, ignored when the
    /// stream exists). Never seed a prefix-count stream: its first commit sends 0 and would be
    /// refused forever.
    #[must_use]
    pub fn stream_seq(mut self, value: impl Into<String>) -> Create {
        self.stream_seq = Some(value.into());
        self
    }

    /// Creates the stream closed (`Stream-Closed: true`).
    #[must_use]
    pub fn closed(mut self) -> Create {
        self.closed = true;
        self
    }

    /// Initial data, appended as the stream's first message(s).
    #[must_use]
    pub fn data(mut self, data: impl Into<Bytes>) -> Create {
        self.data = data.into();
        self
    }
}

/// The answer to a [`Create`].
#[derive(Clone, Debug)]
pub struct Created {
    /// `true` for 201 (created now), `false` for 200 (it existed with the same configuration).
    pub created: bool,
    /// The tail (`Stream-Next-Offset`).
    pub next: Option<Position>,
    /// The stream's content type.
    pub content_type: Option<String>,
    /// Whether the stream is closed.
    pub closed: bool,
    /// The stream's incarnation.
    pub incarnation: Option<Incarnation>,
}

/// A POST: data, a close, or both, with the conditional headers.
#[derive(Clone, Debug, Default)]
pub struct Append {
    pub(crate) content_type: Option<String>,
    pub(crate) data: Bytes,
    pub(crate) stream_seq: Option<String>,
    pub(crate) producer: Option<(String, u64, u64)>,
    pub(crate) close: bool,
    pub(crate) incarnation: Option<Incarnation>,
}

impl Append {
    /// An append of `data` as `content_type` (which must be the stream's, after normalization).
    pub fn new(content_type: &str, data: impl Into<Bytes>) -> Append {
        Append {
            content_type: Some(content_type.to_owned()),
            data: data.into(),
            ..Append::default()
        }
    }

    /// An append of a JSON value to an `application/json` stream: an array appends one message
    /// per element (all or none), anything else one message.
    pub fn json(value: &Value) -> Append {
        Append::new("application/json", value.to_string())
    }

    /// A request that only closes the stream.
    pub fn close_only() -> Append {
        Append {
            close: true,
            ..Append::default()
        }
    }

    /// `Stream-Seq`: append only if `value` is bytewise greater than the stream's stored one
    /// (see [`stream_seq`] for fixed-width numbers).
    #[must_use]
    pub fn stream_seq(mut self, value: impl Into<String>) -> Append {
        self.stream_seq = Some(value.into());
        self
    }

    /// `Producer-Id`, `Producer-Epoch`, `Producer-Seq`: a retry of an accepted append with the
    /// same tuple is answered as a duplicate and not written again.
    #[must_use]
    pub fn producer(mut self, id: impl Into<String>, epoch: u64, seq: u64) -> Append {
        self.producer = Some((id.into(), epoch, seq));
        self
    }

    /// Closes the stream with this append (`Stream-Closed: true`).
    #[must_use]
    pub fn close(mut self) -> Append {
        self.close = true;
        self
    }

    /// Sends this `Stream-Incarnation` instead of the one the handle tracks.
    #[must_use]
    pub fn incarnation(mut self, incarnation: Incarnation) -> Append {
        self.incarnation = Some(incarnation);
        self
    }
}

/// The answer to an [`Append`].
#[derive(Clone, Debug)]
pub struct Appended {
    /// `Stream-Next-Offset`: the tail after the append; for a duplicate, the original write's
    /// tail when it repeats the producer's newest write, `None` when it repeats an older one.
    pub next: Option<Position>,
    /// Whether the server answered a producer's append as a duplicate of an accepted one
    /// (204 to an append with data and a producer tuple): nothing new was written.
    pub duplicate: bool,
    /// Whether the stream is closed now.
    pub closed: bool,
    /// `Producer-Epoch` and `Producer-Seq` as the server echoed them.
    pub producer: Option<(u64, u64)>,
    /// The stream's incarnation.
    pub incarnation: Option<Incarnation>,
}

/// A catch-up or long-poll GET.
#[derive(Clone, Debug, Default)]
pub struct Read {
    pub(crate) from: Position,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) leader: bool,
}

impl Read {
    /// A read from `from`.
    pub fn from(from: Position) -> Read {
        Read {
            from,
            ..Read::default()
        }
    }

    /// Bounds the bytes one response returns (`max_bytes`). A bounded response that stops
    /// short of the tail carries no `Stream-Up-To-Date`: read on from its `next`.
    #[must_use]
    pub fn max_bytes(mut self, n: u64) -> Read {
        self.max_bytes = Some(n);
        self
    }

    /// `consistency=leader`: answered by the leader, so the read reflects every acknowledged
    /// append (brook is always its own leader).
    #[must_use]
    pub fn leader(mut self) -> Read {
        self.leader = true;
        self
    }

    /// Where the read starts.
    pub fn start(&self) -> &Position {
        &self.from
    }
}

/// One read response.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The body: raw bytes, or for a JSON stream the JSON array of the chunk's messages.
    pub data: Bytes,
    /// `Stream-Next-Offset`: where the next read continues.
    pub next: Position,
    /// `Stream-Up-To-Date: true`: the chunk reaches the tail as it was when answered.
    pub up_to_date: bool,
    /// `Stream-Closed: true`: the stream is closed and `next` is its end.
    pub closed: bool,
    /// `Stream-Cursor` of a live read, to echo on the next one.
    pub cursor: Option<String>,
    /// The stream's content type (absent on a 204).
    pub content_type: Option<String>,
    /// The stream's incarnation.
    pub incarnation: Option<Incarnation>,
}

impl Chunk {
    /// Whether the chunk came from an `application/json` stream.
    pub fn is_json(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(content_type_is_json)
    }

    /// The chunk's messages: for a JSON stream, the elements of its array body (none for an
    /// empty body).
    pub fn messages(&self) -> Result<Vec<Value>> {
        json_messages(&self.data)
    }
}

/// Whether a content type (not yet normalized) is JSON.
pub(crate) fn content_type_is_json(ct: &str) -> bool {
    crate::normalize_content_type(ct).is_ok_and(|n| crate::is_json(&n))
}

/// The elements of a JSON stream's read body (`[]` or empty for none).
pub(crate) fn json_messages(data: &[u8]) -> Result<Vec<Value>> {
    if data.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    match serde_json::from_slice(data) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(Error::InvalidResponse(
            "a JSON stream's read body is not a JSON array".into(),
        )),
        Err(e) => Err(Error::InvalidResponse(format!(
            "a JSON stream's read body is not JSON: {e}"
        ))),
    }
}

/// The stream's metadata, as HEAD answers it.
#[derive(Clone, Debug)]
pub struct Info {
    /// The stream's content type.
    pub content_type: Option<String>,
    /// The tail (`Stream-Next-Offset`).
    pub next: Position,
    /// Whether the stream is closed.
    pub closed: bool,
    /// The stream's incarnation.
    pub incarnation: Option<Incarnation>,
    /// `Stream-TTL`, in seconds.
    pub ttl: Option<u64>,
    /// `Stream-Expires-At`.
    pub expires_at: Option<SystemTime>,
    /// `Stream-Earliest-Offset` (brook sends it; other servers may not).
    pub earliest: Option<Position>,
    /// `Stream-Snapshot-Offset`: where the latest snapshot was taken (brook's extension).
    pub snapshot: Option<Position>,
}

/// One page of a brook server's stream listing ([`Client::list_page`](super::Client::list_page)).
#[derive(Clone, Debug)]
pub struct Listing {
    /// The page's streams, in name order.
    pub streams: Vec<ListedStream>,
    /// The cursor of the next page (pass it as `after`); `None` on the last page.
    pub next: Option<String>,
}

/// A stream as a listing describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedStream {
    /// The stream's name (its path under the base URL, without a leading `/`).
    pub name: String,
    /// The stream's content type.
    pub content_type: String,
    /// The stream's tail when listed.
    pub tail: Position,
    /// Whether the stream is closed.
    pub closed: bool,
}

/// A listing body, `{"streams":[{"name","contentType","tail","closed"}],"next":C|null}`.
pub(crate) fn parse_listing(body: &[u8]) -> Result<Listing> {
    let bad = |what: &str| Error::InvalidResponse(format!("a stream listing {what}"));
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad(&format!("that is not JSON: {e}")))?;
    let entries = v
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("without a \"streams\" array"))?;
    let mut streams = Vec::with_capacity(entries.len());
    for s in entries {
        let text = |k: &str| s.get(k).and_then(Value::as_str).map(str::to_owned);
        streams.push(ListedStream {
            name: text("name").ok_or_else(|| bad("entry without a \"name\""))?,
            content_type: text("contentType").unwrap_or_default(),
            tail: Position::new(text("tail").ok_or_else(|| bad("entry without a \"tail\""))?),
            closed: s.get("closed").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    let next = match v.get("next") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(_) => return Err(bad("whose \"next\" is not a string")),
    };
    Ok(Listing { streams, next })
}

/// What [`read_to_tail`](super::StreamHandle::read_to_tail) read.
#[derive(Clone, Debug, PartialEq)]
pub enum TailData {
    /// A JSON stream's messages, the chunks' arrays flattened, in order.
    Json(Vec<Value>),
    /// Any other stream's bytes, in order.
    Bytes(Vec<u8>),
}

/// Everything from a start position to the tail, read with `consistency=leader`.
#[derive(Clone, Debug)]
pub struct TailRead {
    /// The data read.
    pub data: TailData,
    /// Where the tail was when the last response said `Stream-Up-To-Date: true`; read on
    /// from here.
    pub next: Position,
    /// Whether the stream is closed (and `next` is its end).
    pub closed: bool,
    /// The stream's content type.
    pub content_type: Option<String>,
    /// The stream's incarnation.
    pub incarnation: Option<Incarnation>,
}

impl TailRead {
    /// The messages of a JSON stream (empty for a byte stream).
    pub fn messages(&self) -> &[Value] {
        match &self.data {
            TailData::Json(m) => m,
            TailData::Bytes(_) => &[],
        }
    }

    /// The bytes of a byte stream (empty for a JSON stream).
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            TailData::Json(_) => &[],
            TailData::Bytes(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_seq_is_fixed_width_so_bytewise_order_is_numeric() {
        assert_eq!(stream_seq(3), "00000000000000000003");
        assert!(stream_seq(10).as_bytes() > stream_seq(9).as_bytes());
        assert_eq!(stream_seq(u64::MAX).len(), SEQ_WIDTH);
        assert_eq!(parse_stream_seq_number(&stream_seq(42)), Some(42));
        assert_eq!(parse_stream_seq_number("42"), None);
        assert_eq!(parse_stream_seq_number("0000000000000000004x"), None);
    }

    #[test]
    fn json_bodies_flatten_to_messages() {
        assert_eq!(json_messages(b"").ok(), Some(vec![]));
        assert_eq!(json_messages(b"[]").ok(), Some(vec![]));
        assert_eq!(
            json_messages(br#"[{"a":1},2]"#).ok(),
            Some(vec![serde_json::json!({"a":1}), serde_json::json!(2)])
        );
        assert!(matches!(
            json_messages(b"{}"),
            Err(Error::InvalidResponse(ref m)) if m.contains("not a JSON array")
        ));
        assert!(content_type_is_json("Application/JSON; charset=utf-8"));
        assert!(!content_type_is_json("text/plain"));
    }

    #[test]
    fn a_listing_parses_its_pages_and_refuses_what_is_not_one() -> Result<()> {
        let page = parse_listing(
            br#"{"streams":[{"name":"a/b","contentType":"text/plain","tail":"0_5","closed":true}],"next":"a/b"}"#,
        )?;
        assert_eq!(
            page.streams,
            vec![ListedStream {
                name: "a/b".into(),
                content_type: "text/plain".into(),
                tail: Position::new("0_5"),
                closed: true,
            }]
        );
        assert_eq!(page.next.as_deref(), Some("a/b"));
        assert!(
            parse_listing(br#"{"streams":[],"next":null}"#)?
                .next
                .is_none()
        );
        for bad in [
            &b"[]"[..],
            br#"{"streams":[{"tail":"0_0"}]}"#,
            br#"{"streams":[],"next":1}"#,
        ] {
            assert!(
                matches!(parse_listing(bad), Err(Error::InvalidResponse(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        Ok(())
    }
}
