//! One stream's copy: create the destination with the source's content type and expiry, append
//! the source's messages with producer headers, copy the latest snapshot, close it when the
//! source is closed; resumable at any point (see `state.rs` and the module doc of `mirror`).

use std::collections::HashSet;

use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde_json::value::RawValue;

use crate::headers::{
    PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, STREAM_CLOSED, STREAM_EARLIEST_OFFSET,
    STREAM_EXPIRES_AT, STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_SNAPSHOT_OFFSET, STREAM_TTL,
    STREAM_UP_TO_DATE,
};

use super::state::{Pending, Progress, path_for};
use super::{MirrorError, MirrorOptions, Side, join};

/// The producer id of every mirror append.
pub(crate) const PRODUCER: &str = "brook-mirror";

/// The header with which brook answers a `boundary=message` read.
const READ_BOUNDARY: &str = "brook-read-boundary";

/// What every stream's copy shares.
pub(crate) struct Context {
    /// The HTTP client (one pool for both servers).
    pub(crate) http: reqwest::Client,
    /// The source's base URL.
    pub(crate) source: Url,
    /// The destination's base URL.
    pub(crate) dest: Url,
    /// The `Authorization` value for the source, when it has a token.
    pub(crate) source_auth: Option<HeaderValue>,
    /// The `Authorization` value for the destination, when it has a token.
    pub(crate) dest_auth: Option<HeaderValue>,
    /// The run's options.
    pub(crate) opts: MirrorOptions,
    /// Ursula buckets already created in this run.
    pub(crate) buckets: tokio::sync::Mutex<HashSet<String>>,
}

/// What one stream's copy did.
#[derive(Debug, Default)]
pub(crate) struct Copied {
    /// Appends sent (and acknowledged).
    pub(crate) appends: u64,
    /// Body bytes appended.
    pub(crate) bytes: u64,
    /// Snapshots copied.
    pub(crate) snapshots: usize,
}

/// At most 300 bytes of a response body, as text, for error messages.
pub(crate) fn shorten(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(300).collect()
}

/// A response read whole.
struct Answer {
    /// The server that sent it.
    side: Side,
    /// Its status.
    status: StatusCode,
    /// Its headers.
    headers: HeaderMap,
    /// Its body.
    body: Bytes,
}

impl Answer {
    /// A header as text.
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether `name: true` is set.
    fn flag(&self, name: &str) -> bool {
        self.h(name) == Some("true")
    }

    /// The refusal this answer is, for `what` (a 401 is [`MirrorError::Unauthorized`]).
    fn refused(&self, what: &str) -> MirrorError {
        if self.status == StatusCode::UNAUTHORIZED {
            return MirrorError::unauthorized(self.side, what, &self.body);
        }
        MirrorError::Refused {
            what: what.to_owned(),
            status: self.status.as_u16(),
            body: shorten(&self.body),
        }
    }
}

/// Sends one request to `side` (with its token, if any) and reads the whole response.
async fn send(
    ctx: &Context,
    side: Side,
    method: Method,
    url: Url,
    headers: &[(&str, String)],
    body: Option<Bytes>,
) -> Result<Answer, MirrorError> {
    let what = format!("{method} {url}");
    let mut req = ctx.http.request(method, url);
    let auth = match side {
        Side::Source => &ctx.source_auth,
        Side::Destination => &ctx.dest_auth,
    };
    if let Some(a) = auth {
        req = req.header(AUTHORIZATION, a.clone());
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    if let Some(b) = body {
        req = req.body(b);
    }
    let res = req
        .send()
        .await
        .map_err(|e| MirrorError::Transport(what.clone(), e.to_string()))?;
    let status = res.status();
    let headers = res.headers().clone();
    let body = res
        .bytes()
        .await
        .map_err(|e| MirrorError::Transport(what, e.to_string()))?;
    Ok(Answer {
        side,
        status,
        headers,
        body,
    })
}

/// The source stream's metadata, from HEAD.
struct SourceInfo {
    /// Its content type.
    content_type: String,
    /// `Stream-Incarnation`, or empty.
    incarnation: String,
    /// `Stream-Earliest-Offset`, if sent.
    earliest: Option<String>,
    /// `Stream-TTL` and `Stream-Expires-At`, as sent.
    expiry: Vec<(&'static str, String)>,
    /// `Stream-Snapshot-Offset`, if any.
    snapshot: Option<String>,
}

/// HEAD of the source stream.
async fn source_info(ctx: &Context, url: &Url) -> Result<SourceInfo, MirrorError> {
    let a = send(ctx, Side::Source, Method::HEAD, url.clone(), &[], None).await?;
    if a.status != StatusCode::OK {
        return Err(a.refused(&format!("HEAD {url}")));
    }
    let mut expiry = Vec::new();
    for k in [STREAM_TTL, STREAM_EXPIRES_AT] {
        if let Some(v) = a.h(k) {
            expiry.push((k, v.to_owned()));
        }
    }
    Ok(SourceInfo {
        content_type: a
            .h(CONTENT_TYPE.as_str())
            .unwrap_or("application/octet-stream")
            .to_owned(),
        incarnation: a.h(STREAM_INCARNATION).unwrap_or("").to_owned(),
        earliest: a.h(STREAM_EARLIEST_OFFSET).map(str::to_owned),
        expiry,
        snapshot: a.h(STREAM_SNAPSHOT_OFFSET).map(str::to_owned),
    })
}

/// How a byte stream's messages are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bytewise {
    /// Not known yet (the first read asks with `boundary=message`).
    Unknown,
    /// One message per read (the source honours `boundary=message`).
    Messages,
    /// Chunks as the source cuts them.
    Chunks,
}

/// One chunk read from the source.
struct Chunk {
    /// The body: a JSON array, one message, or a chunk of bytes.
    body: Bytes,
    /// `Stream-Next-Offset`.
    next: String,
    /// `Stream-Up-To-Date` (or a long-poll's 204).
    up_to_date: bool,
    /// `Stream-Closed`.
    closed: bool,
    /// Whether the source honoured `boundary=message`.
    by_message: bool,
}

/// Reads the source from `from`: a catch-up read, or a long-poll when `live`; one message when
/// `by_message`; at most `max_bytes` when set.
async fn read(
    ctx: &Context,
    url: &Url,
    from: &str,
    live: bool,
    by_message: bool,
    max_bytes: Option<u64>,
) -> Result<Chunk, MirrorError> {
    let mut u = url.clone();
    {
        let mut q = u.query_pairs_mut();
        if by_message {
            q.append_pair("boundary", "message");
        }
        if live {
            q.append_pair("live", "long-poll");
        }
        if let Some(m) = max_bytes.or(by_message.then_some(1)) {
            q.append_pair("max_bytes", &m.to_string());
        }
        q.append_pair("offset", from);
    }
    let what = format!("GET {u}");
    let a = send(ctx, Side::Source, Method::GET, u, &[], None).await?;
    match a.status {
        StatusCode::OK => Ok(Chunk {
            next: a
                .h(STREAM_NEXT_OFFSET)
                .ok_or_else(|| a.refused(&format!("{what}: no Stream-Next-Offset")))?
                .to_owned(),
            up_to_date: a.flag(STREAM_UP_TO_DATE),
            closed: a.flag(STREAM_CLOSED),
            by_message: a.h(READ_BOUNDARY) == Some("message"),
            body: a.body,
        }),
        StatusCode::NO_CONTENT if live => Ok(Chunk {
            next: a.h(STREAM_NEXT_OFFSET).unwrap_or(from).to_owned(),
            up_to_date: true,
            closed: a.flag(STREAM_CLOSED),
            by_message,
            body: Bytes::new(),
        }),
        _ => Err(a.refused(&what)),
    }
}

/// A brook offset's byte position (`%016d_%016d`), if `offset` is one.
fn brook_bytes(offset: &str) -> Option<u64> {
    let (m, b) = offset.split_once('_')?;
    if m.len() != 16 || b.len() != 16 {
        return None;
    }
    m.parse::<u64>().ok()?;
    b.parse().ok()
}

/// The messages of a JSON chunk.
fn json_messages(body: &[u8]) -> Result<Vec<&RawValue>, String> {
    serde_json::from_slice(body).map_err(|e| format!("a JSON read is not an array: {e}"))
}

/// One stream's copy, in progress.
struct StreamCopy<'a> {
    /// The run.
    ctx: &'a Context,
    /// The source stream's URL.
    src: Url,
    /// The destination stream's URL.
    dst: Url,
    /// The progress file.
    state: std::path::PathBuf,
    /// The progress.
    p: Progress,
    /// The source's content type.
    content_type: String,
    /// Whether the stream is JSON (read and appended as arrays).
    json: bool,
    /// How a byte stream is read.
    bytewise: Bytewise,
    /// Whether the destination has Ursula's snapshot routes (brook and Ursula do; on other
    /// servers `PUT {s}/snapshot/{o}` would create a stream of that name).
    dest_snapshots: bool,
    /// What was done.
    copied: Copied,
}

impl StreamCopy<'_> {
    /// Sends one append with sequence number `seq`; returns the destination's next offset.
    async fn append(&mut self, seq: u64, body: Bytes) -> Result<String, MirrorError> {
        let len = body.len() as u64;
        let headers = [
            (CONTENT_TYPE.as_str(), self.content_type.clone()),
            (PRODUCER_ID, PRODUCER.to_owned()),
            (PRODUCER_EPOCH, "0".to_owned()),
            (PRODUCER_SEQ, seq.to_string()),
        ];
        let a = send(
            self.ctx,
            Side::Destination,
            Method::POST,
            self.dst.clone(),
            &headers,
            Some(body),
        )
        .await?;
        if !matches!(a.status, StatusCode::OK | StatusCode::NO_CONTENT) {
            return Err(a.refused(&format!("POST {} (Producer-Seq {seq})", self.dst)));
        }
        self.copied.appends += 1;
        self.copied.bytes += len;
        Ok(a.h(STREAM_NEXT_OFFSET)
            .unwrap_or(&self.p.dest_next)
            .to_owned())
    }

    /// Records an acknowledged append ending at the source offset `to` (the destination at
    /// `dest_next`), marking where the snapshot at `snapshot` goes when `to` is it.
    fn acked(
        &mut self,
        to: String,
        dest_next: String,
        snapshot: Option<&str>,
    ) -> Result<(), MirrorError> {
        self.p.next_seq += 1;
        if snapshot == Some(to.as_str()) {
            self.p.mark = Some((to.clone(), dest_next.clone()));
        }
        self.p.next_offset = to;
        self.p.dest_next = dest_next;
        self.p.pending = None;
        // A lost write leaves an older lower bound: the appends after it are resent as
        // duplicates (a byte stream's one-message reads are the same every time), or the
        // pending record names them.
        self.p.save(&self.state, false)
    }

    /// Sends again the append a restart found pending: the same messages (or bytes), read
    /// again from the same offset, with the same sequence number.
    async fn redo(&mut self, pending: Pending, snapshot: Option<&str>) -> Result<(), MirrorError> {
        let body = if self.json {
            let c = read(self.ctx, &self.src, &pending.from, false, false, None).await?;
            let all = json_messages(&c.body).map_err(|e| MirrorError::Refused {
                what: format!("GET {}", self.src),
                status: 200,
                body: e,
            })?;
            let n = pending.count as usize;
            if all.len() < n {
                return Err(MirrorError::State(
                    self.state.clone(),
                    format!(
                        "the pending append of {n} messages reads back as {}",
                        all.len()
                    ),
                ));
            }
            let mut text = String::from("[");
            for (i, m) in all.iter().take(n).enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(m.get());
            }
            text.push(']');
            Bytes::from(text)
        } else {
            let by_message = self.bytewise == Bytewise::Messages;
            let max = (!by_message).then_some(pending.count);
            let c = read(self.ctx, &self.src, &pending.from, false, by_message, max).await?;
            if (c.body.len() as u64) < pending.count {
                return Err(MirrorError::State(
                    self.state.clone(),
                    format!(
                        "the pending append of {} bytes reads back shorter",
                        pending.count
                    ),
                ));
            }
            c.body.slice(..pending.count as usize)
        };
        let dest_next = self.append(pending.seq, body).await?;
        self.p.next_seq = pending.seq;
        self.acked(pending.to, dest_next, snapshot)
    }

    /// Appends one chunk read from `from`; returns whether it carried data.
    async fn copy_chunk(
        &mut self,
        chunk: &Chunk,
        snapshot: Option<&str>,
    ) -> Result<bool, MirrorError> {
        let seq = self.p.next_seq;
        let from = self.p.next_offset.clone();
        let count = if self.json {
            let n = json_messages(&chunk.body)
                .map_err(|e| MirrorError::Refused {
                    what: format!("GET {}", self.src),
                    status: 200,
                    body: e,
                })?
                .len();
            n as u64
        } else {
            chunk.body.len() as u64
        };
        if count == 0 {
            if chunk.next != from {
                // No data but a new position (the source skipped ahead): keep it.
                self.p.next_offset.clone_from(&chunk.next);
                self.p.save(&self.state, false)?;
            }
            return Ok(false);
        }
        // A one-message read is the same on every retry; any other range is recorded durably
        // first, so a restart resends exactly it.
        if self.json || self.bytewise != Bytewise::Messages {
            self.p.pending = Some(Pending {
                seq,
                from,
                to: chunk.next.clone(),
                count,
            });
            self.p.save(&self.state, true)?;
        }
        let dest_next = self.append(seq, chunk.body.clone()).await?;
        self.acked(chunk.next.clone(), dest_next, snapshot)?;
        Ok(true)
    }

    /// Copies the source's latest snapshot `at` if it was not yet, to the destination offset
    /// marked for it. A destination without snapshots (404, 405, 400) is told in the log.
    async fn copy_snapshot(&mut self, at: &str) -> Result<(), MirrorError> {
        if self.p.snapshot.as_deref() == Some(at) {
            return Ok(());
        }
        if !self.dest_snapshots {
            tracing::warn!(
                "mirror: {}: the destination has no snapshot routes; the snapshot at {at} is not copied",
                self.dst
            );
            self.p.snapshot = Some(at.to_owned());
            return self.p.save(&self.state, false);
        }
        let Some((_, dest_at)) = self.p.mark.clone().filter(|(s, _)| s == at) else {
            tracing::warn!(
                "mirror: {}: the snapshot at {at} lies before where this mirror started copying; not copied",
                self.src
            );
            self.p.snapshot = Some(at.to_owned());
            return self.p.save(&self.state, false);
        };
        let src = join(&self.src, &format!("snapshot/{at}"));
        let blob = send(self.ctx, Side::Source, Method::GET, src.clone(), &[], None).await?;
        if blob.status != StatusCode::OK {
            return Err(blob.refused(&format!("GET {src}")));
        }
        let ct = blob
            .h(CONTENT_TYPE.as_str())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let dst = join(&self.dst, &format!("snapshot/{dest_at}"));
        let put = send(
            self.ctx,
            Side::Destination,
            Method::PUT,
            dst.clone(),
            &[(CONTENT_TYPE.as_str(), ct)],
            Some(blob.body),
        )
        .await?;
        match put.status.as_u16() {
            200..=299 => self.copied.snapshots += 1,
            400 | 404 | 405 | 501 => tracing::warn!(
                "mirror: {dst}: the destination does not take snapshots ({}); not copied",
                put.status
            ),
            _ => return Err(put.refused(&format!("PUT {dst}"))),
        }
        self.p.snapshot = Some(at.to_owned());
        self.p.save(&self.state, false)
    }

    /// Closes the destination (idempotent: an already closed one answers 204 or 409 closed).
    async fn close(&mut self) -> Result<(), MirrorError> {
        let a = send(
            self.ctx,
            Side::Destination,
            Method::POST,
            self.dst.clone(),
            &[
                (CONTENT_TYPE.as_str(), self.content_type.clone()),
                (STREAM_CLOSED, "true".into()),
            ],
            None,
        )
        .await?;
        let closed =
            a.status.is_success() || (a.status == StatusCode::CONFLICT && a.flag(STREAM_CLOSED));
        if !closed {
            return Err(a.refused(&format!("POST {} (close)", self.dst)));
        }
        self.p.closed = true;
        self.p.save(&self.state, false)
    }

    /// The read size that makes a JSON (or byte-chunk) read end exactly at the snapshot offset
    /// `at` when it lies ahead (brook offsets only).
    fn bound(&self, at: Option<&str>) -> Option<u64> {
        let at = brook_bytes(at?)?;
        let from = brook_bytes(&self.p.next_offset)?;
        (at > from && self.bytewise != Bytewise::Messages).then(|| at - from)
    }
}

/// Creates the Ursula bucket `bucket` on the destination once per run (an existing one is
/// fine).
async fn ensure_bucket(ctx: &Context, bucket: &str) -> Result<(), MirrorError> {
    let mut done = ctx.buckets.lock().await;
    if done.contains(bucket) {
        return Ok(());
    }
    let url = join(&ctx.dest, bucket);
    let a = send(ctx, Side::Destination, Method::PUT, url.clone(), &[], None).await?;
    if !(a.status.is_success() || a.status == StatusCode::CONFLICT) {
        return Err(a.refused(&format!("PUT {url} (bucket)")));
    }
    done.insert(bucket.to_owned());
    Ok(())
}

/// Copies the source stream `name` to its destination, resuming from its progress file.
pub(crate) async fn mirror_stream(ctx: &Context, name: &str) -> Result<Copied, MirrorError> {
    let mapped = ctx.opts.names.map(name)?;
    let src = join(&ctx.source, name);
    let dst = join(&ctx.dest, &mapped.path);
    let state = path_for(&ctx.opts.state_dir, dst.as_str());
    let mut info = source_info(ctx, &src).await?;
    let p = match Progress::load(&state)? {
        Some(p) if p.incarnation != info.incarnation => {
            return Err(MirrorError::SourceRecreated(src.to_string()));
        }
        Some(p) => p,
        None => {
            let head = send(ctx, Side::Destination, Method::HEAD, dst.clone(), &[], None).await?;
            if head.status.is_success() {
                return Err(MirrorError::Foreign(dst.to_string()));
            }
            if head.status != StatusCode::NOT_FOUND {
                return Err(head.refused(&format!("HEAD {dst}")));
            }
            let from = info.earliest.clone().unwrap_or_else(|| "-1".to_owned());
            let p = Progress::new(info.incarnation.clone(), from);
            p.save(&state, true)?;
            p
        }
    };
    if p.closed {
        return Ok(Copied::default());
    }
    let json = info
        .content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    let mut c = StreamCopy {
        ctx,
        src,
        dst,
        state,
        p,
        content_type: info.content_type.clone(),
        json,
        bytewise: if json {
            Bytewise::Chunks
        } else {
            Bytewise::Unknown
        },
        dest_snapshots: false,
        copied: Copied::default(),
    };
    if let Some(bucket) = &mapped.bucket {
        ensure_bucket(ctx, bucket).await?;
    }
    if !c.p.created {
        let mut headers = vec![(CONTENT_TYPE.as_str(), info.content_type.clone())];
        headers.extend(info.expiry.iter().cloned());
        let a = send(
            ctx,
            Side::Destination,
            Method::PUT,
            c.dst.clone(),
            &headers,
            None,
        )
        .await?;
        if !matches!(a.status, StatusCode::CREATED | StatusCode::OK) {
            return Err(a.refused(&format!("PUT {}", c.dst)));
        }
        c.p.created = true;
        a.h(STREAM_NEXT_OFFSET)
            .unwrap_or("")
            .clone_into(&mut c.p.dest_next);
        if info.snapshot.as_deref() == Some(c.p.next_offset.as_str()) {
            c.p.mark = Some((c.p.next_offset.clone(), c.p.dest_next.clone()));
        }
        c.p.save(&c.state, true)?;
    }
    // brook answers with Stream-Incarnation; Ursula has snapshots but no incarnations.
    c.dest_snapshots = mapped.bucket.is_some() || {
        let head = send(
            ctx,
            Side::Destination,
            Method::HEAD,
            c.dst.clone(),
            &[],
            None,
        )
        .await?;
        if matches!(
            head.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(head.refused(&format!("HEAD {}", c.dst)));
        }
        head.h(STREAM_INCARNATION).is_some()
    };
    if let Some(pending) = c.p.pending.clone() {
        if !c.json {
            // Learn how the source reads before resending a byte range.
            let probe = read(ctx, &c.src, &pending.from, false, true, None).await?;
            c.bytewise = if probe.by_message {
                Bytewise::Messages
            } else {
                Bytewise::Chunks
            };
        }
        c.redo(pending, info.snapshot.as_deref()).await?;
    }
    let mut live = false;
    loop {
        let by_message = !c.json && c.bytewise != Bytewise::Chunks;
        let bound = c.bound(info.snapshot.as_deref());
        let mut chunk = read(ctx, &c.src, &c.p.next_offset, live, by_message, bound).await?;
        if c.bytewise == Bytewise::Unknown {
            if chunk.by_message {
                c.bytewise = Bytewise::Messages;
            } else {
                // The source ignored `boundary=message`: read that range again as chunks.
                c.bytewise = Bytewise::Chunks;
                chunk = read(ctx, &c.src, &c.p.next_offset, live, false, bound).await?;
            }
        }
        c.copy_chunk(&chunk, info.snapshot.as_deref()).await?;
        if !chunk.up_to_date {
            live = false;
            continue;
        }
        // At the tail: the latest snapshot, then closure; a follower waits for more.
        info = source_info(ctx, &c.src).await?;
        if info.incarnation != c.p.incarnation {
            return Err(MirrorError::SourceRecreated(c.src.to_string()));
        }
        if info.snapshot.as_deref() == Some(c.p.next_offset.as_str()) && c.p.mark.is_none() {
            c.p.mark = Some((c.p.next_offset.clone(), c.p.dest_next.clone()));
        }
        if let Some(at) = info.snapshot.clone() {
            c.copy_snapshot(&at).await?;
        }
        if chunk.closed {
            c.close().await?;
            return Ok(c.copied);
        }
        if !ctx.opts.follow {
            return Ok(c.copied);
        }
        live = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brook_offsets_give_byte_positions() {
        assert_eq!(brook_bytes("0000000000000002_0000000000000031"), Some(31));
        assert_eq!(brook_bytes("-1"), None);
        assert_eq!(brook_bytes("2_31"), None);
        assert_eq!(shorten(&[b'x'; 400]).len(), 300);
    }
}
