//! Ursula's snapshot and retention routes: publish, read and (always refused) delete a snapshot,
//! and advance a stream's earliest readable offset.

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;

use crate::headers::parse_offset;
use crate::{
    Offset, PublishSnapshot, Published, RetentionRequest, Snapshot, SnapshotRequest, StreamName,
    normalize_content_type,
};

use super::body::{Pieces, pump};
use super::error::{ApiError, Op};
use super::names::{
    STREAM_CLOSED, STREAM_EARLIEST_OFFSET, STREAM_INCARNATION, STREAM_NEXT_OFFSET,
    STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_MATCH, STREAM_SNAPSHOT_OFFSET, STREAM_UP_TO_DATE,
};
use super::reply::Reply;
use super::request::{absolute_url, expected_incarnation, none_match, text};
use super::{AppState, blocking};

/// An offset from a route's last segment; one this server did not issue is 400 `INVALID_OFFSET`.
fn route_offset(offset: &str) -> Result<Offset, ApiError> {
    parse_offset(offset).map_err(|_| {
        ApiError::bad_request(
            "INVALID_OFFSET",
            format!("{offset:?} is not an offset this server returned"),
        )
    })
}

/// PUT `{s}/snapshot/{offset}`: publishes the body as the snapshot at `offset` (204). The body
/// is streamed to the engine and never held whole; over the store's snapshot limit it is 413.
pub(crate) async fn publish_snapshot(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let offset = route_offset(offset)?;
    let h = &parts.headers;
    let expect = expected_incarnation(h)?;
    let content_type = match text(h, header::CONTENT_TYPE)
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(ct) => Some(normalize_content_type(ct).map_err(|e| ApiError::Store(e, Op::Snapshot))?),
    };
    let expect_digest = text(h, STREAM_SNAPSHOT_MATCH).map(|s| s.trim().to_owned());
    let limit = app.store.options().max_snapshot_bytes();
    // The declared length (hyper's from `Content-Length`, brook's loop's from the body it read).
    if http_body::Body::size_hint(&body)
        .exact()
        .is_some_and(|n| n > limit)
    {
        return Err(ApiError::too_large(limit));
    }
    // What is in flight between the body and the file: the pump's few frames.
    let _in_flight = app
        .budget
        .lease(super::budget::Use::Bodies, super::body::PUMP_HELD)?;
    let (mut reader, status, feed) = pump(body, limit, app.body_rules());
    let store = app.store.clone();
    let publish = blocking(Op::Snapshot, move || {
        let req = PublishSnapshot {
            offset,
            content_type,
            blob: Box::new(&mut reader),
            if_digest: expect_digest,
            expect,
        };
        store.publish_snapshot(&name, req)
    });
    let ((), published) = tokio::join!(feed, publish);
    let Published {
        snapshot: snap,
        stream: info,
    } = match published {
        Ok(v) => v,
        Err(_) if status.overflowed() => return Err(ApiError::too_large(limit)),
        Err(_) if let Some(refusal) = status.timed_out() => return Err(refusal),
        Err(_) if status.failed() => {
            return Err(ApiError::bad_request(
                "INVALID_BODY",
                "the request body could not be read",
            ));
        }
        Err(e) => return Err(e),
    };
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .offset(STREAM_NEXT_OFFSET, info.tail)
        .offset(STREAM_SNAPSHOT_OFFSET, snap.offset)
        .header(STREAM_SNAPSHOT_DIGEST, &snap.digest)
        .header(STREAM_INCARNATION, info.incarnation.as_str())
        .empty())
}

/// GET `{s}/snapshot`: the latest snapshot's blob, answered as `{s}/snapshot/{offset}` answers it
/// (its `Content-Location` names that URL); 404 when none was published.
pub(crate) async fn snapshot_latest(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let snap = app
        .blocking_on_stream(name, &parts.headers, Op::Read, |store, name, expect| {
            let req = SnapshotRequest {
                offset: None,
                expect: expect.cloned(),
            };
            store.snapshot(name, &req)
        })
        .await?;
    let location = format!("{}/{}", absolute_url(app, parts), snap.info.offset);
    // Which snapshot is the latest changes as new ones are published: revalidate every time.
    let r = snapshot_reply(parts, snap, "no-cache");
    Ok(r.header(header::CONTENT_LOCATION, &location)
        .into_response())
}

/// GET `{s}/snapshot/{offset}`: the blob with its own content type.
pub(crate) async fn snapshot_at(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let offset = route_offset(offset)?;
    let snap = app
        .blocking_on_stream(
            name,
            &parts.headers,
            Op::Read,
            move |store, name, expect| {
                let req = SnapshotRequest {
                    offset: Some(offset),
                    expect: expect.cloned(),
                };
                store.snapshot(name, &req)
            },
        )
        .await?;
    // Immutable per offset within an incarnation.
    Ok(snapshot_reply(parts, snap, "private, max-age=60").into_response())
}

/// A snapshot response under construction: its headers, and its blob unless `If-None-Match`
/// names it (304).
struct SnapshotReply {
    /// Status and headers.
    reply: Reply,
    /// The blob; `None` for a 304.
    body: Option<Bytes>,
}

impl SnapshotReply {
    /// Adds a header.
    fn header(mut self, name: header::HeaderName, value: &str) -> Self {
        self.reply = self.reply.header(name, value);
        self
    }

    /// The response: the blob as a view of its file, or no body for a 304.
    fn into_response(self) -> Response {
        match self.body {
            // A view of the snapshot's file, handed to the socket without a copy.
            Some(blob) => self.reply.body(Pieces::new(vec![blob]).into_body()),
            None => self.reply.empty(),
        }
    }
}

/// The blob with its content type, `Stream-Snapshot-Offset`, `Stream-Snapshot-Digest`, the
/// stream's `Stream-Next-Offset` and `Stream-Incarnation`, and an `ETag` naming both the
/// incarnation and the digest.
fn snapshot_reply(parts: &Parts, snap: Snapshot, cache_control: &str) -> SnapshotReply {
    let tag = format!("\"{}:{}\"", snap.incarnation, snap.info.digest);
    let matched = none_match(&parts.headers, &tag);
    let reply = Reply::new(if matched {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    })
    .header(header::CONTENT_TYPE, &snap.info.content_type)
    .header(header::ETAG, &tag)
    .header(header::CACHE_CONTROL, cache_control)
    .offset(STREAM_NEXT_OFFSET, snap.tail)
    .offset(STREAM_SNAPSHOT_OFFSET, snap.info.offset)
    .header(STREAM_SNAPSHOT_DIGEST, &snap.info.digest)
    .header(STREAM_INCARNATION, snap.incarnation.as_str())
    .flag(STREAM_UP_TO_DATE, snap.tail == snap.info.offset)
    .flag(STREAM_CLOSED, snap.closed);
    SnapshotReply {
        reply,
        body: (!matched).then_some(snap.data),
    }
}

/// DELETE `{s}/snapshot/{offset}`: snapshots are immutable, so this is always refused (409 for
/// the latest, 404 for any other), as in Ursula.
pub(crate) async fn delete_snapshot(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let offset = route_offset(offset)?;
    app.blocking_on_stream(
        name,
        &parts.headers,
        Op::Snapshot,
        move |store, name, expect| {
            store.delete_snapshot(name, offset, &crate::Guard::from(expect.cloned()))
        },
    )
    .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT).empty())
}

/// PUT `{s}/retention/{offset}`: advances the earliest readable offset (204).
pub(crate) async fn retention(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let offset = route_offset(offset)?;
    let info = app
        .blocking_on_stream(
            name,
            &parts.headers,
            Op::Snapshot,
            move |store, name, expect| {
                let req = RetentionRequest {
                    offset,
                    expect: expect.cloned(),
                };
                store.set_retention(name, &req)
            },
        )
        .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .offset(STREAM_NEXT_OFFSET, info.tail)
        .offset(STREAM_EARLIEST_OFFSET, info.earliest)
        .header(STREAM_INCARNATION, info.incarnation.as_str())
        .empty())
}
