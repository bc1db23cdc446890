//! Request heads: parsing (httparse, then the checks hyper makes), the request a handler sees,
//! and the refusals of heads this loop cannot frame.

use std::mem::MaybeUninit;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use bytes::Bytes;

use super::{Head, INLINE_BODY_MAX, MAX_HEADERS, MAX_TARGET, NotHere};
use crate::http::error::ApiError;

/// The positions of a head's header lines in the read buffer: name and value, each as start
/// and length.
pub(super) type Lines = Vec<((usize, usize), (usize, usize))>;

/// Parses the head at the start of `buf`, its header lines' positions into `lines`: `None` when
/// it is not complete yet.
pub(super) fn parse(buf: &[u8], lines: &mut Lines) -> Result<Option<Head>, NotHere> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(NotHere::Refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "REQUEST_HEADER_FIELDS_TOO_LARGE",
                format!("requests may carry at most {MAX_HEADERS} header lines"),
            ));
        }
        Err(e) => {
            return Err(malformed(&format!(
                "the request head is not HTTP/1.1 ({e})"
            )));
        }
    };
    // HTTP/1.0 (other keep-alive rules, no chunked responses) is hyper's.
    if req.version != Some(1) {
        return Err(NotHere::Handoff);
    }
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Err(malformed("the request line is incomplete"));
    };
    if path.len() > MAX_TARGET {
        return Err(uri_too_long());
    }
    let method = match method {
        "GET" => Method::GET,
        "POST" => Method::POST,
        "PUT" => Method::PUT,
        "HEAD" => Method::HEAD,
        "DELETE" => Method::DELETE,
        "OPTIONS" => Method::OPTIONS,
        // hyper ends HTTP on a connection whose CONNECT was answered 2xx (a tunnel follows):
        // framing this loop does not do.
        "CONNECT" => return Err(NotHere::Handoff),
        // Any other token: the handler answers 405 with the methods the route allows.
        other => Method::from_bytes(other.as_bytes())
            .map_err(|_| malformed("the method is not a token"))?,
    };
    let at = |s: &[u8]| (s.as_ptr() as usize - buf.as_ptr() as usize, s.len());
    let mut head = Head {
        method,
        target: at(path.as_bytes()),
        len,
        body_len: 0,
        expects_continue: false,
        close: false,
    };
    let mut length: Option<usize> = None;
    let mut total = 0;
    lines.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        // Whether the handler's map gets this line.
        let mut kept = true;
        // The names this loop acts on, told apart by length first (most lines match none).
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        match name.len() {
            14 if is(b"content-length") => {
                let n = parse_length(h.value)
                    .ok_or_else(|| malformed("the Content-Length is not a decimal number"))?;
                // Two lengths that disagree: no framing can be trusted (request smuggling).
                if length.is_some_and(|m| m as u64 != n) {
                    return Err(malformed("the Content-Length is given twice, differently"));
                }
                // A larger body streams, on hyper's path (which refuses one past its limit).
                let Some(n) = usize::try_from(n).ok().filter(|&n| n <= INLINE_BODY_MAX) else {
                    return Err(NotHere::Handoff);
                };
                length = Some(n);
                // The body's exact length says it to the handler (see `unread`).
                kept = false;
            }
            17 if is(b"transfer-encoding") => return Err(NotHere::Handoff),
            7 if is(b"upgrade") => return Err(NotHere::Handoff),
            6 if is(b"expect") => {
                if !h.value.eq_ignore_ascii_case(b"100-continue") {
                    return Err(NotHere::Handoff);
                }
                head.expects_continue = true;
            }
            10 if is(b"connection") => {
                // hyper reads no token of a value that is not ASCII (not even `close`): such a
                // connection is hyper's.
                if !h.value.is_ascii() {
                    return Err(NotHere::Handoff);
                }
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        head.close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return Err(NotHere::Handoff);
                    }
                }
            }
            _ => {}
        }
        total += name.len() + h.value.len();
        if kept && !unread(name) {
            lines.push((at(name), at(h.value)));
        }
    }
    if total > crate::http::limits::MAX_HEADER_BYTES {
        // Keep every line, so that the handler's check refuses the head with its 431 as it
        // counts it on hyper's path.
        lines.clear();
        lines.extend(
            req.headers
                .iter()
                .map(|h| (at(h.name.as_bytes()), at(h.value))),
        );
    }
    head.body_len = length.unwrap_or(0);
    // Without a body to wait for, a `100 Continue` would only confuse the client.
    head.expects_continue &= head.body_len > 0 && buf.len() < len + head.body_len;
    Ok(Some(head))
}

/// Whether no handler reads request header `name`: the headers clients and browsers send for
/// content negotiation, caching and fetch metadata, which this protocol has no use for. They
/// are framing-checked by httparse and counted toward the header-size limit, but left out of
/// the handler's `HeaderMap` (`Connection` is read here, by the loop). Building and dropping
/// that map is most of a small request's parse cost. `Content-Length` is left out too (by
/// [`parse`], which reads it): the loop reads the body whole, and handlers take a body's
/// declared length from its exact size hint, which hyper sets from the header on its path.
pub(crate) fn unread(name: &[u8]) -> bool {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    match name.len() {
        2 => is(b"te"),
        3 => is(b"dnt"),
        6 => is(b"accept") || is(b"pragma") || is(b"cookie"),
        7 => is(b"referer"),
        8 => is(b"priority"),
        10 => is(b"user-agent") || is(b"connection") || is(b"keep-alive"),
        14 => {
            name[..10].eq_ignore_ascii_case(b"sec-fetch-")
                && (is(b"sec-fetch-dest")
                    || is(b"sec-fetch-mode")
                    || is(b"sec-fetch-site")
                    || is(b"sec-fetch-user"))
        }
        15 => is(b"accept-encoding") || is(b"accept-language"),
        25 => is(b"upgrade-insecure-requests"),
        _ => name.len() > 9 && name[..9].eq_ignore_ascii_case(b"sec-ch-ua"),
    }
}

/// The refusal of a request target over [`MAX_TARGET`] bytes: 414 `URI_TOO_LONG`.
pub(super) fn uri_too_long() -> NotHere {
    NotHere::Refuse(
        StatusCode::URI_TOO_LONG,
        "URI_TOO_LONG",
        format!("a request target may be at most {MAX_TARGET} bytes"),
    )
}

/// The refusal of a target or header value that `http` does not accept, though httparse did:
/// 400 `MALFORMED_REQUEST`.
pub(super) fn unparsable() -> ApiError {
    ApiError::Http {
        status: StatusCode::BAD_REQUEST,
        code: "MALFORMED_REQUEST",
        detail: "the request target or a header value is not valid".to_owned(),
    }
}

/// The refusal of a head that is not well-formed HTTP/1.1: 400 `MALFORMED_REQUEST`.
fn malformed(detail: &str) -> NotHere {
    NotHere::Refuse(
        StatusCode::BAD_REQUEST,
        "MALFORMED_REQUEST",
        detail.to_owned(),
    )
}

/// A `Content-Length` value: decimal digits only, any number of them (leading zeros too) while
/// the value fits in a `u64`, as hyper takes it (without a sign, spaces or a list).
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        let digit = char::from(b).to_digit(10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The handler's request head: its target and headers as views of `message` (the head's bytes,
/// frozen), the headers in `headers` (an empty map, reused for its room).
/// `None` if the target or a header is not one `http` accepts.
pub(super) fn request(
    message: &Bytes,
    head: &Head,
    lines: &Lines,
    mut headers: HeaderMap,
) -> Option<Request<()>> {
    let slice = |(at, len): (usize, usize)| message.slice(at..at + len);
    let uri = Uri::from_maybe_shared(slice(head.target)).ok()?;
    headers.reserve(lines.len());
    for &(name, value) in lines {
        let name = header_name(&message[name.0..name.0 + name.1])?;
        let value = HeaderValue::from_maybe_shared(slice(value)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(());
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Some(req)
}

/// The protocol's own header names, so the common requests' names cost no allocation (`http`
/// allocates a custom name it parses).
const KNOWN: [HeaderName; 9] = [
    HeaderName::from_static("producer-id"),
    HeaderName::from_static("producer-epoch"),
    HeaderName::from_static("producer-seq"),
    HeaderName::from_static("stream-seq"),
    HeaderName::from_static("stream-incarnation"),
    HeaderName::from_static("stream-closed"),
    HeaderName::from_static("stream-ttl"),
    HeaderName::from_static("stream-expires-at"),
    HeaderName::from_static("stream-forked-from"),
];

/// `name` as a header name: a standard one or one of [`KNOWN`] without allocating, and the
/// commonest request headers without `http`'s general parse.
fn header_name(name: &[u8]) -> Option<HeaderName> {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    let common = match name.len() {
        4 if is(b"host") => Some(header::HOST),
        6 if is(b"origin") => Some(header::ORIGIN),
        12 if is(b"content-type") => Some(header::CONTENT_TYPE),
        13 if is(b"authorization") => Some(header::AUTHORIZATION),
        13 if is(b"if-none-match") => Some(header::IF_NONE_MATCH),
        14 if is(b"content-length") => Some(header::CONTENT_LENGTH),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    let ours = name.len() > 9 && name[..7].eq_ignore_ascii_case(b"stream-")
        || name.len() > 10 && name[..9].eq_ignore_ascii_case(b"producer-");
    if ours
        && let Some(known) = KNOWN
            .iter()
            .find(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
    {
        return Some(known.clone());
    }
    HeaderName::from_bytes(name).ok()
}
