//! [`StreamHandle`]: the protocol's operations on one stream URL, with incarnation tracking.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures_util::Stream;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode};

use crate::Incarnation;
use crate::headers::{
    PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, QUERY_CONSISTENCY, QUERY_CURSOR, QUERY_LIVE,
    QUERY_MAX_BYTES, QUERY_OFFSET, STREAM_CLOSED, STREAM_CURSOR, STREAM_EARLIEST_OFFSET,
    STREAM_EXPIRES_AT, STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_SEQ, STREAM_SNAPSHOT_OFFSET,
    STREAM_TTL, STREAM_UP_TO_DATE, format_expires_at, parse_closed, parse_expires_at,
    parse_safe_integer, parse_stream_seq,
};

use super::error::{Error, Result};
use super::sse::{self, SseEvent};
use super::types::{
    Append, Appended, Chunk, Create, Created, Expiry, Info, Position, Read, TailData, TailRead,
    content_type_is_json, json_messages,
};

/// One stream URL on a server.
///
/// Tracks the stream's incarnation: the first successful response's `Stream-Incarnation` is
/// remembered and sent on every later request, so a stream recreated at the same URL answers
/// [`Error::IncarnationChanged`] (a 412, which applies nothing) rather than serving or taking
/// data meant for the stream this handle knew. Clones share the remembered token.
#[derive(Clone, Debug)]
pub struct StreamHandle {
    http: reqwest::Client,
    url: String,
    /// The client's `Authorization` value (`Bearer <token>`), if it has one.
    auth: Option<HeaderValue>,
    incarnation: Arc<Mutex<Option<Incarnation>>>,
}

/// A response header as trimmed text.
fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
}

fn flag(h: &HeaderMap, name: &str) -> bool {
    parse_closed(h.get(name).map(reqwest::header::HeaderValue::as_bytes))
}

fn incarnation_of(h: &HeaderMap) -> Option<Incarnation> {
    header(h, STREAM_INCARNATION).and_then(|t| Incarnation::new(&t).ok())
}

/// A `Stream-Seq` the server would check: printable ASCII of at most 256 bytes. Anything else
/// is refused here, since the server would ignore it and let the write through unchecked.
fn checked_stream_seq(value: &str) -> Result<&str> {
    match parse_stream_seq(Some(value.as_bytes())) {
        Ok(Some(_)) => Ok(value),
        Ok(None) => Err(Error::InvalidArgument(format!(
            "Stream-Seq {value:?} is not printable ASCII: the server would ignore it and not check the write"
        ))),
        Err(e) => Err(Error::InvalidArgument(e.to_string())),
    }
}

fn next_offset(h: &HeaderMap) -> Result<Position> {
    header(h, STREAM_NEXT_OFFSET)
        .map(Position::new)
        .ok_or_else(|| Error::InvalidResponse("a response without Stream-Next-Offset".into()))
}

impl StreamHandle {
    pub(crate) fn new(
        http: reqwest::Client,
        url: String,
        auth: Option<HeaderValue>,
    ) -> StreamHandle {
        StreamHandle {
            http,
            url,
            auth,
            incarnation: Arc::new(Mutex::new(None)),
        }
    }

    /// The stream's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The incarnation this handle knows, if any response has told it yet.
    pub fn incarnation(&self) -> Option<Incarnation> {
        self.incarnation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts sending `incarnation` (after an [`Error::IncarnationChanged`], once whatever was
    /// derived from the old stream is discarded; or to resume with a token kept elsewhere).
    pub fn accept_incarnation(&self, incarnation: Incarnation) {
        *self
            .incarnation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(incarnation);
    }

    /// Forgets the incarnation: the next successful response's token is remembered instead.
    pub fn forget_incarnation(&self) {
        *self
            .incarnation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Remembers the response's incarnation if the handle knows none yet.
    fn observe(&self, h: &HeaderMap) {
        if let Some(seen) = incarnation_of(h) {
            let mut known = self
                .incarnation
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if known.is_none() {
                *known = Some(seen);
            }
        }
    }

    /// A request to the stream carrying the tracked incarnation (or `explicit`).
    fn request(&self, method: Method, explicit: Option<&Incarnation>) -> RequestBuilder {
        let mut rb = self.http.request(method, &self.url);
        if let Some(a) = &self.auth {
            rb = rb.header(AUTHORIZATION, a.clone());
        }
        if let Some(inc) = explicit.cloned().or_else(|| self.incarnation()) {
            rb = rb.header(STREAM_INCARNATION, inc.as_str());
        }
        rb
    }

    /// Sends a request: a success (2xx, 304) is returned and its incarnation remembered;
    /// anything else becomes an [`Error`].
    async fn send(&self, rb: RequestBuilder) -> Result<Response> {
        let res = rb.send().await.map_err(Error::Transport)?;
        let status = res.status();
        if status.is_success() || status == StatusCode::NOT_MODIFIED {
            self.observe(res.headers());
            return Ok(res);
        }
        let headers = res.headers().clone();
        // A refusal's body is small; when it cannot be read, the headers still tell most.
        let body = res.bytes().await.unwrap_or_default();
        Err(Error::from_response(
            status.as_u16(),
            |n| header(&headers, n),
            &body,
        ))
    }

    /// PUT: creates the stream, or confirms it (200) when it exists with the same
    /// configuration. A handle that already tracks an incarnation sends it, so a recreated
    /// stream answers [`Error::IncarnationChanged`] and a missing one creates nothing.
    pub async fn create(&self, req: &Create) -> Result<Created> {
        let mut rb = self.request(Method::PUT, None);
        if let Some(ct) = &req.content_type {
            rb = rb.header(CONTENT_TYPE, ct);
        }
        match req.expiry {
            Some(Expiry::Ttl(s)) => rb = rb.header(STREAM_TTL, s.to_string()),
            Some(Expiry::At(at)) => rb = rb.header(STREAM_EXPIRES_AT, format_expires_at(at)),
            None => {}
        }
        if let Some(seq) = &req.stream_seq {
            rb = rb.header(STREAM_SEQ, checked_stream_seq(seq)?);
        }
        if req.closed {
            rb = rb.header(STREAM_CLOSED, "true");
        }
        if !req.data.is_empty() {
            rb = rb.body(req.data.clone());
        }
        let res = self.send(rb).await?;
        let h = res.headers();
        Ok(Created {
            created: res.status() == StatusCode::CREATED,
            next: header(h, STREAM_NEXT_OFFSET).map(Position::new),
            content_type: header(h, CONTENT_TYPE.as_str()),
            closed: flag(h, STREAM_CLOSED),
            incarnation: incarnation_of(h),
        })
    }

    /// POST: appends data, closes the stream, or both. The refusals are the protocol's:
    /// [`Error::StreamSeqConflict`], [`Error::StreamClosed`], [`Error::ProducerSeqGap`],
    /// [`Error::ProducerEpochStale`], [`Error::ContentTypeMismatch`],
    /// [`Error::IncarnationChanged`]; each applied nothing. On [`Error::outcome_unknown`] the
    /// append may or may not have been applied.
    pub async fn append(&self, req: &Append) -> Result<Appended> {
        if req.data.is_empty() && !req.close {
            return Err(Error::InvalidArgument(
                "an append needs data unless it closes the stream".into(),
            ));
        }
        let mut rb = self.request(Method::POST, req.incarnation.as_ref());
        if let Some(ct) = &req.content_type {
            rb = rb.header(CONTENT_TYPE, ct);
        }
        if let Some(seq) = &req.stream_seq {
            rb = rb.header(STREAM_SEQ, checked_stream_seq(seq)?);
        }
        if let Some((id, epoch, seq)) = &req.producer {
            rb = rb
                .header(PRODUCER_ID, id)
                .header(PRODUCER_EPOCH, epoch.to_string())
                .header(PRODUCER_SEQ, seq.to_string());
        }
        if req.close {
            rb = rb.header(STREAM_CLOSED, "true");
        }
        let rb = rb.body(req.data.clone());
        let res = self.send(rb).await?;
        let h = res.headers();
        let echoed = match (header(h, PRODUCER_EPOCH), header(h, PRODUCER_SEQ)) {
            (Some(e), Some(s)) => {
                parse_safe_integer(e.as_bytes()).zip(parse_safe_integer(s.as_bytes()))
            }
            _ => None,
        };
        Ok(Appended {
            next: header(h, STREAM_NEXT_OFFSET).map(Position::new),
            duplicate: req.producer.is_some()
                && !req.data.is_empty()
                && res.status() == StatusCode::NO_CONTENT,
            closed: flag(h, STREAM_CLOSED),
            producer: echoed,
            incarnation: incarnation_of(h),
        })
    }

    fn read_request(&self, req: &Read) -> RequestBuilder {
        let mut q: Vec<(&str, String)> = vec![(QUERY_OFFSET, req.from.as_str().to_owned())];
        if let Some(n) = req.max_bytes {
            q.push((QUERY_MAX_BYTES, n.to_string()));
        }
        if req.leader {
            q.push((QUERY_CONSISTENCY, "leader".to_owned()));
        }
        self.request(Method::GET, None).query(&q)
    }

    async fn chunk(&self, res: Response) -> Result<Chunk> {
        let h = res.headers().clone();
        let no_content = res.status() == StatusCode::NO_CONTENT;
        let data = if no_content {
            Bytes::new()
        } else {
            res.bytes().await.map_err(Error::Transport)?
        };
        Ok(Chunk {
            data,
            next: next_offset(&h)?,
            up_to_date: flag(&h, STREAM_UP_TO_DATE),
            closed: flag(&h, STREAM_CLOSED),
            cursor: header(&h, STREAM_CURSOR),
            content_type: header(&h, CONTENT_TYPE.as_str()),
            incarnation: incarnation_of(&h),
        })
    }

    /// A catch-up GET: the data from `req`'s position, up to the tail or `max_bytes`.
    pub async fn read(&self, req: &Read) -> Result<Chunk> {
        let res = self.send_read(self.read_request(req)).await?;
        self.chunk(res).await
    }

    /// Sends a read. The protocol answers a read at an offset the stream no longer has (410)
    /// or does not have yet (416) with that status even when the stream is another
    /// incarnation; a handle that tracks one then asks HEAD, with the token, whether the
    /// stream was recreated, and answers [`Error::IncarnationChanged`] if it was (an offset of
    /// the old stream means nothing in the new one).
    async fn send_read(&self, rb: RequestBuilder) -> Result<Response> {
        match self.send(rb).await {
            Err(e @ (Error::Gone { .. } | Error::Http { status: 416, .. }))
                if self.incarnation().is_some() =>
            {
                match self.send(self.request(Method::HEAD, None)).await {
                    Err(changed @ Error::IncarnationChanged { .. }) => Err(changed),
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// A `live=long-poll` GET: data at once if there is any past `req`'s position, otherwise
    /// waits up to the server's timeout and answers an empty chunk (`up_to_date`, and `closed`
    /// once the stream is closed at that position). Echo the previous chunk's `cursor`.
    pub async fn long_poll(&self, req: &Read, cursor: Option<&str>) -> Result<Chunk> {
        let mut rb = self.read_request(req).query(&[(QUERY_LIVE, "long-poll")]);
        if let Some(c) = cursor {
            rb = rb.query(&[(QUERY_CURSOR, c)]);
        }
        let res = self.send_read(rb).await?;
        self.chunk(res).await
    }

    /// HEAD: the stream's metadata.
    pub async fn head(&self) -> Result<Info> {
        let res = self.send(self.request(Method::HEAD, None)).await?;
        let h = res.headers();
        Ok(Info {
            content_type: header(h, CONTENT_TYPE.as_str()),
            next: next_offset(h)?,
            closed: flag(h, STREAM_CLOSED),
            incarnation: incarnation_of(h),
            ttl: header(h, STREAM_TTL).and_then(|t| parse_safe_integer(t.as_bytes())),
            expires_at: header(h, STREAM_EXPIRES_AT)
                .and_then(|t| parse_expires_at(t.as_bytes()).ok()),
            earliest: header(h, STREAM_EARLIEST_OFFSET).map(Position::new),
            snapshot: header(h, STREAM_SNAPSHOT_OFFSET).map(Position::new),
        })
    }

    /// DELETE: removes the stream (only the incarnation this handle knows, if it knows one).
    /// The handle then forgets the incarnation: the stream it named is gone.
    pub async fn delete(&self) -> Result<()> {
        self.send(self.request(Method::DELETE, None)).await?;
        self.forget_incarnation();
        Ok(())
    }

    /// Reads from `req`'s position until a response carries `Stream-Up-To-Date: true`, with
    /// `consistency=leader`, continuing from each `Stream-Next-Offset`; `max_bytes`, if set,
    /// bounds each response, never the whole read. A JSON stream's arrays are flattened into
    /// one list of messages.
    pub async fn read_to_tail(&self, req: &Read) -> Result<TailRead> {
        let mut at = req.from.clone();
        let mut json: Option<Vec<serde_json::Value>> = None;
        let mut bytes: Vec<u8> = Vec::new();
        let mut content_type = None;
        loop {
            let page = Read {
                from: at.clone(),
                max_bytes: req.max_bytes,
                leader: true,
            };
            let chunk = self.read(&page).await?;
            if content_type.is_none() {
                content_type = chunk.content_type.clone();
            }
            let is_json = content_type.as_deref().is_some_and(content_type_is_json);
            if is_json {
                json.get_or_insert_with(Vec::new)
                    .extend(json_messages(&chunk.data)?);
            } else {
                bytes.extend_from_slice(&chunk.data);
            }
            if chunk.up_to_date {
                return Ok(TailRead {
                    data: match json {
                        Some(m) => TailData::Json(m),
                        None if is_json => TailData::Json(Vec::new()),
                        None => TailData::Bytes(bytes),
                    },
                    next: chunk.next,
                    closed: chunk.closed,
                    content_type,
                    incarnation: chunk.incarnation,
                });
            }
            if chunk.next == at && chunk.data.is_empty() {
                return Err(Error::InvalidResponse(
                    "a read made no progress and did not say Stream-Up-To-Date".into(),
                ));
            }
            at = chunk.next;
        }
    }

    /// Tails the stream with long-polls from `from`: every chunk with data, in order, then the
    /// stream ends once the stream is closed. Reconnects on each 204 with the last cursor.
    pub fn tail(
        &self,
        from: Position,
    ) -> impl Stream<Item = Result<Chunk>> + Send + Unpin + 'static {
        struct State {
            handle: StreamHandle,
            next: Position,
            cursor: Option<String>,
            done: bool,
        }
        let state = State {
            handle: self.clone(),
            next: from,
            cursor: None,
            done: false,
        };
        Box::pin(futures_util::stream::unfold(state, |mut s| async move {
            loop {
                if s.done {
                    return None;
                }
                let req = Read::from(s.next.clone());
                match s.handle.long_poll(&req, s.cursor.as_deref()).await {
                    Err(e) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                    Ok(chunk) => {
                        s.next = chunk.next.clone();
                        s.cursor = chunk.cursor.clone().or(s.cursor.take());
                        s.done = chunk.closed;
                        if !chunk.data.is_empty() {
                            return Some((Ok(chunk), s));
                        }
                    }
                }
            }
        }))
    }

    /// Tails the stream over SSE (`live=sse`) from `from`: data and control events in order,
    /// reconnecting from the last control event's offset (and cursor) whenever the server ends
    /// a connection, until a control event says the stream is closed.
    pub fn sse(
        &self,
        from: Position,
    ) -> impl Stream<Item = Result<SseEvent>> + Send + Unpin + 'static {
        sse::events(self.clone(), from)
    }

    /// Opens one SSE connection (used by [`sse`](Self::sse)).
    pub(crate) async fn sse_connect(
        &self,
        from: &Position,
        cursor: Option<&str>,
    ) -> Result<Response> {
        let mut rb = self
            .request(Method::GET, None)
            .query(&[(QUERY_OFFSET, from.as_str()), (QUERY_LIVE, "sse")]);
        if let Some(c) = cursor {
            rb = rb.query(&[(QUERY_CURSOR, c)]);
        }
        self.send_read(rb).await
    }
}
