//! Responses: [`Reply`], the builder every handler answers with; [`problem`], the RFC 9457 body
//! of every refusal; and the headers every response carries (PROTOCOL.md 12.7 and CORS).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;

use crate::name::{Digits, Offset};

use super::names::{CROSS_ORIGIN_RESOURCE_POLICY, TRUE, X_CONTENT_TYPE_OPTIONS};

/// Sets a header from a string, skipping values that are not valid header values (never the
/// case for the offsets, numbers and tokens brook writes).
pub(crate) fn set_header(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// A response under construction.
pub(crate) struct Reply {
    /// The status.
    status: StatusCode,
    /// The headers so far.
    headers: HeaderMap,
}

impl Reply {
    /// A response with `status` and room for the headers a protocol response carries, so adding
    /// them does not reallocate.
    pub(crate) fn new(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::with_capacity(16),
        }
    }

    /// Adds a header (a [`HeaderName`] constant: `http::header`'s or `super::names`').
    pub(crate) fn header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.insert(name, v);
        }
        self
    }

    /// Adds a header with a static value (a `const` one: no copy, no check).
    pub(crate) fn fixed(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Adds an offset header (`%016d_%016d`).
    pub(crate) fn offset(self, name: HeaderName, offset: Offset) -> Self {
        self.header(name, Digits::offset(offset).as_str())
    }

    /// Adds a decimal integer header.
    pub(crate) fn number(self, name: HeaderName, n: u64) -> Self {
        self.header(name, Digits::u64(n).as_str())
    }

    /// Adds `name: true` when `flag` is set.
    pub(crate) fn flag(mut self, name: HeaderName, flag: bool) -> Self {
        if flag {
            self.headers.insert(name, TRUE);
        }
        self
    }

    /// Adds `name: value` when `flag` is set.
    pub(crate) fn flag_value(mut self, name: HeaderName, flag: bool, value: HeaderValue) -> Self {
        if flag {
            self.headers.insert(name, value);
        }
        self
    }

    /// The response, with `body`.
    pub(crate) fn body(self, body: Body) -> Response {
        let mut res = Response::new(body);
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }

    /// The response, without a body.
    pub(crate) fn empty(self) -> Response {
        self.body(Body::empty())
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
    Stream-Snapshot-Offset, Stream-Snapshot-Digest, Stream-SSE-Data-Encoding, Producer-Epoch, \
    Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type, \
    WWW-Authenticate"
    };
}
/// [`exposed_headers!`] as a constant.
const EXPOSED_HEADERS: &str = exposed_headers!();

/// Request headers a browser may send (the preflight's `Access-Control-Allow-Headers`).
const ALLOWED_HEADERS: &str = "Content-Type, If-None-Match, Authorization, Stream-Seq, Stream-TTL, \
    Stream-Expires-At, Stream-Closed, Stream-Incarnation, Stream-Forked-From, Stream-Fork-Offset, \
    Stream-Fork-Sub-Offset, Stream-Snapshot-Match, Producer-Id, Producer-Epoch, Producer-Seq";

/// The methods a preflight allows.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";

/// Adds the headers every response carries: PROTOCOL.md 12.7's security headers and, when `cors`,
/// the CORS ones.
///
/// The CORS headers go on responses to requests that carry `Origin` (every cross-origin browser
/// request does, and every browser POST, PUT and DELETE) and on every GET response, since a
/// shared cache may hand a GET response to a browser that asked with `Origin`. Other responses
/// (a server-side client's append, say) go without them: `Access-Control-Expose-Headers` alone
/// is 400 bytes, more than the rest of an append's response.
/// [`common_headers`] as header lines, for a framer that writes them itself (`h1.rs`); the same
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
