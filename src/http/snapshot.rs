//! Ursula's snapshot and retention routes: publish, read and (always refused) delete a snapshot,
//! and advance a stream's earliest readable offset.

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use crate::headers::parse_offset;
use crate::{
    Error, Incarnation, Offset, PublishSnapshot, Published, RetentionRequest, Snapshot,
    SnapshotRequest, StreamName, normalize_content_type,
};

use super::body::{Pieces, pump_to_store};
use super::error::{ApiError, Op};
use super::names::{
    STREAM_CLOSED, STREAM_EARLIEST_OFFSET, STREAM_IMMUTABLE, STREAM_INCARNATION,
    STREAM_NEXT_OFFSET, STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_MATCH, STREAM_SNAPSHOT_OFFSET,
    STREAM_SNAPSHOT_PARTS, STREAM_UP_TO_DATE, TRUE,
};
use super::ranges::{ByteRange, Selected};
use super::reply::{Reply, problem, set_header};
use super::request::{absolute_url, expected_incarnation, none_match, text};
use super::{AppState, blocking};

/// An offset from a route's last segment; one this server did not issue is 400 `INVALID_OFFSET`.
pub(super) fn route_offset(offset: &str) -> Result<Offset, ApiError> {
    parse_offset(offset).map_err(|_| {
        ApiError::bad_request(
            "INVALID_OFFSET",
            format!("{offset:?} is not an offset this server returned"),
        )
    })
}

/// What a request to `{s}/snapshot/{offset}` (or under it) names: the route's offset, then the
/// incarnation its `Stream-Incarnation` expects, refused in that order.
pub(super) fn route_target(
    offset: &str,
    headers: &HeaderMap,
) -> Result<(Offset, Option<Incarnation>), ApiError> {
    let offset = route_offset(offset)?;
    Ok((offset, expected_incarnation(headers)?))
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
    // A commit of staged parts (Ursula 0.11): its body lists them.
    if parts.headers.contains_key(STREAM_SNAPSHOT_PARTS) {
        return super::snapshot_parts::commit(app, name, offset, parts, body).await;
    }
    let h = &parts.headers;
    let (offset, expect) = route_target(offset, h)?;
    let content_type = match text(h, header::CONTENT_TYPE)
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(ct) => Some(normalize_content_type(ct).map_err(|e| ApiError::Store(e, Op::Snapshot))?),
    };
    let expect_digest = text(h, STREAM_SNAPSHOT_MATCH).map(|s| s.trim().to_owned());
    let limit = app.store.options().max_snapshot_bytes();
    let store = app.store.clone();
    let Published {
        snapshot: snap,
        stream: info,
    } = pump_to_store(app, parts, body, limit, Op::Snapshot, move |reader| {
        let req = PublishSnapshot {
            offset,
            content_type,
            blob: Box::new(reader),
            if_digest: expect_digest,
            expect,
        };
        store.publish_snapshot(&name, req)
    })
    .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .offset(STREAM_NEXT_OFFSET, info.tail)
        .offset(STREAM_SNAPSHOT_OFFSET, snap.offset)
        .header(STREAM_SNAPSHOT_DIGEST, &snap.digest)
        .header(STREAM_INCARNATION, info.incarnation.as_str())
        .empty())
}

/// GET `{s}/snapshot`: the latest snapshot's blob, answered as `{s}/snapshot/{offset}` answers it
/// (its `Content-Location` names that URL); 404 when none was published. Ursula 0.11 answers
/// this route 405 and has clients read `Stream-Snapshot-Offset` from HEAD instead; brook keeps
/// it, as the seed's Ursula had it.
pub(crate) async fn snapshot_latest(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let expect = expected_incarnation(&parts.headers)?;
    let snap = read_snapshot(app, name, None).await?;
    let location = format!("{}/{}", absolute_url(app, parts), snap.info.offset);
    // Which snapshot is the latest changes as new ones are published: revalidate every time.
    let shape = Shape::Stream {
        cache: "no-cache",
        location: Some(location),
    };
    snapshot_response(parts, snap, expect.as_ref(), shape)
}

/// GET `{s}/snapshot/{offset}`: the blob with its own content type, or the byte range `Range`
/// names.
pub(crate) async fn snapshot_at(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let (offset, expect) = route_target(offset, &parts.headers)?;
    let snap = read_snapshot(app, name, Some(offset)).await?;
    // Immutable per offset within an incarnation.
    let shape = Shape::Stream {
        cache: "private, max-age=60",
        location: None,
    };
    snapshot_response(parts, snap, expect.as_ref(), shape)
}

/// The snapshot of `name` at `offset` (the latest if `None`), read on the blocking pool without
/// an incarnation check: [`snapshot_response`] makes it, after the range check, against the
/// incarnation the snapshot was read from.
pub(super) async fn read_snapshot(
    app: &AppState,
    name: StreamName,
    offset: Option<Offset>,
) -> Result<Snapshot, ApiError> {
    let store = app.store.clone();
    blocking(Op::Read, move || {
        store.snapshot(
            &name,
            &SnapshotRequest {
                offset,
                expect: None,
            },
        )
    })
    .await
}

/// Which resource a snapshot answer is for.
pub(super) enum Shape {
    /// `{s}/snapshot[/{offset}]`: with the stream's `Stream-Next-Offset`, `Stream-Up-To-Date` and
    /// `Stream-Closed`, cached as `cache` says.
    Stream {
        /// `Cache-Control`.
        cache: &'static str,
        /// `Content-Location`, for the latest snapshot.
        location: Option<String>,
    },
    /// `{s}/incarnation/{token}/snapshot/{offset}`: only headers that never change
    /// (`Stream-Next-Offset` is the snapshot's offset), marked `Stream-Immutable`.
    Immutable {
        /// `Cache-Control` of a success.
        cache: HeaderValue,
    },
}

/// The answer to a snapshot read: the blob, or the one byte range `Range` names (206 with
/// `Content-Range`; 416 when it selects nothing), or 304 when `If-None-Match` names it. Its
/// `Content-Type` is the snapshot's, `Stream-Snapshot-Offset` and `Stream-Snapshot-Digest`
/// describe the whole snapshot, and its `ETag` names the incarnation and the digest. The order
/// of refusals is the seed's: a read that would answer 404 or 416 without `Stream-Incarnation`
/// still does; then `expect`, if any, must be the incarnation the snapshot was read from (412).
pub(super) fn snapshot_response(
    parts: &Parts,
    snap: Snapshot,
    expect: Option<&Incarnation>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let tag = format!("\"{}:{}\"", snap.incarnation, snap.info.digest);
    let matched = none_match(&parts.headers, &tag);
    let total = snap.data.len() as u64;
    let selected = if matched {
        None
    } else {
        ByteRange::of(&parts.headers).and_then(|r| r.select(total))
    };
    if let Some(unsatisfied @ Selected::Unsatisfiable { .. }) = selected {
        let mut h = HeaderMap::new();
        set_header(&mut h, header::CONTENT_RANGE, &unsatisfied.content_range());
        set_header(&mut h, STREAM_INCARNATION, snap.incarnation.as_str());
        return Ok(problem(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "RANGE_NOT_SATISFIABLE",
            &format!("the range lies outside the snapshot's {total} bytes"),
            h,
            serde_json::Map::new(),
        ));
    }
    if let Some(want) = expect
        && *want != snap.incarnation
    {
        let current = snap.incarnation;
        return Err(ApiError::Store(
            Error::IncarnationMismatch { current },
            Op::Read,
        ));
    }
    let status = match selected {
        _ if matched => StatusCode::NOT_MODIFIED,
        Some(Selected::Partial { .. }) => StatusCode::PARTIAL_CONTENT,
        _ => StatusCode::OK,
    };
    let mut reply = Reply::new(status)
        .header(header::CONTENT_TYPE, &snap.info.content_type)
        .header(header::ETAG, &tag)
        .fixed(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"))
        .offset(STREAM_SNAPSHOT_OFFSET, snap.info.offset)
        .header(STREAM_SNAPSHOT_DIGEST, &snap.info.digest)
        .header(STREAM_INCARNATION, snap.incarnation.as_str());
    reply = match shape {
        Shape::Stream { cache, location } => {
            let r = reply
                .header(header::CACHE_CONTROL, cache)
                .offset(STREAM_NEXT_OFFSET, snap.tail)
                .flag(STREAM_UP_TO_DATE, snap.tail == snap.info.offset)
                .flag(STREAM_CLOSED, snap.closed);
            match location {
                Some(l) => r.header(header::CONTENT_LOCATION, &l),
                None => r,
            }
        }
        Shape::Immutable { cache } => reply
            .fixed(header::CACHE_CONTROL, cache)
            .offset(STREAM_NEXT_OFFSET, snap.info.offset)
            .fixed(STREAM_IMMUTABLE, TRUE),
    };
    if matched {
        return Ok(reply.empty());
    }
    let body = match selected {
        Some(part @ Selected::Partial { first, last, .. }) => {
            reply = reply.header(header::CONTENT_RANGE, &part.content_range());
            // `select` keeps `first <= last < total`, the blob's length.
            let (first, last) = (usize::try_from(first), usize::try_from(last));
            match (first, last) {
                (Ok(a), Ok(b)) => snap.data.slice(a..=b),
                _ => return Err(ApiError::internal("a snapshot range outside its blob")),
            }
        }
        _ => snap.data,
    };
    // A view of the snapshot's file, handed to the socket without a copy.
    Ok(reply.body(Pieces::new(vec![body]).into_body()))
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
