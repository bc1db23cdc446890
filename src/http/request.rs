//! Reading a request: header values as bytes or text, the typed values several handlers share
//! (`Stream-Incarnation`, `If-None-Match`, `Content-Length`), the query string, and the request's
//! absolute URL.

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::Incarnation;
use crate::headers::{InvalidHeader};

use super::names::{STREAM_INCARNATION};
use super::AppState;
use super::error::ApiError;

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

/// The request's `Stream-Incarnation`, if any.
pub(crate) fn expected_incarnation(headers: &HeaderMap) -> Result<Option<Incarnation>, ApiError> {
    match headers.get(&STREAM_INCARNATION) {
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

/// The request's declared `Content-Length`, if any (`None` when it is not a decimal).
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
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

/// The request's query parameters, percent-decoded, in order.
pub(crate) fn query_params(parts: &Parts) -> Vec<(String, String)> {
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

/// The one value of a query parameter; an error when it is given more than once.
pub(crate) fn single<'a>(
    params: &'a [(String, String)],
    name: &'static str,
) -> Result<Option<&'a str>, ApiError> {
    let mut found = params
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str());
    let first = found.next();
    if found.next().is_some() {
        return Err(ApiError::bad_request(
            if name == "offset" {
                "INVALID_OFFSET"
            } else {
                "INVALID_ARGUMENT"
            },
            format!("the query parameter {name} is given more than once"),
        ));
    }
    Ok(first)
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; a `%` without two
/// hex digits stays as it is, and bytes that are not UTF-8 become U+FFFD.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
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
    String::from_utf8_lossy(&out).into_owned()
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
    let scheme = parts.uri.scheme_str().unwrap_or("http");
    format!("{scheme}://{host}{path}")
}
