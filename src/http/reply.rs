//! Responses: [`Reply`], the builder every handler answers with, and [`Answer`], what a
//! handler returns; [`problem`], the RFC 9457 body of every refusal; and the headers every
//! response carries (PROTOCOL.md 12.7 and CORS).
//!
//! A [`Reply`] keeps its headers as typed fields (an offset, a number, an incarnation, a
//! constant value, text) in the order the handler set them, and renders them only when the
//! response is written: straight into the connection's output buffer in brook's HTTP/1.1 loop
//! ([`Reply::write_lines`]), or into a [`HeaderMap`] for hyper (HTTP/2, TLS, the hyper
//! fallback: [`Answer::into_response`]). Both renderings come from the same fields, so which
//! headers a response carries is decided in one place, the handler.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Incarnation;
use crate::name::{Digits, Offset};

use super::names::{CROSS_ORIGIN_RESOURCE_POLICY, TRUE, X_CONTENT_TYPE_OPTIONS};

/// Sets a header from a string, skipping values that are not valid header values (never the
/// case for the offsets, numbers and tokens brook writes).
pub(crate) fn set_header(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// A header value as a handler set it, rendered when the response is written.
enum Value {
    /// Text; skipped when it is not a valid header value (as [`HeaderValue::from_str`] says).
    Text(String),
    /// A constant or shared value, already checked.
    Fixed(HeaderValue),
    /// An offset, `%016d_%016d`.
    Offset(Offset),
    /// A decimal integer.
    Number(u64),
    /// A stream's incarnation token (printable ASCII, so always a valid value).
    Incarnation(Incarnation),
    /// A read's entity tag.
    Tag(ReadTag),
}

/// A read's strong entity tag, `"{incarnation}:{start}:{next}"`, with `:c` when the read
/// reaches the end of a closed stream (so a 304 never hides the closure). Printable ASCII, so
/// always a valid header value.
pub(crate) struct ReadTag {
    /// The stream's incarnation.
    pub(crate) incarnation: Incarnation,
    /// Where the read starts.
    pub(crate) start: Offset,
    /// Where it ends.
    pub(crate) next: Offset,
    /// Whether the stream is closed at `next`.
    pub(crate) closed: bool,
}

impl ReadTag {
    /// Appends the tag to `out`.
    fn write(&self, out: &mut Vec<u8>) {
        let inc = self.incarnation.as_str().as_bytes();
        out.reserve(inc.len() + 72);
        out.push(b'"');
        out.extend_from_slice(inc);
        out.push(b':');
        out.extend_from_slice(Digits::offset(self.start).as_bytes());
        out.push(b':');
        out.extend_from_slice(Digits::offset(self.next).as_bytes());
        if self.closed {
            out.extend_from_slice(b":c");
        }
        out.push(b'"');
    }

    /// The tag as text.
    pub(crate) fn text(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out);
        // Only ASCII was written.
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Value {
    /// Appends the value's bytes to `out`; false (nothing appended) for text that is not a
    /// valid header value.
    fn write(&self, out: &mut Vec<u8>) -> bool {
        match self {
            Value::Text(s) => {
                if !valid_value(s.as_bytes()) {
                    return false;
                }
                out.extend_from_slice(s.as_bytes());
            }
            Value::Fixed(v) => out.extend_from_slice(v.as_bytes()),
            Value::Offset(o) => out.extend_from_slice(Digits::offset(*o).as_bytes()),
            Value::Number(n) => out.extend_from_slice(Digits::u64(*n).as_bytes()),
            // Printable ASCII by construction (`Incarnation::new` checks a caller's token, the
            // engine makes its own of hex digits and `-`), so no check per response.
            Value::Incarnation(i) => out.extend_from_slice(i.as_str().as_bytes()),
            Value::Tag(t) => t.write(out),
        }
        true
    }

    /// The value as a [`HeaderValue`]; `None` for text that is not a valid one.
    fn into_header_value(self) -> Option<HeaderValue> {
        match self {
            Value::Text(s) => HeaderValue::try_from(s).ok(),
            Value::Fixed(v) => Some(v),
            Value::Offset(o) => HeaderValue::from_str(Digits::offset(o).as_str()).ok(),
            Value::Number(n) => Some(HeaderValue::from(n)),
            Value::Incarnation(i) => HeaderValue::from_str(i.as_str()).ok(),
            Value::Tag(t) => HeaderValue::try_from(t.text()).ok(),
        }
    }
}

/// Whether `v` is a valid header value: visible ASCII, spaces, tabs and obs-text (bytes 0x80 and
/// up), the bytes [`HeaderValue::from_str`] accepts.
fn valid_value(v: &[u8]) -> bool {
    v.iter().all(|&b| (b >= 32 && b != 127) || b == b'\t')
}

/// The fields room is made for up front: more than any protocol response carries.
const FIELDS: usize = 10;

/// A response under construction: a status and typed header fields, in the order they were
/// set (setting a name again replaces its value in place, as [`HeaderMap::insert`] does).
pub(crate) struct Reply {
    /// The status.
    status: StatusCode,
    /// The headers so far.
    fields: Vec<(HeaderName, Value)>,
    /// A bit per name set so far ([`name_bit`]): a name whose bit is clear is new, and adding
    /// it needs no comparison with the others.
    seen: u64,
}

/// A name's bit in [`Reply::seen`], from its length and last byte: the names of one protocol
/// response each get a bit of their own (two names sharing one are only compared in full).
fn name_bit(name: &HeaderName) -> u64 {
    let s = name.as_str().as_bytes();
    let last = usize::from(s.last().copied().unwrap_or(0));
    1 << ((s.len() * 7 + last) % 64)
}

impl Reply {
    /// A response with `status` and room for the headers a protocol response carries, so adding
    /// them does not reallocate.
    pub(crate) fn new(status: StatusCode) -> Self {
        Reply {
            status,
            fields: Vec::with_capacity(FIELDS),
            seen: 0,
        }
    }

    /// The status.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// Sets `name` to `value`, replacing an earlier value of the same name where it stands.
    fn set(mut self, name: HeaderName, value: Value) -> Self {
        let bit = name_bit(&name);
        if self.seen & bit != 0
            && let Some(field) = self.fields.iter_mut().find(|(n, _)| *n == name)
        {
            field.1 = value;
        } else {
            self.seen |= bit;
            self.fields.push((name, value));
        }
        self
    }

    /// Adds a header (a [`HeaderName`] constant: `http::header`'s or `super::names`').
    pub(crate) fn header(self, name: HeaderName, value: &str) -> Self {
        self.set(name, Value::Text(value.to_owned()))
    }

    /// Adds a header whose text the caller hands over (no copy).
    pub(crate) fn text(self, name: HeaderName, value: String) -> Self {
        self.set(name, Value::Text(value))
    }

    /// Adds a header with a static value (a `const` one: no copy, no check).
    pub(crate) fn fixed(self, name: HeaderName, value: HeaderValue) -> Self {
        self.set(name, Value::Fixed(value))
    }

    /// Adds an offset header (`%016d_%016d`).
    pub(crate) fn offset(self, name: HeaderName, offset: Offset) -> Self {
        self.set(name, Value::Offset(offset))
    }

    /// Adds a decimal integer header.
    pub(crate) fn number(self, name: HeaderName, n: u64) -> Self {
        self.set(name, Value::Number(n))
    }

    /// Adds an incarnation header (`Stream-Incarnation`).
    pub(crate) fn incarnation(self, name: HeaderName, incarnation: &Incarnation) -> Self {
        self.set(name, Value::Incarnation(incarnation.clone()))
    }

    /// Adds a read's entity tag (`ETag`).
    pub(crate) fn tag(self, name: HeaderName, tag: ReadTag) -> Self {
        self.set(name, Value::Tag(tag))
    }

    /// Adds `name: true` when `flag` is set.
    pub(crate) fn flag(self, name: HeaderName, flag: bool) -> Self {
        if flag {
            self.set(name, Value::Fixed(TRUE))
        } else {
            self
        }
    }

    /// Adds `name: value` when `flag` is set.
    pub(crate) fn flag_value(self, name: HeaderName, flag: bool, value: HeaderValue) -> Self {
        if flag {
            self.set(name, Value::Fixed(value))
        } else {
            self
        }
    }

    /// The constant value `name` was set to with [`Reply::fixed`], to change it in place.
    pub(crate) fn fixed_mut(&mut self, name: &HeaderName) -> Option<&mut HeaderValue> {
        self.fields.iter_mut().find_map(|(n, v)| match v {
            Value::Fixed(v) if n == name => Some(v),
            _ => None,
        })
    }

    /// Appends the header lines (`name: value\r\n`, names in lower case) to `out`, in the order
    /// they were set; a text value that is not a valid header value is left out, as
    /// [`Reply::into_headers`] leaves it out.
    pub(crate) fn write_lines(&self, out: &mut Vec<u8>) {
        for (name, value) in &self.fields {
            let at = out.len();
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            if value.write(out) {
                out.extend_from_slice(b"\r\n");
            } else {
                out.truncate(at);
            }
        }
    }

    /// The headers as a map (with room for the common and CORS headers added after them).
    fn into_headers(self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(self.fields.len() + 4);
        for (name, value) in self.fields {
            if let Some(v) = value.into_header_value() {
                headers.insert(name, v);
            }
        }
        headers
    }

    /// The response, with `body`.
    pub(crate) fn body(self, body: Body) -> Response {
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.into_headers();
        res
    }

    /// The response, without a body.
    pub(crate) fn empty(self) -> Response {
        self.body(Body::empty())
    }

    /// The answer, with `body`, its head still typed fields (for the hot routes, whose heads
    /// brook's HTTP/1.1 loop writes without a [`HeaderMap`]). The fields must not include the
    /// framing headers (`Content-Length`, `Transfer-Encoding`, `Connection`, `Date`), which the
    /// loop writes itself.
    pub(crate) fn answer(self, body: Body) -> Answer {
        Answer::Typed(self, body)
    }

    /// [`Reply::answer`] without a body.
    pub(crate) fn answer_empty(self) -> Answer {
        Answer::Typed(self, Body::empty())
    }
}

/// What a handler answers with: a [`Reply`] and its body (the hot routes: appends, catch-up
/// and long-poll reads, HEAD), or a finished [`Response`] (everything else, errors included).
pub(crate) enum Answer {
    /// A typed head and a body.
    Typed(Reply, Body),
    /// A response built as a [`Response`].
    Built(Response),
}

impl Answer {
    /// The status.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Answer::Typed(reply, _) => reply.status,
            Answer::Built(res) => res.status(),
        }
    }

    /// The body.
    pub(crate) fn body(&self) -> &Body {
        match self {
            Answer::Typed(_, body) => body,
            Answer::Built(res) => res.body(),
        }
    }
}

impl From<Response> for Answer {
    /// A finished response.
    fn from(res: Response) -> Self {
        Answer::Built(res)
    }
}

impl IntoResponse for Answer {
    /// The response, a typed head rendered into a [`HeaderMap`].
    fn into_response(self) -> Response {
        match self {
            Answer::Typed(reply, body) => reply.body(body),
            Answer::Built(res) => res,
        }
    }
}

/// An RFC 9457 `application/problem+json` response: `type`, `title`, `status`, `code` and
/// `detail`, then the `extra` members; never cached.
pub(crate) fn problem(
    status: StatusCode,
    code: &str,
    detail: &str,
    mut headers: HeaderMap,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Response {
    let mut body = serde_json::Map::new();
    body.insert("type".into(), "about:blank".into());
    body.insert(
        "title".into(),
        status.canonical_reason().unwrap_or("Error").into(),
    );
    body.insert("status".into(), status.as_u16().into());
    body.insert("code".into(), code.into());
    body.insert("detail".into(), detail.into());
    // PROTOCOL.md sections 6-7 name the code in `{"error": {"code": ...}}`: every problem
    // carries it there too (an `extra` `error` member with more fields replaces it).
    body.insert("error".into(), serde_json::json!({ "code": code }));
    body.extend(extra);
    let bytes = serde_json::Value::Object(body).to_string();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let mut res = Response::new(Body::from(bytes));
    *res.status_mut() = status;
    res.headers_mut().extend(headers);
    res
}

/// The response headers a browser's script may read (`Access-Control-Expose-Headers`): every
/// header the protocol answers with.
macro_rules! exposed_headers {
    () => {
        "Stream-Next-Offset, Stream-Up-To-Date, Stream-Closed, Stream-Cursor, \
    Stream-Last-Seq, Stream-Incarnation, Stream-TTL, Stream-Expires-At, Stream-Earliest-Offset, \
    Stream-Retention-Max-Age, Stream-Retention-Max-Bytes, Stream-Snapshot-Offset, Stream-Snapshot-Digest, Stream-SSE-Data-Encoding, Producer-Epoch, \
    Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, Producer-Outcome, ETag, Location, Content-Type, \
    WWW-Authenticate, Stream-Offset, Stream-Immutable, Stream-Snapshot-Part, Content-Range, \
    Ursula-Max-Staged-Parts, Ursula-Max-Staged-Bytes"
    };
}
/// [`exposed_headers!`] as a constant.
const EXPOSED_HEADERS: &str = exposed_headers!();

/// Request headers a browser may send (the preflight's `Access-Control-Allow-Headers`).
const ALLOWED_HEADERS: &str = "Content-Type, If-None-Match, Authorization, Stream-Seq, Stream-TTL, \
    Stream-Expires-At, Stream-Closed, Stream-Incarnation, Stream-Forked-From, Stream-Fork-Offset, \
    Stream-Fork-Sub-Offset, Stream-Retention-Max-Age, Stream-Retention-Max-Bytes, \
    Stream-Snapshot-Match, Producer-Id, Producer-Epoch, Producer-Seq, Producer-Digest, If-Match, \
    Range, If-Range, Stream-Snapshot-Parts, Stream-Snapshot-Digest";

/// The methods a preflight allows.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";

/// Whether the answer to a request carries the CORS headers: a `GET`, or any request that
/// names an `Origin` (a look at the few names a request has costs less than a hashed lookup).
pub(crate) fn cors_wanted(parts: &axum::http::request::Parts) -> bool {
    parts.method == axum::http::Method::GET || parts.headers.keys().any(|k| k == header::ORIGIN)
}

/// Adds the headers every response carries: PROTOCOL.md 12.7's security headers and, when `cors`,
/// the CORS ones.
///
/// The CORS headers go on responses to requests that carry `Origin` (every cross-origin browser
/// request does, and every browser POST, PUT and DELETE) and on every GET response, since a
/// shared cache may hand a GET response to a browser that asked with `Origin`. Other responses
/// (a server-side client's append, say) go without them: `Access-Control-Expose-Headers` alone
/// is 400 bytes, more than the rest of an append's response.
/// [`common_headers`] as header lines, for a framer that writes them itself (`transport/h1/`); the same
/// names and values, in the same order.
pub(crate) const COMMON_LINES: &[u8] =
    b"x-content-type-options: nosniff\r\ncross-origin-resource-policy: cross-origin\r\n";

/// The CORS lines [`common_headers`] adds when `cors`, for the same framer.
pub(crate) const CORS_LINES: &[u8] = concat!(
    "access-control-allow-origin: *\r\naccess-control-expose-headers: ",
    exposed_headers!(),
    "\r\n"
)
.as_bytes();

pub(crate) fn common_headers(h: &mut HeaderMap, cors: bool) {
    h.insert(
        X_CONTENT_TYPE_OPTIONS,
        const { HeaderValue::from_static("nosniff") },
    );
    h.insert(
        CROSS_ORIGIN_RESOURCE_POLICY,
        const { HeaderValue::from_static("cross-origin") },
    );
    if !cors {
        return;
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        const { HeaderValue::from_static("*") },
    );
    // Built at compile time: checking its 400 bytes on every response would cost more than
    // the rest of this function.
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        const { HeaderValue::from_static(EXPOSED_HEADERS) },
    );
}

/// A CORS preflight: every method and protocol header is allowed, plus whatever the browser
/// asks for.
pub(crate) fn preflight(headers: &HeaderMap) -> Response {
    let mut allow = ALLOWED_HEADERS.to_owned();
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|v| v.to_str().ok());
    if let Some(asked) = asked.filter(|a| !a.trim().is_empty()) {
        allow.push_str(", ");
        allow.push_str(asked);
    }
    Reply::new(StatusCode::NO_CONTENT)
        .header(header::ACCESS_CONTROL_ALLOW_METHODS, ALLOWED_METHODS)
        .fixed(
            header::ACCESS_CONTROL_MAX_AGE,
            const { HeaderValue::from_static("86400") },
        )
        .header(header::ALLOW, ALLOWED_METHODS)
        .header(header::ACCESS_CONTROL_ALLOW_HEADERS, &allow)
        .empty()
}

/// A JSON response with `status`, never cached.
pub(crate) fn json(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut res = Response::new(body.into());
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::names::{PRODUCER_SEQ, STREAM_CLOSED, STREAM_INCARNATION, STREAM_NEXT_OFFSET};

    /// The two renderings of a typed head agree: the lines brook's loop writes are the map's
    /// entries, in the order they were set, a replaced value where the first stood, and a text
    /// value that is no header value left out of both.
    #[test]
    fn lines_and_map_render_the_same_fields() {
        let reply = Reply::new(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/plain")
            .offset(STREAM_NEXT_OFFSET, Offset::new(7, 42))
            .incarnation(
                STREAM_INCARNATION,
                &Incarnation::new("inc-1").expect("a token"),
            )
            .flag(STREAM_CLOSED, false)
            .number(PRODUCER_SEQ, 1)
            .header(header::ETAG, "bad\nvalue")
            .fixed(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"))
            .number(PRODUCER_SEQ, 18_446_744_073_709_551_615)
            .flag(STREAM_CLOSED, true);
        let mut lines = Vec::new();
        reply.write_lines(&mut lines);
        assert_eq!(
            String::from_utf8(lines.clone()).expect("ASCII"),
            "content-type: text/plain\r\n\
             stream-next-offset: 0000000000000007_0000000000000042\r\n\
             stream-incarnation: inc-1\r\n\
             producer-seq: 18446744073709551615\r\n\
             cache-control: no-cache\r\n\
             stream-closed: true\r\n"
        );
        let res = reply.answer_empty().into_response();
        let mut from_map = Vec::new();
        for (name, value) in res.headers() {
            from_map.extend_from_slice(name.as_str().as_bytes());
            from_map.extend_from_slice(b": ");
            from_map.extend_from_slice(value.as_bytes());
            from_map.extend_from_slice(b"\r\n");
        }
        assert_eq!(from_map, lines);
    }
}
