//! PUT of a stream: create, idempotent re-create, expiry and fork headers.

use super::*;

/// A first PUT creates (201, `Location`), the same PUT again is 200, another configuration 409.
#[tokio::test]
async fn create_answers_201_then_200_then_409() -> TestResult {
    let t = harness()?;
    let r = t.put("/v1/stream/a", &[CT_TEXT], "hi").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.h("location"), Some("http://brook.test/v1/stream/a"));
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert!(r.h("stream-next-offset").is_some_and(|o| o.len() == 33));
    let inc = r.h("stream-incarnation").ok_or("incarnation")?.to_owned();
    assert_eq!(r.h("stream-closed"), None);
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.h("cross-origin-resource-policy"), Some("cross-origin"));

    let r = t
        .put("/v1/stream/a", &[("content-type", "TEXT/PLAIN")], "")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.h("location"), None);
    assert_eq!(r.h("stream-incarnation"), Some(inc.as_str()));

    let r = t.put("/v1/stream/a", &[CT_JSON], "").await;
    assert_problem(&r, StatusCode::CONFLICT, "STREAM_CONFIG_MISMATCH");

    let r = t
        .put(
            "/v1/stream/c",
            &[CT_TEXT, ("stream-closed", "true")],
            "final",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.h("stream-closed"), Some("true"));

    let r = t.put("/v1/stream/d", &[], "").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.h("content-type"), Some("application/octet-stream"));
    Ok(())
}

/// `Stream-TTL` and `Stream-Expires-At` (never both) and the fork headers are validated; valid ones
/// create the stream, or the fork with its inherited prefix.
#[tokio::test]
async fn create_validates_ttl_expiry_and_fork_headers() -> TestResult {
    let t = harness()?;
    let at = headers::format_expires_at(std::time::SystemTime::now() + Duration::from_hours(1));
    let r = t
        .put(
            "/s/both",
            &[CT_TEXT, ("stream-ttl", "60"), ("stream-expires-at", &at)],
            "",
        )
        .await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    for bad in ["abc", "-1", "00060", "+60", "60.5", "1e3"] {
        let r = t.put("/s/ttl", &[CT_TEXT, ("stream-ttl", bad)], "").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let r = t
        .put(
            "/s/exp",
            &[CT_TEXT, ("stream-expires-at", "not-a-timestamp")],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .put("/s/exp", &[CT_TEXT, ("stream-expires-at", &at)], "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let h = t.head("/s/exp", &[]).await;
    assert_eq!(h.h("stream-expires-at"), Some(at.as_str()));
    let r = t
        .put("/s/ttl", &[CT_TEXT, ("stream-ttl", "3600")], "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(t.head("/s/ttl", &[]).await.h("stream-ttl"), Some("3600"));
    let r = t
        .put("/s/ttl", &[CT_TEXT, ("stream-ttl", "7200")], "")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);

    let r = t
        .put("/s/f", &[CT_TEXT, ("stream-fork-sub-offset", "0")], "")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .put(
            "/s/f",
            &[
                CT_TEXT,
                ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = t
        .put("/s/f", &[CT_TEXT, ("stream-forked-from", "/s/missing")], "")
        .await;
    assert_problem(&r, StatusCode::NOT_FOUND, "FORK_SOURCE_NOT_FOUND");
    t.text_stream("/s/src", "hello").await;
    let r = t
        .put(
            "/s/f",
            &[
                CT_TEXT,
                ("stream-forked-from", "/s/src"),
                ("stream-fork-sub-offset", "1"),
            ],
            "",
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "sub-offset without an offset"
    );
    let r = t
        .put(
            "/s/f",
            &[
                CT_TEXT,
                ("stream-forked-from", "/s/src"),
                ("stream-fork-offset", "garbage"),
            ],
            "",
        )
        .await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_FORK_OFFSET");
    let beyond = "9999999999999999_9999999999999999";
    let r = t
        .put(
            "/s/f",
            &[
                CT_TEXT,
                ("stream-forked-from", "/s/src"),
                ("stream-fork-offset", beyond),
            ],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let r = t
        .put(
            "/s/f",
            &[
                ("stream-forked-from", "/s/src"),
                ("stream-fork-offset", "0000000000000000_0000000000000000"),
                ("stream-fork-sub-offset", "3"),
            ],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert_eq!(r.h("stream-forked-from"), None);
    assert_eq!(t.get("/s/f?offset=-1", &[]).await.text(), "hel");
    Ok(())
}

/// `--portable-names`: only `bucket/stream` names an Ursula-style server accepts are created
/// (400 `NAME_NOT_PORTABLE` otherwise, creating nothing), and forks are refused
/// (`FORK_NOT_PORTABLE`); without it every valid name is created.
#[tokio::test]
async fn portable_names_refuse_what_could_not_move() -> TestResult {
    let config = ServerConfig {
        portable_names: true,
        ..ServerConfig::default()
    };
    let t = harness_with(Options::default(), config)?;
    for bad in [
        "/chat",
        "/abc/x",
        "/Chat/x",
        "/chat/a/b",
        "/chat/streams",
        "/chat/a..b",
    ] {
        let r = t.put(bad, &[CT_TEXT], "").await;
        assert_problem(&r, StatusCode::BAD_REQUEST, "NAME_NOT_PORTABLE");
        assert_eq!(
            t.head(bad, &[]).await.status,
            StatusCode::NOT_FOUND,
            "{bad}"
        );
    }
    let r = t.put("/chat/room-1", &[CT_TEXT], "hi").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = t
        .put(
            "/chat/fork",
            &[
                ("stream-forked-from", "/chat/room-1"),
                ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ],
            "",
        )
        .await;
    assert_problem(&r, StatusCode::BAD_REQUEST, "FORK_NOT_PORTABLE");
    let open = harness()?;
    assert_eq!(
        open.put("/chat/a/b", &[CT_TEXT], "").await.status,
        StatusCode::CREATED
    );
    Ok(())
}
