//! Server-sent events (`live=sse`): the event parser and the reconnecting event stream.

use std::collections::VecDeque;
use std::pin::Pin;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::headers::STREAM_SSE_DATA_ENCODING;

use super::error::{Error, Result};
use super::stream::StreamHandle;
use super::types::Position;

/// One event of an SSE tail.
#[derive(Clone, Debug, PartialEq)]
pub enum SseEvent {
    /// A data event: the stream's bytes (for a JSON stream, a JSON array of messages), decoded
    /// from base64 when the server sent `Stream-SSE-Data-Encoding: base64`.
    Data(Bytes),
    /// A control event: where the data so far ends, and the stream's state there.
    Control(Control),
}

/// A control event's members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Control {
    /// `streamNextOffset`: where the data so far ends.
    pub next: Position,
    /// `streamCursor`, echoed on reconnect.
    pub cursor: Option<String>,
    /// `upToDate`: the data so far reaches the tail.
    pub up_to_date: bool,
    /// `streamClosed`: the stream is closed at `next`; no more events follow.
    pub closed: bool,
}

/// An event as framed on the wire: its type and its data lines joined with LF.
#[derive(Debug, PartialEq, Eq)]
struct RawEvent {
    event: String,
    data: String,
}

/// The text/event-stream framing: lines ending in LF, CRLF or CR; `field: value` lines; a blank
/// line dispatches the event; lines starting with `:` are comments.
#[derive(Default)]
struct Parser {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
    /// The previous line ended with CR: a following LF belongs to it.
    after_cr: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<RawEvent>) {
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.buf);
                    self.line(&line, out);
                }
                _ => self.buf.push(b),
            }
        }
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<RawEvent>) {
        if line.is_empty() {
            if !self.data.is_empty() || !self.event.is_empty() {
                let event = std::mem::take(&mut self.event);
                let data = std::mem::take(&mut self.data).join("\n");
                out.push(RawEvent {
                    event: if event.is_empty() {
                        "message".to_owned()
                    } else {
                        event
                    },
                    data,
                });
            }
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f.to_owned(), v.strip_prefix(' ').unwrap_or(v).to_owned()),
            None => (text.into_owned(), String::new()),
        };
        match field.as_str() {
            "event" => self.event = value,
            "data" => self.data.push(value),
            _ => {}
        }
    }
}

fn decode(raw: RawEvent, base64: bool) -> Result<Option<SseEvent>> {
    match raw.event.as_str() {
        "data" => {
            let data = if base64 {
                let compact: String = raw.data.split_whitespace().collect();
                base64::engine::general_purpose::STANDARD
                    .decode(compact)
                    .map_err(|e| {
                        Error::InvalidResponse(format!("an SSE data event is not base64: {e}"))
                    })?
            } else {
                raw.data.into_bytes()
            };
            Ok(Some(SseEvent::Data(Bytes::from(data))))
        }
        "control" => {
            let v: serde_json::Value = serde_json::from_str(&raw.data).map_err(|e| {
                Error::InvalidResponse(format!("an SSE control event is not JSON: {e}"))
            })?;
            let next = v
                .get("streamNextOffset")
                .and_then(|o| o.as_str())
                .ok_or_else(|| {
                    Error::InvalidResponse("an SSE control event without streamNextOffset".into())
                })?;
            Ok(Some(SseEvent::Control(Control {
                next: Position::new(next),
                cursor: v
                    .get("streamCursor")
                    .and_then(|c| c.as_str())
                    .map(str::to_owned),
                up_to_date: v.get("upToDate").and_then(serde_json::Value::as_bool) == Some(true),
                closed: v.get("streamClosed").and_then(serde_json::Value::as_bool) == Some(true),
            })))
        }
        // Unknown event types are for other clients.
        _ => Ok(None),
    }
}

type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

struct State {
    handle: StreamHandle,
    next: Position,
    cursor: Option<String>,
    body: Option<(Body, bool)>,
    parser: Parser,
    /// Data events of this connection not yet confirmed by their control event.
    unconfirmed: Vec<SseEvent>,
    queue: VecDeque<SseEvent>,
    done: bool,
}

/// The reconnecting event stream behind [`StreamHandle::sse`].
pub(crate) fn events(
    handle: StreamHandle,
    from: Position,
) -> impl Stream<Item = Result<SseEvent>> + Send + Unpin + 'static {
    let state = State {
        handle,
        next: from,
        cursor: None,
        body: None,
        parser: Parser::default(),
        unconfirmed: Vec::new(),
        queue: VecDeque::new(),
        done: false,
    };
    Box::pin(futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(ev) = s.queue.pop_front() {
                if let SseEvent::Control(c) = &ev {
                    s.next = c.next.clone();
                    if c.cursor.is_some() {
                        s.cursor.clone_from(&c.cursor);
                    }
                    if c.closed {
                        s.done = true;
                        s.queue.clear();
                    }
                }
                return Some((Ok(ev), s));
            }
            if s.done {
                return None;
            }
            let Some((body, base64)) = s.body.as_mut() else {
                match s.handle.sse_connect(&s.next, s.cursor.as_deref()).await {
                    Ok(res) => {
                        let base64 = res
                            .headers()
                            .get(STREAM_SSE_DATA_ENCODING)
                            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"base64"));
                        s.parser = Parser::default();
                        s.unconfirmed.clear();
                        s.body = Some((Box::pin(res.bytes_stream()), base64));
                        continue;
                    }
                    Err(e) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                }
            };
            let base64 = *base64;
            match body.next().await {
                Some(Ok(bytes)) => {
                    let mut raw = Vec::new();
                    s.parser.feed(&bytes, &mut raw);
                    for r in raw {
                        match decode(r, base64) {
                            // A data event is passed on with the control event after it, so a
                            // connection cut between the two never delivers data twice.
                            Ok(Some(ev @ SseEvent::Data(_))) => s.unconfirmed.push(ev),
                            Ok(Some(ev)) => {
                                s.queue.extend(s.unconfirmed.drain(..));
                                s.queue.push_back(ev);
                            }
                            Ok(None) => {}
                            Err(e) => {
                                s.done = true;
                                return Some((Err(e), s));
                            }
                        }
                    }
                }
                // The server ended the connection (its lifetime is up): reconnect from the last
                // control event; data not confirmed by one is read again.
                None => s.body = None,
                Some(Err(e)) => {
                    s.done = true;
                    return Some((Err(Error::Transport(e)), s));
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<RawEvent> {
        let mut p = Parser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    #[test]
    fn events_are_framed_across_chunk_boundaries_and_line_endings() {
        let out = parse(&[
            b"event: data\ndata:a\r\nda",
            b"ta: b\r\r\n: keep-alive\n\nevent: control\rdata:{}\n\n",
        ]);
        assert_eq!(
            out,
            vec![
                RawEvent {
                    event: "data".into(),
                    data: "a\nb".into()
                },
                RawEvent {
                    event: "control".into(),
                    data: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn data_and_control_events_decode() {
        let ev = decode(
            RawEvent {
                event: "data".into(),
                data: "SGVs\nbG8=".into(),
            },
            true,
        );
        assert_eq!(
            ev.ok().flatten(),
            Some(SseEvent::Data(Bytes::from_static(b"Hello")))
        );
        let ev = decode(
            RawEvent {
                event: "control".into(),
                data: r#"{"streamNextOffset":"x","streamCursor":"7","upToDate":true}"#.into(),
            },
            false,
        );
        assert_eq!(
            ev.ok().flatten(),
            Some(SseEvent::Control(Control {
                next: Position::new("x"),
                cursor: Some("7".into()),
                up_to_date: true,
                closed: false,
            }))
        );
        assert!(matches!(
            decode(
                RawEvent {
                    event: "control".into(),
                    data: "{}".into()
                },
                false
            ),
            Err(Error::InvalidResponse(m)) if m.contains("without streamNextOffset")
        ));
        assert!(matches!(
            decode(
                RawEvent {
                    event: "other".into(),
                    data: String::new()
                },
                false
            ),
            Ok(None)
        ));
    }
}
