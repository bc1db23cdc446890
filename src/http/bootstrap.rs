//! Ursula's bootstrap route: the latest snapshot and every message after it, as one streamed
//! `multipart/mixed` body.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;

use crate::headers::QUERY_LIVE;
use crate::{
    Error, Guard, Incarnation, Message, Offset, ReadFrom, ReadRequest, SnapshotRequest, StreamName,
};

use super::error::{ApiError, Op};
use super::names::{
    STREAM_CLOSED, STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_SNAPSHOT_OFFSET,
    STREAM_UP_TO_DATE,
};
use super::reply::Reply;
use super::request::query_params;
use super::{AppState, blocking};

/// The parts of a bootstrap body still to be produced.
struct Bootstrap {
    /// The server's shared state.
    app: AppState,
    /// The stream read.
    name: StreamName,
    /// The incarnation the response began on; every read expects it.
    incarnation: Incarnation,
    /// The multipart boundary.
    boundary: String,
    /// The stream's content type, for each message part.
    part_type: String,
    /// Messages starting before this offset are included; the tail when the response began.
    end: Offset,
    /// Where the next read continues.
    next: Offset,
    /// Pieces produced and not yet sent.
    queue: VecDeque<Bytes>,
    /// The closing boundary is queued.
    finished: bool,
}

impl Bootstrap {
    /// Queues one part: its boundary line and `Content-Type`, the payload, and the CRLF ending it.
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

    /// Queues each message that starts before `end` as its own part.
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
                whole_messages: false,
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
    let found = app
        .blocking_on_stream(
            name.clone(),
            &parts.headers,
            Op::Read,
            |store, name, expect| {
                let req = SnapshotRequest {
                    offset: None,
                    expect: expect.cloned(),
                };
                match store.snapshot(name, &req) {
                    Ok(s) => Ok((Some(s), None)),
                    Err(Error::SnapshotNotFound) => store
                        .head(name, &Guard::from(req.expect))
                        .map(|info| (None, Some(info))),
                    Err(e) => Err(e),
                }
            },
        )
        .await?;
    let (snapshot, start, end, closed, incarnation, content_type) = match found {
        (Some(s), _) => {
            // The stream's content type comes from a HEAD; the snapshot has its own.
            let store = app.store.clone();
            let n = name.clone();
            let inc = s.incarnation.clone();
            let info = blocking(Op::Read, move || store.head(&n, &Guard::expect(inc))).await?;
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
        .fixed(
            header::CACHE_CONTROL,
            const { HeaderValue::from_static("no-store") },
        )
        .offset(STREAM_NEXT_OFFSET, end)
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
        r = r.fixed(
            STREAM_SNAPSHOT_OFFSET,
            const { HeaderValue::from_static("-1") },
        );
        state.push_part("application/octet-stream", Bytes::new());
    }
    let body = futures_util::stream::unfold(state, |mut s| async move {
        let piece = s.step().await?;
        Some((Ok::<_, Infallible>(piece), s))
    });
    Ok(r.body(Body::from_stream(body)))
}
