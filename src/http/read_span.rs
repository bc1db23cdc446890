//! A catch-up read that spans several engine reads: a reader far behind the tail of a byte
//! stream gets up to `ServerConfig::catch_up_read_bytes` in one response instead of one
//! `max_read_bytes` chunk per request.
//!
//! Each engine read returns views of the segment maps, so joining them joins lists of views:
//! no byte is copied, and on plain HTTP/1.1 the body still goes out by `sendfile`. JSON streams
//! (whose chunk is wrapped as an array) and reads that bound themselves (`max_bytes`,
//! `boundary=message`) are left as one engine read.

use crate::name::is_json;
use crate::{Incarnation, ReadChunk, ReadFrom, ReadRequest, StreamName};

use super::AppState;
use super::read::read_chunk;

/// Extends `chunk` (a catch-up read's first engine read, made with `expect`) with the reads that
/// follow it along `next`, while it is short of the tail and of `config.catch_up_read_bytes`.
/// Each further read asks for what is left of the target (the engine still caps it at its
/// `max_read_bytes`), so the span never passes the target. It stops early at the first read that
/// fails, changes incarnation or returns nothing: the chunk so far is still a correct answer, the
/// range from its start to its `next`.
pub(super) async fn extend(
    app: &AppState,
    name: &StreamName,
    expect: Option<&Incarnation>,
    mut chunk: ReadChunk,
) -> ReadChunk {
    let target = app.config.catch_up_read_bytes;
    if is_json(&chunk.content_type) {
        return chunk;
    }
    while !chunk.up_to_date && chunk.data_len < target {
        let req = ReadRequest {
            from: ReadFrom::At(chunk.next),
            max_bytes: Some(target - chunk.data_len),
            expect: expect.cloned(),
            whole_messages: false,
        };
        let Ok(more) = read_chunk(&app.store, name, req).await else {
            break;
        };
        if more.incarnation != chunk.incarnation || more.data_len == 0 || more.start != chunk.next {
            break;
        }
        chunk.body.extend(more.body);
        chunk.data_len += more.data_len;
        chunk.next = more.next;
        chunk.up_to_date = more.up_to_date;
        chunk.closed = more.closed;
    }
    chunk
}
