//! Ursula's extension routes: snapshots, retention and bootstrap.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;

use crate::headers::{
    QUERY_LIVE, STREAM_CLOSED, STREAM_EARLIEST_OFFSET, STREAM_INCARNATION, STREAM_NEXT_OFFSET,
    STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_MATCH, STREAM_SNAPSHOT_OFFSET, STREAM_UP_TO_DATE,
    parse_offset,
};
use crate::{
    Error, Incarnation, Message, Offset, ReadFrom, ReadRequest, Snapshot, StreamName,
    normalize_content_type,
};

use super::body::{Pieces, pump};
use super::error::{ApiError, Op};
use super::{AppState, Reply, absolute_url, blocking, expected_incarnation, query_params, text};

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
    let limit = app.store.options().snapshot_limit();
    let declared = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let (mut reader, status, feed) = pump(body, limit);
    let store = app.store.clone();
    let publish = blocking(Op::Snapshot, move || {
        store.publish_snapshot(
            &name,
            offset,
            content_type.as_deref(),
            &mut reader,
            expect_digest.as_deref(),
            expect.as_ref(),
        )
    });
    let ((), published) = tokio::join!(feed, publish);
    let (snap, info) = match published {
        Ok(v) => v,
        Err(_) if status.overflowed() => return Err(ApiError::too_large(limit)),
        Err(_) if status.failed() => {
            return Err(ApiError::bad_request(
                "INVALID_BODY",
                "the request body could not be read",
            ));
        }
        Err(e) => return Err(e),
    };
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .header(STREAM_NEXT_OFFSET, &info.tail.to_string())
        .header(STREAM_SNAPSHOT_OFFSET, &snap.offset.to_string())
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
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    let snap = blocking(Op::Read, move || {
        store.snapshot(&name, None, expect.as_ref())
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
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    let snap = blocking(Op::Read, move || {
        store.snapshot(&name, Some(offset), expect.as_ref())
    })
    .await?;
    // Immutable per offset within an incarnation.
    Ok(snapshot_reply(parts, snap, "private, max-age=60").into_response())
}

/// A snapshot response under construction: its headers, and its blob unless `If-None-Match`
/// names it (304).
struct SnapshotReply {
    reply: Reply,
    body: Option<Bytes>,
}

impl SnapshotReply {
    fn header(mut self, name: header::HeaderName, value: &str) -> Self {
        self.reply = self.reply.header(name, value);
        self
    }

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
    let matched = parts
        .headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|l| {
            l.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
        });
    let reply = Reply::new(if matched {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    })
    .header(header::CONTENT_TYPE, &snap.info.content_type)
    .header(header::ETAG, &tag)
    .header(header::CACHE_CONTROL, cache_control)
    .header(STREAM_NEXT_OFFSET, &snap.tail.to_string())
    .header(STREAM_SNAPSHOT_OFFSET, &snap.info.offset.to_string())
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
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    blocking(Op::Snapshot, move || {
        store.delete_snapshot(&name, offset, expect.as_ref())
    })
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
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    let info = blocking(Op::Snapshot, move || {
        store.set_retention(&name, offset, expect.as_ref())
    })
    .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .header(STREAM_NEXT_OFFSET, &info.tail.to_string())
        .header(STREAM_EARLIEST_OFFSET, &info.earliest.to_string())
        .header(STREAM_INCARNATION, info.incarnation.as_str())
        .empty())
}

/// The parts of a bootstrap body still to be produced.
struct Bootstrap {
    app: AppState,
    name: StreamName,
    incarnation: Incarnation,
    boundary: String,
    part_type: String,
    /// Messages starting before this offset are included; the tail when the response began.
    end: Offset,
    /// Where the next read continues.
    next: Offset,
    queue: VecDeque<Bytes>,
    finished: bool,
}

impl Bootstrap {
    fn push_part(&mut self, content_type: &str, payload: Bytes) {
        self.queue.push_back(Bytes::from(format!(
            "--{}\r\nContent-Type: {}\r\n\r\n",
            self.boundary, content_type
        )));
        if !payload.is_empty() {
            self.queue.push_back(payload);
        }
        self.queue.push_back(Bytes::from_static(b"\r\n"));
    }

    fn push_messages(&mut self, messages: Vec<Message>) {
        let part_type = self.part_type.clone();
        let end = self.end;
        for m in messages.into_iter().filter(|m| m.start < end) {
            self.push_part(&part_type, m.data);
        }
    }

    /// The next piece of the body; `None` at its end. A read failing midway (the stream was
    /// deleted) ends the body early: the status line has long been sent.
    async fn step(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.finished {
                return None;
            }
            if self.next >= self.end {
                self.finished = true;
                self.queue
                    .push_back(Bytes::from(format!("--{}--\r\n", self.boundary)));
                continue;
            }
            let store = self.app.store.clone();
            let name = self.name.clone();
            let req = ReadRequest {
                from: ReadFrom::At(self.next),
                max_bytes: None,
                expect: Some(self.incarnation.clone()),
            };
            let (messages, chunk) = blocking(Op::Read, move || store.read_messages(&name, &req))
                .await
                .ok()?;
            if chunk.next <= self.next && messages.is_empty() {
                // No progress although the tail was past `next`: end cleanly rather than spin.
                self.next = self.end;
            } else {
                self.next = chunk.next;
            }
            self.push_messages(messages);
        }
    }
}

/// GET `{s}/bootstrap`: `multipart/mixed`, first the latest snapshot (an empty part when there is
/// none), then each message after it up to the tail as it was when the response began, each in
/// the stream's content type. Streamed: a large stream is never held in memory.
pub(crate) async fn bootstrap(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    if query_params(parts).iter().any(|(k, _)| k == QUERY_LIVE) {
        return Err(ApiError::bad_request(
            "INVALID_ARGUMENT",
            "bootstrap is not a live read: read live from its Stream-Next-Offset",
        ));
    }
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    let n = name.clone();
    let found = blocking(Op::Read, move || {
        match store.snapshot(&n, None, expect.as_ref()) {
            Ok(s) => Ok((Some(s), None)),
            Err(Error::SnapshotNotFound) => store
                .head(&n, expect.as_ref())
                .map(|info| (None, Some(info))),
            Err(e) => Err(e),
        }
    })
    .await?;
    let (snapshot, start, end, closed, incarnation, content_type) = match found {
        (Some(s), _) => {
            // The stream's content type comes from a HEAD; the snapshot has its own.
            let store = app.store.clone();
            let n = name.clone();
            let inc = s.incarnation.clone();
            let info = blocking(Op::Read, move || store.head(&n, Some(&inc))).await?;
            (
                Some((s.info.content_type, s.data, s.info.offset)),
                s.info.offset,
                s.tail,
                s.closed,
                s.incarnation,
                info.content_type,
            )
        }
        (None, Some(info)) => {
            let store = app.store.clone();
            let n = name.clone();
            let start = blocking(Op::Read, move || store.resolve(&n, ReadFrom::Start)).await?;
            (
                None,
                start,
                info.tail,
                info.closed,
                info.incarnation,
                info.content_type,
            )
        }
        (None, None) => {
            return Err(ApiError::internal(
                "bootstrap found neither a snapshot nor a stream",
            ));
        }
    };
    let boundary = format!(
        "brook-bootstrap-{:016x}",
        RandomState::new().hash_one(&name)
    );
    let mut r = Reply::new(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            &format!("multipart/mixed; boundary={boundary}"),
        )
        .header(header::CACHE_CONTROL, "no-store")
        .header(STREAM_NEXT_OFFSET, &end.to_string())
        .header(STREAM_INCARNATION, incarnation.as_str())
        .flag(STREAM_UP_TO_DATE, true)
        .flag(STREAM_CLOSED, closed);
    let mut state = Bootstrap {
        app: app.clone(),
        name,
        incarnation,
        boundary,
        part_type: content_type,
        end,
        next: start,
        queue: VecDeque::new(),
        finished: false,
    };
    if let Some((ct, data, offset)) = snapshot {
        r = r.header(STREAM_SNAPSHOT_OFFSET, &offset.to_string());
        state.push_part(&ct, data);
    } else {
        r = r.header(STREAM_SNAPSHOT_OFFSET, "-1");
        state.push_part("application/octet-stream", Bytes::new());
    }
    let body = futures_util::stream::unfold(state, |mut s| async move {
        let piece = s.step().await?;
        Some((Ok::<_, Infallible>(piece), s))
    });
    Ok(r.body(Body::from_stream(body)))
}
