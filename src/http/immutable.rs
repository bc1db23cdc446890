//! Immutable reads (Ursula 0.11): the resources of one incarnation of a stream, named by its
//! token and an offset in the path, so that a shared cache may keep them forever.
//!
//! - `GET {s}/incarnation/{token}/chunk/{offset}`: the stream's bytes from `offset` to the end
//!   of the [`CHUNK_GRID_BYTES`] chunk that holds it, or to the tail.
//! - `GET {s}/incarnation/{token}/snapshot/{offset}`: the snapshot published at `offset`, with
//!   the byte ranges of a snapshot read.
//!
//! Both refuse a query (400 `QUERY_NOT_ACCEPTED`) and a token or offset not in the form this
//! server issues (400 `INVALID_RESOURCE`), then answer as any read does with the path's token as
//! the `Stream-Incarnation` precondition: 404, 410 and 416 before 412 (which carries the current
//! token). A request's own `Stream-Incarnation` header is ignored: the path names the token.
//!
//! Only an answer whose bytes and headers can never change is marked `Stream-Immutable: true`
//! and cached for a year (`Cache-Control: public, max-age=31536000, immutable`; `private` under
//! `--private-cache` or when a token admitted it). A chunk answer that ends at the tail of an
//! open stream is not: the same URL answers more bytes once the stream grows, so it carries no
//! marker and `Cache-Control: no-store`.

use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use crate::headers::parse_offset;
use crate::{Incarnation, Offset, ReadFrom, ReadRequest, StreamName};

use super::AppState;
use super::body::Pieces;
use super::error::ApiError;
use super::names::{
    STREAM_CLOSED, STREAM_IMMUTABLE, STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_OFFSET, TRUE,
};
use super::read::read_chunk;
use super::reply::{Answer, ReadTag, Reply};
use super::request::none_match;
use super::snapshot::{Shape, read_snapshot, snapshot_response};

/// The chunk grid (Ursula's): chunk boundaries are the multiples of 4 MiB of the stream's byte
/// position, so readers that start anywhere ask for the same URLs after their first answer. A
/// JSON chunk ends at the last message boundary before the grid line (or after its first
/// message, if that one is larger), and every chunk is at most the store's `max_read_bytes`.
pub(crate) const CHUNK_GRID_BYTES: u64 = 4 << 20;

/// `Cache-Control: no-store`: a chunk answer at the open tail.
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// The body length a chunk read from byte position `at` asks for: to the end of its chunk.
pub(crate) fn chunk_len(at: u64) -> u64 {
    CHUNK_GRID_BYTES - at % CHUNK_GRID_BYTES
}

/// The token and offset of an immutable path, which takes no query; each must be as this server
/// issues it (the offset in its canonical 33 characters), so one resource has one URL.
fn resource(parts: &Parts, token: &str, offset: &str) -> Result<(Incarnation, Offset), ApiError> {
    if parts.uri.query().is_some() {
        return Err(ApiError::bad_request(
            "QUERY_NOT_ACCEPTED",
            "an immutable resource takes no query",
        ));
    }
    let malformed = |what: &str| {
        ApiError::bad_request(
            "INVALID_RESOURCE",
            format!("malformed immutable resource: {what}"),
        )
    };
    // Tokens this server issues are hex digits and `-`; anything else (a `%`-escape above all)
    // would give one resource a second URL.
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(malformed("the token is not one this server issues"));
    }
    let token = Incarnation::new(token).map_err(|_| malformed("the token is malformed"))?;
    let at = parse_offset(offset)
        .ok()
        .filter(|o| o.to_string() == offset)
        .ok_or_else(|| malformed("the offset is not one this server returned"))?;
    Ok((token, at))
}

/// GET `{s}/incarnation/{token}/chunk/{offset}`: the stream's bytes from `offset` to the end of
/// its chunk or the tail, with `Stream-Offset` (the path's offset), `Stream-Next-Offset` and
/// `Stream-Incarnation`. Marked immutable when it ends below the tail or at a closed stream's
/// final offset (then with `Stream-Closed: true` too); a 304 when `If-None-Match` names it.
pub(crate) async fn chunk(
    app: &AppState,
    name: StreamName,
    token: &str,
    offset: &str,
    parts: &Parts,
) -> Result<Answer, ApiError> {
    let (token, at) = resource(parts, token, offset)?;
    let req = ReadRequest {
        from: ReadFrom::At(at),
        max_bytes: Some(chunk_len(at.bytes)),
        expect: Some(token),
        whole_messages: false,
    };
    let mut chunk = read_chunk(&app.store, &name, req).await?;
    // The engine plans a read from its start and length alone, and the bytes below the tail
    // never change: an answer that ends there (or at a closed tail) is final for this URL.
    let fixed = !chunk.up_to_date || chunk.closed;
    let tag = ReadTag {
        incarnation: chunk.incarnation.clone(),
        start: chunk.start,
        next: chunk.next,
        closed: chunk.closed,
    };
    let matched = parts.headers.contains_key(header::IF_NONE_MATCH)
        && none_match(&parts.headers, &tag.text());
    let status = if matched {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let r = Reply::new(status)
        .text(
            header::CONTENT_TYPE,
            std::mem::take(&mut chunk.content_type),
        )
        .incarnation(STREAM_INCARNATION, &chunk.incarnation)
        .offset(STREAM_OFFSET, chunk.start)
        .offset(STREAM_NEXT_OFFSET, chunk.next)
        .flag_value(STREAM_IMMUTABLE, fixed, TRUE)
        .flag(STREAM_CLOSED, fixed && chunk.closed)
        .tag(header::ETAG, tag)
        .fixed(
            header::CACHE_CONTROL,
            if fixed {
                app.immutable_cache.clone()
            } else {
                NO_STORE
            },
        );
    if matched {
        return Ok(r.answer_empty());
    }
    Ok(r.answer(Pieces::new(chunk.body).into_body()))
}

/// GET `{s}/incarnation/{token}/snapshot/{offset}`: the snapshot at `offset` as
/// `{s}/snapshot/{offset}` serves it (byte ranges included), with only the headers that never
/// change and `Stream-Immutable: true`; a 416 carries no marker.
pub(crate) async fn snapshot(
    app: &AppState,
    name: StreamName,
    token: &str,
    offset: &str,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let (token, at) = resource(parts, token, offset)?;
    let snap = read_snapshot(app, name, Some(at)).await?;
    let shape = Shape::Immutable {
        cache: app.immutable_cache.clone(),
    };
    snapshot_response(parts, snap, Some(&token), shape)
}
