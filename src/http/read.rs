//! GET of a stream (catch-up, `live=long-poll`, `live=sse`) and HEAD.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use tokio::time::{Instant, Sleep};

use crate::headers::{
    QUERY_CURSOR, QUERY_LIVE, QUERY_MAX_BYTES, QUERY_OFFSET, STREAM_CLOSED, STREAM_CURSOR,
    STREAM_EARLIEST_OFFSET, STREAM_EXPIRES_AT, STREAM_INCARNATION, STREAM_NEXT_OFFSET,
    STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_OFFSET, STREAM_SSE_DATA_ENCODING, STREAM_TTL,
    STREAM_UP_TO_DATE, format_expires_at, parse_canonical_u64, parse_read_from,
};
use crate::{Expiry, Incarnation, Offset, ReadChunk, ReadFrom, ReadRequest, StreamName, is_json};

use super::body::Pieces;
use super::cursor::{interval_at, response_cursor};
use super::error::{ApiError, Op};
use super::{AppState, Reply, blocking, expected_incarnation, query_params, single};

/// The read mode a GET asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Live {
    CatchUp,
    LongPoll,
    Sse,
}

/// A GET's query, validated.
struct ReadParams {
    from: Option<ReadFrom>,
    live: Live,
    cursor: Option<u64>,
    max_bytes: Option<u64>,
}

fn read_params(parts: &Parts) -> Result<ReadParams, ApiError> {
    let q = query_params(parts);
    let from = match single(&q, QUERY_OFFSET)? {
        None => None,
        Some(o) => Some(parse_read_from(o)?),
    };
    let live = match single(&q, QUERY_LIVE)? {
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
    let cursor = single(&q, QUERY_CURSOR)?.and_then(|c| c.parse::<u64>().ok());
    let max_bytes = match single(&q, QUERY_MAX_BYTES)? {
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
    Ok(ReadParams {
        from,
        live,
        cursor,
        max_bytes,
    })
}

/// Whether a chunk carries any data (a JSON chunk's body is at least `[]`).
fn has_data(chunk: &ReadChunk) -> bool {
    chunk.data_len > 0 || chunk.next != chunk.start
}

/// `"{incarnation}:{start}:{next}"`, with `:c` when the chunk reaches the end of a closed
/// stream: the tag changes when the stream is closed, so a 304 never hides the closure.
fn etag(chunk: &ReadChunk) -> String {
    let closed = if chunk.closed { ":c" } else { "" };
    format!(
        "\"{}:{}:{}{}\"",
        chunk.incarnation, chunk.start, chunk.next, closed
    )
}

/// Whether `If-None-Match` names `tag` (or is `*`). Weak tags compare by their opaque part.
fn none_match(headers: &HeaderMap, tag: &str) -> bool {
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

fn cache_control(app: &AppState) -> &'static str {
    if app.config.private_cache {
        "private, max-age=60, stale-while-revalidate=300"
    } else {
        "public, max-age=60, stale-while-revalidate=300"
    }
}

/// The headers every read response carries.
fn chunk_reply(status: StatusCode, chunk: &ReadChunk) -> Reply {
    Reply::new(status)
        .header(header::CONTENT_TYPE, &chunk.content_type)
        .header(STREAM_NEXT_OFFSET, &chunk.next.to_string())
        .header(STREAM_INCARNATION, chunk.incarnation.as_str())
        .flag(STREAM_UP_TO_DATE, chunk.up_to_date)
        .flag(STREAM_CLOSED, chunk.closed)
}

async fn read_chunk(
    app: &AppState,
    name: &StreamName,
    req: ReadRequest,
) -> Result<ReadChunk, ApiError> {
    // An open stream's verified range is read right here (index lookups and map slicing); the
    // rest goes to a blocking thread.
    if let Some(read) = app.store.engine().try_read(name, &req) {
        return read.map_err(|e| ApiError::Store(e, Op::Read));
    }
    let store = app.store.clone();
    let name = name.clone();
    blocking(Op::Read, move || store.read(&name, &req)).await
}

/// The read a live reader makes right after [`Store::wait`](crate::Store::wait) woke it: on the
/// async worker, not the blocking pool. The stream is loaded (the reader was just waiting on it)
/// and the bytes are the tail the journal thread has just written, so the read is map lookups
/// and slicing. Sending it through `spawn_blocking` cost a blocking-pool thread hand-off per
/// reader per append: 1000 SSE subscribers filled the pool's 512 threads and spent about a
/// third of the CPU in futex calls.
fn read_woken(app: &AppState, name: &StreamName, req: &ReadRequest) -> Result<ReadChunk, ApiError> {
    app.store
        .read(name, req)
        .map_err(|e| ApiError::Store(e, Op::Read))
}

/// GET `{s}`.
pub(crate) async fn get(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let p = read_params(parts)?;
    let expect = expected_incarnation(&parts.headers)?;
    match p.live {
        Live::CatchUp => catch_up(app, name, parts, p, expect).await,
        Live::LongPoll => long_poll(app, name, p, expect).await,
        Live::Sse => sse(app, name, p, expect).await,
    }
}

async fn catch_up(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
    p: ReadParams,
    expect: Option<Incarnation>,
) -> Result<Response, ApiError> {
    let from = p.from.unwrap_or(ReadFrom::Start);
    let chunk = read_chunk(
        app,
        &name,
        ReadRequest {
            from,
            max_bytes: p.max_bytes,
            expect,
        },
    )
    .await?;
    if from == ReadFrom::Tail {
        // `offset=now`: no data, the tail, never cached and without an ETag (PROTOCOL.md 8).
        let r = chunk_reply(StatusCode::OK, &chunk)
            .flag(STREAM_UP_TO_DATE, true)
            .header(header::CACHE_CONTROL, "no-store");
        return Ok(r.body(Pieces::new(chunk.body).into_body()));
    }
    let tag = etag(&chunk);
    if none_match(&parts.headers, &tag) {
        let r = chunk_reply(StatusCode::NOT_MODIFIED, &chunk)
            .header(header::ETAG, &tag)
            .header(header::CACHE_CONTROL, cache_control(app));
        return Ok(r.empty());
    }
    let r = chunk_reply(StatusCode::OK, &chunk)
        .header(header::ETAG, &tag)
        .header(header::CACHE_CONTROL, cache_control(app));
    Ok(r.body(Pieces::new(chunk.body).into_body()))
}

/// `live=long-poll`: data at once if there is any; otherwise wait for it up to the configured
/// timeout (204), answering a closed stream at its tail at once (204 with `Stream-Closed`).
async fn long_poll(
    app: &AppState,
    name: StreamName,
    p: ReadParams,
    expect: Option<Incarnation>,
) -> Result<Response, ApiError> {
    let deadline = Instant::now() + app.config.long_poll_timeout;
    let cursor = response_cursor(p.cursor, SystemTime::now()).to_string();
    let from = p.from.unwrap_or(ReadFrom::Start);
    let mut chunk = read_chunk(
        app,
        &name,
        ReadRequest {
            from,
            max_bytes: p.max_bytes,
            expect,
        },
    )
    .await?;
    // Later reads must see the same incarnation: a stream recreated meanwhile is another stream.
    let expect = Some(chunk.incarnation.clone());
    loop {
        if has_data(&chunk) {
            let tag = etag(&chunk);
            let r = chunk_reply(StatusCode::OK, &chunk)
                .header(header::ETAG, &tag)
                .header(header::CACHE_CONTROL, cache_control(app))
                .header(STREAM_CURSOR, &cursor);
            return Ok(r.body(Pieces::new(chunk.body).into_body()));
        }
        let at = chunk.next;
        let no_content = |closed: bool, inc: &Incarnation| {
            let mut r = Reply::new(StatusCode::NO_CONTENT)
                .header(STREAM_NEXT_OFFSET, &at.to_string())
                .header(STREAM_INCARNATION, inc.as_str())
                .header(header::CACHE_CONTROL, "no-store")
                .flag(STREAM_UP_TO_DATE, true)
                .flag(STREAM_CLOSED, closed);
            if !closed {
                r = r.header(STREAM_CURSOR, &cursor);
            }
            r.empty()
        };
        if chunk.closed {
            return Ok(no_content(true, &chunk.incarnation));
        }
        tokio::select! {
            woke = app.store.wait(&name, at) => woke.map_err(|e| ApiError::Store(e, Op::Read))?,
            () = tokio::time::sleep_until(deadline) => return Ok(no_content(false, &chunk.incarnation)),
            () = app.shutting_down() => return Ok(no_content(false, &chunk.incarnation)),
        }
        let req = ReadRequest {
            from: ReadFrom::At(at),
            max_bytes: p.max_bytes,
            expect: expect.clone(),
        };
        chunk = read_woken(app, &name, &req)?;
    }
}

/// How SSE data events carry the stream's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// `text/*` and `application/json`: UTF-8 text, one `data:` line per line.
    Text,
    /// Everything else: standard base64, one line per event.
    Base64,
}

fn encoding_for(content_type: &str) -> Encoding {
    if content_type.starts_with("text/") || is_json(content_type) {
        Encoding::Text
    } else {
        Encoding::Base64
    }
}

/// The pieces of a body in one buffer.
fn joined(body: &[Bytes]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.iter().map(Bytes::len).sum());
    for b in body {
        v.extend_from_slice(b);
    }
    v
}

/// The last (up to) four bytes of a body made of pieces.
fn last_bytes(body: &[Bytes]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4);
    for b in body.iter().rev() {
        let take = (4 - v.len()).min(b.len());
        v.splice(0..0, b[b.len() - take..].iter().copied());
        if v.len() == 4 {
            break;
        }
    }
    v
}

/// Appends an `event: data` whose payload is `body`.
fn data_event(out: &mut Vec<u8>, body: &[Bytes], encoding: Encoding) {
    out.extend_from_slice(b"event: data\n");
    match encoding {
        Encoding::Base64 => {
            let joined = joined(body);
            out.extend_from_slice(b"data:");
            out.extend_from_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(joined)
                    .as_bytes(),
            );
            out.push(b'\n');
        }
        Encoding::Text => {
            let joined = joined(body);
            // Every line break (CRLF, CR or LF) ends a `data:` line, so a payload can never end
            // the event or inject another one; the client joins the lines with LF.
            let mut rest: &[u8] = &joined;
            loop {
                let brk = rest.iter().position(|&c| c == b'\n' || c == b'\r');
                let (line, next) = match brk {
                    None => (rest, None),
                    Some(i) => {
                        let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                            2
                        } else {
                            1
                        };
                        (&rest[..i], Some(&rest[i + skip..]))
                    }
                };
                out.extend_from_slice(b"data:");
                // A client strips one space after "data:": keep a leading space by adding one.
                if line.first() == Some(&b' ') {
                    out.push(b' ');
                }
                out.extend_from_slice(line);
                out.push(b'\n');
                match next {
                    Some(n) => rest = n,
                    None => break,
                }
            }
        }
    }
    out.push(b'\n');
}

/// Appends an `event: control`: `{"streamNextOffset":..,"streamCursor":..,"upToDate":true,
/// "streamClosed":true}`, members present as they apply. Offsets and cursors are digits and `_`,
/// so the JSON is written directly.
fn control_event(
    out: &mut Vec<u8>,
    next: Offset,
    cursor: Option<u64>,
    up_to_date: bool,
    closed: bool,
) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "event: control\ndata:{{\"streamNextOffset\":\"{next}\""
    );
    // The cursor is omitted once the stream is closed: the client must not reconnect.
    if let (Some(cursor), false) = (cursor, closed) {
        let _ = write!(out, ",\"streamCursor\":\"{cursor}\"");
    }
    if up_to_date || closed {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    if closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    }
    out.extend_from_slice(b"}\n\n");
}

/// How many bytes at the end of `b` are an incomplete UTF-8 sequence (0 when it ends cleanly).
fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0b1100_0000 != 0b1000_0000 {
            // A lead byte `back` bytes from the end: complete if its sequence fits.
            let need = match c {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if need > back { back } else { 0 };
        }
    }
    0
}

/// The state of one SSE connection.
struct Sse {
    app: AppState,
    name: StreamName,
    /// The incarnation the connection started on; a recreated stream ends the connection.
    incarnation: Incarnation,
    encoding: Encoding,
    json: bool,
    max_bytes: Option<u64>,
    /// Where the next read starts.
    next: Offset,
    /// A chunk already read and not yet sent.
    pending: Option<ReadChunk>,
    /// Whether the client was told it is up to date at `next`.
    announced: bool,
    /// Cursors sent are at least this (the response cursor for the request's `cursor`).
    cursor_floor: u64,
    deadline: Instant,
    /// One timer for the connection's deadline and its keep-alive comments, reset only when it
    /// fires (not per event: 1000 subscribers woken 100 times a second made timer-wheel inserts
    /// and removals a visible part of the fan-out profile).
    timer: Pin<Box<Sleep>>,
    /// When the last frame went out (keep-alive comments are due `sse_keepalive` after it).
    last_sent: Instant,
    /// Resolves when the server shuts down; created once per connection.
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
    /// `Store::wait` just woke the connection: the next read is of fresh, loaded data.
    woken: bool,
}

impl Sse {
    fn cursor(&self) -> u64 {
        interval_at(SystemTime::now()).max(self.cursor_floor)
    }

    async fn read(&mut self) -> Option<ReadChunk> {
        let req = ReadRequest {
            from: ReadFrom::At(self.next),
            max_bytes: self.max_bytes,
            expect: Some(self.incarnation.clone()),
        };
        if std::mem::take(&mut self.woken) {
            return read_woken(&self.app, &self.name, &req).ok();
        }
        read_chunk(&self.app, &self.name, req).await.ok()
    }

    /// A text event must be valid UTF-8 on its own: a chunk cut inside a character (only a
    /// size-bounded chunk can be, so never one that reaches the tail) is read again just short
    /// of it.
    async fn whole_characters(&mut self, chunk: ReadChunk) -> Option<ReadChunk> {
        if self.encoding != Encoding::Text || self.json || chunk.up_to_date {
            return Some(chunk);
        }
        let cut = incomplete_utf8_tail(&last_bytes(&chunk.body));
        let len = chunk.body_len();
        if cut == 0 || len <= cut {
            return Some(chunk);
        }
        let req = ReadRequest {
            from: ReadFrom::At(chunk.start),
            max_bytes: Some((len - cut) as u64),
            expect: Some(self.incarnation.clone()),
        };
        read_chunk(&self.app, &self.name, req).await.ok()
    }

    /// The next frame of the event stream, `None` when the connection should end.
    async fn step(&mut self) -> Option<Bytes> {
        loop {
            // The connection ends between events once its lifetime is up, even on a stream that
            // never goes idle, so a CDN can collapse new readers onto fresh connections.
            if self.done || Instant::now() >= self.deadline {
                return None;
            }
            let chunk = match self.pending.take() {
                Some(c) => c,
                // Told it is up to date at `next` and not woken since: nothing to read yet.
                None if self.announced && !self.woken => {
                    if let Err(frame) = self.sleep().await {
                        return frame;
                    }
                    continue;
                }
                None => self.read().await?,
            };
            let chunk = self.whole_characters(chunk).await?;
            let mut out = Vec::new();
            if has_data(&chunk) {
                self.next = chunk.next;
                self.announced = chunk.up_to_date;
                self.done = chunk.closed;
                let cursor = self.cursor();
                data_event(&mut out, &chunk.body, self.encoding);
                control_event(
                    &mut out,
                    chunk.next,
                    Some(cursor),
                    chunk.up_to_date,
                    chunk.closed,
                );
                return Some(Bytes::from(out));
            }
            self.next = chunk.next;
            if chunk.closed {
                self.done = true;
                control_event(&mut out, chunk.next, None, true, true);
                return Some(Bytes::from(out));
            }
            if !self.announced {
                self.announced = true;
                control_event(&mut out, chunk.next, Some(self.cursor()), true, false);
                return Some(Bytes::from(out));
            }
            if let Err(frame) = self.sleep().await {
                return frame;
            }
        }
    }

    /// Waits at the tail until the stream changes (`Ok`), or answers what ends the wait
    /// instead: the keep-alive comment, or `None` to end the connection.
    async fn sleep(&mut self) -> Result<(), Option<Bytes>> {
        let wait = self.app.store.wait(&self.name, self.next);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                woke = &mut wait => {
                    woke.map_err(|_| None)?;
                    self.woken = true;
                    return Ok(());
                }
                () = &mut self.timer => {
                    let now = Instant::now();
                    if now >= self.deadline {
                        return Err(None);
                    }
                    let due = self.last_sent + self.app.config.sse_keepalive;
                    if now >= due {
                        // The frame's `sent` moves the timer on.
                        return Err(Some(Bytes::from_static(b": keep-alive\n\n")));
                    }
                    self.timer.as_mut().reset(due.min(self.deadline));
                }
                () = &mut self.shutdown => return Err(None),
            }
        }
    }

    /// Notes a frame going out now; the timer's next stop is the keep-alive after it.
    fn sent(&mut self, now: Instant) {
        self.last_sent = now;
        let next = (now + self.app.config.sse_keepalive).min(self.deadline);
        if self.timer.deadline() < now {
            self.timer.as_mut().reset(next);
        }
    }
}

/// `live=sse`: catch-up chunks, each as a data event followed by its control event, then live
/// data as it becomes durable, until the stream is closed (final control with
/// `streamClosed: true`), the connection's lifetime is up, or the server shuts down.
async fn sse(
    app: &AppState,
    name: StreamName,
    p: ReadParams,
    expect: Option<Incarnation>,
) -> Result<Response, ApiError> {
    let from = p.from.unwrap_or(ReadFrom::Start);
    // The first read happens before the response starts, so a missing stream is still a 404.
    let first = read_chunk(
        app,
        &name,
        ReadRequest {
            from,
            max_bytes: p.max_bytes,
            expect,
        },
    )
    .await?;
    let encoding = encoding_for(&first.content_type);
    let mut r = Reply::new(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header(STREAM_INCARNATION, first.incarnation.as_str())
        .header("x-accel-buffering", "no");
    if encoding == Encoding::Base64 {
        r = r.header(STREAM_SSE_DATA_ENCODING, "base64");
    }
    let start = Instant::now();
    let deadline = start + app.config.sse_max_duration;
    let down = app.clone();
    let state = Sse {
        app: app.clone(),
        name,
        incarnation: first.incarnation.clone(),
        encoding,
        json: is_json(&first.content_type),
        max_bytes: p.max_bytes,
        next: first.start,
        announced: false,
        cursor_floor: response_cursor(p.cursor, SystemTime::now()),
        deadline,
        timer: Box::pin(tokio::time::sleep_until(
            (start + app.config.sse_keepalive).min(deadline),
        )),
        last_sent: start,
        shutdown: Box::pin(async move { down.shutting_down().await }),
        done: false,
        woken: false,
        pending: Some(first),
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let frame = s.step().await?;
        s.sent(Instant::now());
        Some((Ok::<_, Infallible>(frame), s))
    });
    Ok(r.body(Body::from_stream(events)))
}

/// HEAD `{s}`: the stream's metadata; never cached, and it does not renew a sliding TTL.
pub(crate) async fn head(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let expect = expected_incarnation(&parts.headers)?;
    let store = app.store.clone();
    let info = blocking(Op::Read, move || store.head(&name, expect.as_ref())).await?;
    let mut r = Reply::new(StatusCode::OK)
        .header(header::CONTENT_TYPE, &info.content_type)
        .header(STREAM_NEXT_OFFSET, &info.tail.to_string())
        .header(STREAM_INCARNATION, info.incarnation.as_str())
        .header(STREAM_EARLIEST_OFFSET, &info.earliest.to_string())
        .header(header::CACHE_CONTROL, "no-store")
        .flag(STREAM_CLOSED, info.closed);
    match info.expiry {
        Expiry::Ttl(secs) => r = r.header(STREAM_TTL, &secs.to_string()),
        Expiry::At(at) => r = r.header(STREAM_EXPIRES_AT, &format_expires_at(at)),
        Expiry::Never => {}
    }
    if let Some(s) = &info.snapshot {
        r = r
            .header(STREAM_SNAPSHOT_OFFSET, &s.offset.to_string())
            .header(STREAM_SNAPSHOT_DIGEST, &s.digest);
    }
    Ok(r.empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_events_split_every_line_break() {
        let mut out = Vec::new();
        data_event(
            &mut out,
            &[Bytes::from_static(b"a\r\n\r\nevent: x\rb\n c")],
            Encoding::Text,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: data\ndata:a\ndata:\ndata:event: x\ndata:b\ndata:  c\n\n"
        );
        let mut out = Vec::new();
        data_event(
            &mut out,
            &[Bytes::from_static(b"Hel"), Bytes::from_static(b"lo")],
            Encoding::Base64,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: data\ndata:SGVsbG8=\n\n"
        );
    }

    #[test]
    fn control_events_omit_the_cursor_once_closed() {
        let mut out = Vec::new();
        control_event(&mut out, Offset::new(1, 2), Some(7), true, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: control\ndata:{\"streamNextOffset\":\"0000000000000001_0000000000000002\",\"streamCursor\":\"7\",\"upToDate\":true}\n\n"
        );
        let mut out = Vec::new();
        control_event(&mut out, Offset::new(1, 2), Some(7), false, true);
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("\"streamClosed\":true") && !s.contains("streamCursor"),
            "{s}"
        );
    }

    #[test]
    fn incomplete_utf8_tails_are_found() {
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_utf8_tail(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_utf8_tail(&"a😀".as_bytes()[..4]), 3);
        assert_eq!(incomplete_utf8_tail("a😀".as_bytes()), 0);
    }
}
