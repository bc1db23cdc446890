//! POST of a stream: append statuses, Stream-Seq, idempotent producers, closing.

use super::*;

/// An append is 204 with the new tail; a missing stream, another content type, a missing type
/// and bad bodies (empty, invalid or empty-array JSON) are refused with their codes.
#[tokio::test]
async fn append_statuses_and_headers() -> TestResult {
    let t = harness()?;
    let r = t.post("/s/missing", &[CT_TEXT], "x").await;
    assert_problem(&r, StatusCode::NOT_FOUND, "STREAM_NOT_FOUND");
    t.text_stream("/s/a", "").await;
    let r = t.post("/s/a", &[CT_TEXT], "one").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let first = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    assert!(r.h("stream-incarnation").is_some());
    let r = t.post("/s/a", &[CT_TEXT], "two").await;
    assert!(r.h("stream-next-offset").ok_or("offset")? > first.as_str());

    let r = t.post("/s/a", &[CT_JSON], "{}").await;
    assert_problem(&r, StatusCode::CONFLICT, "CONTENT_TYPE_MISMATCH");
    assert_eq!(r.h("stream-last-seq"), None);
    assert!(r.seq_conflict().is_none());
    let r = t.post("/s/a", &[], "no type").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t.post("/s/a", &[CT_TEXT], "").await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "EMPTY_BODY");
    let r = t.post("/s/a", &[("content-type", "nonsense")], "x").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    t.put("/s/j", &[CT_JSON], "").await;
    let r = t.post("/s/j", &[CT_JSON], "[]").await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "EMPTY_JSON_ARRAY");
    let r = t.post("/s/j", &[CT_JSON], "{ invalid").await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_JSON");
    let r = t.post("/s/j", &[CT_JSON], r#"[{"a":1},[2]]"#).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = t.get("/s/j", &[]).await;
    assert_eq!(r.h("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v, serde_json::json!([{"a":1},[2]]));
    Ok(())
}

/// Stream-Seq is compared bytewise; a conflict is a 409 the client tells from other 409s.
#[tokio::test]
async fn stream_seq_follows_the_seed() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/q", "").await;
    let r = t
        .post(
            "/s/q",
            &[CT_TEXT, ("stream-seq", "00000000000000000000")],
            "a",
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let tail = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    // Bytewise: "10" < "9".
    let r = t
        .post(
            "/s/q",
            &[CT_TEXT, ("stream-seq", "00000000000000000000")],
            "b",
        )
        .await;
    assert_problem(&r, StatusCode::CONFLICT, "STREAM_SEQ_CONFLICT");
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(r.h("stream-last-seq"), Some("00000000000000000000"));
    assert_eq!(r.h("stream-closed"), None);
    assert_eq!(r.h("producer-expected-seq"), None);
    let c = r.seq_conflict().ok_or("a Stream-Seq conflict")?;
    assert_eq!(c.last_seq, "00000000000000000000");
    assert_eq!(c.tail.as_deref(), Some(tail.as_str()));

    // Not printable ASCII: ignored, not checked and not stored.
    let r = t.send("POST", "/s/q", &[CT_TEXT], Body::from("c")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let mut req = Request::post("/s/q")
        .header("host", "brook.test")
        .header("content-type", "text/plain");
    req = req.header(
        "stream-seq",
        axum::http::HeaderValue::from_bytes(b"\xff\xfe")?,
    );
    let res = t.app.clone().oneshot(req.body(Body::from("d"))?).await?;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let long = "9".repeat(257);
    let r = t
        .send(
            "POST",
            "/s/q",
            &[CT_TEXT, ("stream-seq", &long)],
            Body::from("e"),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .post(
            "/s/q",
            &[CT_TEXT, ("stream-seq", "00000000000000000001")],
            "f",
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(t.get("/s/q", &[]).await.text(), "acdf");

    // A creating PUT seeds the value unchecked.
    let r = t
        .put("/s/seeded", &[CT_TEXT, ("stream-seq", "5")], "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = t
        .post("/s/seeded", &[CT_TEXT, ("stream-seq", "4")], "x")
        .await;
    assert_eq!(r.h("stream-last-seq"), Some("5"));
    Ok(())
}

/// Producer duplicates, stale epochs, new epochs and sequence gaps answer as the seed says.
#[tokio::test]
async fn idempotent_producers() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/p", "").await;
    let p = |e: &'static str, s: &'static str| {
        [
            CT_TEXT,
            ("producer-id", "w"),
            ("producer-epoch", e),
            ("producer-seq", s),
        ]
    };
    let r = t.post("/s/p", &p("0", "0"), "a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        (r.h("producer-epoch"), r.h("producer-seq")),
        (Some("0"), Some("0"))
    );
    let tail0 = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let r = t.post("/s/p", &p("0", "0"), "a").await;
    assert_eq!(
        r.status,
        StatusCode::NO_CONTENT,
        "a retry of the newest write is a duplicate"
    );
    assert_eq!(r.h("stream-next-offset"), Some(tail0.as_str()));
    assert_eq!(r.h("producer-epoch"), Some("0"));
    let r = t.post("/s/p", &p("0", "1"), "b").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t.post("/s/p", &p("0", "0"), "a").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.h("stream-next-offset"),
        None,
        "an older write's repeat carries no offset"
    );

    let r = t.post("/s/p", &p("0", "5"), "gap").await;
    assert_problem(&r, StatusCode::CONFLICT, "PRODUCER_SEQ_GAP");
    assert_eq!(
        (r.h("producer-expected-seq"), r.h("producer-received-seq")),
        (Some("2"), Some("5"))
    );
    assert_eq!(r.h("stream-last-seq"), None);
    let r = t.post("/s/p", &p("1", "3"), "x").await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "PRODUCER_EPOCH_SEQ_NOT_ZERO");
    let r = t.post("/s/p", &p("1", "0"), "c").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t.post("/s/p", &p("0", "2"), "zombie").await;
    assert_problem(&r, StatusCode::FORBIDDEN, "PRODUCER_EPOCH_STALE");
    assert_eq!(r.h("producer-epoch"), Some("1"));

    let r = t.post("/s/p", &[CT_TEXT, ("producer-id", "w")], "x").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .post(
            "/s/p",
            &[
                CT_TEXT,
                ("producer-id", ""),
                ("producer-epoch", "0"),
                ("producer-seq", "0"),
            ],
            "x",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .post(
            "/s/p",
            &[
                CT_TEXT,
                ("producer-id", "w"),
                ("producer-epoch", "1e3"),
                ("producer-seq", "0"),
            ],
            "x",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(t.get("/s/p", &[]).await.text(), "abc");

    // Producer dedup runs before the Stream-Seq check (the seed).
    t.text_stream("/s/ps", "").await;
    let h = [
        CT_TEXT,
        ("producer-id", "o"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
        ("stream-seq", "001"),
    ];
    assert_eq!(t.post("/s/ps", &h, "fact").await.status, StatusCode::OK);
    assert_eq!(
        t.post("/s/ps", &h, "fact").await.status,
        StatusCode::NO_CONTENT
    );
    Ok(())
}

/// Closing (a close-only request ignores its Content-Type), closing again, appending to a closed
/// stream (409 with its tail), reads of a closed stream, and a producer's closing append retried.
#[tokio::test]
async fn closing() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/c", "data").await;
    let r = t
        .post("/s/c", &[("stream-closed", "true"), CT_JSON], "")
        .await;
    assert_eq!(
        r.status,
        StatusCode::NO_CONTENT,
        "a close-only request ignores its Content-Type"
    );
    assert_eq!(r.h("stream-closed"), Some("true"));
    let tail = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let r = t.post("/s/c", &[("stream-closed", "true")], "").await;
    assert_eq!(
        (r.status, r.h("stream-closed")),
        (StatusCode::NO_CONTENT, Some("true"))
    );
    let r = t.post("/s/c", &[CT_TEXT], "more").await;
    assert_problem(&r, StatusCode::CONFLICT, "STREAM_CLOSED");
    assert_eq!(r.h("stream-closed"), Some("true"));
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(r.h("stream-last-seq"), None);
    let r = t
        .post("/s/c", &[CT_TEXT, ("stream-closed", "yes")], "x")
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "a non-true Stream-Closed is absent"
    );
    assert_eq!(t.head("/s/c", &[]).await.h("stream-closed"), Some("true"));

    let r = t.get("/s/c", &[]).await;
    assert_eq!(
        (r.text().as_str(), r.h("stream-closed")),
        ("data", Some("true"))
    );
    let r = t.get(&format!("/s/c?offset={tail}"), &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, ""));
    assert_eq!(
        (r.h("stream-closed"), r.h("stream-up-to-date")),
        (Some("true"), Some("true"))
    );
    let r = t.get("/s/c?offset=now", &[]).await;
    assert_eq!(
        (r.h("stream-closed"), r.h("stream-up-to-date")),
        (Some("true"), Some("true"))
    );

    t.text_stream("/s/pc", "").await;
    let h = [
        CT_TEXT,
        ("stream-closed", "true"),
        ("producer-id", "w"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
    ];
    let r = t.post("/s/pc", &h, "final").await;
    assert_eq!(
        (r.status, r.h("stream-closed")),
        (StatusCode::OK, Some("true"))
    );
    let r = t.post("/s/pc", &h, "final").await;
    assert_eq!(
        (r.status, r.h("stream-closed")),
        (StatusCode::NO_CONTENT, Some("true"))
    );
    Ok(())
}
