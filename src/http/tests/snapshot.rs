//! Snapshots, retention and bootstrap.

use super::*;

/// Publishing, reading and refusing snapshots; retention up to the latest snapshot; bootstrap before
/// and after a snapshot.
#[tokio::test]
async fn snapshots_retention_and_bootstrap() -> TestResult {
    let t = harness()?;
    t.put("/s/sn", &[CT_JSON], r#"[{"n":1},{"n":2}]"#).await;
    let r = t.post("/s/sn", &[CT_JSON], r#"{"n":3}"#).await;
    let tail = r.h("stream-next-offset").ok_or("offset")?.to_owned();
    let head = t.get("/s/sn?offset=-1&max_bytes=1", &[]).await;
    let after_first = head.h("stream-next-offset").ok_or("offset")?.to_owned();

    let r = t.get("/s/sn/snapshot", &[]).await;
    assert_problem(&r, StatusCode::NOT_FOUND, "SNAPSHOT_NOT_FOUND");
    let r = t.get("/s/sn/bootstrap", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.h("stream-snapshot-offset"), Some("-1"));
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    let ct = r.h("content-type").ok_or("content-type")?.to_owned();
    let boundary = ct
        .strip_prefix("multipart/mixed; boundary=")
        .ok_or("multipart")?
        .to_owned();
    let body = r.text();
    assert_eq!(
        body.matches(&format!("--{boundary}\r\n")).count(),
        4,
        "{body}"
    );
    assert!(body.ends_with(&format!("--{boundary}--\r\n")));
    assert!(
        body.contains("Content-Type: application/json\r\n\r\n{\"n\":3}\r\n"),
        "{body}"
    );

    let snap = format!("/s/sn/snapshot/{after_first}");
    let r = t
        .put(&snap, &[("content-type", "application/x-state")], "STATE-1")
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let digest = r.h("stream-snapshot-digest").ok_or("digest")?.to_owned();
    assert!(digest.starts_with("sha256:"));
    assert_eq!(r.h("stream-snapshot-offset"), Some(after_first.as_str()));
    assert!(r.h("stream-incarnation").is_some());
    let r = t
        .put(&snap, &[("content-type", "application/x-state")], "STATE-1")
        .await;
    assert_eq!(
        (r.status, r.h("stream-snapshot-digest")),
        (StatusCode::NO_CONTENT, Some(digest.as_str()))
    );
    let r = t
        .put(&snap, &[("content-type", "application/x-state")], "OTHER")
        .await;
    assert_problem(&r, StatusCode::CONFLICT, "SNAPSHOT_CONFLICT");
    let r = t.put("/s/sn/snapshot/garbage", &[], "x").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .put("/s/sn/snapshot/9999999999999999_9999999999999999", &[], "x")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);

    let r = t.get("/s/sn/snapshot", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "STATE-1"));
    assert_eq!(r.h("content-type"), Some("application/x-state"));
    assert_eq!(
        r.h("content-location"),
        Some(format!("http://brook.test{snap}").as_str())
    );
    assert_eq!(r.h("stream-snapshot-digest"), Some(digest.as_str()));
    assert_eq!(r.h("stream-snapshot-offset"), Some(after_first.as_str()));
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    let r = t.get(&snap, &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "STATE-1"));
    assert_eq!(r.h("content-type"), Some("application/x-state"));
    assert_eq!(r.h("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(r.h("stream-snapshot-offset"), Some(after_first.as_str()));
    assert_eq!(
        t.head("/s/sn", &[]).await.h("stream-snapshot-offset"),
        Some(after_first.as_str())
    );

    let r = t.send("DELETE", &snap, &[], Body::empty()).await;
    assert_problem(&r, StatusCode::CONFLICT, "SNAPSHOT_DELETE_REFUSED");
    let r = t
        .send(
            "DELETE",
            "/s/sn/snapshot/0000000000000000_0000000000000000",
            &[],
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let r = t.get("/s/sn/bootstrap", &[]).await;
    assert_eq!(r.h("stream-snapshot-offset"), Some(after_first.as_str()));
    let body = r.text();
    assert!(
        body.contains("Content-Type: application/x-state\r\n\r\nSTATE-1\r\n"),
        "{body}"
    );
    assert!(
        !body.contains("{\"n\":1}") && body.contains("{\"n\":2}") && body.contains("{\"n\":3}"),
        "{body}"
    );
    assert_eq!(
        t.get("/s/sn/bootstrap?live=sse", &[]).await.status,
        StatusCode::BAD_REQUEST
    );

    let r = t.put(&format!("/s/sn/retention/{tail}"), &[], "").await;
    assert_problem(&r, StatusCode::CONFLICT, "RETENTION_BEYOND_SNAPSHOT");
    let r = t
        .put(&format!("/s/sn/retention/{after_first}"), &[], "")
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let r = t
        .get("/s/sn?offset=0000000000000000_0000000000000000", &[])
        .await;
    assert_problem(&r, StatusCode::GONE, "OFFSET_GONE");
    assert_eq!(r.h("stream-earliest-offset"), Some(after_first.as_str()));
    let r = t.get(&format!("/s/sn?offset={after_first}"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);

    let other = t.put("/s/other", &[CT_TEXT], "x").await;
    let inc = other
        .h("stream-incarnation")
        .ok_or("incarnation")?
        .to_owned();
    for uri in ["/s/sn/bootstrap", snap.as_str(), "/s/sn/snapshot"] {
        let r = t.get(uri, &[("stream-incarnation", &inc)]).await;
        assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{uri}");
    }
    let r = t
        .put(
            &format!("/s/sn/retention/{after_first}"),
            &[("stream-incarnation", &inc)],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    Ok(())
}

/// A snapshot body over the limit is 413, declared or streamed, and nothing is published.
#[tokio::test]
async fn snapshot_bodies_over_the_limit_are_refused() -> TestResult {
    let options = Options::default().with_max_snapshot_bytes(8);
    let t = harness_with(options, ServerConfig::default())?;
    t.text_stream("/s/x", "abc").await;
    let r = t
        .put(
            "/s/x/snapshot/0000000000000001_0000000000000003",
            &[],
            "way too large",
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let chunks =
        futures_util::stream::iter((0..3).map(|_| Ok::<_, std::io::Error>(Bytes::from("0123456"))));
    let r = t
        .send(
            "PUT",
            "/s/x/snapshot/0000000000000001_0000000000000003",
            &[],
            Body::from_stream(chunks),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        t.get("/s/x/snapshot", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    Ok(())
}
