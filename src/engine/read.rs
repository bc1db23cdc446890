//! Reads and waits: planning a read against a stream's durable view, serving it as views of
//! the segment maps (no copy), and waiting for a stream to pass an offset.
//!
//! Readers see only the durable view (`visible`): nothing is readable before it is
//! acknowledged. A read renews a sliding TTL; `head` does not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use event_listener::Listener;

use crate::error::{Error, Result};
use crate::name::{Incarnation, Offset, ReadFrom, StreamName};
use crate::types::{Message, ReadChunk, ReadRequest, StreamInfo};

use super::Engine;
use super::stream::{Stream, Visible};

impl Engine {
    /// The plan of a read of `name` (see [`Engine::read_plan_of`]), after the live-stream check.
    fn read_plan(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Result<(Arc<Stream>, Visible, u64, u64)> {
        self.read_plan_of(self.live(name)?, req)
    }

    /// The range a read of the live stream `s` covers, with the view it was planned on.
    /// Plans a read of the live stream `s`: the byte range `from..to` it covers, with the view
    /// it was planned on. Resolves the start, refuses starts past the tail (`OffsetBeyondTail`)
    /// or before the retained start (`OffsetGone`; once retention has trimmed anything, `Start`
    /// itself), checks the incarnation, bounds the end by `max_bytes` and moves a JSON end
    /// back to a message boundary (at least one whole message).
    fn read_plan_of(
        &self,
        s: Arc<Stream>,
        req: &ReadRequest,
    ) -> Result<(Arc<Stream>, Visible, u64, u64)> {
        s.touch();
        let vis = s.visible();
        let start = match req.from {
            // The seed: once retention trimmed the start, a read from the start (`offset=-1`)
            // answers 410 rather than silently skipping what it cannot count.
            ReadFrom::Start if vis.earliest.bytes > 0 => {
                return Err(Error::OffsetGone {
                    earliest: vis.earliest,
                });
            }
            ReadFrom::Start => vis.earliest,
            ReadFrom::Tail => vis.tail,
            ReadFrom::At(o) => o,
        };
        if start.bytes > vis.tail.bytes {
            return Err(Error::OffsetBeyondTail { tail: vis.tail });
        }
        if start.bytes < vis.earliest.bytes {
            return Err(Error::OffsetGone {
                earliest: vis.earliest,
            });
        }
        // After the range checks: a read that would answer 404, 410 or 416 without
        // Stream-Incarnation still does with it (the seed).
        s.check_expect(req.expect.as_ref())?;
        if s.json && !self.is_boundary(&s, start.bytes)? && start.bytes != vis.tail.bytes {
            return Err(Error::InvalidOffset(format!(
                "offset {start} is not a message boundary"
            )));
        }
        if let ReadFrom::At(o) = req.from
            && o != vis.tail
        {
            self.check_halves(&s, o)?;
        }
        let max = req
            .max_bytes
            .unwrap_or(self.options.max_read_bytes)
            .clamp(1, self.options.max_read_bytes);
        let mut end = if req.from == ReadFrom::Tail {
            start.bytes
        } else {
            vis.tail.bytes.min(start.bytes.saturating_add(max))
        };
        // A JSON read (or one asking for whole messages) ends on a message boundary (at least
        // one whole message), unless it is `offset=now` or reaches the tail.
        if (s.json || req.whole_messages) && end < vis.tail.bytes && req.from != ReadFrom::Tail {
            end = self.read_boundary(&s, start.bytes, end, vis.tail.bytes)?;
        }
        Ok((s, vis, start.bytes, end))
    }

    /// Reads a live stream: the range [`Engine::read_plan_of`] plans, as views of the segment
    /// maps (a JSON range wrapped as an array).
    pub(crate) fn read(&self, name: &StreamName, req: &ReadRequest) -> Result<ReadChunk> {
        let (s, vis, from, to) = self.read_plan(name, req)?;
        self.read_planned(&s, &vis, from, to)
    }

    /// A read without any blocking step, for async callers: `None` when it would block (the
    /// stream is not open, is a fork, has expired, or the range holds messages not yet checked
    /// against their checksums since the stream was opened); the caller then reads on a
    /// blocking thread. Otherwise the read is index lookups and map slicing.
    pub(crate) fn try_read(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Option<Result<ReadChunk>> {
        let s = self.in_memory(name.as_str())?;
        if s.config.fork.is_some() || s.expired() {
            return None;
        }
        {
            let core = s.core.lock();
            if core.gone || core.state.soft_deleted {
                return None;
            }
        }
        let (s, vis, from, to) = match self.read_plan_of(s, req) {
            Ok(plan) => plan,
            Err(e) => return Some(Err(e)),
        };
        if !s
            .data
            .lock()
            .segs
            .as_ref()
            .is_some_and(|g| g.verified(from, to))
        {
            return None;
        }
        Some(self.read_planned(&s, &vis, from, to))
    }

    /// Serves a planned range of `s` as a chunk (a JSON range wrapped as an array).
    fn read_planned(
        &self,
        s: &Arc<Stream>,
        vis: &Visible,
        from: u64,
        to: u64,
    ) -> Result<ReadChunk> {
        let mut pieces = Vec::new();
        self.read_range(s, from, to, &mut pieces)?;
        let data_len = to - from;
        let body = if s.json { json_array(pieces) } else { pieces };
        self.chunk(s, vis, from, to, body, data_len)
    }

    /// The chunk for range `from..to` of `s` read on view `vis`, with `body` and its data length;
    /// `up_to_date` (and `closed`) when it reaches the view's tail.
    fn chunk(
        &self,
        s: &Arc<Stream>,
        vis: &Visible,
        from: u64,
        to: u64,
        body: Vec<Bytes>,
        data_len: u64,
    ) -> Result<ReadChunk> {
        self.counters.read(data_len);
        let up_to_date = to == vis.tail.bytes;
        let next = if up_to_date {
            vis.tail
        } else {
            self.offset_at(s, to)?
        };
        let start = if from == vis.tail.bytes {
            vis.tail
        } else {
            self.offset_at(s, from)?
        };
        Ok(ReadChunk {
            start,
            next,
            body,
            data_len,
            up_to_date,
            closed: up_to_date && vis.closed,
            content_type: s.config.content_type.clone(),
            incarnation: s.incarnation.clone(),
        })
    }

    /// Reads a live stream as separate messages, each with its start offset (a JSON message
    /// without its separator), plus the chunk describing the range (with an empty body).
    pub(crate) fn read_messages(
        &self,
        name: &StreamName,
        req: &ReadRequest,
    ) -> Result<(Vec<Message>, ReadChunk)> {
        let (s, vis, from, to) = self.read_plan(name, req)?;
        let mut pieces = Vec::new();
        self.read_range(&s, from, to, &mut pieces)?;
        let flat: Bytes = if pieces.len() == 1 {
            pieces.pop().unwrap_or_default()
        } else {
            Bytes::from(pieces.concat())
        };
        let mut ranges = Vec::new();
        self.message_ranges(&s, from, to, &mut ranges)?;
        let mut msgs = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            let (ra, mut rb) = ((a - from) as usize, (b - from) as usize);
            if s.json && rb > ra {
                rb -= 1; // the separator after each JSON message
            }
            let start = self.offset_at(&s, a)?;
            msgs.push(Message {
                start,
                data: flat.slice(ra.min(flat.len())..rb.min(flat.len())),
            });
        }
        let chunk = self.chunk(&s, &vis, from, to, Vec::new(), to - from)?;
        Ok((msgs, chunk))
    }

    /// The offset `from` names on a live stream's durable view (`Start` is the retained start).
    pub(crate) fn resolve(&self, name: &StreamName, from: ReadFrom) -> Result<Offset> {
        let s = self.live(name)?;
        let vis = s.visible();
        Ok(match from {
            ReadFrom::Start => vis.earliest,
            ReadFrom::Tail => vis.tail,
            ReadFrom::At(o) => o,
        })
    }

    /// A live stream's description as of its durable view, after the incarnation check. Does
    /// not count as an access (a sliding TTL is not renewed).
    pub(crate) fn head(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<StreamInfo> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        Ok(s.info(&s.visible()))
    }

    /// [`Engine::head`] without any blocking step, for async callers: `None` when it could
    /// block (the stream is not open) or has more to do than describe it (it is deleted,
    /// soft-deleted or expired); the caller then asks [`Engine::head`] on a blocking thread.
    pub(crate) fn try_head(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Option<Result<StreamInfo>> {
        let s = self.live_in_memory(name)?.ok()?;
        Some(s.check_expect(expect).map(|()| s.info(&s.visible())))
    }

    /// Counts as an access of a live stream: renews a sliding TTL.
    pub(crate) fn touch(&self, name: &StreamName) -> Result<()> {
        self.live(name)?.touch();
        Ok(())
    }

    // --- wait -------------------------------------------------------------------------------

    /// Whether a waiter on `s` for data past `after` should wake: the durable tail passed it, or
    /// the stream is closed, deleted, soft-deleted, a tombstone or expired.
    ///
    /// Takes `visible`, lets go, then `core`: never both, as `visible` ranks below `core` in the
    /// lock order. Every condition only ever turns true, so looking at them one at a time
    /// answers as a look at all of them at once would.
    fn wait_ready(s: &Stream, after: Offset) -> bool {
        let visible_ready = {
            let v = s.visible.lock();
            v.tail.bytes > after.bytes || v.closed || v.deleted || v.soft_deleted
        };
        visible_ready || s.core.lock().gone || s.expired()
    }

    /// Waits (without blocking a thread) until [`Engine::wait_ready`] holds for a live stream.
    pub(crate) async fn wait(&self, name: &StreamName, after: Offset) -> Result<()> {
        let s = self.live(name)?;
        wait_on(&s, after).await;
        Ok(())
    }

    /// A live stream held for waiting on it again and again (an SSE connection's): see
    /// [`Watch`].
    pub(crate) fn watch(&self, name: &StreamName) -> Result<Watch> {
        Ok(Watch(self.live(name)?))
    }

    /// [`Engine::wait`] on this thread, for at most `timeout`: false if it timed out.
    pub(crate) fn wait_blocking(
        &self,
        name: &StreamName,
        after: Offset,
        timeout: Duration,
    ) -> Result<bool> {
        let s = self.live(name)?;
        let deadline = Instant::now() + timeout;
        loop {
            let l = s.event.listen();
            if Self::wait_ready(&s, after) {
                return Ok(true);
            }
            if l.wait_deadline(deadline).is_none() && !Self::wait_ready(&s, after) {
                return Ok(false);
            }
        }
    }
}
/// Waits until [`Engine::wait_ready`] holds for `s`. A look that finds it ready costs no
/// listener (a waiter just woken returns at once); otherwise the listener is registered before
/// the next look, so no notification is missed.
async fn wait_on(s: &Stream, after: Offset) {
    loop {
        if Engine::wait_ready(s, after) {
            return;
        }
        let l = s.event.listen();
        if Engine::wait_ready(s, after) {
            return;
        }
        l.await;
    }
}

/// One incarnation of a live stream, held to wait on it over and over (a live reader's, such
/// as an SSE connection): [`Store::wait`](crate::Store::wait) without the lookup by name, and
/// the durable tail at a glance. Made by [`Store::watch`](crate::Store::watch).
///
/// Holding it keeps the stream open in memory (eviction passes over a stream anyone holds).
/// It never follows a recreated stream: a delete wakes its waiters and [`Watch::tail`] answers
/// `None` from then on, and a read by name (which checks the incarnation) reports the error.
pub struct Watch(Arc<Stream>);

impl Watch {
    /// Resolves once the durable tail is past `after`, or the stream is closed, deleted,
    /// soft-deleted or expired (as [`Store::wait`](crate::Store::wait)). Never polls and
    /// takes no thread; usable from any async runtime.
    pub async fn wait(&self, after: Offset) {
        wait_on(&self.0, after).await;
    }

    /// The durable tail and whether the stream is closed there, as a read at the tail would
    /// report them now; `None` once the stream is deleted, soft-deleted or expired (a read by
    /// name then answers the error). Two short locks, no I/O: never blocks on the disk.
    pub fn tail(&self) -> Option<(Offset, bool)> {
        let (tail, closed, dead) = {
            let v = self.0.visible.lock();
            (v.tail, v.closed, v.deleted || v.soft_deleted)
        };
        if dead || self.0.core.lock().gone || self.0.expired() {
            return None;
        }
        Some((tail, closed))
    }
}

/// Wraps a JSON stream's stored messages (`m1,m2,`) as an array (`[m1,m2]`) without copying them.
fn json_array(mut pieces: Vec<Bytes>) -> Vec<Bytes> {
    // Drop the separator after the last message.
    while let Some(last) = pieces.last_mut() {
        if last.is_empty() {
            pieces.pop();
            continue;
        }
        last.truncate(last.len() - 1);
        if last.is_empty() {
            pieces.pop();
        }
        break;
    }
    let mut out = Vec::with_capacity(pieces.len() + 2);
    out.push(Bytes::from_static(b"["));
    out.extend(pieces);
    out.push(Bytes::from_static(b"]"));
    out
}
