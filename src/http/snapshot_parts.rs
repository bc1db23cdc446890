//! Snapshots uploaded in parts (Ursula 0.11), for snapshots larger than a proxy in front of
//! brook lets one request carry:
//!
//! - `POST {s}/snapshot/{offset}/parts` stages one part (its body, streamed to a file) and
//!   answers 201 with its id in `Stream-Snapshot-Part`. The offset is checked and otherwise
//!   unused: a part belongs to its stream's incarnation, not to an offset.
//! - `PUT {s}/snapshot/{offset}` with `Stream-Snapshot-Parts: N` and `Stream-Snapshot-Digest`
//!   commits: its body lists the N distinct part ids in order, one per line, each line ended by
//!   LF. It answers as a publish does (204), from the stream's latest snapshot alone when that
//!   decides it (a repeat of a commit whose parts are spent is 204 again).
//! - `DELETE {s}/snapshot/parts` discards the stream's unused parts (204).
//!
//! The bounds and their refusals are the engine's ([`Store::stage_snapshot_part`]); a part is
//! counted to its tenant, the root of the grant that admitted it (the stream name's first
//! segment without access control). A commit's body is at most [`MAX_MANIFEST_BYTES`].
//!
//! [`Store::stage_snapshot_part`]: crate::Store::stage_snapshot_part

use axum::body::Body;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Response;

use crate::{Guard, PublishParts, StreamName, normalize_content_type};

use super::body::pump_to_store;
use super::error::{ApiError, Op};
use super::names::{
    STREAM_INCARNATION, STREAM_NEXT_OFFSET, STREAM_SNAPSHOT_DIGEST, STREAM_SNAPSHOT_OFFSET,
    STREAM_SNAPSHOT_PART, STREAM_SNAPSHOT_PARTS,
};
use super::reply::Reply;
use super::request::text;
use super::snapshot::route_target;
use super::{AppState, blocking};

/// The most parts one commit lists.
pub(crate) const MAX_COMMIT_PARTS: usize = 4096;

/// The longest part id, in bytes.
pub(crate) const PART_ID_MAX_BYTES: usize = 64;

/// The longest commit body: [`MAX_COMMIT_PARTS`] ids of [`PART_ID_MAX_BYTES`], each with its LF.
pub(crate) const MAX_MANIFEST_BYTES: usize = MAX_COMMIT_PARTS * (PART_ID_MAX_BYTES + 1);

/// 400 `INVALID_PARTS_COMMIT`.
fn invalid_commit(detail: impl Into<String>) -> ApiError {
    ApiError::bad_request("INVALID_PARTS_COMMIT", detail)
}

/// POST `{s}/snapshot/{offset}/parts`: stages the body as one part (201 with
/// `Stream-Snapshot-Part` and `Stream-Incarnation`). The body is streamed to a file and never
/// held whole; over the store's snapshot limit it is 413.
pub(crate) async fn stage(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    // The offset is checked and otherwise unused (see the module's docs).
    let (_, expect) = route_target(offset, &parts.headers)?;
    let guard = Guard::from(expect);
    let limit = app.store.options().max_snapshot_bytes();
    let store = app.store.clone();
    // The tenant the part counts to: the root of the token's grant on the stream, else (no
    // access control, or a grant on every stream) the name's first segment.
    let tenant = parts
        .extensions
        .get::<super::auth::Grants>()
        .and_then(|g| g.tenant_of(name.as_str()))
        .unwrap_or_else(|| crate::engine::parts::default_tenant(&name))
        .to_owned();
    let part = pump_to_store(app, parts, body, limit, Op::Snapshot, move |reader| {
        store.stage_snapshot_part_for(&name, &tenant, reader, &guard)
    })
    .await?;
    Ok(Reply::new(StatusCode::CREATED)
        .header(STREAM_SNAPSHOT_PART, &part.id)
        .header(STREAM_INCARNATION, part.incarnation.as_str())
        .empty())
}

/// The part ids of a commit body that must list exactly `count`: each a line of 1 to 64
/// visible ASCII characters ended by LF, none twice.
fn manifest(count: usize, body: &[u8]) -> Result<Vec<String>, ApiError> {
    let Some(lines) = body.strip_suffix(b"\n") else {
        return Err(invalid_commit(
            "the commit body must end with LF (one part id per line)",
        ));
    };
    let mut ids = Vec::with_capacity(count.min(MAX_COMMIT_PARTS));
    let mut seen = std::collections::HashSet::new();
    for (i, line) in lines.split(|&b| b == b'\n').enumerate() {
        if ids.len() >= count {
            return Err(invalid_commit(format!(
                "the commit body lists more than the {count} parts Stream-Snapshot-Parts declares"
            )));
        }
        let id = std::str::from_utf8(line)
            .ok()
            .filter(|id| {
                !id.is_empty()
                    && id.len() <= PART_ID_MAX_BYTES
                    && id.bytes().all(|b| (0x21..=0x7e).contains(&b))
            })
            .ok_or_else(|| invalid_commit(format!("line {} is not a part id", i + 1)))?;
        if !seen.insert(id) {
            return Err(invalid_commit(format!(
                "line {} repeats an earlier part",
                i + 1
            )));
        }
        ids.push(id.to_owned());
    }
    if ids.len() != count {
        return Err(invalid_commit(format!(
            "the commit body lists {} parts, Stream-Snapshot-Parts declares {count}",
            ids.len()
        )));
    }
    Ok(ids)
}

/// PUT `{s}/snapshot/{offset}` with `Stream-Snapshot-Parts`: publishes the listed parts, in
/// order, as the snapshot at `offset`, answering as a publish does (204 with the snapshot's
/// offset and digest, the stream's tail and incarnation).
pub(crate) async fn commit(
    app: &AppState,
    name: StreamName,
    offset: &str,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let h = &parts.headers;
    let (offset, expect) = route_target(offset, h)?;
    let count = text(h, STREAM_SNAPSHOT_PARTS)
        .and_then(|v| crate::headers::parse_canonical_u64(v.trim().as_bytes()))
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_COMMIT_PARTS).contains(n))
        .ok_or_else(|| {
            invalid_commit(format!(
                "Stream-Snapshot-Parts must be a number of parts from 1 to {MAX_COMMIT_PARTS}"
            ))
        })?;
    let digest = text(h, STREAM_SNAPSHOT_DIGEST)
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            invalid_commit("a parts commit needs Stream-Snapshot-Digest, the assembled snapshot's")
        })?;
    let content_type = match text(h, axum::http::header::CONTENT_TYPE)
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(ct) => Some(normalize_content_type(ct).map_err(|e| ApiError::Store(e, Op::Snapshot))?),
    };
    let declared = http_body::Body::size_hint(&body).exact();
    let held = super::body::read_body(
        body,
        declared,
        MAX_MANIFEST_BYTES,
        &app.body_rules_for(parts, declared),
    )
    .await
    .map_err(|e| {
        if e.code() == "PAYLOAD_TOO_LARGE" {
            invalid_commit(format!(
                "a commit body is at most {MAX_MANIFEST_BYTES} bytes"
            ))
        } else {
            e
        }
    })?;
    let ids = manifest(count, &held.bytes)?;
    drop(held);
    let store = app.store.clone();
    let published = blocking(Op::Snapshot, move || {
        let req = PublishParts {
            offset,
            content_type,
            parts: ids,
            digest,
            expect,
        };
        store.publish_snapshot_parts(&name, &req)
    })
    .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .offset(STREAM_NEXT_OFFSET, published.stream.tail)
        .offset(STREAM_SNAPSHOT_OFFSET, published.snapshot.offset)
        .header(STREAM_SNAPSHOT_DIGEST, &published.snapshot.digest)
        .header(STREAM_INCARNATION, published.stream.incarnation.as_str())
        .empty())
}

/// DELETE `{s}/snapshot/parts`: discards the stream's unused parts (204 with
/// `Stream-Incarnation`).
pub(crate) async fn discard(
    app: &AppState,
    name: StreamName,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let incarnation = app
        .blocking_on_stream(name, &parts.headers, Op::Snapshot, |store, name, expect| {
            store.discard_snapshot_parts(name, &Guard::from(expect.cloned()))
        })
        .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT)
        .header(STREAM_INCARNATION, incarnation.as_str())
        .empty())
}

#[cfg(test)]
mod tests {
    use super::manifest;

    #[test]
    fn manifests_list_distinct_ids_one_per_line() {
        assert_eq!(manifest(2, b"a\nb\n").unwrap(), ["a", "b"]);
        for (count, bad) in [
            (2, &b"a\nb"[..]),
            (2, b"a\na\n"),
            (1, b"a\nb\n"),
            (3, b"a\nb\n"),
            (1, b"\n"),
            (1, b"a b\n"),
            (1, b"a\r\n"),
        ] {
            let e = manifest(count, bad).unwrap_err();
            assert_eq!(e.code(), "INVALID_PARTS_COMMIT", "{bad:?}");
        }
    }
}
