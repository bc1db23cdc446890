//! The bytes of SSE events: a chunk's `data` event (text line by line, or base64) and its
//! `control` event, rendered once per frame for every subscriber at the same place.

use std::borrow::Cow;

use base64::Engine as _;
use bytes::Bytes;

use crate::name::Digits;
use crate::{Offset, ReadChunk, is_json};

use crate::http::service::seat::{Frame, FrameKey};

/// How SSE data events carry the stream's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// `text/*` and `application/json`: UTF-8 text, one `data:` line per line.
    Text,
    /// Everything else: standard base64, one line per event.
    Base64,
}

/// The encoding of SSE data events for a stream of `content_type`.
pub(super) fn encoding_for(content_type: &str) -> Encoding {
    if content_type.starts_with("text/") || is_json(content_type) {
        Encoding::Text
    } else {
        Encoding::Base64
    }
}

/// The body as one slice: the piece itself when there is one, else the pieces joined.
pub(super) fn joined(body: &[Bytes]) -> Cow<'_, [u8]> {
    match body {
        [] => Cow::Borrowed(&[]),
        [one] => Cow::Borrowed(one),
        _ => {
            let mut v = Vec::with_capacity(body.iter().map(Bytes::len).sum());
            for b in body {
                v.extend_from_slice(b);
            }
            Cow::Owned(v)
        }
    }
}

/// The last (up to) four bytes of a body made of pieces.
pub(super) fn last_bytes(body: &[Bytes]) -> Vec<u8> {
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

/// Appends `id: {next}`, the event's resume position. Offsets are digits and `_`: never a line
/// break or the NUL that would make a browser ignore the id.
pub(super) fn id_line(out: &mut Vec<u8>, next: Offset) {
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(Digits::offset(next).as_bytes());
    out.push(b'\n');
}

/// The bytes of a `data` event and its `control` event beyond the payload's own (field names,
/// `id:` lines, the control JSON), with room to spare: what a frame's buffer starts with.
const FRAME_OVERHEAD: usize = 256;

/// A chunk with data as it goes out: its `data` event, then its `control` event with `cursor`,
/// in one buffer sized for both.
pub(super) fn data_frame(chunk: &ReadChunk, encoding: Encoding, cursor: u64) -> Bytes {
    let len = chunk.body_len();
    let payload = match encoding {
        Encoding::Base64 => len.div_ceil(3).saturating_mul(4),
        // A `data:` prefix per line; a body of short lines grows more, and the Vec grows then.
        Encoding::Text => len.saturating_add(len / 8),
    };
    let mut out = Vec::with_capacity(payload.saturating_add(FRAME_OVERHEAD));
    data_event(&mut out, &chunk.body, encoding, chunk.next);
    control_event(
        &mut out,
        chunk.next,
        Some(cursor),
        chunk.up_to_date,
        chunk.closed,
    );
    Bytes::from(out)
}

/// The frame of a chunk with data, for a connection reading with `max_bytes` and sending
/// `cursor`: what it sends, and where it leaves the connection.
pub(crate) fn render(
    chunk: &ReadChunk,
    encoding: Encoding,
    max_bytes: Option<u64>,
    cursor: u64,
) -> Frame {
    Frame {
        key: FrameKey {
            start: chunk.start,
            max_bytes,
            cursor,
        },
        next: chunk.next,
        up_to_date: chunk.up_to_date,
        closed: chunk.closed,
        bytes: data_frame(chunk, encoding, cursor),
    }
}

/// Appends an `event: data` whose payload is `body`, with `id: {next}`, the offset after it: a
/// connection cut between a data event and its control event resumes after the data, not
/// before it.
pub(super) fn data_event(out: &mut Vec<u8>, body: &[Bytes], encoding: Encoding, next: Offset) {
    out.extend_from_slice(b"event: data\n");
    let joined = joined(body);
    match encoding {
        Encoding::Base64 => {
            out.extend_from_slice(b"data:");
            let at = out.len();
            let len = base64::encoded_len(joined.len(), true)
                .expect("an event's data (at most SSE_EVENT_BYTES) has a base64 length");
            out.resize(at + len, 0);
            base64::engine::general_purpose::STANDARD
                .encode_slice(&joined, &mut out[at..])
                .expect("the buffer was sized for the encoding");
            out.push(b'\n');
        }
        Encoding::Text => {
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
    id_line(out, next);
    out.push(b'\n');
}

/// Appends an `event: control`: `{"streamNextOffset":..,"streamCursor":..,"upToDate":true,
/// "streamClosed":true}`, members present as they apply, then `id: {next}` (after `data:`, which
/// clients may expect right after `event:`). Offsets and cursors are digits and `_`, so the JSON
/// is written directly. The id is the offset alone: the cursor only shapes URL cache keys, and
/// a reconnecting `EventSource` keeps its original URL anyway.
pub(super) fn control_event(
    out: &mut Vec<u8>,
    next: Offset,
    cursor: Option<u64>,
    up_to_date: bool,
    closed: bool,
) {
    out.extend_from_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    out.extend_from_slice(Digits::offset(next).as_bytes());
    out.push(b'"');
    // The cursor is omitted once the stream is closed: the client must not reconnect.
    if let (Some(cursor), false) = (cursor, closed) {
        out.extend_from_slice(b",\"streamCursor\":\"");
        out.extend_from_slice(Digits::u64(cursor).as_bytes());
        out.push(b'"');
    }
    if up_to_date || closed {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    if closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    }
    out.extend_from_slice(b"}\n");
    id_line(out, next);
    out.push(b'\n');
}

/// How many bytes at the end of `b` are an incomplete UTF-8 sequence (0 when it ends cleanly).
pub(super) fn incomplete_utf8_tail(b: &[u8]) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line break of a text payload starts a new `data:` line, and a leading space survives;
    /// binary payloads are one base64 line.
    #[test]
    fn text_events_split_every_line_break() {
        let mut out = Vec::new();
        data_event(
            &mut out,
            &[Bytes::from_static(b"a\r\n\r\nevent: x\rb\n c")],
            Encoding::Text,
            Offset::new(0, 9),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: data\ndata:a\ndata:\ndata:event: x\ndata:b\ndata:  c\nid: 0000000000000000_0000000000000009\n\n"
        );
        let mut out = Vec::new();
        data_event(
            &mut out,
            &[Bytes::from_static(b"Hel"), Bytes::from_static(b"lo")],
            Encoding::Base64,
            Offset::new(0, 5),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: data\ndata:SGVsbG8=\nid: 0000000000000000_0000000000000005\n\n"
        );
    }

    /// A control event carries the cursor while the stream is open, and `streamClosed` without a
    /// cursor once it is closed.
    #[test]
    fn control_events_omit_the_cursor_once_closed() {
        let mut out = Vec::new();
        control_event(&mut out, Offset::new(1, 2), Some(7), true, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: control\ndata:{\"streamNextOffset\":\"0000000000000001_0000000000000002\",\"streamCursor\":\"7\",\"upToDate\":true}\nid: 0000000000000001_0000000000000002\n\n"
        );
        let mut out = Vec::new();
        control_event(&mut out, Offset::new(1, 2), Some(7), false, true);
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("\"streamClosed\":true") && !s.contains("streamCursor"),
            "{s}"
        );
    }

    /// `Last-Event-ID` wins over the URL's offset and is validated as one: malformed, non-ASCII or
    /// The bytes of a character cut at the end of a buffer are counted; whole characters are not.
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
