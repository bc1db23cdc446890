//! Ursula 0.11's read and snapshot surface over a real socket (issue 34): the immutable
//! incarnation reads (`{s}/incarnation/{token}/chunk/{offset}` and `.../snapshot/{offset}`),
//! `Range` on snapshot reads, and snapshots uploaded in parts, with access control over them.

use std::fmt::Write as _;
use std::sync::Arc;

use brook::http::{AccessControl, ServerConfig};
use brook::{Error, Guard, Options, PublishParts, StagedLimit, Store, StreamName};
use sha2::Digest;

use crate::http_support::{self, R, Server, config};

const BYTES: (&str, &str) = ("content-type", "application/octet-stream");
const STATE: (&str, &str) = ("content-type", "application/x-state");
const FAR: &str = "9999999999999999_9999999999999999";
const ZERO: &str = "0000000000000000_0000000000000000";
const FOREVER: &str = "public, max-age=31536000, immutable";

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

/// A byte stream at `p` holding `body`; returns its incarnation and tail.
async fn stream_with(s: &Server, p: &str, body: &[u8]) -> R<(String, String)> {
    let token = s.create(p, "application/octet-stream").await?;
    let r = s
        .send(
            "POST",
            p,
            &http_support::bytes_headers(&[BYTES]),
            body.to_vec(),
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    Ok((token, r.need("stream-next-offset")?.to_owned()))
}

// --- immutable chunks -------------------------------------------------------------------------

/// A chunk that ends below the tail reaches the end of its 4 MiB chunk, is marked
/// `Stream-Immutable` and cached for a year; the chunk that reaches an open tail carries no
/// marker and `no-store` (its URL answers more once the stream grows); once the stream is
/// closed the same URL is final, marked with `Stream-Closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_below_the_tail_are_immutable_and_the_open_tail_is_not() -> R {
    let s = Server::start().await?;
    let p = "/imm/chunks";
    let data: Vec<u8> = (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect();
    let (token, tail) = stream_with(&s, p, &data).await?;

    let first = s
        .get(&format!("{p}/incarnation/{token}/chunk/{ZERO}"), &[])
        .await?;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.body.len(), 4 << 20);
    assert_eq!(&first.body[..], &data[..4 << 20]);
    assert_eq!(first.h("stream-immutable"), Some("true"));
    assert_eq!(first.h("cache-control"), Some(FOREVER));
    assert_eq!(first.h("stream-offset"), Some(ZERO));
    assert_eq!(first.h("stream-incarnation"), Some(token.as_str()));
    assert_eq!(first.h("stream-closed"), None);
    let next = first.need("stream-next-offset")?.to_owned();
    assert!(next.ends_with(&format!("{:016}", 4u64 << 20)), "{next}");

    // The rest reaches the open tail: unmarked and never stored.
    let url = format!("{p}/incarnation/{token}/chunk/{next}");
    let rest = s.get(&url, &[]).await?;
    assert_eq!(rest.status, 200);
    assert_eq!(&rest.body[..], &data[4 << 20..]);
    assert_eq!(rest.h("stream-immutable"), None);
    assert_eq!(rest.h("cache-control"), Some("no-store"));
    assert_eq!(rest.h("stream-next-offset"), Some(tail.as_str()));

    // A revalidation of the marked chunk is a 304 with the same caching.
    let etag = first.need("etag")?.to_owned();
    let again = s
        .get(
            &format!("{p}/incarnation/{token}/chunk/{ZERO}"),
            &[("if-none-match", &etag)],
        )
        .await?;
    assert_eq!(again.status, 304);
    assert_eq!(again.h("cache-control"), Some(FOREVER));
    assert_eq!(again.h("stream-immutable"), Some("true"));

    // Closed: the tail chunk is final now.
    let r = s.post(p, &[BYTES, ("stream-closed", "true")], "").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let closed = s.get(&url, &[]).await?;
    assert_eq!(closed.status, 200);
    assert_eq!(&closed.body[..], &data[4 << 20..]);
    assert_eq!(closed.h("stream-immutable"), Some("true"));
    assert_eq!(closed.h("stream-closed"), Some("true"));
    assert_eq!(closed.h("cache-control"), Some(FOREVER));
    Ok(())
}

/// The path's token is the read's precondition: another incarnation's token answers 412 with
/// the current one, but a read that would answer 404, 410 or 416 without it still does. The
/// request's own `Stream-Incarnation` header has no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_incarnation_is_412_after_404_410_and_416() -> R {
    let s = Server::start().await?;
    let p = "/imm/tokens";
    let (old, _) = stream_with(&s, p, b"first life").await?;
    assert_eq!(s.delete(p, &[]).await?.status, 204);
    let (new, tail) = stream_with(&s, p, b"second life").await?;
    assert_ne!(old, new);

    let r = s
        .get(&format!("{p}/incarnation/{old}/chunk/{ZERO}"), &[])
        .await?;
    r.refused(412, "INCARNATION_MISMATCH");
    assert_eq!(r.h("stream-incarnation"), Some(new.as_str()));

    // Past the tail: 416 whatever the token.
    let r = s
        .get(&format!("{p}/incarnation/{old}/chunk/{FAR}"), &[])
        .await?;
    assert_eq!(r.status, 416, "{}", r.text());
    // No stream: 404.
    let r = s
        .get(&format!("/imm/none/incarnation/{old}/chunk/{ZERO}"), &[])
        .await?;
    r.refused(404, "STREAM_NOT_FOUND");
    // Below the retained start: 410.
    let r = s
        .put(&format!("{p}/snapshot/{tail}"), &[STATE], "S")
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s.put(&format!("{p}/retention/{tail}"), &[], "").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s
        .get(&format!("{p}/incarnation/{old}/chunk/{ZERO}"), &[])
        .await?;
    assert_eq!(r.status, 410, "{}", r.text());

    // The header is ignored: the path names the token.
    let r = s
        .get(
            &format!("{p}/incarnation/{new}/chunk/{tail}"),
            &[("stream-incarnation", &old)],
        )
        .await?;
    assert_eq!(r.status, 200, "{}", r.text());
    Ok(())
}

/// An immutable resource takes no query and only the token and offset forms this server
/// issues, so one resource has one URL; names that would shadow the routes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_paths_refuse_queries_and_forms_the_server_never_issues() -> R {
    let s = Server::start().await?;
    let p = "/imm/forms";
    let (token, _) = stream_with(&s, p, b"abc").await?;
    let base = format!("{p}/incarnation/{token}");
    s.get(&format!("{base}/chunk/{ZERO}?offset=-1"), &[])
        .await?
        .refused(400, "QUERY_NOT_ACCEPTED");
    s.get(&format!("{base}/chunk/0"), &[])
        .await?
        .refused(400, "INVALID_RESOURCE");
    s.get(&format!("{p}/incarnation/%41{token}/chunk/{ZERO}"), &[])
        .await?
        .refused(400, "INVALID_RESOURCE");
    s.get(&format!("{base}/snapshot/{ZERO}?x=1"), &[])
        .await?
        .refused(400, "QUERY_NOT_ACCEPTED");
    let r = s
        .post(&format!("{base}/chunk/{ZERO}"), &[BYTES], "x")
        .await?;
    assert_eq!(r.status, 405);
    assert_eq!(r.h("allow"), Some("GET, HEAD, OPTIONS"));
    // A HEAD answers the GET's headers.
    let r = s.head(&format!("{base}/chunk/{ZERO}"), &[]).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("stream-offset"), Some(ZERO));
    // Names that end like these routes are not streams.
    for name in ["/imm/x/incarnation/t", "/imm/x/snapshot/0/parts"] {
        let r = s.put(name, &[BYTES], "").await?;
        assert!(matches!(r.status, 400 | 405), "{name}: {}", r.status);
    }
    s.put("/imm/x/incarnation/t", &[BYTES], "")
        .await?
        .refused(400, "INVALID_STREAM_NAME");
    Ok(())
}

// --- snapshots: immutable, ranges -------------------------------------------------------------

/// `{s}/incarnation/{token}/snapshot/{offset}` serves the snapshot with only headers that never
/// change (`Stream-Next-Offset` is the snapshot's offset; no `Stream-Up-To-Date`), marked and
/// cached for a year; ranges as on the stream's route, 416 before 412.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_immutable_snapshot_is_marked_and_serves_ranges() -> R {
    let s = Server::start().await?;
    let p = "/imm/snap";
    let (token, at) = stream_with(&s, p, b"0123456789").await?;
    let r = s
        .put(&format!("{p}/snapshot/{at}"), &[STATE], "SNAPSHOT-BODY")
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    s.post(p, &[BYTES], "more").await?;
    let url = format!("{p}/incarnation/{token}/snapshot/{at}");

    let r = s.get(&url, &[]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "SNAPSHOT-BODY");
    assert_eq!(r.h("content-type"), Some("application/x-state"));
    assert_eq!(r.h("stream-immutable"), Some("true"));
    assert_eq!(r.h("cache-control"), Some(FOREVER));
    assert_eq!(r.h("stream-next-offset"), Some(at.as_str()));
    assert_eq!(r.h("stream-snapshot-offset"), Some(at.as_str()));
    assert_eq!(r.h("stream-up-to-date"), None);
    assert_eq!(r.h("accept-ranges"), Some("bytes"));
    let etag = r.need("etag")?.to_owned();
    let r = s.get(&url, &[("if-none-match", &etag)]).await?;
    assert_eq!(r.status, 304);
    assert_eq!(r.h("stream-immutable"), Some("true"));

    let r = s.get(&url, &[("range", "bytes=0-7")]).await?;
    assert_eq!(r.status, 206);
    assert_eq!(r.text(), "SNAPSHOT");
    assert_eq!(r.h("content-range"), Some("bytes 0-7/13"));
    assert_eq!(r.h("stream-immutable"), Some("true"));

    // Another incarnation: 412 with the current token, after a 416 and a 404.
    assert_eq!(s.delete(p, &[]).await?.status, 204);
    let (new, _) = stream_with(&s, p, b"0123456789").await?;
    let r = s
        .put(&format!("{p}/snapshot/{at}"), &[STATE], "OTHER")
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s.get(&url, &[]).await?;
    r.refused(412, "INCARNATION_MISMATCH");
    assert_eq!(r.h("stream-incarnation"), Some(new.as_str()));
    let r = s.get(&url, &[("range", "bytes=99-")]).await?;
    r.refused(416, "RANGE_NOT_SATISFIABLE");
    assert_eq!(r.h("content-range"), Some("bytes */5"));
    assert_eq!(r.h("stream-immutable"), None);
    let r = s
        .get(&format!("{p}/incarnation/{token}/snapshot/{ZERO}"), &[])
        .await?;
    r.refused(404, "SNAPSHOT_NOT_FOUND");
    Ok(())
}

/// `Range` on `{s}/snapshot/{offset}` and `{s}/snapshot`: one range is 206 with
/// `Content-Range`, one that selects nothing 416 with `bytes */len`; several ranges, another
/// unit or `If-Range` get the whole body as 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reads_serve_one_byte_range() -> R {
    let s = Server::start().await?;
    let p = "/ranges/s";
    let (_, at) = stream_with(&s, p, b"data").await?;
    let blob = "abcdefghij";
    let r = s.put(&format!("{p}/snapshot/{at}"), &[STATE], blob).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    for url in [format!("{p}/snapshot/{at}"), format!("{p}/snapshot")] {
        for (range, body, content_range) in [
            ("bytes=2-4", "cde", "bytes 2-4/10"),
            ("bytes=7-", "hij", "bytes 7-9/10"),
            ("bytes=-2", "ij", "bytes 8-9/10"),
            ("bytes=5-99", "fghij", "bytes 5-9/10"),
        ] {
            let r = s.get(&url, &[("range", range)]).await?;
            assert_eq!(r.status, 206, "{url} {range}: {}", r.text());
            assert_eq!(r.text(), body);
            assert_eq!(r.h("content-range"), Some(content_range));
            assert_eq!(r.h("stream-snapshot-offset"), Some(at.as_str()));
        }
        let r = s.get(&url, &[("range", "bytes=10-")]).await?;
        r.refused(416, "RANGE_NOT_SATISFIABLE");
        assert_eq!(r.h("content-range"), Some("bytes */10"));
        for whole in [
            vec![("range", "bytes=0-1,4-5")],
            vec![("range", "items=0-1")],
            vec![("range", "bytes=0-1"), ("if-range", "\"x\"")],
            vec![],
        ] {
            let r = s.get(&url, &whole).await?;
            assert_eq!((r.status, r.text().as_str()), (200, blob), "{whole:?}");
            assert_eq!(r.h("accept-ranges"), Some("bytes"));
        }
    }
    // HEAD names the latest snapshot's offset; `GET snapshot/{offset}` reads it (the flow
    // Ursula 0.11 documents instead of the bare route, which brook keeps).
    let head = s.head(p, &[]).await?;
    let latest = head.need("stream-snapshot-offset")?;
    assert_eq!(latest, at);
    Ok(())
}

// --- snapshot parts ---------------------------------------------------------------------------

/// Stages `parts` of `p`'s snapshot at `at`; returns their ids.
async fn stage(s: &Server, p: &str, at: &str, parts: &[&str]) -> R<Vec<String>> {
    let mut ids = Vec::new();
    for part in parts {
        let r = s
            .post(&format!("{p}/snapshot/{at}/parts"), &[], part)
            .await?;
        assert_eq!(r.status, 201, "{}", r.text());
        assert!(r.h("stream-incarnation").is_some());
        ids.push(r.need("stream-snapshot-part")?.to_owned());
    }
    Ok(ids)
}

/// A commit of `ids` with `digest`.
async fn commit(
    s: &Server,
    p: &str,
    at: &str,
    ids: &[String],
    digest: &str,
) -> R<http_support::Resp> {
    let body: String = ids.iter().flat_map(|id| [id.as_str(), "\n"]).collect();
    let n = ids.len().to_string();
    s.put(
        &format!("{p}/snapshot/{at}"),
        &[
            STATE,
            ("stream-snapshot-parts", &n),
            ("stream-snapshot-digest", digest),
        ],
        &body,
    )
    .await
}

/// Parts staged one request each and committed in order publish one snapshot, answered as a
/// publish is; a repeat of the commit (its parts spent) answers the same; a wrong digest
/// publishes nothing; unknown, discarded and other incarnations' parts are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_upload_in_parts_and_commit_once() -> R {
    let s = Server::start().await?;
    let p = "/parts/s";
    let (token, at) = stream_with(&s, p, b"log").await?;
    let ids = stage(&s, p, &at, &["alpha-", "beta-", "gamma"]).await?;
    let digest = digest_of("application/x-state", b"alpha-beta-gamma");

    // A wrong digest: 400, nothing published, the parts spent.
    let wrong = digest_of("application/x-state", b"something else");
    let r = commit(&s, p, &at, &ids, &wrong).await?;
    r.refused(400, "SNAPSHOT_DIGEST_MISMATCH");
    s.get(&format!("{p}/snapshot/{at}"), &[])
        .await?
        .refused(404, "SNAPSHOT_NOT_FOUND");
    commit(&s, p, &at, &ids, &digest)
        .await?
        .refused(400, "UNKNOWN_PART");

    let ids = stage(&s, p, &at, &["alpha-", "beta-", "gamma"]).await?;
    let r = commit(&s, p, &at, &ids, &digest).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h("stream-snapshot-digest"), Some(digest.as_str()));
    assert_eq!(r.h("stream-snapshot-offset"), Some(at.as_str()));
    assert_eq!(r.h("stream-incarnation"), Some(token.as_str()));
    let got = s.get(&format!("{p}/snapshot/{at}"), &[]).await?;
    assert_eq!(got.text(), "alpha-beta-gamma");
    assert_eq!(got.h("content-type"), Some("application/x-state"));
    // The repeat: decided by the published snapshot, not the spent parts.
    let r = commit(&s, p, &at, &ids, &digest).await?;
    assert_eq!(r.status, 204, "{}", r.text());

    // Malformed commits.
    let n = |k: &'static str| ("stream-snapshot-parts", k);
    let url = format!("{p}/snapshot/{at}");
    for (headers, body) in [
        (vec![n("1")], "x\n"),
        (
            vec![n("0"), ("stream-snapshot-digest", digest.as_str())],
            "",
        ),
        (
            vec![n("2"), ("stream-snapshot-digest", digest.as_str())],
            "x\n",
        ),
        (
            vec![n("1"), ("stream-snapshot-digest", digest.as_str())],
            "x",
        ),
        (
            vec![n("2"), ("stream-snapshot-digest", digest.as_str())],
            "x\nx\n",
        ),
    ] {
        s.put(&url, &headers, body)
            .await?
            .refused(400, "INVALID_PARTS_COMMIT");
    }

    // Discarded parts are gone; the route takes only DELETE.
    s.post(p, &[BYTES], "more").await?;
    let later = s.tail(p).await?;
    let ids = stage(&s, p, &later, &["x", "y"]).await?;
    let r = s.delete(&format!("{p}/snapshot/parts"), &[]).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h("stream-incarnation"), Some(token.as_str()));
    let xy = digest_of("application/x-state", b"xy");
    commit(&s, p, &later, &ids, &xy)
        .await?
        .refused(400, "UNKNOWN_PART");
    assert_eq!(
        s.get(&format!("{p}/snapshot/parts"), &[]).await?.status,
        405
    );

    // Another incarnation does not find the old one's parts; a stale token is 412.
    let ids = stage(&s, p, &later, &["x", "y"]).await?;
    assert_eq!(s.delete(p, &[]).await?.status, 204);
    let (new, at2) = stream_with(&s, p, b"log").await?;
    commit(&s, p, &at2, &ids, &xy)
        .await?
        .refused(400, "UNKNOWN_PART");
    let r = s
        .post(
            &format!("{p}/snapshot/{at2}/parts"),
            &[("stream-incarnation", &token)],
            "x",
        )
        .await?;
    r.refused(412, "INCARNATION_MISMATCH");
    assert_eq!(r.h("stream-incarnation"), Some(new.as_str()));
    s.post(&format!("/parts/none/snapshot/{ZERO}/parts"), &[], "x")
        .await?
        .refused(404, "STREAM_NOT_FOUND");
    Ok(())
}

/// The bounds: a part is at most the snapshot limit (413), a stream holds at most twice it in
/// unused parts (429 `STAGED_PARTS_LIMIT` naming `Ursula-Max-Staged-Bytes`), parts that
/// assemble more than the limit are 413; and a part is streamed to disk, so one far larger than
/// the server's memory budget is staged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_parts_are_bounded_and_never_held_in_memory() -> R {
    let limit = 1000usize;
    let s = Server::start_with(
        Options::default().with_max_snapshot_bytes(limit as u64),
        config(),
    )
    .await?;
    let p = "/parts/bounds";
    let (_, at) = stream_with(&s, p, b"log").await?;
    let url = format!("{p}/snapshot/{at}/parts");
    let big = "x".repeat(limit + 1);
    s.post(&url, &[], &big)
        .await?
        .refused(413, "PAYLOAD_TOO_LARGE");
    let full = "y".repeat(limit);
    let ids = stage(&s, p, &at, &[&full, &full]).await?;
    let r = s.post(&url, &[], "z").await?;
    r.refused(429, "STAGED_PARTS_LIMIT");
    assert_eq!(r.h("ursula-max-staged-bytes"), Some("2000"));
    let digest = digest_of("application/x-state", full.repeat(2).as_bytes());
    commit(&s, p, &at, &ids, &digest)
        .await?
        .refused(413, "PAYLOAD_TOO_LARGE");
    // The refused commit copied nothing, so its parts stay until discarded.
    s.post(&url, &[], "z")
        .await?
        .refused(429, "STAGED_PARTS_LIMIT");
    assert_eq!(
        s.delete(&format!("{p}/snapshot/parts"), &[]).await?.status,
        204
    );
    stage(&s, p, &at, &["z"]).await?;

    // 32 MiB part through a server whose memory budget is 8 MiB.
    let small = ServerConfig {
        max_memory: 8 << 20,
        ..config()
    };
    let s = Server::start_with(Options::default(), small).await?;
    let (_, at) = stream_with(&s, p, b"log").await?;
    let blob = vec![7u8; 32 << 20];
    let r = s
        .send(
            "POST",
            &format!("{p}/snapshot/{at}/parts"),
            &[],
            blob.clone(),
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.need("stream-snapshot-part")?.to_owned();
    let digest = digest_of("application/octet-stream", &blob);
    let body = format!("{id}\n");
    let r = s
        .put(
            &format!("{p}/snapshot/{at}"),
            &[
                ("stream-snapshot-parts", "1"),
                ("stream-snapshot-digest", &digest),
            ],
            &body,
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    Ok(())
}

/// The Store API: a part is scratch, so reopening the store forgets it (a commit then names an
/// unknown part) and leaves no file behind.
#[test]
fn staged_parts_do_not_survive_a_reopen() -> R {
    let dir = tempfile::tempdir()?;
    let name = StreamName::new("parts/reopen")?;
    let at = {
        let store = Store::open(dir.path(), Options::default())?;
        store.create(&name, brook::CreateOptions::default())?;
        let part = store.stage_snapshot_part(&name, &mut &b"blob"[..], &Guard::default())?;
        assert_eq!(part.len, 4);
        store.shutdown()?;
        part.id
    };
    let store = Store::open(dir.path(), Options::default())?;
    let req = PublishParts {
        offset: brook::Offset::ZERO,
        content_type: None,
        parts: vec![at],
        digest: digest_of("application/octet-stream", b"blob"),
        expect: None,
    };
    let e = store.publish_snapshot_parts(&name, &req).unwrap_err();
    assert!(matches!(e, Error::UnknownPart { .. }), "{e}");
    let left = std::fs::read_dir(dir.path().join("snapshot-parts")).map_or(0, Iterator::count);
    assert_eq!(left, 0);
    // The bound names itself in the error.
    let small = tempfile::tempdir()?;
    let store = Store::open(small.path(), Options::default().with_max_snapshot_bytes(4))?;
    store.create(&name, brook::CreateOptions::default())?;
    for _ in 0..2 {
        store.stage_snapshot_part(&name, &mut &b"four"[..], &Guard::default())?;
    }
    let e = store
        .stage_snapshot_part(&name, &mut &b"x"[..], &Guard::default())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::StagedPartsLimit {
                limit: StagedLimit::Bytes(8)
            }
        ),
        "{e}"
    );
    Ok(())
}

/// A reader that hands out one byte (saying so on `started`), then waits for `go` before it
/// ends.
struct Paused {
    sent: bool,
    started: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
}

impl std::io::Read for Paused {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.sent {
            self.sent = true;
            buf[0] = b'p';
            let _ = self.started.send(());
            return Ok(1);
        }
        let _ = self.go.recv();
        Ok(0)
    }
}

/// A part being written holds only the room its bytes took: small parts staged beside slow
/// ones all fit, though each could have been as large as the limit.
#[test]
fn parts_in_flight_reserve_only_what_they_wrote() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default().with_max_snapshot_bytes(1000))?;
    let name = StreamName::new("parts/concurrent")?;
    store.create(&name, brook::CreateOptions::default())?;
    let mut slow = Vec::new();
    let mut gos = Vec::new();
    let (started, reading) = std::sync::mpsc::channel();
    for _ in 0..3 {
        let (go, wait) = std::sync::mpsc::channel();
        let (store, name, started) = (store.clone(), name.clone(), started.clone());
        gos.push(go);
        slow.push(std::thread::spawn(move || {
            let mut r = Paused {
                sent: false,
                started,
                go: wait,
            };
            store.stage_snapshot_part(&name, &mut r, &Guard::default())
        }));
    }
    // Three parts are being written; three more fit beside them.
    for _ in 0..3 {
        reading.recv()?;
    }
    for _ in 0..3 {
        store.stage_snapshot_part(&name, &mut &b"small"[..], &Guard::default())?;
    }
    for go in gos {
        go.send(())?;
    }
    for t in slow {
        let part = t.join().map_err(|_| "a stage panicked")??;
        assert_eq!(part.len, 1);
    }
    Ok(())
}

// --- access control ---------------------------------------------------------------------------

/// The new routes need the rights of the old ones: `read` for the immutable reads, `admin` for
/// staging, committing and discarding parts; a read a token admitted is cached `private`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_covers_the_new_routes() -> R {
    let dir = tempfile::tempdir()?;
    let tokens = http_support::token_file(
        dir.path(),
        &[
            ("reader", "read app/"),
            ("admin", "admin app/"),
            ("writer", "write app/"),
        ],
    )?;
    let mut cfg = config();
    cfg.access = Some(Arc::new(AccessControl::new().with_token_file(tokens)?));
    let s = Server::start_with(Options::default(), cfg).await?;
    let bearer = |n: &str| format!("Bearer {n}-token");
    let (admin, reader, writer) = (bearer("admin"), bearer("reader"), bearer("writer"));
    let auth = |t: &str| ("authorization", t.to_owned());
    let p = "/app/s";
    let r = s.put(p, &[BYTES, ("authorization", &admin)], "").await?;
    assert_eq!(r.status, 201, "{}", r.text());
    let token = r.need("stream-incarnation")?.to_owned();
    let r = s
        .post(p, &[BYTES, ("authorization", &writer)], "data")
        .await?;
    assert_eq!(r.status, 204);
    let chunk = format!("{p}/incarnation/{token}/chunk/{ZERO}");
    assert_eq!(s.get(&chunk, &[]).await?.status, 401);
    assert_eq!(
        s.get(&chunk, &[("authorization", &writer)]).await?.status,
        403
    );
    let r = s.get(&chunk, &[("authorization", &reader)]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    let snap = format!("{p}/incarnation/{token}/snapshot/{ZERO}");
    assert_eq!(
        s.get(&snap, &[("authorization", &writer)]).await?.status,
        403
    );
    let parts = format!("{p}/snapshot/{ZERO}/parts");
    for t in [&reader, &writer] {
        let (k, v) = auth(t);
        assert_eq!(s.post(&parts, &[(k, &v)], "x").await?.status, 403);
        let r = s.delete(&format!("{p}/snapshot/parts"), &[(k, &v)]).await?;
        assert_eq!(r.status, 403);
    }
    let r = s.post(&parts, &[("authorization", &admin)], "x").await?;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.need("stream-snapshot-part")?.to_owned();
    let digest = digest_of("application/octet-stream", b"x");
    let commit = |t: String| {
        let body = format!("{id}\n");
        let digest = digest.clone();
        let s = &s;
        async move {
            s.put(
                &format!("{p}/snapshot/{ZERO}"),
                &[
                    ("authorization", &t),
                    ("stream-snapshot-parts", "1"),
                    ("stream-snapshot-digest", &digest),
                ],
                &body,
            )
            .await
        }
    };
    assert_eq!(commit(reader.clone()).await?.status, 403);
    assert_eq!(commit(admin.clone()).await?.status, 204);
    let r = s.get(&snap, &[("authorization", &reader)]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.h("cache-control"),
        Some("private, max-age=31536000, immutable")
    );
    Ok(())
}

/// A browser can use the new surface: the preflight allows `Range` and the parts headers, and
/// answers expose the headers a reader of them needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_see_the_new_headers() -> R {
    let s = Server::start().await?;
    let p = "/cors/s";
    let (token, _) = stream_with(&s, p, b"abc").await?;
    let r = s
        .send(
            "OPTIONS",
            &format!("{p}/snapshot/{ZERO}"),
            &[
                ("origin", b"https://app.example"),
                ("access-control-request-method", b"PUT"),
            ],
            Vec::new(),
        )
        .await?;
    let allowed = r.need("access-control-allow-headers")?.to_ascii_lowercase();
    for h in [
        "range",
        "if-range",
        "stream-snapshot-parts",
        "stream-snapshot-digest",
    ] {
        assert!(allowed.contains(h), "{h} not in {allowed}");
    }
    let r = s
        .get(
            &format!("{p}/incarnation/{token}/chunk/{ZERO}"),
            &[("origin", "https://app.example")],
        )
        .await?;
    let exposed = r
        .need("access-control-expose-headers")?
        .to_ascii_lowercase();
    for h in [
        "stream-offset",
        "stream-immutable",
        "stream-snapshot-part",
        "content-range",
        "ursula-max-staged-bytes",
    ] {
        assert!(exposed.contains(h), "{h} not in {exposed}");
    }
    Ok(())
}
