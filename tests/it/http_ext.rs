//! Snapshots, retention and bootstrap over a real socket (issue 5): every status and header of
//! the routes, reserved names, disk reclaimed by retention, and a bootstrap (and snapshot) far
//! larger than the server's memory use.

use std::fmt::Write as _;
use std::time::Duration;

use brook::Options;
use futures_util::StreamExt;
use sha2::Digest;

use crate::http_support::{ChildServer, R, Resp, Server, config, disk_usage};

const TEXT: (&str, &str) = ("content-type", "text/plain");
const JSON: (&str, &str) = ("content-type", "application/json");
const STATE: (&str, &str) = ("content-type", "application/x-state");
const ZERO: &str = "0000000000000000_0000000000000000";
const FAR: &str = "9999999999999999_9999999999999999";

/// A JSON stream with three messages; returns the offsets after each.
async fn three_messages(s: &Server, p: &str) -> R<[String; 3]> {
    s.create(p, "application/json").await?;
    let mut after = Vec::new();
    for n in 1..=3 {
        let r = s.post(p, &[JSON], &format!(r#"{{"n":{n}}}"#)).await?;
        assert_eq!(r.status, 204);
        after.push(r.need("stream-next-offset")?.to_owned());
    }
    Ok([after[0].clone(), after[1].clone(), after[2].clone()])
}

fn digest_of(content_type: &str, blob: &[u8]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(content_type.as_bytes());
    h.update([0u8]);
    h.update(blob);
    h.finalize()
        .iter()
        .fold(String::from("sha256:"), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

// --- publish ----------------------------------------------------------------------------------

/// PUT `{s}/snapshot/{offset}`: 204 with the digest, offset, tail and incarnation; immutable per
/// offset (same body and type: same digest; anything else: 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_is_idempotent_per_offset_and_conflicts_otherwise() -> R {
    let s = Server::start().await?;
    let p = "/snap/publish";
    let [a1, _, a3] = three_messages(&s, p).await?;
    let url = format!("{p}/snapshot/{a1}");
    let r = s.put(&url, &[STATE], "STATE-1").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let digest = r.need("stream-snapshot-digest")?.to_owned();
    assert_eq!(digest, digest_of("application/x-state", b"STATE-1"));
    assert_eq!(r.h("stream-snapshot-offset"), Some(a1.as_str()));
    assert_eq!(r.h("stream-next-offset"), Some(a3.as_str()));
    assert!(r.h("stream-incarnation").is_some());
    // Again: idempotent, same digest.
    let r = s.put(&url, &[STATE], "STATE-1").await?;
    assert_eq!(
        (r.status, r.h("stream-snapshot-digest")),
        (204, Some(digest.as_str()))
    );
    // Other content, or the same bytes with another type: 409.
    s.put(&url, &[STATE], "STATE-2")
        .await?
        .refused(409, "SNAPSHOT_CONFLICT");
    s.put(&url, &[("content-type", "application/x-other")], "STATE-1")
        .await?
        .refused(409, "SNAPSHOT_CONFLICT");
    assert_eq!(s.get(&url, &[]).await?.text(), "STATE-1");
    Ok(())
}

/// Without a Content-Type the blob is `application/octet-stream`; with one, it keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_has_its_own_content_type() -> R {
    let s = Server::start().await?;
    let p = "/snap/types";
    let [a1, a2, _] = three_messages(&s, p).await?;
    let r = s
        .send(
            "PUT",
            &format!("{p}/snapshot/{a1}"),
            &[],
            b"\x00\x01raw".to_vec(),
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s.get(&format!("{p}/snapshot/{a1}"), &[]).await?;
    assert_eq!(r.h("content-type"), Some("application/octet-stream"));
    assert_eq!(&r.body[..], b"\x00\x01raw");
    s.put(
        &format!("{p}/snapshot/{a2}"),
        &[("content-type", "text/csv; charset=utf-8")],
        "a,b",
    )
    .await?;
    let r = s.get(&format!("{p}/snapshot/{a2}"), &[]).await?;
    assert_eq!(r.h("content-type"), Some("text/csv;charset=utf-8"));
    Ok(())
}

/// Offsets past the tail, not on a message boundary, older than the latest snapshot or below
/// retention are refused, each with its own code; nothing is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_snapshot_offsets_are_refused_with_clear_codes() -> R {
    let s = Server::start().await?;
    let p = "/snap/offsets";
    let [a1, a2, a3] = three_messages(&s, p).await?;
    s.put(&format!("{p}/snapshot/{FAR}"), &[STATE], "x")
        .await?
        .refused(409, "OFFSET_BEYOND_TAIL");
    s.put(&format!("{p}/snapshot/garbage"), &[STATE], "x")
        .await?
        .refused(400, "INVALID_OFFSET");
    // Inside the first message: one byte after the start.
    let inside = "0000000000000000_0000000000000001";
    s.put(&format!("{p}/snapshot/{inside}"), &[STATE], "x")
        .await?
        .refused(400, "OFFSET_NOT_ON_BOUNDARY");
    // Inside a byte stream's append too.
    s.create("/snap/offsets-bytes", "text/plain").await?;
    s.post("/snap/offsets-bytes", &[TEXT], "abcdef").await?;
    let r = s
        .put(
            &format!(
                "/snap/offsets-bytes/snapshot/{}",
                "0000000000000000_0000000000000003"
            ),
            &[STATE],
            "x",
        )
        .await?;
    r.refused(400, "OFFSET_NOT_ON_BOUNDARY");
    // Older than the latest.
    assert_eq!(
        s.put(&format!("{p}/snapshot/{a2}"), &[STATE], "two")
            .await?
            .status,
        204
    );
    s.put(&format!("{p}/snapshot/{a1}"), &[STATE], "one")
        .await?
        .refused(409, "SNAPSHOT_STALE");
    // Below retention.
    assert_eq!(
        s.put(&format!("{p}/retention/{a2}"), &[], "").await?.status,
        204
    );
    s.put(&format!("{p}/snapshot/{a1}"), &[STATE], "one")
        .await?
        .refused(410, "OFFSET_GONE");
    s.put(&format!("{p}/snapshot/{ZERO}"), &[STATE], "zero")
        .await?
        .refused(410, "OFFSET_GONE");
    // The tail itself is a boundary.
    assert_eq!(
        s.put(&format!("{p}/snapshot/{a3}"), &[STATE], "three")
            .await?
            .status,
        204
    );
    assert_eq!(
        s.head(p, &[]).await?.h("stream-snapshot-offset"),
        Some(a3.as_str())
    );
    Ok(())
}

/// `Stream-Snapshot-Match` publishes only if the latest snapshot's digest is the one named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_snapshot_match_guards_a_publish() -> R {
    let s = Server::start().await?;
    let p = "/snap/match";
    let [a1, a2, a3] = three_messages(&s, p).await?;
    // No snapshot yet: any expected digest fails.
    let r = s
        .put(
            &format!("{p}/snapshot/{a1}"),
            &[STATE, ("stream-snapshot-match", "sha256:00")],
            "one",
        )
        .await?;
    r.refused(409, "SNAPSHOT_MATCH_FAILED");
    let r = s
        .put(&format!("{p}/snapshot/{a1}"), &[STATE], "one")
        .await?;
    let d1 = r.need("stream-snapshot-digest")?.to_owned();
    let r = s
        .put(
            &format!("{p}/snapshot/{a2}"),
            &[STATE, ("stream-snapshot-match", "sha256:00")],
            "two",
        )
        .await?;
    r.refused(409, "SNAPSHOT_MATCH_FAILED");
    assert_eq!(
        r.h("stream-snapshot-digest"),
        Some(d1.as_str()),
        "the 409 names the current digest"
    );
    let r = s
        .put(
            &format!("{p}/snapshot/{a2}"),
            &[STATE, ("stream-snapshot-match", d1.as_str())],
            "two",
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let d2 = r.need("stream-snapshot-digest")?.to_owned();
    // The earlier digest no longer matches.
    let r = s
        .put(
            &format!("{p}/snapshot/{a3}"),
            &[STATE, ("stream-snapshot-match", d1.as_str())],
            "three",
        )
        .await?;
    r.refused(409, "SNAPSHOT_MATCH_FAILED");
    assert_eq!(
        s.get(&format!("{p}/snapshot"), &[])
            .await?
            .h("stream-snapshot-digest"),
        Some(d2.as_str())
    );
    Ok(())
}

/// A body over the snapshot limit is 413, declared or streamed, and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_bodies_over_the_limit_are_413() -> R {
    let s = Server::start_with(
        Options::default().with_max_snapshot_bytes(1 << 20),
        config(),
    )
    .await?;
    let p = "/snap/limit";
    s.create(p, "text/plain").await?;
    s.post(p, &[TEXT], "abc").await?;
    let tail = s.tail(p).await?;
    let url = format!("{p}/snapshot/{tail}");
    let r = s.send("PUT", &url, &[], vec![b'x'; (1 << 20) + 1]).await?;
    r.refused(413, "PAYLOAD_TOO_LARGE");
    // Streamed without a Content-Length.
    let chunks =
        futures_util::stream::iter((0..5).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 256 << 10])));
    let r = s
        .send("PUT", &url, &[], reqwest::Body::wrap_stream(chunks))
        .await?;
    r.refused(413, "PAYLOAD_TOO_LARGE");
    s.get(&format!("{p}/snapshot"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    // Exactly the limit is fine.
    let r = s.send("PUT", &url, &[], vec![b'z'; 1 << 20]).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    Ok(())
}

// --- read and delete --------------------------------------------------------------------------

/// GET `{s}/snapshot` answers the latest blob itself (404 when there is none) and
/// GET `{s}/snapshot/{offset}` the one at that offset, each with its content type,
/// Stream-Snapshot-Offset, Stream-Snapshot-Digest and the stream's Stream-Next-Offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_read_latest_or_by_offset() -> R {
    let s = Server::start().await?;
    let p = "/snap/read";
    let [a1, a2, a3] = three_messages(&s, p).await?;
    s.get(&format!("{p}/snapshot"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    s.get(&format!("{p}/snapshot/{a1}"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    s.get("/snap/missing/snapshot", &[])
        .await?
        .refused(404, "STREAM_NOT_FOUND");
    s.put(&format!("{p}/snapshot/{a1}"), &[STATE], "ONE")
        .await?;
    s.put(
        &format!("{p}/snapshot/{a2}"),
        &[("content-type", "application/json")],
        r#"{"count":2}"#,
    )
    .await?;

    let check = |r: &Resp, body: &str, ct: &str, at: &str| {
        assert_eq!((r.status, r.text().as_str()), (200, body));
        assert_eq!(r.h("content-type"), Some(ct));
        assert_eq!(r.h("stream-snapshot-offset"), Some(at));
        assert_eq!(
            r.h("stream-snapshot-digest").map(str::to_owned),
            Some(digest_of(ct, body.as_bytes()))
        );
        assert_eq!(r.h("stream-next-offset"), Some(a3.as_str()));
        assert!(r.h("stream-incarnation").is_some());
    };
    let latest = s.get(&format!("{p}/snapshot"), &[]).await?;
    check(&latest, r#"{"count":2}"#, "application/json", &a2);
    assert!(
        latest.h("location").is_none(),
        "the blob itself, not a redirect"
    );
    check(
        &s.get(&format!("{p}/snapshot/{a2}"), &[]).await?,
        r#"{"count":2}"#,
        "application/json",
        &a2,
    );
    check(
        &s.get(&format!("{p}/snapshot/{a1}"), &[]).await?,
        "ONE",
        "application/x-state",
        &a1,
    );
    // Conditional reads.
    let tag = latest.need("etag")?.to_owned();
    let r = s
        .get(&format!("{p}/snapshot"), &[("if-none-match", tag.as_str())])
        .await?;
    assert_eq!((r.status, r.body.len()), (304, 0));
    Ok(())
}

/// DELETE `{s}/snapshot/{offset}` is always refused: 409 for the latest, 404 otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_deletes_are_always_refused() -> R {
    let s = Server::start().await?;
    let p = "/snap/delete";
    let [a1, a2, _] = three_messages(&s, p).await?;
    s.delete(&format!("{p}/snapshot/{a1}"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    s.put(&format!("{p}/snapshot/{a1}"), &[STATE], "ONE")
        .await?;
    s.put(&format!("{p}/snapshot/{a2}"), &[STATE], "TWO")
        .await?;
    s.delete(&format!("{p}/snapshot/{a2}"), &[])
        .await?
        .refused(409, "SNAPSHOT_DELETE_REFUSED");
    s.delete(&format!("{p}/snapshot/{a1}"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    s.delete(&format!("{p}/snapshot/{ZERO}"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    s.delete(&format!("/snap/nope/snapshot/{ZERO}"), &[])
        .await?
        .refused(404, "STREAM_NOT_FOUND");
    assert_eq!(
        s.get(&format!("{p}/snapshot/{a2}"), &[]).await?.text(),
        "TWO"
    );
    assert_eq!(
        s.get(&format!("{p}/snapshot/{a1}"), &[]).await?.text(),
        "ONE"
    );
    Ok(())
}

/// HEAD reports Stream-Snapshot-Offset (and the digest) once a snapshot exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_reports_the_latest_snapshot() -> R {
    let s = Server::start().await?;
    let p = "/snap/head";
    let [a1, _, _] = three_messages(&s, p).await?;
    let h = s.head(p, &[]).await?;
    assert_eq!(
        (h.h("stream-snapshot-offset"), h.h("stream-snapshot-digest")),
        (None, None)
    );
    let r = s
        .put(&format!("{p}/snapshot/{a1}"), &[STATE], "ONE")
        .await?;
    let h = s.head(p, &[]).await?;
    assert_eq!(h.h("stream-snapshot-offset"), Some(a1.as_str()));
    assert_eq!(h.h("stream-snapshot-digest"), r.h("stream-snapshot-digest"));
    Ok(())
}

// --- retention ------------------------------------------------------------------------------

/// PUT `{s}/retention/{offset}` advances the earliest offset to a published snapshot's offset or
/// older; reads below it answer 410 with the earliest offset, and `offset=-1` answers 410 once
/// anything was trimmed (the seed), in every read mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_reads_below_it_and_the_start() -> R {
    let s = Server::start().await?;
    let p = "/ret/reads";
    let [a1, a2, a3] = three_messages(&s, p).await?;
    // Without a snapshot, or beyond the latest one: refused.
    s.put(&format!("{p}/retention/{a1}"), &[], "")
        .await?
        .refused(409, "RETENTION_BEYOND_SNAPSHOT");
    s.put(&format!("{p}/snapshot/{a2}"), &[STATE], "TWO")
        .await?;
    s.put(&format!("{p}/retention/{a3}"), &[], "")
        .await?
        .refused(409, "RETENTION_BEYOND_SNAPSHOT");
    let r = s.put(&format!("{p}/retention/{FAR}"), &[], "").await?;
    assert!(matches!(r.status, 400 | 409), "{}: {}", r.status, r.text());
    s.put(&format!("{p}/retention/garbage"), &[], "")
        .await?
        .refused(400, "INVALID_OFFSET");
    // `offset=-1` reads from the start while nothing is trimmed.
    assert_eq!(s.get(&format!("{p}?offset=-1"), &[]).await?.status, 200);
    // To an offset older than the snapshot.
    let r = s.put(&format!("{p}/retention/{a1}"), &[], "").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h("stream-earliest-offset"), Some(a1.as_str()));
    assert!(r.h("stream-incarnation").is_some());
    for read in [
        format!("{p}?offset={ZERO}"),
        format!("{p}?offset=-1"),
        format!("{p}?offset=-1&live=long-poll"),
        format!("{p}?offset=-1&live=sse"),
        format!("{p}?offset={ZERO}&live=sse"),
    ] {
        let r = s.get(&read, &[]).await?;
        r.refused(410, "OFFSET_GONE");
        assert_eq!(r.h("stream-earliest-offset"), Some(a1.as_str()), "{read}");
    }
    // From the earliest offset on, reads work.
    let r = s.get(&format!("{p}?offset={a1}"), &[]).await?;
    assert_eq!(r.text(), r#"[{"n":2},{"n":3}]"#);
    // Up to the snapshot; idempotent; never backwards.
    assert_eq!(
        s.put(&format!("{p}/retention/{a2}"), &[], "").await?.status,
        204
    );
    let r = s.put(&format!("{p}/retention/{a1}"), &[], "").await?;
    assert_eq!(
        (r.status, r.h("stream-earliest-offset")),
        (204, Some(a2.as_str()))
    );
    let h = s.head(p, &[]).await?;
    assert_eq!(h.h("stream-earliest-offset"), Some(a2.as_str()));
    s.get(&format!("{p}?offset={a1}"), &[])
        .await?
        .refused(410, "OFFSET_GONE");
    // The snapshot stays readable, and bootstrap starts from it.
    assert_eq!(s.get(&format!("{p}/snapshot"), &[]).await?.text(), "TWO");
    let b = s.get(&format!("{p}/bootstrap"), &[]).await?;
    assert_eq!(b.status, 200);
    assert!(
        b.text().contains("TWO")
            && b.text().contains(r#"{"n":3}"#)
            && !b.text().contains(r#"{"n":2}"#)
    );
    Ok(())
}

/// Retention reclaims disk space: with small segments, the data directory shrinks once the
/// start is trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_reclaims_disk_space() -> R {
    let options = Options::default()
        .with_segment_bytes(64 << 10)
        .with_checkpoint_bytes(256 << 10);
    let s = Server::start_with(options, config()).await?;
    let p = "/ret/disk";
    s.create(p, "application/octet-stream").await?;
    let chunk = vec![b'x'; 32 << 10];
    for _ in 0..256 {
        let r = s
            .send(
                "POST",
                p,
                &[("content-type", b"application/octet-stream")],
                chunk.clone(),
            )
            .await?;
        assert_eq!(r.status, 204);
    }
    let tail = s.tail(p).await?;
    s.store.checkpoint()?;
    let before = disk_usage(s.dir.path())?;
    assert!(before >= 8 << 20, "8 MiB written, {before} bytes on disk");
    let r = s
        .put(&format!("{p}/snapshot/{tail}"), &[STATE], "all of it")
        .await?;
    assert_eq!(r.status, 204);
    let r = s.put(&format!("{p}/retention/{tail}"), &[], "").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    // Segments are removed once the retention record is applied; a checkpoint applies it.
    let mut after = before;
    for _ in 0..50 {
        s.store.checkpoint()?;
        after = disk_usage(s.dir.path())?;
        if after < before / 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        after < before / 4,
        "retention reclaimed {before} -> {after} bytes"
    );
    // The stream goes on.
    assert_eq!(
        s.post(p, &[("content-type", "application/octet-stream")], "more")
            .await?
            .status,
        204
    );
    assert_eq!(
        s.get(&format!("{p}?offset={tail}"), &[]).await?.text(),
        "more"
    );
    Ok(())
}

// --- bootstrap ------------------------------------------------------------------------------

/// One part of a multipart body.
struct Part {
    content_type: String,
    body: Vec<u8>,
}

fn multipart(r: &Resp) -> R<Vec<Part>> {
    let ct = r.need("content-type")?;
    let boundary = ct
        .strip_prefix("multipart/mixed; boundary=")
        .ok_or("not multipart/mixed")?;
    let delim = format!("--{boundary}");
    let body = &r.body[..];
    let text = body;
    let mut parts = Vec::new();
    let mut pos = find(text, delim.as_bytes(), 0).ok_or("no first boundary")?;
    loop {
        let after = pos + delim.len();
        if text[after..].starts_with(b"--") {
            return Ok(parts);
        }
        let head_start = after + 2; // CRLF
        let head_end = find(text, b"\r\n\r\n", head_start).ok_or("part without headers")?;
        let head = std::str::from_utf8(&text[head_start..head_end])?;
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Type: "))
            .ok_or("part without Content-Type")?
            .to_owned();
        let next = find(text, format!("\r\n{delim}").as_bytes(), head_end + 4)
            .ok_or("unterminated part")?;
        parts.push(Part {
            content_type,
            body: text[head_end + 4..next].to_vec(),
        });
        pos = next + 2;
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// GET `{s}/bootstrap`: `multipart/mixed`, the latest snapshot first (an empty part when there
/// is none), then each message after it in the stream's content type; headers give the
/// snapshot offset, Stream-Next-Offset, Stream-Up-To-Date and Stream-Closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_answers_the_snapshot_then_the_messages_after_it() -> R {
    let s = Server::start().await?;
    let p = "/boot/parts";
    let [a1, _, a3] = three_messages(&s, p).await?;
    // No snapshot: an empty first part, then every message.
    let r = s.get(&format!("{p}/bootstrap"), &[]).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("stream-snapshot-offset"), Some("-1"));
    assert_eq!(r.h("stream-next-offset"), Some(a3.as_str()));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    assert_eq!(r.h("stream-closed"), None);
    assert!(r.h("stream-incarnation").is_some());
    let parts = multipart(&r)?;
    assert_eq!(parts.len(), 4);
    assert!(parts[0].body.is_empty());
    let bodies: Vec<&[u8]> = parts[1..].iter().map(|p| &p.body[..]).collect();
    assert_eq!(bodies, [&br#"{"n":1}"#[..], br#"{"n":2}"#, br#"{"n":3}"#]);
    assert!(
        parts[1..]
            .iter()
            .all(|p| p.content_type == "application/json")
    );

    // With a snapshot: the snapshot in its own type, then the messages after it.
    s.put(&format!("{p}/snapshot/{a1}"), &[STATE], "STATE@1")
        .await?;
    s.post(p, &[("stream-closed", "true")], "").await?;
    let r = s.get(&format!("{p}/bootstrap"), &[]).await?;
    assert_eq!(r.h("stream-snapshot-offset"), Some(a1.as_str()));
    assert_eq!(r.h("stream-closed"), Some("true"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    let parts = multipart(&r)?;
    assert_eq!(parts.len(), 3);
    assert_eq!(
        (parts[0].content_type.as_str(), &parts[0].body[..]),
        ("application/x-state", &b"STATE@1"[..])
    );
    assert_eq!(&parts[1].body[..], br#"{"n":2}"#);
    assert_eq!(&parts[2].body[..], br#"{"n":3}"#);
    // A snapshot at the tail: nothing after it.
    s.create("/boot/at-tail", "text/plain").await?;
    s.post("/boot/at-tail", &[TEXT], "abc").await?;
    let tail = s.tail("/boot/at-tail").await?;
    s.put(&format!("/boot/at-tail/snapshot/{tail}"), &[STATE], "S")
        .await?;
    let parts = multipart(&s.get("/boot/at-tail/bootstrap", &[]).await?)?;
    assert_eq!(parts.len(), 1);
    s.get("/boot/none/bootstrap", &[])
        .await?
        .refused(404, "STREAM_NOT_FOUND");
    Ok(())
}

/// "Any `live` parameter answers 400."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_refuses_any_live_parameter() -> R {
    let s = Server::start().await?;
    s.create("/boot/live", "text/plain").await?;
    for q in ["live=sse", "live=long-poll", "live=true", "live=", "live"] {
        let r = s.get(&format!("/boot/live/bootstrap?{q}"), &[]).await?;
        assert_eq!(r.status, 400, "{q}");
        assert_eq!(r.h("content-type"), Some("application/problem+json"));
    }
    Ok(())
}

/// The shapes of the extension routes are reserved: a stream whose name would collide with
/// them cannot be created; names that merely contain the words can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_names_are_refused_on_create() -> R {
    let s = Server::start().await?;
    s.create("/res/x", "text/plain").await?;
    for path in [
        "/res/x/snapshot",
        "/res/x/bootstrap",
        "/res/snapshot",
        "/bootstrap",
        "/snapshot",
    ] {
        let r = s.put(path, &[TEXT], "").await?;
        r.refused(400, "INVALID_STREAM_NAME");
        let r = s.post(path, &[TEXT], "x").await?;
        r.refused(400, "INVALID_STREAM_NAME");
    }
    for path in [
        "/res/x/retention",
        "/res/x/snapshot/name",
        "/res/x/retention/name",
    ] {
        let r = s.put(path, &[TEXT], "").await?;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    for ok in [
        "/res/snapshots",
        "/res/my-bootstrap/x",
        "/res/snapshot-1",
        "/res/retention-policy/x",
    ] {
        assert_eq!(s.put(ok, &[TEXT], "").await?.status, 201, "{ok}");
    }
    assert_eq!(
        s.get("/res/x/bootstrap", &[]).await?.status,
        200,
        "the route itself still works"
    );
    Ok(())
}

// --- large bodies: streamed, never held whole ----------------------------------------------

/// A bootstrap of a 64 MiB stream (and a 128 MiB snapshot publish and read) streams: the
/// `brook serve` process's anonymous memory grows by far less than the data it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bootstraps_and_snapshots_stream_through_bounded_memory() -> R {
    const MIB: usize = 1 << 20;
    let server = ChildServer::start(&["--max-read-bytes", "4194304"])?;
    let c = &server.client;
    let p = "/big/stream";
    let r = c
        .put(server.url(p))
        .header("content-type", "application/octet-stream")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 201);
    // 64 MiB in 1 MiB appends, each a recognisable pattern.
    for i in 0..64u8 {
        let r = c
            .post(server.url(p))
            .header("content-type", "application/octet-stream")
            .body(vec![i; MIB])
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 204);
    }
    let tail = c.head(server.url(p)).send().await?;
    let tail = tail
        .headers()
        .get("stream-next-offset")
        .ok_or("tail")?
        .to_str()?
        .to_owned();
    let baseline = server.rss_anon()?;

    // Bootstrap, read as a stream; sample the server's memory as it goes.
    let res = c.get(server.url(&format!("{p}/bootstrap"))).send().await?;
    assert_eq!(res.status().as_u16(), 200);
    assert!(
        res.content_length().is_none(),
        "streamed, not sized up front"
    );
    let mut body = res.bytes_stream();
    let (mut received, mut peak, mut next_sample) = (0usize, baseline, 0usize);
    let mut hasher = sha2::Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        received += chunk.len();
        hasher.update(&chunk);
        if received >= next_sample {
            peak = peak.max(server.rss_anon()?);
            next_sample += 2 * MIB;
        }
    }
    assert!(received > 64 * MIB, "{received} bytes");
    let grew = peak.saturating_sub(baseline);
    eprintln!(
        "server anonymous memory grew by {} KiB during the bootstrap of 64 MiB",
        grew >> 10
    );
    assert!(
        grew < 32 * MIB as u64,
        "bootstrap of 64 MiB grew the server's anonymous memory by {grew} bytes"
    );

    // A 128 MiB snapshot, streamed in and out.
    let url = server.url(&format!("{p}/snapshot/{tail}"));
    let before = server.rss_anon()?;
    let chunks = futures_util::stream::iter(
        (0..128u32).map(|i| Ok::<_, std::io::Error>(vec![(i % 251) as u8; MIB])),
    );
    let upload = tokio::spawn(
        c.put(&url)
            .header("content-type", "application/x-state")
            .body(reqwest::Body::wrap_stream(chunks))
            .send(),
    );
    let mut peak = before;
    let started = std::time::Instant::now();
    while !upload.is_finished() {
        peak = peak.max(server.rss_anon()?);
        assert!(
            started.elapsed() < Duration::from_mins(1),
            "the 128 MiB upload took over a minute"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let res = upload.await??;
    assert_eq!(res.status().as_u16(), 204, "{}", res.text().await?);
    let grew = peak.saturating_sub(before);
    eprintln!(
        "server anonymous memory grew by {} KiB during the upload of a 128 MiB snapshot",
        grew >> 10
    );
    assert!(
        grew < 32 * MIB as u64,
        "a 128 MiB snapshot upload grew the server's anonymous memory by {grew} bytes"
    );
    let after_upload = server.rss_anon()?;
    // Read back (latest), streamed; sampled.
    let res = c.get(server.url(&format!("{p}/snapshot"))).send().await?;
    assert_eq!(res.status().as_u16(), 200);
    let mut body = res.bytes_stream();
    let (mut received, mut peak, mut next_sample) = (0usize, after_upload, 0usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        received += chunk.len();
        if received >= next_sample {
            peak = peak.max(server.rss_anon()?);
            next_sample += 4 * MIB;
        }
    }
    assert_eq!(received, 128 * MIB);
    let grew = peak.saturating_sub(after_upload);
    eprintln!(
        "server anonymous memory grew by {} KiB during the read of a 128 MiB snapshot",
        grew >> 10
    );
    assert!(
        grew < 32 * MIB as u64,
        "reading a 128 MiB snapshot grew anonymous memory by {grew} bytes"
    );
    // One byte more than 128 MiB is refused.
    let chunks = futures_util::stream::iter(
        (0..=128u32)
            .map(|i| Ok::<_, std::io::Error>(if i == 128 { vec![1u8] } else { vec![0u8; MIB] })),
    );
    let url = server.url(&format!("{p}/snapshot/{tail}"));
    let res = c
        .put(url)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The server may answer 413 before the client finished sending (and close the connection).
    if let Ok(res) = res {
        assert_eq!(res.status().as_u16(), 413);
    }
    Ok(())
}
