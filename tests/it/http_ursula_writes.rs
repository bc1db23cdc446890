//! Ursula 0.11's write headers and brook's tail precondition, over a real socket:
//! `Producer-Digest` (a retry under a held producer key with another identity is refused, not
//! answered as a duplicate; durable across SIGKILL of the real binary) and `If-Match` on an
//! append behind `--append-if-match` (off by default, when it is ignored as Ursula ignores it).

use std::time::{Duration, Instant};

use brook::BodyDigest;
use brook::Options;
use brook::http::{AppendIfMatch, ServerConfig};

use crate::http_support::{R, Resp, Server, config, spawn_serve};

const S: &str = "/w/s";

fn digest(body: &str) -> String {
    BodyDigest::of(body.as_bytes()).to_string()
}

/// POST `body` as producer `p` at `(epoch, seq)`, with `Producer-Digest` of `digest_of` when
/// given, and `extra` headers.
async fn keyed(
    s: &Server,
    body: &str,
    (epoch, seq): (u64, u64),
    digest_of: Option<&str>,
    extra: &[(&str, &str)],
) -> R<Resp> {
    let (epoch, seq) = (epoch.to_string(), seq.to_string());
    let d = digest_of.map(digest);
    let mut h = vec![
        ("content-type", "text/plain"),
        ("producer-id", "p"),
        ("producer-epoch", epoch.as_str()),
        ("producer-seq", seq.as_str()),
    ];
    if let Some(d) = &d {
        h.push(("producer-digest", d.as_str()));
    }
    h.extend_from_slice(extra);
    s.post(S, &h, body).await
}

/// A retry under the producer's newest key with its own digest is the duplicate the seed
/// describes; with another body and digest, or without the digest, it is another write:
/// 403 `PRODUCER_KEY_CONFLICT` (Ursula 0.11), `Producer-Epoch` and `Producer-Outcome`, and
/// nothing is written.
#[tokio::test]
async fn a_retry_with_another_body_is_refused_not_deduplicated() -> R {
    let s = Server::start().await?;
    s.create(S, "text/plain").await?;
    let first = keyed(&s, "a", (0, 0), Some("a"), &[]).await?;
    assert_eq!(first.status, 200, "{}", first.text());
    let tail = first.need("stream-next-offset")?.to_owned();
    let again = keyed(&s, "a", (0, 0), Some("a"), &[]).await?;
    assert_eq!(again.status, 204, "{}", again.text());
    assert_eq!(again.h("stream-next-offset"), Some(tail.as_str()));
    for other in [
        keyed(&s, "b", (0, 0), Some("b"), &[]).await?,
        keyed(&s, "a", (0, 0), None, &[]).await?,
    ] {
        other.refused(403, "PRODUCER_KEY_CONFLICT");
        assert_eq!(other.h("producer-epoch"), Some("0"));
        assert_eq!(other.h("producer-outcome"), Some("key-conflict"));
    }
    assert_eq!(s.read_all(S).await?, b"a");
    Ok(())
}

/// The identity of a write without a digest is "no digest": a retry that adds one is another
/// write (Ursula 0.11: an absent digest matches only an absent one).
#[tokio::test]
async fn a_retry_that_adds_a_digest_is_another_write() -> R {
    let s = Server::start().await?;
    s.create(S, "text/plain").await?;
    assert_eq!(keyed(&s, "a", (0, 0), None, &[]).await?.status, 200);
    keyed(&s, "a", (0, 0), Some("a"), &[])
        .await?
        .refused(403, "PRODUCER_KEY_CONFLICT");
    assert_eq!(keyed(&s, "a", (0, 0), None, &[]).await?.status, 204);
    Ok(())
}

/// A write that would apply with a body that does not hash to its digest is 400
/// `PRODUCER_DIGEST_MISMATCH`: nothing is written and its Producer-Seq is still the next one.
/// A digest without the producer headers, or not 64 lowercase hex digits, is 400
/// `INVALID_ARGUMENT`.
#[tokio::test]
async fn a_digest_that_does_not_match_the_body_commits_nothing() -> R {
    let s = Server::start().await?;
    s.create(S, "text/plain").await?;
    keyed(&s, "a", (0, 0), Some("not a"), &[])
        .await?
        .refused(400, "PRODUCER_DIGEST_MISMATCH");
    assert_eq!(s.read_all(S).await?, b"");
    assert_eq!(keyed(&s, "a", (0, 0), Some("a"), &[]).await?.status, 200);
    let d = digest("b");
    s.post(
        S,
        &[("content-type", "text/plain"), ("producer-digest", &d)],
        "b",
    )
    .await?
    .refused(400, "INVALID_ARGUMENT");
    let upper = d.to_uppercase();
    let r = s
        .post(
            S,
            &[
                ("content-type", "text/plain"),
                ("producer-id", "p"),
                ("producer-epoch", "0"),
                ("producer-seq", "1"),
                ("producer-digest", &upper),
            ],
            "b",
        )
        .await?;
    r.refused(400, "INVALID_ARGUMENT");
    assert_eq!(s.read_all(S).await?, b"a");
    Ok(())
}

/// A `brook serve` child on `dir`, ready: its base URL.
async fn serve_on(dir: &std::path::Path) -> R<(crate::http_support::Served, String)> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "info");
    let served = spawn_serve(cmd)?;
    let base = format!("http://{}", served.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = reqwest::Client::new();
    while !matches!(probe.get(format!("{base}/__brook/ready")).send().await, Ok(r) if r.status() == 200)
    {
        if Instant::now() > deadline {
            return Err("brook was not ready within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((served, base))
}

/// The kept digest is durable with the producer's position: after SIGKILL of the real binary
/// (no shutdown, no checkpoint) and a restart on the same data directory, the retry with the
/// original digest is still a duplicate and one with another body still a key conflict; the
/// same holds after a clean restart, from the checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_survives_sigkill_and_restart() -> R {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let client = reqwest::Client::new();
    let post = |base: &str, body: &'static str, seq: u64, d: &'static str| {
        client
            .post(format!("{base}{S}"))
            .header("content-type", "text/plain")
            .header("producer-id", "p")
            .header("producer-epoch", "4")
            .header("producer-seq", seq.to_string())
            .header("producer-digest", digest(d))
            .body(body)
            .send()
    };
    let (mut served, base) = serve_on(&data).await?;
    let r = client
        .put(format!("{base}{S}"))
        .header("content-type", "text/plain")
        .send()
        .await?;
    assert_eq!(r.status(), 201);
    assert_eq!(post(&base, "zero", 0, "zero").await?.status(), 200);
    assert_eq!(post(&base, "one", 1, "one").await?.status(), 200);
    served.child.kill()?;
    served.child.wait()?;

    for round in ["after SIGKILL", "after a clean restart"] {
        let (mut served, base) = serve_on(&data).await?;
        let newest = post(&base, "one", 1, "one").await?;
        assert_eq!(newest.status(), 204, "{round}");
        let claim = post(&base, "zero", 0, "zero").await?;
        assert_eq!(claim.status(), 204, "{round}");
        for (body, seq) in [("uno", 1), ("cero", 0)] {
            let other = post(&base, body, seq, body).await?;
            assert_eq!(other.status(), 403, "{round}: {body}");
            let code: serde_json::Value = serde_json::from_slice(&other.bytes().await?)?;
            assert_eq!(code["code"], "PRODUCER_KEY_CONFLICT", "{round}");
        }
        let all = client
            .get(format!("{base}{S}?offset=-1"))
            .send()
            .await?
            .text()
            .await?;
        assert_eq!(all, "zeroone", "{round}");
        if round == "after SIGKILL" {
            // A clean stop (SIGTERM) checkpoints every stream: the next start reads the
            // digests from the sidecar, not the journal.
            let pid = served.child.id().to_string();
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()?;
            served.child.wait()?;
        } else {
            served.child.kill()?;
            served.child.wait()?;
        }
    }
    Ok(())
}

fn guarded() -> ServerConfig {
    ServerConfig {
        append_if_match: AppendIfMatch::TailPrecondition,
        ..config()
    }
}

/// The tag a read of the whole stream carries.
async fn tail_tag(s: &Server) -> R<String> {
    let r = s.get(&format!("{S}?offset=-1"), &[]).await?;
    assert_eq!(r.status, 200, "{}", r.text());
    Ok(r.need("etag")?.to_owned())
}

/// Without `--append-if-match`, `If-Match` on an append is ignored, as Ursula ignores it: a
/// stale tag still appends, and every 412 keeps the seed's meaning.
#[tokio::test]
async fn if_match_on_an_append_is_ignored_by_default() -> R {
    let s = Server::start().await?;
    s.create(S, "text/plain").await?;
    let stale = tail_tag(&s).await?;
    let ct = ("content-type", "text/plain");
    assert_eq!(s.post(S, &[ct], "a").await?.status, 204);
    let r = s.post(S, &[ct, ("if-match", &stale)], "b").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h("etag"), None);
    let r = s.post(S, &[ct, ("if-match", "not a tag")], "c").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(s.read_all(S).await?, b"abc");
    Ok(())
}

/// With `--append-if-match`: the tag of a read that reached the tail guards the append; the
/// answer carries the new tail's tag; a stale tag is 412 `TAIL_MOVED` with the current tail's
/// tag and `Stream-Next-Offset`, and commits nothing. A tag that is not one of this server's
/// reads is 400.
#[tokio::test]
async fn if_match_guards_the_tail_when_enabled() -> R {
    let s = Server::start_with(Options::default(), guarded()).await?;
    s.create(S, "text/plain").await?;
    let ct = ("content-type", "text/plain");
    let first = tail_tag(&s).await?;
    let r = s.post(S, &[ct, ("if-match", &first)], "a").await?;
    assert_eq!(r.status, 204, "{}", r.text());
    // The new tail's tag (a read starting at the tail carries the same one).
    let next = r.need("etag")?.to_owned();
    let tail = s.tail(S).await?;
    let at_tail = s.get(&format!("{S}?offset={tail}"), &[]).await?;
    assert_eq!(at_tail.h("etag"), Some(next.as_str()));
    let refused = s.post(S, &[ct, ("if-match", &first)], "b").await?;
    refused.refused(412, "TAIL_MOVED");
    assert_eq!(refused.h("etag"), Some(next.as_str()));
    assert_eq!(
        refused.h("stream-next-offset"),
        Some(s.tail(S).await?.as_str())
    );
    assert_eq!(s.read_all(S).await?, b"a");
    // The refusal's tag is the one to send next.
    assert_eq!(
        s.post(S, &[ct, ("if-match", &next)], "b").await?.status,
        204
    );
    assert_eq!(s.post(S, &[ct, ("if-match", "*")], "c").await?.status, 204);
    for bad in ["\"x\"", "W/\"x\"", "\"a\", \"b\""] {
        s.post(S, &[ct, ("if-match", bad)], "d")
            .await?
            .refused(400, "INVALID_ARGUMENT");
    }
    // Two lines are a list too.
    s.post(S, &[ct, ("if-match", &next), ("if-match", &next)], "d")
        .await?
        .refused(400, "INVALID_ARGUMENT");
    assert_eq!(s.read_all(S).await?, b"abc");
    Ok(())
}

/// The documented order of checks with `If-Match`: Stream-Incarnation first (the seed's 412),
/// then producer deduplication (a retry of an accepted guarded append is its duplicate, though
/// its own write moved the tail), then the tail, then Stream-Seq; a `TAIL_MOVED` refusal uses
/// up no Producer-Seq and stores no Stream-Seq.
#[tokio::test]
async fn if_match_sits_after_deduplication_and_before_stream_seq() -> R {
    let s = Server::start_with(Options::default(), guarded()).await?;
    let inc = s.create(S, "text/plain").await?;
    let stale = tail_tag(&s).await?;
    let accepted = keyed(&s, "a", (0, 0), None, &[("if-match", &stale)]).await?;
    assert_eq!(accepted.status, 200, "{}", accepted.text());
    let retry = keyed(&s, "a", (0, 0), None, &[("if-match", &stale)]).await?;
    assert_eq!(retry.status, 204, "{}", retry.text());
    // A stale tag refuses seq 1 and stores nothing; seq 1 is still next with a fresh one.
    keyed(
        &s,
        "b",
        (0, 1),
        None,
        &[("if-match", &stale), ("stream-seq", "5")],
    )
    .await?
    .refused(412, "TAIL_MOVED");
    let fresh = tail_tag(&s).await?;
    let r = keyed(
        &s,
        "b",
        (0, 1),
        None,
        &[("if-match", &fresh), ("stream-seq", "1")],
    )
    .await?;
    assert_eq!(r.status, 200, "{}", r.text());
    // The tail before Stream-Seq: a stale tag with a conflicting Stream-Seq is TAIL_MOVED.
    let ct = ("content-type", "text/plain");
    s.post(S, &[ct, ("if-match", &stale), ("stream-seq", "0")], "c")
        .await?
        .refused(412, "TAIL_MOVED");
    // With a fresh tag, the Stream-Seq conflict is the seed's 409.
    let fresh = tail_tag(&s).await?;
    let r = s
        .post(S, &[ct, ("if-match", &fresh), ("stream-seq", "0")], "c")
        .await?;
    r.refused(409, "STREAM_SEQ_CONFLICT");
    assert_eq!(r.h("stream-last-seq"), Some("1"));
    // Stream-Incarnation before all of them: the seed's 412.
    let wrong = format!("{inc}x");
    s.post(
        S,
        &[ct, ("if-match", &stale), ("stream-incarnation", &wrong)],
        "c",
    )
    .await?
    .refused(412, "INCARNATION_MISMATCH");
    assert_eq!(s.read_all(S).await?, b"ab");
    Ok(())
}

/// A browser may send both headers (the preflight allows them) and read `Producer-Outcome`.
#[tokio::test]
async fn browsers_may_send_the_write_headers() -> R {
    let s = Server::start().await?;
    s.create(S, "text/plain").await?;
    let r = s
        .send(
            "OPTIONS",
            S,
            &[
                ("origin", b"https://example.com".as_slice()),
                ("access-control-request-method", b"POST".as_slice()),
                (
                    "access-control-request-headers",
                    b"producer-digest, if-match".as_slice(),
                ),
            ],
            Vec::new(),
        )
        .await?;
    let allowed = r.need("access-control-allow-headers")?.to_ascii_lowercase();
    assert!(
        allowed.contains("producer-digest") && allowed.contains("if-match"),
        "{allowed}"
    );
    let r = s.get(&format!("{S}?offset=-1"), &[]).await?;
    let exposed = r
        .need("access-control-expose-headers")?
        .to_ascii_lowercase();
    assert!(exposed.contains("producer-outcome"), "{exposed}");
    Ok(())
}
