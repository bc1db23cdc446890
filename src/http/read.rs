//! GET of a stream as a catch-up read or a long-poll (`live=long-poll`), and HEAD. An SSE read
//! (`live=sse`) starts here and continues in `sse.rs`.

use std::time::SystemTime;

use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use tokio::time::Instant;

use crate::headers::{
    QUERY_CURSOR, QUERY_LIVE, QUERY_MAX_BYTES, QUERY_OFFSET, format_expires_at,
    parse_canonical_u64, parse_read_from,
};
use crate::{Expiry, Guard, Incarnation, ReadChunk, ReadFrom, ReadRequest, StreamName};

use super::auth::CredentialExpiry;
use super::body::Pieces;
use super::cursor::collapsing_cursor;
use super::error::{ApiError, Op};
use super::names::{
    STREAM_CLOSED, STREAM_CURSOR, STREAM_EARLIEST_OFFSET, STREAM_EXPIRES_AT, STREAM_INCARNATION,
    STREAM_NEXT_OFFSET, STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_OFFSET, STREAM_TTL,
    STREAM_UP_TO_DATE,
};
use super::reply::{Answer, ReadTag, Reply};
use super::request::{expected_incarnation, none_match, query_values};
use super::{AppState, blocking, sse};

/// The query parameter of a read that ends on a message boundary in a byte stream too.
const QUERY_BOUNDARY: &str = "boundary";

/// Answers a read made with `boundary=message`, so a client can tell that this server honoured
/// it (others ignore the parameter).
const READ_BOUNDARY: HeaderName = HeaderName::from_static("brook-read-boundary");

/// The read mode a GET asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Live {
    /// No `live`: what is there now.
    CatchUp,
    /// `live=long-poll`.
    LongPoll,
    /// `live=sse`.
    Sse,
}

/// A GET's query, validated.
pub(super) struct ReadParams {
    /// `offset`; required for live reads.
    pub(super) from: Option<ReadFrom>,
    /// `live`.
    live: Live,
    /// `cursor`, the echoed `Stream-Cursor`; a malformed one is absent.
    pub(super) cursor: Option<u64>,
    /// `max_bytes`, positive.
    pub(super) max_bytes: Option<u64>,
    /// `boundary=message` (a brook extension): a byte stream's read ends on a message boundary
    /// too, so `max_bytes=1` reads exactly one message (`brook mirror` copies byte streams
    /// message by message with it).
    whole_messages: bool,
}

/// The GET's query, validated: at most one of each parameter, `live` known, a live read with an
/// offset, `max_bytes` positive.
fn read_params(parts: &Parts) -> Result<ReadParams, ApiError> {
    let [offset, live, cursor, max_bytes, boundary] = query_values(
        parts,
        [
            QUERY_OFFSET,
            QUERY_LIVE,
            QUERY_CURSOR,
            QUERY_MAX_BYTES,
            QUERY_BOUNDARY,
        ],
    );
    let from = match offset.single()? {
        None => None,
        Some(o) => Some(parse_read_from(o)?),
    };
    let live = match live.single()? {
        None | Some("" | "false") => Live::CatchUp,
        Some("long-poll") => Live::LongPoll,
        Some("sse") => Live::Sse,
        Some(_) => {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "live must be long-poll or sse",
            ));
        }
    };
    if live != Live::CatchUp && from.is_none() {
        return Err(ApiError::bad_request(
            "INVALID_OFFSET",
            "a live read needs an offset (-1 for the start)",
        ));
    }
    // A malformed cursor is treated as absent: it only shapes cache keys.
    let cursor = cursor.single()?.and_then(|c| c.parse::<u64>().ok());
    let max_bytes = match max_bytes.single()? {
        None => None,
        Some(m) => match parse_canonical_u64(m.as_bytes()) {
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err(ApiError::bad_request(
                    "INVALID_ARGUMENT",
                    "max_bytes must be a positive integer",
                ));
            }
        },
    };
    let whole_messages = match boundary.single()? {
        None => false,
        Some("message") => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                "INVALID_ARGUMENT",
                "boundary must be message",
            ));
        }
    };
    Ok(ReadParams {
        from,
        live,
        cursor,
        max_bytes,
        whole_messages,
    })
}

/// Whether a chunk carries any data (a JSON chunk's body is at least `[]`).
pub(super) fn has_data(chunk: &ReadChunk) -> bool {
    chunk.data_len > 0 || chunk.next != chunk.start
}

/// The entity tag of `chunk` (see [`ReadTag`]).
fn etag(chunk: &ReadChunk) -> ReadTag {
    ReadTag {
        incarnation: chunk.incarnation.clone(),
        start: chunk.start,
        next: chunk.next,
        closed: chunk.closed,
    }
}

/// `Cache-Control` of a catch-up chunk that never changes: one read at an explicit offset that
/// ends before the tail, or at the final offset of a closed stream. A standard shared cache may
/// keep it for the configured `immutable_max_age` and never revalidate it; `private` instead of
/// `public` when the server is configured so. Made once per server ([`AppState`]).
pub(super) fn immutable_cache_control(config: &super::ServerConfig) -> HeaderValue {
    let secs = config.immutable_max_age.as_secs();
    HeaderValue::from_str(&format!("{}, max-age={secs}, immutable", scope(config)))
        .expect("a scope, a number and a token are a valid header value")
}

/// `Cache-Control` of a chunk with data that a later read of the same URL may answer
/// differently (PROTOCOL.md 10.1): the tail chunk, a read from `-1` (retention may move the
/// start), a long-poll's `200`. A cache may serve it for `cache_max_age` and then, while it asks
/// brook again, for `cache_stale_while_revalidate` more (left out when zero); `private` instead of
/// `public` when the server is configured so. Made once per server ([`AppState`]).
pub(super) fn shared_cache_control(config: &super::ServerConfig) -> HeaderValue {
    let (scope, age) = (scope(config), config.cache_max_age.as_secs());
    let value = match config.cache_stale_while_revalidate.as_secs() {
        0 => format!("{scope}, max-age={age}"),
        stale => format!("{scope}, max-age={age}, stale-while-revalidate={stale}"),
    };
    HeaderValue::from_str(&value).expect("a scope and numbers are a valid header value")
}

/// The cache scope of every cacheable read: `private` with `--private-cache`, else `public` (a
/// read a token admitted is made `private` after the handler, in `auth`).
fn scope(config: &super::ServerConfig) -> &'static str {
    if config.private_cache {
        "private"
    } else {
        "public"
    }
}

/// `Cache-Control: no-cache`: a cache may keep the response but must ask brook (with the
/// `ETag`) before each reuse. For the empty read at an open tail, the request at which a reader
/// learns of new data and of the closure (PROTOCOL.md 10.1: the `ETag` varies with the closure,
/// so the revalidation answers 200 with `Stream-Closed`), and with `cache_revalidate_tail` for
/// every read that reaches an open tail or starts at `-1`.
const REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");

/// The value of [`READ_BOUNDARY`].
const MESSAGE: HeaderValue = HeaderValue::from_static("message");

/// `Cache-Control: no-store`: SSE aside, the reads no cache may keep: `offset=now` (catch-up and
/// long-poll), a long-poll's `204`, HEAD; with `cache_revalidate_tail`, every long-poll.
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// The `Cache-Control` of a catch-up read from `from` answered with `chunk`: immutable when its
/// bytes and headers are final (an explicit offset, and either more data follows or the stream
/// is closed at `next`); revalidated on every use when it has no data (the open tail's empty
/// read, where new data and the closure show) or when the server keeps caches off the tail;
/// otherwise the protocol's shared caching ([`shared_cache_control`]).
pub(super) fn catch_up_caching(app: &AppState, from: ReadFrom, chunk: &ReadChunk) -> HeaderValue {
    let fixed = matches!(from, ReadFrom::At(_)) && (!chunk.up_to_date || chunk.closed);
    if fixed {
        app.immutable_cache.clone()
    } else if !has_data(chunk) || app.config.cache_revalidate_tail {
        REVALIDATE
    } else {
        app.shared_cache.clone()
    }
}

/// The `Cache-Control` of a long-poll's `200` from `from`: the protocol's shared caching, which
/// a cache keys by the URL (offset and cursor) and credentials, so the pollers waiting at one
/// offset share one upstream request per wake; `no-store` from `offset=now` (a later reader
/// asking "from now" must not get older data) and when the server keeps caches off the tail.
fn long_poll_caching(app: &AppState, from: ReadFrom) -> HeaderValue {
    if from == ReadFrom::Tail || app.config.cache_revalidate_tail {
        NO_STORE
    } else {
        app.shared_cache.clone()
    }
}

/// The `Cache-Control` of a cacheable read shared caches may keep, at the default ages (the
/// value [`shared_cache_control`] makes by default, which `auth` turns `private` without
/// formatting).
pub(super) const PUBLIC_CACHE: HeaderValue =
    HeaderValue::from_static("public, max-age=60, stale-while-revalidate=300");

/// [`PUBLIC_CACHE`] for only the client to keep (`--private-cache`, or a read admitted by a
/// token).
pub(super) const PRIVATE_CACHE: HeaderValue =
    HeaderValue::from_static("private, max-age=60, stale-while-revalidate=300");

/// The headers every read response carries (the chunk's content type is moved into it).
fn chunk_reply(status: StatusCode, chunk: &mut ReadChunk) -> Reply {
    Reply::new(status)
        .text(
            header::CONTENT_TYPE,
            std::mem::take(&mut chunk.content_type),
        )
        .offset(STREAM_NEXT_OFFSET, chunk.next)
        .incarnation(STREAM_INCARNATION, &chunk.incarnation)
        .flag(STREAM_UP_TO_DATE, chunk.up_to_date)
        .flag(STREAM_CLOSED, chunk.closed)
}

/// Reads one chunk: on this worker when the engine can serve it without touching the disk,
/// otherwise on the blocking pool.
pub(super) async fn read_chunk(
    store: &crate::Store,
    name: &StreamName,
    req: ReadRequest,
) -> Result<ReadChunk, ApiError> {
    // An open stream's verified range is read right here (index lookups and map slicing); the
    // rest goes to a blocking thread.
    if let Some(read) = store.try_read(name, &req) {
        return read.map_err(|e| ApiError::Store(e, Op::Read));
    }
    let store = store.clone();
    let name = name.clone();
    blocking(Op::Read, move || store.read(&name, &req)).await
}

/// The read a live reader makes right after [`Store::wait`](crate::Store::wait) woke it: on the
/// async worker, not the blocking pool. The stream is loaded (the reader was just waiting on it)
/// and the bytes are the tail the journal thread has just written, so the read is map lookups
/// and slicing. Through `spawn_blocking` it would cost a thread hand-off per reader per append:
/// 1000 SSE subscribers would fill the pool's 512 threads and spend about a third of the CPU in
/// futex calls.
pub(super) fn read_woken(
    store: &crate::Store,
    name: &StreamName,
    req: &ReadRequest,
) -> Result<ReadChunk, ApiError> {
    store
        .read(name, req)
        .map_err(|e| ApiError::Store(e, Op::Read))
}

/// GET `{s}`.
pub(crate) async fn get(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Answer, ApiError> {
    let p = read_params(parts)?;
    let expect = expected_incarnation(&parts.headers)?;
    // A live read admitted by an expiring token ends when it expires (auth.rs).
    let credential = parts
        .extensions
        .get::<CredentialExpiry>()
        .and_then(|e| e.deadline());
    match p.live {
        // Each boxed: no read's state is part of every request's future (brook's HTTP/1.1 loop
        // boxes that future per request, and copies it into its box), so that an append's
        // stays within the allocator's per-thread cache.
        Live::CatchUp => Box::pin(catch_up(app, name, parts, p, expect)).await,
        Live::LongPoll => Box::pin(long_poll(app, name, p, expect, credential)).await,
        Live::Sse => Box::pin(sse::respond(
            app,
            name,
            &parts.headers,
            p,
            expect,
            credential,
        ))
        .await
        .map(Answer::from),
    }
}

/// A catch-up read: one chunk from `offset` (the start by default), with a strong `ETag` (which
/// varies with the closure) and a 304 when `If-None-Match` names it, cacheable as
/// [`catch_up_caching`] says; `offset=now` answers the tail, uncached.
async fn catch_up(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
    p: ReadParams,
    expect: Option<Incarnation>,
) -> Result<Answer, ApiError> {
    let from = p.from.unwrap_or(ReadFrom::Start);
    let mut chunk = read_chunk(
        &app.store,
        &name,
        ReadRequest {
            from,
            max_bytes: p.max_bytes,
            expect: expect.clone(),
            whole_messages: p.whole_messages,
        },
    )
    .await?;
    if from != ReadFrom::Tail && p.max_bytes.is_none() && !p.whole_messages {
        chunk = super::read_span::extend(app, &name, expect.as_ref(), chunk).await;
    }
    if from == ReadFrom::Tail {
        // `offset=now`: no data, the tail, never cached and without an ETag (PROTOCOL.md 8).
        let r = chunk_reply(StatusCode::OK, &mut chunk)
            .flag(STREAM_UP_TO_DATE, true)
            .fixed(header::CACHE_CONTROL, NO_STORE);
        return Ok(r.answer(Pieces::new(chunk.body).into_body()));
    }
    let tag = etag(&chunk);
    let caching = catch_up_caching(app, from, &chunk);
    if parts.headers.contains_key(header::IF_NONE_MATCH) && none_match(&parts.headers, &tag.text())
    {
        let r = chunk_reply(StatusCode::NOT_MODIFIED, &mut chunk)
            .tag(header::ETAG, tag)
            .fixed(header::CACHE_CONTROL, caching);
        return Ok(r.answer_empty());
    }
    let r = chunk_reply(StatusCode::OK, &mut chunk)
        .tag(header::ETAG, tag)
        .fixed(header::CACHE_CONTROL, caching)
        .flag_value(READ_BOUNDARY, p.whole_messages, MESSAGE);
    Ok(r.answer(Pieces::new(chunk.body).into_body()))
}

/// `live=long-poll`: data at once if there is any; otherwise wait for it up to the configured
/// timeout (204), answering a closed stream at its tail at once (204 with `Stream-Closed`), and
/// a wait that outlives the `credential` that admitted it with 401 `TOKEN_EXPIRED`. A `200` is
/// cacheable as [`long_poll_caching`] says; a `204` never is (it only says that nothing came in
/// time). Both carry a cursor that every poller of the same URL gets alike
/// ([`collapsing_cursor`]), so pollers that shared one request share the next.
async fn long_poll(
    app: &AppState,
    name: StreamName,
    p: ReadParams,
    expect: Option<Incarnation>,
    credential: Option<Instant>,
) -> Result<Answer, ApiError> {
    let deadline = Instant::now() + app.config.long_poll_timeout;
    let _waiting = app.metrics.long_poll_reader();
    let from = p.from.unwrap_or(ReadFrom::Start);
    let at = match from {
        ReadFrom::At(offset) => Some(offset),
        ReadFrom::Start | ReadFrom::Tail => None,
    };
    let url = (&name, std::mem::discriminant(&from), at);
    let cursor = collapsing_cursor(p.cursor, SystemTime::now(), url);
    let mut chunk = read_chunk(
        &app.store,
        &name,
        ReadRequest {
            from,
            max_bytes: p.max_bytes,
            expect,
            whole_messages: p.whole_messages,
        },
    )
    .await?;
    // Later reads must see the same incarnation: a stream recreated meanwhile is another stream.
    let expect = Some(chunk.incarnation.clone());
    // Taken before the first wait: a long-poll answered at once is no live reader.
    let mut slot = None;
    loop {
        if has_data(&chunk) {
            let tag = etag(&chunk);
            let r = chunk_reply(StatusCode::OK, &mut chunk)
                .tag(header::ETAG, tag)
                .fixed(header::CACHE_CONTROL, long_poll_caching(app, from))
                .number(STREAM_CURSOR, cursor)
                .flag_value(READ_BOUNDARY, p.whole_messages, MESSAGE);
            return Ok(r.answer(Pieces::new(chunk.body).into_body()));
        }
        let at = chunk.next;
        let no_content = |closed: bool, inc: &Incarnation| {
            let mut r = Reply::new(StatusCode::NO_CONTENT)
                .offset(STREAM_NEXT_OFFSET, at)
                .incarnation(STREAM_INCARNATION, inc)
                .fixed(header::CACHE_CONTROL, NO_STORE)
                .flag(STREAM_UP_TO_DATE, true)
                .flag(STREAM_CLOSED, closed);
            if !closed {
                r = r.number(STREAM_CURSOR, cursor);
            }
            r.answer_empty()
        };
        if chunk.closed {
            return Ok(no_content(true, &chunk.incarnation));
        }
        if slot.is_none() {
            slot = Some(app.live_reader(&name)?);
        }
        tokio::select! {
            woke = app.store.wait(&name, at) => woke.map_err(|e| ApiError::Store(e, Op::Read))?,
            () = tokio::time::sleep_until(deadline) => return Ok(no_content(false, &chunk.incarnation)),
            () = app.shutting_down() => return Ok(no_content(false, &chunk.incarnation)),
            () = until(credential) => return Ok(super::auth::expired_response().into()),
        }
        let req = ReadRequest {
            from: ReadFrom::At(at),
            max_bytes: p.max_bytes,
            expect: expect.clone(),
            whole_messages: p.whole_messages,
        };
        chunk = read_woken(&app.store, &name, &req)?;
    }
}

/// Sleeps until `at`; forever when `None`.
pub(super) async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// HEAD `{s}`: the stream's metadata; never cached, and it does not renew a sliding TTL.
pub(crate) async fn head(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Answer, ApiError> {
    // An open stream is described right here (a look at memory); the rest goes to a blocking
    // thread, which may load it from disk.
    let expect = expected_incarnation(&parts.headers)?;
    let guard = Guard::from(expect);
    let info = if let Some(info) = app.store.try_head(&name, &guard) {
        info.map_err(|e| ApiError::Store(e, Op::Read))?
    } else {
        let store = app.store.clone();
        blocking(Op::Read, move || store.head(&name, &guard)).await?
    };
    let mut r = Reply::new(StatusCode::OK)
        .text(header::CONTENT_TYPE, info.content_type)
        .offset(STREAM_NEXT_OFFSET, info.tail)
        .incarnation(STREAM_INCARNATION, &info.incarnation)
        .offset(STREAM_EARLIEST_OFFSET, info.earliest)
        .fixed(header::CACHE_CONTROL, NO_STORE)
        .flag(STREAM_CLOSED, info.closed);
    match info.expiry {
        Expiry::Ttl(secs) => r = r.number(STREAM_TTL, secs),
        Expiry::At(at) => r = r.text(STREAM_EXPIRES_AT, format_expires_at(at)),
        Expiry::Never => {}
    }
    if let Some(s) = &info.snapshot {
        r = r
            .offset(STREAM_SNAPSHOT_OFFSET, s.offset)
            .header(STREAM_SNAPSHOT_DIGEST, &s.digest);
    }
    let r = super::retention::in_force(r, info.retention, app.store.options().retention_default());
    Ok(r.answer_empty())
}
