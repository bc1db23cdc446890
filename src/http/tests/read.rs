//! GET and HEAD of a stream: catch-up, `ETag`s, offsets, long-poll, checksums after a restart.

use super::*;

/// Catch-up reads: offsets, `max_bytes`, `ETag`s and 304s, `offset=now`, refused offsets.
#[tokio::test]
async fn catch_up_reads_etags_and_offsets() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/r", "first").await;
    let r = t.get("/s/r", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "first"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    assert_eq!(r.h("content-length"), Some("5"));
    assert_eq!(
        r.h("cache-control"),
        Some(PROTOCOL_CACHE),
        "a read from the start is cacheable for a while"
    );
    let etag = r.h("etag").ok_or("etag")?.to_owned();
    let mid = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let r = t.get("/s/r", &[("if-none-match", &etag)]).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::NOT_MODIFIED, 0));
    let r = t.get("/s/r", &[("if-none-match", "\"other\"")]).await;
    assert_eq!(r.status, StatusCode::OK);
    t.post("/s/r", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/r", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status, StatusCode::OK, "closing changes the ETag");
    assert!(r.h("etag").is_some_and(|e| e.ends_with(":c\"")));

    t.text_stream("/s/r2", "first").await;
    t.post("/s/r2", &[CT_TEXT], "second").await;
    assert_eq!(
        t.get(&format!("/s/r2?offset={mid}"), &[]).await.text(),
        "second"
    );
    let r = t.get("/s/r2?offset=-1&max_bytes=3", &[]).await;
    assert_eq!(r.text(), "fir");
    assert_eq!(
        r.h("stream-up-to-date"),
        None,
        "a bounded read short of the tail"
    );
    let r = t.get("/s/r2?offset=now", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, ""));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    assert_eq!(r.h("etag"), None);
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    let r = t
        .get("/s/r2?offset=-1&consistency=leader&foo=bar", &[])
        .await;
    assert_eq!(r.text(), "firstsecond");

    for bad in ["", "0,1", "0%201", "abc", "..%2Fx", "-2"] {
        let r = t.get(&format!("/s/r2?offset={bad}"), &[]).await;
        assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_OFFSET");
    }
    let r = t.get("/s/r2?offset=-1&offset=now", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .get("/s/r2?offset=9999999999999999_9999999999999999", &[])
        .await;
    assert_problem(&r, StatusCode::RANGE_NOT_SATISFIABLE, "OFFSET_BEYOND_TAIL");
    let r = t.get("/s/r2?live=maybe&offset=-1", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    t.put("/s/j", &[CT_JSON], r#"[{"x":1}]"#).await;
    let r = t.get("/s/j?offset=now", &[]).await;
    assert_eq!(r.text(), "[]");
    let r = t.get("/s/missing", &[]).await;
    assert_problem(&r, StatusCode::NOT_FOUND, "STREAM_NOT_FOUND");
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    Ok(())
}

/// PROTOCOL.md 10.1's `Cache-Control` for a chunk that is not final, at the default ages.
const PROTOCOL_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";

/// Which reads a shared cache may keep: a chunk at an explicit offset that ends before the tail,
/// or at the end of a closed stream, is immutable with a strong `ETag` (and so is its 304); the
/// tail chunk, `offset=-1`, no offset and a long-poll's `200` are cacheable for PROTOCOL.md
/// 10.1's minute; the empty read at an open tail is revalidated; `offset=now`, a long-poll's
/// `204`, HEAD and errors are never stored.
#[tokio::test]
async fn cache_control_follows_the_protocol() -> TestResult {
    const IMMUTABLE: &str = "public, max-age=31536000, immutable";
    let t = harness()?;
    t.text_stream("/s/c", "abcdef").await;
    let zero = "0000000000000000_0000000000000000";
    let r = t.get(&format!("/s/c?offset={zero}&max_bytes=2"), &[]).await;
    assert_eq!(
        (r.text().as_str(), r.h("cache-control")),
        ("ab", Some(IMMUTABLE))
    );
    let etag = r.h("etag").ok_or("etag")?.to_owned();
    assert!(etag.starts_with('"'), "a strong validator: {etag}");
    let again = t
        .get(
            &format!("/s/c?offset={zero}&max_bytes=2"),
            &[("if-none-match", &etag)],
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert_eq!(again.h("cache-control"), Some(IMMUTABLE));
    let next = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let tail = t.get(&format!("/s/c?offset={next}"), &[]).await;
    assert_eq!(tail.text(), "cdef");
    assert_eq!(
        tail.h("cache-control"),
        Some(PROTOCOL_CACHE),
        "the tail chunk is cacheable too"
    );
    let tail_tag = tail.h("etag").ok_or("etag")?.to_owned();
    let same = t
        .get(
            &format!("/s/c?offset={next}"),
            &[("if-none-match", &tail_tag)],
        )
        .await;
    assert_eq!(
        (same.status, same.h("cache-control")),
        (StatusCode::NOT_MODIFIED, Some(PROTOCOL_CACHE))
    );
    for path in ["/s/c", "/s/c?offset=-1&max_bytes=2"] {
        let r = t.get(path, &[]).await;
        assert_eq!(r.h("cache-control"), Some(PROTOCOL_CACHE), "{path}");
    }
    let end = tail.h("stream-next-offset").ok_or("offset")?.to_owned();
    let empty = t.get(&format!("/s/c?offset={end}"), &[]).await;
    assert_eq!(
        (empty.text().as_str(), empty.h("cache-control")),
        ("", Some("no-cache")),
        "the open tail's empty read shows new data and the closure at once"
    );
    assert_eq!(
        t.get("/s/c?offset=now", &[]).await.h("cache-control"),
        Some("no-store")
    );
    let lp = t
        .get(&format!("/s/c?offset={next}&live=long-poll"), &[])
        .await;
    assert_eq!(
        (lp.status, lp.h("cache-control")),
        (StatusCode::OK, Some(PROTOCOL_CACHE))
    );
    let lp = t
        .get(&format!("/s/c?offset={end}&live=long-poll"), &[])
        .await;
    assert_eq!(
        (lp.status, lp.h("cache-control")),
        (StatusCode::NO_CONTENT, Some("no-store"))
    );
    assert_eq!(
        t.head("/s/c", &[]).await.h("cache-control"),
        Some("no-store")
    );
    let gone = t
        .get("/s/none?offset=0000000000000000_0000000000000000", &[])
        .await;
    assert_eq!(
        (gone.status, gone.h("cache-control")),
        (StatusCode::NOT_FOUND, Some("no-store"))
    );

    t.post("/s/c", &[("stream-closed", "true")], "").await;
    let last = t.get(&format!("/s/c?offset={next}"), &[]).await;
    assert_eq!(last.h("stream-closed"), Some("true"));
    assert_eq!(
        last.h("cache-control"),
        Some(IMMUTABLE),
        "a closed stream's end is final"
    );
    let closed_tag = last.h("etag").ok_or("etag")?;
    assert_ne!(closed_tag, tail_tag, "the ETag varies with the closure");
    let revalidated = t
        .get(
            &format!("/s/c?offset={next}"),
            &[("if-none-match", &tail_tag)],
        )
        .await;
    assert_eq!(
        (revalidated.status, revalidated.h("stream-closed")),
        (StatusCode::OK, Some("true")),
        "a revalidation of the open tail chunk learns of the closure"
    );
    let eof = t.get(&format!("/s/c?offset={end}"), &[]).await;
    assert_eq!(
        (eof.text().as_str(), eof.h("cache-control")),
        ("", Some(IMMUTABLE))
    );
    Ok(())
}

/// The cacheable reads' ages come from the configuration (`stale-while-revalidate` left out at
/// zero), `private_cache` makes them `private`, and `cache_revalidate_tail` keeps caches off
/// the open tail: its reads `no-cache`, long-polls `no-store`, final chunks still immutable.
#[tokio::test]
async fn cache_control_is_configurable() -> TestResult {
    let short = ServerConfig {
        long_poll_timeout: Duration::from_millis(200),
        cache_max_age: Duration::from_secs(5),
        cache_stale_while_revalidate: Duration::ZERO,
        private_cache: true,
        ..ServerConfig::default()
    };
    let strict = ServerConfig {
        long_poll_timeout: Duration::from_millis(200),
        cache_revalidate_tail: true,
        ..ServerConfig::default()
    };
    for (config, tail, long_poll, fixed) in [
        (
            short,
            "private, max-age=5",
            "private, max-age=5",
            "private, max-age=31536000, immutable",
        ),
        (
            strict,
            "no-cache",
            "no-store",
            "public, max-age=31536000, immutable",
        ),
    ] {
        let t = harness_with(Options::default(), config)?;
        t.text_stream("/s/k", "abcdef").await;
        let zero = "0000000000000000_0000000000000000";
        for path in ["/s/k".to_owned(), format!("/s/k?offset={zero}")] {
            assert_eq!(
                t.get(&path, &[]).await.h("cache-control"),
                Some(tail),
                "{path}"
            );
        }
        let lp = t.get("/s/k?offset=-1&live=long-poll", &[]).await;
        assert_eq!(
            (lp.status, lp.h("cache-control")),
            (StatusCode::OK, Some(long_poll))
        );
        let r = t.get(&format!("/s/k?offset={zero}&max_bytes=2"), &[]).await;
        assert_eq!(r.h("cache-control"), Some(fixed));
    }
    Ok(())
}

/// HEAD reports content type, tail, incarnation and TTL without a body, never cached; 404 for a
/// missing stream.
#[tokio::test]
async fn head_reports_metadata_without_caching() -> TestResult {
    let t = harness()?;
    t.put("/s/h", &[CT_TEXT, ("stream-ttl", "3600")], "abc")
        .await;
    let r = t.head("/s/h", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    assert_eq!(r.h("stream-ttl"), Some("3600"));
    assert!(r.h("stream-next-offset").is_some() && r.h("stream-incarnation").is_some());
    assert_eq!(r.h("stream-closed"), None);
    assert!(r.body.is_empty());
    assert_eq!(t.head("/s/none", &[]).await.status, StatusCode::NOT_FOUND);
    Ok(())
}

/// A long-poll needs an offset, answers data at once with a cursor that only moves forward, times
/// out with 204 at the tail, is woken by an append, and answers a closed tail at once without a
/// cursor.
#[tokio::test]
async fn long_poll_waits_and_answers() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/lp", "x").await;
    let r = t.get("/s/lp?live=long-poll", &[]).await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "long-poll needs an offset"
    );
    let r = t.get("/s/lp?offset=-1&live=long-poll", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "x"));
    let cursor = r.h("stream-cursor").ok_or("cursor")?.parse::<u64>()?;
    let r = t
        .get(
            &format!("/s/lp?offset=-1&live=long-poll&cursor={cursor}"),
            &[],
        )
        .await;
    assert!(
        r.h("stream-cursor").ok_or("cursor")?.parse::<u64>()? > cursor,
        "jitter moves it forward"
    );

    let tail = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let started = std::time::Instant::now();
    let r = t
        .get(&format!("/s/lp?offset={tail}&live=long-poll"), &[])
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    assert!(
        r.h("stream-cursor")
            .is_some_and(|c| c.bytes().all(|b| b.is_ascii_digit()))
    );
    assert!(r.h("stream-incarnation").is_some());

    let r = t.get("/s/lp?offset=now&live=long-poll", &[]).await;
    assert_eq!(
        (r.status, r.h("stream-next-offset")),
        (StatusCode::NO_CONTENT, Some(tail.as_str()))
    );

    // An append wakes a waiting reader; from `offset=now`, its 200 is never stored.
    let app = t.app.clone();
    let uri = "/s/lp?offset=now&live=long-poll";
    let waiter = tokio::spawn(async move {
        let res = app
            .oneshot(
                Request::get(uri)
                    .header("host", "brook.test")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("infallible");
        let status = res.status();
        let cache = res.headers().get("cache-control").cloned();
        (
            status,
            cache,
            res.into_body().collect().await.expect("body").to_bytes(),
        )
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    t.post("/s/lp", &[CT_TEXT], "y").await;
    let (status, cache, body) = waiter.await?;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"y"[..]));
    assert_eq!(
        cache.as_ref().map(axum::http::HeaderValue::as_bytes),
        Some(&b"no-store"[..])
    );

    t.post("/s/lp", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/lp?offset=now&live=long-poll", &[]).await;
    assert_eq!(
        (r.status, r.h("stream-closed")),
        (StatusCode::NO_CONTENT, Some("true"))
    );
    assert_eq!(r.h("stream-cursor"), None);
    Ok(())
}

/// Reads of an open stream run on the async worker only over messages already checked against
/// their checksums: after a restart, a damaged byte is still found (500), never served.
#[tokio::test]
async fn reads_after_a_restart_still_check_checksums() -> TestResult {
    let dir = tempfile::tempdir()?;
    let payload = "0123456789".repeat(100);
    {
        let t = Harness {
            app: router(
                Store::open(dir.path(), Options::default())?,
                ServerConfig::default(),
            ),
            _dir: tempfile::tempdir()?,
        };
        t.put("/s/v", &[CT_TEXT], "").await;
        let r = t.send("POST", "/s/v", &[CT_TEXT], payload.clone()).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        // Read once while open: verified, so later reads may run inline.
        assert_eq!(t.get("/s/v?offset=-1", &[]).await.text(), payload);
    }
    let mut logs = Vec::new();
    // The stream's own directory (the store also keeps its system streams).
    let mut stack = vec![crate::fs::stream_dir(dir.path(), "s/v")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                logs.push(p);
            }
        }
    }
    assert_eq!(logs.len(), 1, "{logs:?}");
    let mut bytes = std::fs::read(&logs[0])?;
    bytes[500] ^= 0x55;
    std::fs::write(&logs[0], &bytes)?;
    let t = Harness {
        app: router(
            Store::open(dir.path(), Options::default())?,
            ServerConfig::default(),
        ),
        _dir: tempfile::tempdir()?,
    };
    for _ in 0..2 {
        let r = t.get("/s/v?offset=-1", &[]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
        assert!(!r.text().contains("0123456789"), "damaged data was served");
    }
    Ok(())
}

/// `boundary=message` (brook's extension for `brook mirror`): a byte stream's read ends on a
/// message boundary, so `max_bytes=1` reads exactly one message, and says so with
/// `Brook-Read-Boundary`; another value is 400.
#[tokio::test]
async fn boundary_message_reads_whole_byte_messages() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/m", "first").await;
    t.post("/s/m", &[CT_TEXT], "second").await;
    let r = t
        .get("/s/m?boundary=message&max_bytes=1&offset=-1", &[])
        .await;
    assert_eq!(
        (r.text().as_str(), r.h("brook-read-boundary")),
        ("first", Some("message"))
    );
    let next = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let r = t
        .get(
            &format!("/s/m?boundary=message&max_bytes=1&offset={next}"),
            &[],
        )
        .await;
    assert_eq!(r.text(), "second");
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    let plain = t.get("/s/m?max_bytes=1&offset=-1", &[]).await;
    assert_eq!(
        (plain.text().as_str(), plain.h("brook-read-boundary")),
        ("f", None)
    );
    let r = t.get("/s/m?boundary=byte&offset=-1", &[]).await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    Ok(())
}
