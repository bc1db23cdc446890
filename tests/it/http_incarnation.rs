//! The seed's Stream-Incarnation over a real socket: carried on every successful response that
//! addresses a stream (except DELETE's), accepted on every route, 412 with the current token
//! for another incarnation (applying nothing), and the 404/410/416 precedence.

use std::time::Duration;

use crate::http_support::{R, Resp, Server};

const TEXT: (&str, &str) = ("content-type", "text/plain");
const INC: &str = "stream-incarnation";

/// A stream with data, a snapshot at its tail, more data after it; returns the snapshot offset.
async fn stream_with_snapshot(s: &Server, p: &str) -> R<String> {
    s.create(p, "text/plain").await?;
    s.post(p, &[TEXT], "abc").await?;
    let at = s.tail(p).await?;
    let r = s
        .put(
            &format!("{p}/snapshot/{at}"),
            &[("content-type", "application/x-state")],
            "STATE",
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    s.post(p, &[TEXT], "def").await?;
    Ok(at)
}

/// One request on a route: (what, method, path, extra headers, body, expected status).
type Route = (
    &'static str,
    &'static str,
    String,
    Vec<(&'static str, String)>,
    &'static str,
    u16,
);

/// Every route that addresses the stream at `p`. `snap` is a published snapshot's offset.
fn routes(p: &str, snap: &str, tail: &str) -> Vec<Route> {
    let t = |s: &str| s.to_owned();
    vec![
        (
            "PUT of the existing stream",
            "PUT",
            t(p),
            vec![("content-type", t("text/plain"))],
            "",
            200,
        ),
        (
            "append",
            "POST",
            t(p),
            vec![("content-type", t("text/plain"))],
            "g",
            204,
        ),
        (
            "producer append",
            "POST",
            t(p),
            vec![
                ("content-type", t("text/plain")),
                ("producer-id", t("p")),
                ("producer-epoch", t("0")),
                ("producer-seq", t("0")),
            ],
            "h",
            200,
        ),
        (
            "catch-up read",
            "GET",
            format!("{p}?offset=-1"),
            vec![],
            "",
            200,
        ),
        (
            "read at the tail",
            "GET",
            format!("{p}?offset=now"),
            vec![],
            "",
            200,
        ),
        (
            "long-poll with data",
            "GET",
            format!("{p}?offset=-1&live=long-poll"),
            vec![],
            "",
            200,
        ),
        ("HEAD", "HEAD", t(p), vec![], "", 200),
        (
            "snapshot publish",
            "PUT",
            format!("{p}/snapshot/{snap}"),
            vec![("content-type", t("application/x-state"))],
            "STATE",
            204,
        ),
        (
            "latest snapshot",
            "GET",
            format!("{p}/snapshot"),
            vec![],
            "",
            200,
        ),
        (
            "snapshot at an offset",
            "GET",
            format!("{p}/snapshot/{snap}"),
            vec![],
            "",
            200,
        ),
        (
            "retention",
            "PUT",
            format!("{p}/retention/{snap}"),
            vec![],
            "",
            204,
        ),
        (
            "bootstrap",
            "GET",
            format!("{p}/bootstrap"),
            vec![],
            "",
            200,
        ),
        (
            "read from the retained start",
            "GET",
            format!("{p}?offset={snap}"),
            vec![],
            "",
            200,
        ),
        (
            "long-poll timing out",
            "GET",
            format!("{p}?offset={tail}&live=long-poll"),
            vec![],
            "",
            204,
        ),
    ]
}

/// Walks every route on a fresh stream at `p`, sending the current token on each request when
/// `send_token` is set; every success carries the token, DELETE's excepted.
async fn walk(s: &Server, p: &str, send_token: bool) -> R {
    let snap = stream_with_snapshot(s, p).await?;
    let current = s.head(p, &[]).await?.need(INC)?.to_owned();
    let token: Vec<(&str, &[u8])> = if send_token {
        vec![(INC, current.as_bytes())]
    } else {
        Vec::new()
    };
    for (what, method, path, headers, body, status) in routes(p, &snap, "") {
        // The long-poll that times out must start at the tail as it is now.
        let tail = s.tail(p).await?;
        let path = path.replace("offset=&", &format!("offset={tail}&"));
        let mut h: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        h.extend_from_slice(&token);
        let r = s.send(method, &path, &h, body.to_owned()).await?;
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(
            r.h(INC),
            Some(current.as_str()),
            "{what} carries Stream-Incarnation"
        );
    }
    // SSE: the token is on the response head.
    let mut req = s.client.get(s.url(&format!("{p}?offset={snap}&live=sse")));
    if send_token {
        req = req.header(INC, current.as_str());
    }
    let res = req.send().await?;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(
        res.headers().get(INC).and_then(|v| v.to_str().ok()),
        Some(current.as_str())
    );
    drop(res);
    // DELETE is the one success without it.
    let r = s.send("DELETE", p, &token, Vec::new()).await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h(INC), None, "DELETE carries no Stream-Incarnation");
    assert_eq!(s.head(p, &[]).await?.status, 404);
    Ok(())
}

/// "Every successful response that addresses a stream, except a DELETE, carries
/// Stream-Incarnation." And "Without the header nothing changes."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_successful_response_carries_the_incarnation_except_delete() -> R {
    let s = Server::start().await?;
    let r = s.put("/inc/carried", &[TEXT], "").await?;
    assert_eq!(r.status, 201);
    assert!(
        r.h(INC).is_some_and(|t| !t.is_empty()),
        "the creating PUT carries it"
    );
    s.delete("/inc/carried", &[]).await?;
    walk(&s, "/inc/carried", false).await
}

/// "Send it back as a request header on any later request: appends, reads (including long-poll
/// and SSE), HEAD, DELETE, a PUT of an existing stream, bootstrap, snapshot publish and read,
/// retention."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_incarnation_is_accepted_on_every_route() -> R {
    let s = Server::start().await?;
    walk(&s, "/inc/accepted", true).await
}

#[track_caller]
fn precondition_failed(r: &Resp, what: &str, current: &str) {
    assert_eq!(r.status, 412, "{what}: {}", r.text());
    if what != "HEAD" {
        // (A HEAD response has no body to carry the problem.)
        assert_eq!(r.code().as_deref(), Some("INCARNATION_MISMATCH"), "{what}");
    }
    assert_eq!(
        r.h(INC),
        Some(current),
        "{what}: the 412 carries the current token"
    );
    assert_eq!(
        r.h("stream-last-seq"),
        None,
        "{what}: 412 never mixes with the 409s"
    );
}

/// "The server compares it for equality with the stream's current incarnation, atomically with
/// the request, and answers 412 Precondition Failed when the stream is another incarnation; a
/// refused write applies nothing. The 412 carries the current token."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_incarnation_answers_412_on_every_route_and_applies_nothing() -> R {
    let s = Server::start().await?;
    let p = "/inc/stale";
    let old = s.create(p, "text/plain").await?;
    assert_eq!(s.delete(p, &[]).await?.status, 204);
    let snap = stream_with_snapshot(&s, p).await?;
    let current = s.head(p, &[]).await?.need(INC)?.to_owned();
    assert_ne!(old, current, "a recreated stream is another incarnation");
    let tail = s.tail(p).await?;
    let stale = [(INC, old.as_str())];

    for (what, method, path, headers, body, _) in routes(p, &snap, &tail) {
        let path = path.replace("offset=&", &format!("offset={tail}&"));
        let mut h: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        h.push((INC, old.as_bytes()));
        let r = s.send(method, &path, &h, body.to_owned()).await?;
        precondition_failed(&r, what, &current);
    }
    let r = s
        .get(&format!("{p}?offset={snap}&live=sse"), &stale)
        .await?;
    precondition_failed(&r, "SSE", &current);
    let r = s.delete(p, &stale).await?;
    precondition_failed(&r, "DELETE", &current);
    let r = s
        .send(
            "DELETE",
            &format!("{p}/snapshot/{snap}"),
            &[(INC, old.as_bytes())],
            Vec::new(),
        )
        .await?;
    precondition_failed(&r, "DELETE of the latest snapshot", &current);

    // Nothing was applied: same tail, same data, same snapshot, same retention, still there.
    let head = s.head(p, &[]).await?;
    assert_eq!(head.status, 200);
    assert_eq!(head.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(head.h("stream-snapshot-offset"), Some(snap.as_str()));
    assert_eq!(
        head.h("stream-earliest-offset"),
        Some("0000000000000000_0000000000000000")
    );
    assert_eq!(s.read_all(p).await?, b"abcdef");
    Ok(())
}

/// "412 never mixes with the 409s above": a stale token on a request that would conflict on
/// the current stream answers 412, without Stream-Last-Seq, Stream-Closed or producer headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_412_never_mixes_with_a_409() -> R {
    let s = Server::start().await?;
    let p = "/inc/mix";
    let old = s.create(p, "text/plain").await?;
    s.delete(p, &[]).await?;
    let current = s.create(p, "text/plain").await?;
    let r = s.post(p, &[TEXT, ("stream-seq", "5")], "a").await?;
    assert_eq!(r.status, 204);
    let r = s
        .post(p, &[TEXT, ("stream-seq", "5"), (INC, old.as_str())], "x")
        .await?;
    precondition_failed(&r, "Stream-Seq conflict", &current);
    let r = s
        .post(
            p,
            &[("content-type", "application/json"), (INC, old.as_str())],
            "[1]",
        )
        .await?;
    precondition_failed(&r, "content-type mismatch", &current);
    s.post(p, &[("stream-closed", "true")], "").await?;
    let r = s.post(p, &[TEXT, (INC, old.as_str())], "x").await?;
    precondition_failed(&r, "closed stream", &current);
    assert_eq!(r.h("stream-closed"), None);
    assert_eq!(s.read_all(p).await?, b"a");
    Ok(())
}

/// "A request that would answer 404 (or, for a read, 410 or 416) without the header still
/// does."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_gone_and_out_of_range_win_over_412() -> R {
    let s = Server::start().await?;
    let p = "/inc/precedence";
    let old = s.create(p, "text/plain").await?;
    s.delete(p, &[]).await?;
    let stale = [(INC, old.as_str())];
    // The stream is missing: 404 everywhere.
    for (method, path) in [
        ("GET", format!("{p}?offset=-1")),
        ("GET", format!("{p}?offset=-1&live=long-poll")),
        ("GET", format!("{p}?offset=-1&live=sse")),
        ("HEAD", p.to_owned()),
        ("POST", p.to_owned()),
        ("DELETE", p.to_owned()),
        ("GET", format!("{p}/bootstrap")),
        ("GET", format!("{p}/snapshot")),
        (
            "PUT",
            format!("{p}/snapshot/0000000000000000_0000000000000000"),
        ),
        (
            "PUT",
            format!("{p}/retention/0000000000000000_0000000000000000"),
        ),
    ] {
        let h: Vec<(&str, &[u8])> = vec![(INC, old.as_bytes()), ("content-type", b"text/plain")];
        let r = s
            .send(method, &path, &h, if method == "POST" { "x" } else { "" })
            .await?;
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
    }

    // A recreated stream with a snapshot and retention.
    let snap = stream_with_snapshot(&s, p).await?;
    let current = s.head(p, &[]).await?.need(INC)?.to_owned();
    assert_eq!(
        s.put(&format!("{p}/retention/{snap}"), &[], "")
            .await?
            .status,
        204
    );
    // 416: past the tail.
    let r = s
        .get(
            &format!("{p}?offset=9999999999999999_9999999999999999"),
            &stale,
        )
        .await?;
    r.refused(416, "OFFSET_BEYOND_TAIL");
    let r = s
        .get(
            &format!("{p}?offset=9999999999999999_9999999999999999&live=long-poll"),
            &stale,
        )
        .await?;
    assert_eq!(r.status, 416);
    // 410: below retention, and from the trimmed start.
    let r = s
        .get(
            &format!("{p}?offset=0000000000000000_0000000000000000"),
            &stale,
        )
        .await?;
    r.refused(410, "OFFSET_GONE");
    let r = s.get(&format!("{p}?offset=-1"), &stale).await?;
    r.refused(410, "OFFSET_GONE");
    assert_eq!(r.h("stream-earliest-offset"), Some(snap.as_str()));
    let r = s.get(&format!("{p}?offset=-1&live=sse"), &stale).await?;
    assert_eq!(r.status, 410);
    // 404: a snapshot that does not exist; a non-latest snapshot's DELETE.
    let r = s
        .get(
            &format!("{p}/snapshot/0000000000000000_0000000000000001"),
            &stale,
        )
        .await?;
    r.refused(404, "SNAPSHOT_NOT_FOUND");
    let r = s
        .send(
            "DELETE",
            &format!("{p}/snapshot/0000000000000000_0000000000000001"),
            &[(INC, old.as_bytes())],
            Vec::new(),
        )
        .await?;
    r.refused(404, "SNAPSHOT_NOT_FOUND");
    // Anything else is the 412.
    let r = s.get(&format!("{p}?offset={snap}"), &stale).await?;
    precondition_failed(&r, "read in range", &current);

    // 410: a soft-deleted stream (deleted while a fork reads from it).
    s.create("/inc/source", "text/plain").await?;
    let src_token = s.head("/inc/source", &[]).await?.need(INC)?.to_owned();
    s.post("/inc/source", &[TEXT], "abc").await?;
    let r = s
        .put(
            "/inc/fork",
            &[TEXT, ("stream-forked-from", "/inc/source")],
            "",
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.delete("/inc/source", &[]).await?.status, 204);
    let other = [(INC, "not-the-token")];
    assert_eq!(
        s.get("/inc/source?offset=-1", &[(INC, src_token.as_str())])
            .await?
            .status,
        410
    );
    assert_eq!(s.get("/inc/source?offset=-1", &other).await?.status, 410);
    assert_eq!(s.head("/inc/source", &other).await?.status, 410);
    Ok(())
}

/// "A PUT with the header for a missing stream answers 412 and creates nothing."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_with_an_incarnation_for_a_missing_stream_is_412_and_creates_nothing() -> R {
    let s = Server::start().await?;
    let p = "/inc/missing";
    let old = s.create(p, "text/plain").await?;
    s.delete(p, &[]).await?;
    let r = s.put(p, &[TEXT, (INC, old.as_str())], "").await?;
    r.refused(412, "INCARNATION_MISMATCH");
    assert_eq!(s.head(p, &[]).await?.status, 404, "nothing created");
    let r = s.put("/inc/never", &[TEXT, (INC, "any-token")], "").await?;
    assert_eq!(r.status, 412);
    assert_eq!(s.head("/inc/never", &[]).await?.status, 404);
    Ok(())
}

/// A live reader sent the current token keeps it: a long-poll waiting on the stream answers
/// its data when it arrives, with the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_with_the_token_wakes_on_an_append() -> R {
    let s = Server::start_with(
        brook::Options::default(),
        brook::http::ServerConfig {
            long_poll_timeout: Duration::from_secs(10),
            ..crate::http_support::config()
        },
    )
    .await?;
    let p = "/inc/live";
    let token = s.create(p, "text/plain").await?;
    let tail = s.tail(p).await?;
    let url = format!("{p}?offset={tail}&live=long-poll");
    let with_token = [(INC, token.as_str())];
    let reader = s.get(&url, &with_token);
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.post(p, &[TEXT, (INC, token.as_str())], "late").await
    };
    let (r, w) = tokio::join!(reader, writer);
    let (r, w) = (r?, w?);
    assert_eq!(w.status, 204);
    assert_eq!((r.status, r.text().as_str()), (200, "late"));
    assert_eq!(r.h(INC), Some(token.as_str()));
    Ok(())
}
