//! PUT (create, fork, idempotent create), POST (append, close) and DELETE of a stream.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use bytes::Bytes;

use crate::headers::{
    parse_closed, parse_expires_at, parse_offset, parse_producer, parse_stream_seq,
    parse_sub_offset, parse_ttl,
};
use crate::{
    AppendRequest, AppendStatus, Commit, CreateOptions, Expiry, ForkFrom, Guard, StreamName,
    TryAppend, normalize_content_type,
};

use super::body::{Held, read_body, take_whole};
use super::budget;
use super::error::{ApiError, Op};
use super::if_match::tail_match;
use super::names::{
    PRODUCER_EPOCH, PRODUCER_SEQ, STREAM_CLOSED, STREAM_EXPIRES_AT, STREAM_FORK_OFFSET,
    STREAM_FORK_SUB_OFFSET, STREAM_FORKED_FROM, STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_TTL,
};
use super::reply::{Answer, ReadTag, Reply};
use super::request::{
    WriteHeaders, absolute_url, bytes_of, incarnation_of, producer_digest_of, raw,
};
use super::{AppState, AppendIfMatch, blocking};

/// The request's `Content-Type`, normalized; `None` when absent or empty.
fn content_type(value: Option<&HeaderValue>, op: Op) -> Result<Option<String>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v.as_bytes().trim_ascii().is_empty() => Ok(None),
        Some(v) => {
            let s = v.to_str().map_err(|_| {
                ApiError::bad_request(
                    "INVALID_CONTENT_TYPE",
                    "the Content-Type is not visible ASCII",
                )
            })?;
            normalize_content_type(s)
                .map(Some)
                .map_err(|e| ApiError::Store(e, op))
        }
    }
}

/// `Stream-TTL` and `Stream-Expires-At` (both at once is a 400, PROTOCOL.md 5.1).
fn expiry(headers: &HeaderMap) -> Result<Expiry, ApiError> {
    match (raw(headers, &STREAM_TTL), raw(headers, &STREAM_EXPIRES_AT)) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "INVALID_ARGUMENT",
            "Stream-TTL and Stream-Expires-At are mutually exclusive",
        )),
        (Some(ttl), None) => Ok(Expiry::Ttl(parse_ttl(ttl)?)),
        (None, Some(at)) => Ok(Expiry::At(parse_expires_at(at)?)),
        (None, None) => Ok(Expiry::Never),
    }
}

/// The source of a fork: `Stream-Forked-From` is a path on this server (an absolute URL's path
/// is accepted too).
pub(super) fn fork_source(value: &str) -> Result<StreamName, ApiError> {
    let value = value.trim();
    let path = match value.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |i| &rest[i..]),
        None => value,
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    StreamName::new(path).map_err(|_| {
        ApiError::bad_request(
            "INVALID_ARGUMENT",
            "Stream-Forked-From is not a valid stream path",
        )
    })
}

/// `Stream-Forked-From`, `Stream-Fork-Offset`, `Stream-Fork-Sub-Offset`.
fn fork(headers: &HeaderMap) -> Result<Option<ForkFrom>, ApiError> {
    let offset = raw(headers, &STREAM_FORK_OFFSET);
    let sub = raw(headers, &STREAM_FORK_SUB_OFFSET);
    let Some(source) = headers.get(&STREAM_FORKED_FROM) else {
        if offset.is_some() || sub.is_some() {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let source = fork_source(source.to_str().map_err(|_| {
        ApiError::bad_request(
            "INVALID_ARGUMENT",
            "Stream-Forked-From is not visible ASCII",
        )
    })?)?;
    let offset = match offset {
        None => None,
        Some(o) => {
            let s = std::str::from_utf8(o).unwrap_or("");
            Some(parse_offset(s.trim()).map_err(|_| {
                ApiError::bad_request(
                    "INVALID_FORK_OFFSET",
                    "Stream-Fork-Offset is not an offset this server returned",
                )
            })?)
        }
    };
    let sub_offset = match sub {
        None => 0,
        Some(s) => parse_sub_offset(s)
            .map_err(|e| ApiError::bad_request("INVALID_FORK_OFFSET", e.to_string()))?,
    };
    if sub_offset > 0 && offset.is_none() {
        return Err(ApiError::bad_request(
            "INVALID_FORK_OFFSET",
            "Stream-Fork-Sub-Offset needs an explicit Stream-Fork-Offset",
        ));
    }
    Ok(Some(ForkFrom {
        source,
        offset,
        sub_offset,
    }))
}

/// Under `--portable-names`: 400 `NAME_NOT_PORTABLE` for a name that could not move to a
/// server with Ursula's rules (`bucket/stream`), 400 `FORK_NOT_PORTABLE` for a fork (such
/// servers have none).
fn portable(name: &StreamName, h: &HeaderMap) -> Result<(), ApiError> {
    if let Some(problem) = crate::portable::name_problem(name.as_str()) {
        return Err(ApiError::bad_request(
            "NAME_NOT_PORTABLE",
            format!("'{name}' is not a portable stream name: {problem}"),
        ));
    }
    if h.contains_key(STREAM_FORKED_FROM) {
        return Err(ApiError::bad_request(
            "FORK_NOT_PORTABLE",
            "forks cannot move to servers without them (--portable-names)",
        ));
    }
    Ok(())
}

/// PUT `{s}`: 201 when created, 200 when it existed with the same configuration.
pub(crate) async fn create(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
    body: Body,
) -> Result<Answer, ApiError> {
    let h = &parts.headers;
    let w = WriteHeaders::of(h);
    if app.config.portable_names {
        portable(&name, h)?;
    }
    let opts = CreateOptions {
        content_type: content_type(w.content_type, Op::Create)?,
        expiry: expiry(h)?,
        closed: parse_closed(bytes_of(w.closed)),
        data: Bytes::new(),
        stream_seq: parse_stream_seq(bytes_of(w.stream_seq))?,
        fork: fork(h)?,
        expect: incarnation_of(w.incarnation)?,
        retention: super::retention::requested(h)?,
    };
    let held = write_body(app, parts, body).await?;
    let data = held.bytes.clone();
    let opts = CreateOptions { data, ..opts };
    let store = app.store.clone();
    let n = name.clone();
    let pending = blocking(Op::Create, move || store.submit_create(&n, opts)).await?;
    let created = pending
        .wait_async()
        .await
        .map_err(|e| ApiError::Store(e, Op::Create))?;
    let info = created.info;
    let status = if created.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut r = Reply::new(status)
        .text(header::CONTENT_TYPE, info.content_type)
        .offset(STREAM_NEXT_OFFSET, info.tail)
        .incarnation(STREAM_INCARNATION, &info.incarnation)
        .flag(STREAM_CLOSED, info.closed);
    if created.created {
        r = r.text(header::LOCATION, absolute_url(app, parts));
    }
    Ok(r.answer_empty())
}

/// POST `{s}`: 204 for a plain append, a close, or a producer's duplicate; 200 for a producer's
/// accepted append with data.
///
/// A small body that is there whole ([`take_whole`]: brook's HTTP/1.1 loop reads it before the
/// handler runs) is taken first, its refusal kept until the headers are checked (theirs come
/// first); the append then waits only for its durability, so its future (boxed per request by
/// that loop, and copied into its box) holds little more than the pending append. Any other
/// body is read, and the append made, in a boxed future of its own.
pub(crate) async fn append(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
    body: Body,
) -> Result<Answer, ApiError> {
    let declared = http_body::Body::size_hint(&body).exact();
    let limit = app.store.options().max_append_bytes() as u64;
    let taken = match declared {
        Some(n) if n <= limit && n <= budget::SMALL => take_whole(body, n, &app.budget),
        _ => Ok(Err(body)),
    };
    let mut s = match taken {
        Ok(Ok(held)) => start_append(app, &name, AppendHeaders::of(app, parts)?, held)?,
        Ok(Err(body)) => Box::pin(read_and_start(app, &name, parts, body)).await?,
        Err(e) => {
            AppendHeaders::of(app, parts)?;
            return Err(e);
        }
    };
    if let TryAppend::WouldBlock(req) = s.tried {
        // Boxed: the blocking call's state need not be part of every append's future.
        let store = app.store.clone();
        let submitted = blocking(Op::Append, move || store.submit_append(&name, req));
        s.tried = TryAppend::Done(Box::pin(submitted).await?);
    }
    let TryAppend::Done(pending) = &s.tried else {
        unreachable!("submitted above");
    };
    // The writers that might join this append's batch: every open connection but the live
    // readers (SSE, long-polls at the tail), which send no appends. The store's group-commit
    // policy says whether to let them enqueue first.
    let writers = app
        .connections
        .load(Ordering::Relaxed)
        .saturating_sub(app.edge.live_readers.load(Ordering::Relaxed));
    if app.store.commit_hint(writers) == Commit::Batch {
        tokio::task::yield_now().await;
    }
    // Waited on in place (`Pending::wait_async` would hold a second copy of it).
    if let Some(ticket) = pending.ticket() {
        ticket
            .wait_async()
            .await
            .map_err(|e| ApiError::Store(e, Op::Append))?;
    }
    let TryAppend::Done(pending) = s.tried else {
        unreachable!("submitted above");
    };
    let outcome = pending
        .into_outcome()
        .map_err(|e| ApiError::Store(e, Op::Append))?;
    let sent = s.sent;

    let status = match (sent, outcome.status) {
        (Some(_), AppendStatus::Appended) if s.has_data => StatusCode::OK,
        _ => StatusCode::NO_CONTENT,
    };
    // A duplicate carries the original write's tail only when it repeats the producer's newest
    // write (the seed); a repeat of an older write carries none.
    let next = match outcome.status {
        AppendStatus::Duplicate { original_tail } => original_tail,
        AppendStatus::Appended | AppendStatus::AlreadyClosed => Some(outcome.tail),
    };
    let mut r = Reply::new(status)
        .incarnation(STREAM_INCARNATION, &outcome.incarnation)
        .flag(STREAM_CLOSED, outcome.closed);
    if let Some(next) = next {
        r = r.offset(STREAM_NEXT_OFFSET, next);
    }
    if let Some((epoch, seq)) = outcome.producer.or(sent) {
        r = r.number(PRODUCER_EPOCH, epoch).number(PRODUCER_SEQ, seq);
    }
    // The new tail's tag, so a writer can chain its next guarded append without a read.
    if s.tail_guarded {
        r = r.tag(
            header::ETAG,
            ReadTag {
                incarnation: outcome.incarnation.clone(),
                start: outcome.tail,
                next: outcome.tail,
                closed: outcome.closed,
            },
        );
    }
    Ok(r.answer_empty())
}

/// [`append`]'s start for a body still to be read: the headers, the body, the submission.
async fn read_and_start(
    app: &AppState,
    name: &StreamName,
    parts: &Parts,
    body: Body,
) -> Result<Started, ApiError> {
    let h = AppendHeaders::of(app, parts)?;
    let held = write_body(app, parts, body).await?;
    start_append(app, name, h, held)
}

/// An append's request headers, parsed before its body is read (their refusals come first).
struct AppendHeaders<'a> {
    /// `Content-Type`, checked once the body is known not to be empty.
    content_type: Option<&'a HeaderValue>,
    /// `Stream-Closed`.
    close: bool,
    /// `Producer-Id`, `Producer-Epoch`, `Producer-Seq`.
    producer: Option<crate::Producer>,
    /// `Producer-Digest`.
    producer_digest: Option<crate::BodyDigest>,
    /// `Stream-Seq`.
    stream_seq: Option<String>,
    /// `Stream-Incarnation`.
    expect: Option<crate::Incarnation>,
    /// `If-Match`, when appends honour it.
    expect_tail: Option<crate::TailMatch>,
    /// The response carries the new tail's tag.
    tail_guarded: bool,
}

impl<'a> AppendHeaders<'a> {
    /// The headers of `parts`, or the refusal of the first that is not valid.
    fn of(app: &AppState, parts: &'a Parts) -> Result<AppendHeaders<'a>, ApiError> {
        let w = WriteHeaders::of(&parts.headers);
        let close = parse_closed(bytes_of(w.closed));
        let producer = parse_producer(
            bytes_of(w.producer_id),
            bytes_of(w.producer_epoch),
            bytes_of(w.producer_seq),
        )?;
        let stream_seq = parse_stream_seq(bytes_of(w.stream_seq))?;
        let expect = incarnation_of(w.incarnation)?;
        let producer_digest = producer_digest_of(w.producer_digest)?;
        if producer_digest.is_some() && producer.is_none() {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "Producer-Digest needs Producer-Id, Producer-Epoch and Producer-Seq",
            ));
        }
        // Off by default: Ursula has no precondition on the tail, and the header is ignored.
        let guarded = app.config.append_if_match == AppendIfMatch::TailPrecondition;
        let expect_tail = if guarded {
            // `If-Match` is a list header: on other requests brook ignores it, and an append's
            // precondition names one tag, so a second line is refused like a list in one.
            if parts
                .headers
                .get_all(header::IF_MATCH)
                .iter()
                .nth(1)
                .is_some()
            {
                return Err(ApiError::bad_request(
                    "INVALID_ARGUMENT",
                    "If-Match on an append must be one entity tag or *",
                ));
            }
            tail_match(w.if_match)?
        } else {
            None
        };
        Ok(AppendHeaders {
            content_type: w.content_type,
            close,
            producer,
            producer_digest,
            stream_seq,
            expect,
            expect_tail,
            tail_guarded: guarded && w.if_match.is_some(),
        })
    }
}

/// An append submitted to the store, waiting for its outcome.
struct Started {
    /// What the store did with it.
    tried: TryAppend,
    /// The body, whose lease lasts until the append is answered.
    _held: Held,
    /// The producer's epoch and sequence number, if one sent it.
    sent: Option<(u64, u64)>,
    /// The append carries data.
    has_data: bool,
    /// The response carries the new tail's tag.
    tail_guarded: bool,
}

/// Submits the append of `held` to `name` with the headers `h`.
fn start_append(
    app: &AppState,
    name: &StreamName,
    h: AppendHeaders<'_>,
    held: Held,
) -> Result<Started, ApiError> {
    let data = held.bytes.clone();
    // A body needs its media type; a close-only request's Content-Type is ignored (PROTOCOL.md
    // 5.2: clients may attach a default one).
    let content_type = if data.is_empty() {
        None
    } else {
        match content_type(h.content_type, Op::Append)? {
            Some(ct) => Some(ct),
            None => {
                return Err(ApiError::bad_request(
                    "CONTENT_TYPE_REQUIRED",
                    "an append with a body needs a Content-Type",
                ));
            }
        }
    };
    let has_data = !data.is_empty();
    let sent = h.producer.as_ref().map(|p| (p.epoch, p.seq));
    let req = AppendRequest {
        data,
        content_type,
        close: h.close,
        stream_seq: h.stream_seq,
        producer: h.producer,
        producer_digest: h.producer_digest,
        expect: h.expect,
        expect_tail: h.expect_tail,
    };
    // An append to an open stream needs no disk work before its durability wait, so it runs on
    // this worker; the store hands the request back when it would block (opening the stream,
    // expiry, a large body), and then it goes to a blocking thread.
    Ok(Started {
        tried: app.store.try_append(name, req),
        _held: held,
        sent,
        has_data,
        tail_guarded: h.tail_guarded,
    })
}

/// DELETE `{s}`: 204. The only successful response that addresses a stream without
/// `Stream-Incarnation` (there is no stream left to name).
pub(crate) async fn delete(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Answer, ApiError> {
    app.blocking_on_stream(name, &parts.headers, Op::Read, |store, name, expect| {
        store.delete(name, &Guard::from(expect.cloned()))
    })
    .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT).answer_empty())
}

/// A create's or append's body, read whole: at most `max_append_bytes` (413 past it, from its
/// declared length when it has one), and 408 when it stalls past `body_read_timeout`.
///
/// The declared length is the body's exact size hint: hyper's from a valid `Content-Length`
/// (HTTP/1.1 and HTTP/2 alike; a malformed one never reaches a handler), brook's HTTP/1.1
/// loop's from the body it read whole. So the header is not parsed again here. A body that may
/// be large is charged to the request's owner (`parts`: its peer and token).
///
/// A small body that is there whole (brook's HTTP/1.1 loop reads it before the handler runs) is
/// taken at once ([`take_whole`]); any other is read by [`read_body`], whose future is boxed so
/// that it is no part of every append's (which that loop boxes, and copies, per request).
async fn write_body(app: &AppState, parts: &Parts, mut body: Body) -> Result<Held, ApiError> {
    let declared = http_body::Body::size_hint(&body).exact();
    let limit = app.store.options().max_append_bytes();
    if let Some(n) = declared
        && n <= limit as u64
        && n <= budget::SMALL
    {
        match take_whole(body, n, &app.budget)? {
            Ok(held) => return Ok(held),
            Err(rest) => body = rest,
        }
    }
    Box::pin(read_body(
        body,
        declared,
        limit,
        &app.body_rules_for(parts, declared),
    ))
    .await
}
