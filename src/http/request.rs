//! Reading a request: header values as bytes or text, the typed values several handlers share
//! (`Stream-Incarnation`, `If-None-Match`, `Content-Length`), the query string, and the request's
//! absolute URL.

use std::borrow::Cow;

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::Incarnation;
use crate::headers::InvalidHeader;

use super::AppState;
use super::error::ApiError;
use super::limits::MAX_HEADER_BYTES;
use super::names::STREAM_INCARNATION;

/// A request header's raw bytes.
pub(crate) fn raw<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    headers.get(name).map(HeaderValue::as_bytes)
}

/// A request header as text, `None` when absent or not visible ASCII.
pub(crate) fn text(
    headers: &HeaderMap,
    name: impl axum::http::header::AsHeaderName,
) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The request headers a write reads, found in one pass over the request's headers instead of
/// a hashed lookup per name. Each is the name's first value, as [`HeaderMap::get`] answers.
#[derive(Default)]
pub(crate) struct WriteHeaders<'a> {
    /// `Content-Type`.
    pub(crate) content_type: Option<&'a HeaderValue>,
    /// `Stream-Closed`.
    pub(crate) closed: Option<&'a HeaderValue>,
    /// `Stream-Seq`.
    pub(crate) stream_seq: Option<&'a HeaderValue>,
    /// `Stream-Incarnation`.
    pub(crate) incarnation: Option<&'a HeaderValue>,
    /// `Producer-Id`.
    pub(crate) producer_id: Option<&'a HeaderValue>,
    /// `Producer-Epoch`.
    pub(crate) producer_epoch: Option<&'a HeaderValue>,
    /// `Producer-Seq`.
    pub(crate) producer_seq: Option<&'a HeaderValue>,
    /// `Producer-Digest`.
    pub(crate) producer_digest: Option<&'a HeaderValue>,
    /// `If-Match`.
    pub(crate) if_match: Option<&'a HeaderValue>,
}

impl<'a> WriteHeaders<'a> {
    /// Picks them out of `headers`.
    pub(crate) fn of(headers: &'a HeaderMap) -> Self {
        let mut w = WriteHeaders::default();
        for (name, value) in headers {
            let slot = match name.as_str() {
                "content-type" => &mut w.content_type,
                crate::headers::STREAM_CLOSED => &mut w.closed,
                crate::headers::STREAM_SEQ => &mut w.stream_seq,
                crate::headers::STREAM_INCARNATION => &mut w.incarnation,
                crate::headers::PRODUCER_ID => &mut w.producer_id,
                crate::headers::PRODUCER_EPOCH => &mut w.producer_epoch,
                crate::headers::PRODUCER_SEQ => &mut w.producer_seq,
                crate::headers::PRODUCER_DIGEST => &mut w.producer_digest,
                "if-match" => &mut w.if_match,
                _ => continue,
            };
            // Iteration yields a name's values in order: the first is the one `get` answers.
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        w
    }
}

/// A header's raw bytes.
pub(crate) fn bytes_of(value: Option<&HeaderValue>) -> Option<&[u8]> {
    value.map(HeaderValue::as_bytes)
}

/// The request's `Stream-Incarnation`, if any.
pub(crate) fn expected_incarnation(headers: &HeaderMap) -> Result<Option<Incarnation>, ApiError> {
    incarnation_of(headers.get(&STREAM_INCARNATION))
}

/// A `Stream-Incarnation` value, if any.
pub(crate) fn incarnation_of(value: Option<&HeaderValue>) -> Result<Option<Incarnation>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) => {
            let bad = || InvalidHeader {
                name: "Stream-Incarnation",
                reason: "not a token this server issued",
            };
            let s = v.to_str().map_err(|_| bad())?;
            Ok(Some(Incarnation::new(s.trim()).map_err(|_| bad())?))
        }
    }
}

/// A `Producer-Digest` value (Ursula 0.11: BLAKE3-256 of the body, 64 lowercase hex digits), if
/// any; anything else is 400 `INVALID_ARGUMENT`.
pub(crate) fn producer_digest_of(
    value: Option<&HeaderValue>,
) -> Result<Option<crate::BodyDigest>, ApiError> {
    let Some(v) = value else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| crate::BodyDigest::parse(s.trim()))
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_request(
                "INVALID_ARGUMENT",
                "Producer-Digest must be the BLAKE3-256 digest of the body as 64 lowercase hex \
                 digits",
            )
        })
}

/// Whether `If-None-Match` names `tag` (or is `*`). Weak tags compare by their opaque part.
pub(crate) fn none_match(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|list| {
            list.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
        })
}

/// The request's query parameters, percent-decoded (borrowed when there is nothing to decode),
/// in order.
pub(crate) fn query_params(parts: &Parts) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let Some(q) = parts.uri.query() else {
        return Vec::new();
    };
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// One query parameter as [`query_values`] found it: its first value and whether it came again.
pub(crate) struct QueryValue<'a> {
    /// The parameter's name.
    name: &'static str,
    /// Its first value, percent-decoded.
    first: Option<Cow<'a, str>>,
    /// Whether it was given more than once.
    repeated: bool,
}

impl QueryValue<'_> {
    /// The one value of the parameter; an error when it is given more than once.
    pub(crate) fn single(&self) -> Result<Option<&str>, ApiError> {
        if self.repeated {
            return Err(ApiError::bad_request(
                if self.name == "offset" {
                    "INVALID_OFFSET"
                } else {
                    "INVALID_ARGUMENT"
                },
                format!("the query parameter {} is given more than once", self.name),
            ));
        }
        Ok(self.first.as_deref())
    }
}

/// The query parameters `names`, in one pass over the query and without allocating for the
/// usual query: what [`query_params`] would list for each name (names and values compared and
/// answered percent-decoded), less the parameters no name asks for, whose values are never
/// decoded.
pub(crate) fn query_values<'a, const N: usize>(
    parts: &'a Parts,
    names: [&'static str; N],
) -> [QueryValue<'a>; N] {
    let mut found = names.map(|name| QueryValue {
        name,
        first: None,
        repeated: false,
    });
    let Some(q) = parts.uri.query() else {
        return found;
    };
    let coded = |s: &str| s.bytes().any(|c| c == b'%' || c == b'+');
    let mut rest = Some(q);
    while let Some(r) = rest {
        // Split at ASCII bytes, so never inside a character.
        let (kv, more) = match r.bytes().position(|c| c == b'&') {
            Some(i) => (&r[..i], Some(&r[i + 1..])),
            None => (r, None),
        };
        rest = more;
        if kv.is_empty() {
            continue;
        }
        let (key, value) = match kv.bytes().position(|c| c == b'=') {
            Some(i) => (&kv[..i], &kv[i + 1..]),
            None => (kv, ""),
        };
        // No name has a `%` or `+`: a key without one is compared as it is.
        let slot = if coded(key) {
            let key = percent_decode(key);
            found.iter_mut().find(|f| f.name == key)
        } else {
            found.iter_mut().find(|f| f.name == key)
        };
        if let Some(slot) = slot {
            if slot.first.is_some() {
                slot.repeated = true;
            } else {
                slot.first = Some(percent_decode(value));
            }
        }
    }
    found
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; a `%` without two
/// hex digits stays as it is, and bytes that are not UTF-8 become U+FFFD.
fn percent_decode(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    if !b.iter().any(|&c| c == b'+' || c == b'%') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Request headers that carry one value: a request that repeats one is refused (400) rather
/// than resolved to whichever copy comes first, which a proxy and brook could disagree on.
const SINGLETONS: [&str; 24] = [
    "host",
    "content-type",
    "content-length",
    "authorization",
    "last-event-id",
    "if-none-match",
    crate::headers::STREAM_SEQ,
    crate::headers::STREAM_CLOSED,
    crate::headers::STREAM_INCARNATION,
    crate::headers::STREAM_TTL,
    crate::headers::STREAM_EXPIRES_AT,
    crate::headers::STREAM_RETENTION_MAX_AGE,
    crate::headers::STREAM_RETENTION_MAX_BYTES,
    crate::headers::STREAM_FORKED_FROM,
    crate::headers::STREAM_FORK_OFFSET,
    crate::headers::STREAM_FORK_SUB_OFFSET,
    crate::headers::STREAM_SSE_DATA_ENCODING,
    crate::headers::STREAM_SNAPSHOT_MATCH,
    crate::headers::STREAM_SNAPSHOT_OFFSET,
    crate::headers::STREAM_SNAPSHOT_DIGEST,
    crate::headers::PRODUCER_ID,
    crate::headers::PRODUCER_EPOCH,
    crate::headers::PRODUCER_SEQ,
    crate::headers::PRODUCER_DIGEST,
];

/// Longest request target (path and query) brook reads (`414 URI_TOO_LONG` past it; hyper
/// itself refuses targets past 64 KiB, without a body).
pub(crate) const MAX_TARGET_BYTES: usize = 16 << 10;

/// The checks every request's head passes before its route is looked at, in one pass over its
/// headers: [`within_limits`], [`no_repeated_singletons`], [`valid_host`], refused in that
/// order.
pub(crate) fn check_head(parts: &Parts) -> Result<(), ApiError> {
    let mut bytes = 0;
    let mut host = None;
    for (name, value) in &parts.headers {
        bytes += name.as_str().len() + value.len();
        if host.is_none() && name == header::HOST {
            host = Some(value);
        }
    }
    within_limits(parts, bytes)?;
    no_repeated_singletons(&parts.headers)?;
    valid_host(parts, host)
}

/// Refuses a request whose target or headers (`header_bytes` of names and values) are over
/// brook's limits, with problem+json (431 `REQUEST_HEADER_FIELDS_TOO_LARGE`, 414
/// `URI_TOO_LONG`). More than 100 header lines are hyper's own bare 431: parsing more would
/// cost every request two allocations.
fn within_limits(parts: &Parts, header_bytes: usize) -> Result<(), ApiError> {
    let target = parts.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_TARGET_BYTES {
        return Err(ApiError::Http {
            status: axum::http::StatusCode::URI_TOO_LONG,
            code: "URI_TOO_LONG",
            detail: format!("the request target is longer than {MAX_TARGET_BYTES} bytes"),
        });
    }
    if header_bytes > MAX_HEADER_BYTES {
        return Err(ApiError::Http {
            status: axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            code: "REQUEST_HEADER_FIELDS_TOO_LARGE",
            detail: format!("requests may carry at most {MAX_HEADER_BYTES} bytes of headers"),
        });
    }
    Ok(())
}

/// Refuses a request that repeats a single-valued header (400 `INVALID_ARGUMENT` naming it).
/// Free for the usual request, whose header names are all distinct.
fn no_repeated_singletons(headers: &HeaderMap) -> Result<(), ApiError> {
    if headers.len() == headers.keys_len() {
        return Ok(());
    }
    for name in SINGLETONS {
        let mut values = headers.get_all(name).iter();
        if values.next().is_some() && values.next().is_some() {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                format!("the header {name} is given more than once"),
            ));
        }
    }
    Ok(())
}

/// Refuses a request whose `Host` (its first one, `host`) is not a host name or IP literal with
/// an optional port (400 `INVALID_ARGUMENT`), and an HTTP/1.1 request without one (RFC 9112
/// section 3.2): the value is echoed into `Location`, so it must be a well-formed authority and
/// nothing else.
fn valid_host(parts: &Parts, host: Option<&HeaderValue>) -> Result<(), ApiError> {
    let refuse = |why: &str| Err(ApiError::bad_request("INVALID_ARGUMENT", why.to_owned()));
    let Some(host) = host else {
        if parts.version == axum::http::Version::HTTP_11 {
            return refuse("an HTTP/1.1 request needs a Host header");
        }
        return Ok(());
    };
    if !is_authority(host.as_bytes()) {
        return refuse("the Host header is not a host name or address with an optional port");
    }
    Ok(())
}

/// Whether `v` is `host[:port]`: a name of letters, digits, `-`, `.`, `_` and `~`, or a
/// bracketed IPv6 literal, then at most one `:` and 1 to 5 digits of a port up to 65535.
fn is_authority(v: &[u8]) -> bool {
    let rest = if let Some(literal) = v.strip_prefix(b"[") {
        let Some(close) = literal.iter().position(|&c| c == b']') else {
            return false;
        };
        let (ip, rest) = literal.split_at(close);
        if ip.is_empty()
            || !ip
                .iter()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, b':' | b'.'))
        {
            return false;
        }
        &rest[1..]
    } else {
        let end = v.iter().position(|&c| c == b':').unwrap_or(v.len());
        let (name, rest) = v.split_at(end);
        let name_char =
            |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~');
        if name.is_empty() || !name.iter().all(name_char) {
            return false;
        }
        rest
    };
    match rest {
        [] => true,
        [b':', port @ ..] => {
            (1..=5).contains(&port.len())
                && port.iter().all(u8::is_ascii_digit)
                && port.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')) <= 65_535
        }
        _ => false,
    }
}

/// The absolute URL of the request's path, for `Location`.
pub(crate) fn absolute_url(app: &AppState, parts: &Parts) -> String {
    let path = parts.uri.path();
    if let Some(base) = &app.config.public_url {
        return format!("{}{}", base.trim_end_matches('/'), path);
    }
    let host = text(&parts.headers, header::HOST)
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(std::string::ToString::to_string))
        .unwrap_or_else(|| "localhost".to_owned());
    let default = if app.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let scheme = parts.uri.scheme_str().unwrap_or(default);
    format!("{scheme}://{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`query_values`] answers, for each name, what [`query_params`] lists: the first value,
    /// decoded, and whether the name came again; names are matched decoded too.
    #[test]
    fn query_values_agree_with_query_params() {
        let names = ["offset", "live", "cursor", "max bytes"];
        for query in [
            "",
            "?",
            "?offset=-1",
            "?offset=0000000000000001_0000000000000002&live=long-poll&cursor=7",
            "?&&offset=1&&offset=2",
            "?offset",
            "?offset=&live",
            "?off%73et=a%2Bb+c&live=sse",
            "?max+bytes=5&max%20bytes=6",
            "?live=a=b&cursor=%zz&other=1&offset=%E2%82%AC",
            "?x=%FF&offset=%FF",
            "?=1&live=%",
        ] {
            let parts = axum::http::Request::get(format!("/s{query}"))
                .body(())
                .expect("a request")
                .into_parts()
                .0;
            let all = query_params(&parts);
            let found = query_values(&parts, names);
            for (name, v) in names.iter().zip(&found) {
                let mut values = all.iter().filter(|(k, _)| k == name).map(|(_, v)| v);
                assert_eq!(v.first.as_ref(), values.next(), "{query}: {name}");
                assert_eq!(v.repeated, values.next().is_some(), "{query}: {name}");
                assert_eq!(v.single().is_err(), v.repeated, "{query}: {name}");
            }
        }
    }
}
