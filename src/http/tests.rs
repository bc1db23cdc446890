//! In-process router tests: every status and header the protocol, the seed and Ursula's routes
//! name, through `Router` + `oneshot` (no sockets).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::{Route, ServerConfig, parse_route, router};
use crate::headers::{self, StreamSeqConflict};
use crate::{Options, Store, StreamName};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Harness {
    app: Router,
    _dir: tempfile::TempDir,
}

struct Res {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Res {
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn code(&self) -> Option<String> {
        headers::problem_code(&self.body)
    }

    fn seq_conflict(&self) -> Option<StreamSeqConflict> {
        StreamSeqConflict::from_response(
            self.status.as_u16(),
            |n| self.h(n).map(str::to_owned),
            &self.body,
        )
    }
}

fn harness_with(
    options: Options,
    config: ServerConfig,
) -> Result<Harness, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options)?;
    Ok(Harness {
        app: router(store, config),
        _dir: dir,
    })
}

fn harness() -> Result<Harness, Box<dyn std::error::Error>> {
    let config = ServerConfig {
        long_poll_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    harness_with(Options::default(), config)
}

impl Harness {
    async fn send(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: impl Into<Body>,
    ) -> Res {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(uri);
        req = req.header("host", "brook.test");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = self
            .app
            .clone()
            .oneshot(req.body(body.into()).expect("request"))
            .await
            .expect("infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        Res {
            status,
            headers,
            body,
        }
    }

    async fn put(&self, uri: &str, headers: &[(&str, &str)], body: &'static str) -> Res {
        self.send("PUT", uri, headers, body).await
    }

    async fn post(&self, uri: &str, headers: &[(&str, &str)], body: &'static str) -> Res {
        self.send("POST", uri, headers, body).await
    }

    async fn get(&self, uri: &str, headers: &[(&str, &str)]) -> Res {
        self.send("GET", uri, headers, Body::empty()).await
    }

    async fn head(&self, uri: &str, headers: &[(&str, &str)]) -> Res {
        self.send("HEAD", uri, headers, Body::empty()).await
    }

    async fn text_stream(&self, uri: &str, body: &'static str) -> Res {
        let r = self.put(uri, &[("content-type", "text/plain")], body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r
    }
}

const CT_TEXT: (&str, &str) = ("content-type", "text/plain");
const CT_JSON: (&str, &str) = ("content-type", "application/json");

fn assert_problem(r: &Res, status: StatusCode, code: &str) {
    assert_eq!(r.status, status, "body: {}", r.text());
    assert_eq!(r.h("content-type"), Some("application/problem+json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("problem+json body");
    assert_eq!(v["status"], status.as_u16());
    assert_eq!(v["code"], code, "{v}");
    assert!(
        v["type"].is_string() && v["title"].is_string() && v["detail"].is_string(),
        "{v}"
    );
}

#[test]
fn routes_split_on_the_reserved_last_segments() {
    let n = |s: &str| StreamName::new(s).expect("name");
    assert_eq!(parse_route("/a/b").ok(), Some(Route::Stream(n("a/b"))));
    assert_eq!(
        parse_route("/a/b/snapshot").ok(),
        Some(Route::SnapshotLatest(n("a/b")))
    );
    assert_eq!(
        parse_route("/a/b/snapshot/x").ok(),
        Some(Route::SnapshotAt(n("a/b"), "x".into()))
    );
    assert_eq!(
        parse_route("/a/retention/x").ok(),
        Some(Route::Retention(n("a"), "x".into()))
    );
    assert_eq!(
        parse_route("/a/bootstrap").ok(),
        Some(Route::Bootstrap(n("a")))
    );
    assert_eq!(
        parse_route("/snapshots/x").ok(),
        Some(Route::Stream(n("snapshots/x")))
    );
    for bad in [
        "/",
        "/snapshot",
        "/snapshot/x",
        "/a/retention",
        "/a//b",
        "/a/../b",
        "/a/%2e%2e/b",
        "/a/%00",
    ] {
        assert!(parse_route(bad).is_err(), "{bad}");
    }
}

#[test]
fn headers_are_valid_names() {
    use axum::http::HeaderName;
    for n in [
        headers::STREAM_NEXT_OFFSET,
        headers::STREAM_UP_TO_DATE,
        headers::STREAM_CLOSED,
        headers::STREAM_CURSOR,
        headers::STREAM_SEQ,
        headers::STREAM_LAST_SEQ,
        headers::STREAM_INCARNATION,
        headers::STREAM_TTL,
        headers::STREAM_EXPIRES_AT,
        headers::STREAM_FORKED_FROM,
        headers::STREAM_FORK_OFFSET,
        headers::STREAM_FORK_SUB_OFFSET,
        headers::STREAM_SSE_DATA_ENCODING,
        headers::STREAM_EARLIEST_OFFSET,
        headers::STREAM_SNAPSHOT_OFFSET,
        headers::STREAM_SNAPSHOT_DIGEST,
        headers::STREAM_SNAPSHOT_MATCH,
        headers::PRODUCER_ID,
        headers::PRODUCER_EPOCH,
        headers::PRODUCER_SEQ,
        headers::PRODUCER_EXPECTED_SEQ,
        headers::PRODUCER_RECEIVED_SEQ,
        "x-accel-buffering",
    ] {
        assert!(HeaderName::from_lowercase(n.as_bytes()).is_ok(), "{n}");
    }
}

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

#[tokio::test]
async fn create_validates_ttl_expiry_and_fork_headers() -> TestResult {
    let t = harness()?;
    let at = headers::format_expires_at(std::time::SystemTime::now() + Duration::from_secs(3600));
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
    let mut req = Request::post("/s/q").header("content-type", "text/plain");
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

#[tokio::test]
async fn incarnations_guard_every_route() -> TestResult {
    let t = harness()?;
    let r = t.text_stream("/s/i", "old").await;
    let old = r.h("stream-incarnation").ok_or("incarnation")?.to_owned();
    for (m, h) in [
        ("GET", &[][..]),
        ("HEAD", &[][..]),
        ("POST", &[CT_TEXT][..]),
    ] {
        let mut hs = h.to_vec();
        hs.push(("stream-incarnation", old.as_str()));
        let r = t.send(m, "/s/i", &hs, Body::from("x")).await;
        assert!(r.status.is_success(), "{m}: {}", r.status);
        assert_eq!(r.h("stream-incarnation"), Some(old.as_str()), "{m}");
    }
    let r = t
        .send(
            "DELETE",
            "/s/i",
            &[("stream-incarnation", &old)],
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        r.h("stream-incarnation"),
        None,
        "DELETE carries no incarnation"
    );
    let r = t.text_stream("/s/i", "new").await;
    let new = r.h("stream-incarnation").ok_or("incarnation")?.to_owned();
    assert_ne!(old, new);
    for (m, h) in [
        ("GET", &[][..]),
        ("HEAD", &[][..]),
        ("POST", &[CT_TEXT][..]),
        ("DELETE", &[][..]),
        ("PUT", &[CT_TEXT][..]),
    ] {
        let mut hs = h.to_vec();
        hs.push(("stream-incarnation", old.as_str()));
        let r = t.send(m, "/s/i", &hs, Body::from("x")).await;
        assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{m}");
        assert_eq!(r.h("stream-incarnation"), Some(new.as_str()), "{m}");
        if m != "HEAD" {
            assert_eq!(r.code().as_deref(), Some("INCARNATION_MISMATCH"));
        }
    }
    assert_eq!(
        t.get("/s/i", &[]).await.text(),
        "new",
        "a refused write applies nothing"
    );
    let r = t
        .get("/s/gone", &[("stream-incarnation", old.as_str())])
        .await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "404 without the header stays 404"
    );
    let r = t
        .put(
            "/s/gone",
            &[CT_TEXT, ("stream-incarnation", old.as_str())],
            "",
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::PRECONDITION_FAILED,
        "a guarded PUT creates nothing"
    );
    assert_eq!(t.head("/s/gone", &[]).await.status, StatusCode::NOT_FOUND);
    let r = t
        .get("/s/i", &[("stream-incarnation", "not a token")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    Ok(())
}

#[tokio::test]
async fn catch_up_reads_etags_and_offsets() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/r", "first").await;
    let r = t.get("/s/r", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "first"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    assert_eq!(r.h("content-length"), Some("5"));
    assert!(
        r.h("cache-control")
            .is_some_and(|c| c.contains("max-age=60"))
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

    // An append wakes a waiting reader.
    let app = t.app.clone();
    let uri = format!("/s/lp?offset={tail}&live=long-poll");
    let waiter = tokio::spawn(async move {
        let res = app
            .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = res.status();
        (
            status,
            res.into_body().collect().await.expect("body").to_bytes(),
        )
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    t.post("/s/lp", &[CT_TEXT], "y").await;
    let (status, body) = waiter.await?;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"y"[..]));

    t.post("/s/lp", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/lp?offset=now&live=long-poll", &[]).await;
    assert_eq!(
        (r.status, r.h("stream-closed")),
        (StatusCode::NO_CONTENT, Some("true"))
    );
    assert_eq!(r.h("stream-cursor"), None);
    Ok(())
}

fn events(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    text.split("\n\n")
        .filter_map(|block| {
            let mut kind = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(k) = line.strip_prefix("event: ") {
                    kind = Some(k.to_owned());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
                }
            }
            kind.map(|k| (k, data.join("\n")))
        })
        .collect()
}

#[tokio::test]
async fn sse_pairs_data_with_control_and_ends_on_close() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/e", "line1\nline2").await;
    t.post("/s/e", &[CT_TEXT], " more").await;
    t.post("/s/e", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/e?live=sse", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "SSE needs an offset");
    let r = t.get("/s/e?offset=-1&live=sse", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.h("content-type"), Some("text/event-stream"));
    assert!(r.h("cache-control").is_some_and(|c| c.contains("no-cache")));
    assert_eq!(r.h("stream-sse-data-encoding"), None);
    assert_eq!(r.h("content-length"), None);
    let ev = events(&r.body);
    assert_eq!(ev.first().map(|e| e.0.as_str()), Some("data"));
    assert_eq!(ev[0].1, "line1\nline2 more");
    let last: serde_json::Value = serde_json::from_str(&ev.last().ok_or("events")?.1)?;
    assert_eq!(last["streamClosed"], true);
    assert!(last.get("streamCursor").is_none());
    for (i, e) in ev.iter().enumerate() {
        if e.0 == "data" {
            assert_eq!(ev.get(i + 1).map(|e| e.0.as_str()), Some("control"));
        }
    }

    t.put(
        "/s/b",
        &[("content-type", "application/octet-stream")],
        "Hello",
    )
    .await;
    t.post("/s/b", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/b?offset=-1&live=sse", &[]).await;
    assert_eq!(r.h("stream-sse-data-encoding"), Some("base64"));
    let ev = events(&r.body);
    assert_eq!(ev[0], ("data".to_owned(), "SGVsbG8=".to_owned()));
    let r = t.get("/s/none?offset=-1&live=sse", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test]
async fn sse_ends_after_its_lifetime() -> TestResult {
    let config = ServerConfig {
        sse_max_duration: Duration::from_millis(150),
        ..ServerConfig::default()
    };
    let t = harness_with(Options::default(), config)?;
    t.put("/s/e", &[CT_JSON], r#"[{"n":1}]"#).await;
    let r = t.get("/s/e?offset=now&live=sse", &[]).await;
    let ev = events(&r.body);
    assert_eq!(ev.len(), 1, "{ev:?}");
    let c: serde_json::Value = serde_json::from_str(&ev[0].1)?;
    assert_eq!(c["upToDate"], true);
    assert!(
        c["streamCursor"]
            .as_str()
            .is_some_and(|s| s.parse::<u64>().is_ok())
    );
    Ok(())
}

/// An idle SSE connection gets keep-alive comments every `sse_keepalive`, data still arrives
/// between them, and the connection ends at its lifetime.
#[tokio::test]
async fn sse_keeps_idle_connections_alive_and_still_delivers() -> TestResult {
    let config = ServerConfig {
        sse_keepalive: Duration::from_millis(60),
        sse_max_duration: Duration::from_millis(700),
        ..ServerConfig::default()
    };
    let t = std::sync::Arc::new(harness_with(Options::default(), config)?);
    t.text_stream("/s/k", "").await;
    let writer = t.clone();
    let append = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        writer.post("/s/k", &[CT_TEXT], "late").await.status
    });
    let started = std::time::Instant::now();
    let r = t.get("/s/k?offset=-1&live=sse", &[]).await;
    let lasted = started.elapsed();
    assert_eq!(append.await?, StatusCode::NO_CONTENT);
    let text = r.text();
    let data = text.find("data:late").expect("the append is delivered");
    let before = text[..data].matches(": keep-alive").count();
    let after = text[data..].matches(": keep-alive").count();
    assert!(
        before >= 2,
        "keep-alives while idle before the append: {text}"
    );
    assert!(
        after >= 2,
        "keep-alives while idle after the append: {text}"
    );
    assert!(
        lasted >= Duration::from_millis(650),
        "ended early: {lasted:?}"
    );
    assert!(
        lasted < Duration::from_secs(5),
        "did not end at its lifetime: {lasted:?}"
    );
    Ok(())
}

#[tokio::test]
async fn delete_and_soft_delete() -> TestResult {
    let t = harness()?;
    assert_eq!(
        t.send("DELETE", "/s/none", &[], Body::empty()).await.status,
        StatusCode::NOT_FOUND
    );
    t.text_stream("/s/src", "data").await;
    let r = t
        .put("/s/fork", &[CT_TEXT, ("stream-forked-from", "/s/src")], "")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        t.send("DELETE", "/s/src", &[], Body::empty()).await.status,
        StatusCode::NO_CONTENT
    );
    assert_problem(&t.get("/s/src", &[]).await, StatusCode::GONE, "STREAM_GONE");
    assert_eq!(t.head("/s/src", &[]).await.status, StatusCode::GONE);
    assert_eq!(
        t.post("/s/src", &[CT_TEXT], "x").await.status,
        StatusCode::GONE
    );
    assert_eq!(
        t.send("DELETE", "/s/src", &[], Body::empty()).await.status,
        StatusCode::GONE
    );
    assert_eq!(
        t.put("/s/src", &[CT_TEXT], "").await.status,
        StatusCode::CONFLICT
    );
    let r = t
        .put("/s/fork2", &[CT_TEXT, ("stream-forked-from", "/s/src")], "")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(t.get("/s/fork?offset=-1", &[]).await.text(), "data");
    Ok(())
}

#[tokio::test]
async fn bad_requests_methods_limits_and_cors() -> TestResult {
    let options = Options::default().max_append_bytes(16);
    let t = harness_with(options, ServerConfig::default())?;
    t.text_stream("/s/l", "").await;
    let r = t.post("/s/l", &[CT_TEXT], "0123456789abcdefXYZ").await;
    assert_problem(&r, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE");
    // Without a Content-Length, the body is refused once it passes the limit.
    let chunks = futures_util::stream::iter(
        (0..3).map(|_| Ok::<_, std::io::Error>(Bytes::from("0123456789"))),
    );
    let r = t
        .send("POST", "/s/l", &[CT_TEXT], Body::from_stream(chunks))
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(t.get("/s/l", &[]).await.text(), "");

    let r = t.send("PATCH", "/s/l", &[], Body::empty()).await;
    assert_problem(&r, StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED");
    assert!(r.h("allow").is_some_and(|a| a.contains("POST")));
    for bad in ["/a//b", "/a/../b", "/a/%2e%2e", "/a/%00b", "/", "/a/"] {
        let r = t.put(bad, &[CT_TEXT], "").await;
        assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_STREAM_NAME");
    }
    for reserved in ["/s/x/snapshot", "/s/x/bootstrap"] {
        let r = t.put(reserved, &[CT_TEXT], "").await;
        assert_problem(&r, StatusCode::BAD_REQUEST, "INVALID_STREAM_NAME");
    }
    let r = t.send("DELETE", "/s/x/bootstrap", &[], Body::empty()).await;
    assert_eq!(
        r.status,
        StatusCode::METHOD_NOT_ALLOWED,
        "a reserved route, not a stream"
    );

    let r = t
        .send(
            "OPTIONS",
            "/s/l",
            &[
                ("origin", "https://example.com"),
                ("access-control-request-method", "GET"),
                ("access-control-request-headers", "if-none-match"),
            ],
            Body::empty(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(
        r.h("access-control-allow-headers")
            .is_some_and(|h| h.to_ascii_lowercase().contains("if-none-match"))
    );
    assert!(
        r.h("access-control-allow-methods")
            .is_some_and(|h| h.contains("DELETE"))
    );
    assert_eq!(r.h("access-control-allow-origin"), Some("*"));
    let r = t.get("/s/l", &[]).await;
    let exposed = r
        .h("access-control-expose-headers")
        .ok_or("expose")?
        .to_ascii_lowercase();
    for h in [
        "stream-next-offset",
        "stream-last-seq",
        "stream-incarnation",
        "producer-expected-seq",
        "etag",
    ] {
        assert!(exposed.contains(h), "{h}");
    }
    // A browser's append (it sends Origin) gets the CORS headers; a server-side client's does
    // not need them. The security headers go on every response.
    let r = t
        .post("/s/l", &[CT_TEXT, ("origin", "https://app.example")], "x")
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(r.h("access-control-allow-origin"), Some("*"));
    assert!(r.h("access-control-expose-headers").is_some());
    let r = t.post("/s/l", &[CT_TEXT], "y").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(r.h("access-control-allow-origin"), None);
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.h("cross-origin-resource-policy"), Some("cross-origin"));
    Ok(())
}

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

#[tokio::test]
async fn snapshot_bodies_over_the_limit_are_refused() -> TestResult {
    let options = Options::default().max_snapshot_bytes(8);
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

#[tokio::test]
async fn sse_text_events_never_split_a_character() -> TestResult {
    let t = harness()?;
    t.text_stream("/s/u", "aéb").await;
    t.post("/s/u", &[("stream-closed", "true")], "").await;
    let r = t.get("/s/u?offset=-1&live=sse&max_bytes=2", &[]).await;
    let data: Vec<String> = events(&r.body)
        .into_iter()
        .filter(|e| e.0 == "data")
        .map(|e| e.1)
        .collect();
    assert_eq!(data, ["a", "é", "b"]);
    Ok(())
}

/// Reads from `conn` until `needle` shows up (or EOF), returning everything read.
async fn read_until(conn: &mut tokio::net::TcpStream, needle: &str) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&seen).contains(needle) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test]
async fn serve_over_a_socket_and_shut_down_with_live_readers() -> TestResult {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(super::serve(
        listener,
        store.clone(),
        ServerConfig::default(),
        async move {
            let _ = stopped.await;
        },
    ));

    let mut put = tokio::net::TcpStream::connect(addr).await?;
    put.write_all(b"PUT /s/live HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi").await?;
    let head = read_until(&mut put, "\r\n\r\n").await?;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("location: http://t/s/live"),
        "{head}"
    );

    let mut sse = tokio::net::TcpStream::connect(addr).await?;
    sse.write_all(b"GET /s/live?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;
    let seen = read_until(&mut sse, "upToDate").await?;
    assert!(
        seen.contains("text/event-stream") && seen.contains("data:hi"),
        "{seen}"
    );
    let mut poll = tokio::net::TcpStream::connect(addr).await?;
    poll.write_all(b"GET /s/live?offset=now&live=long-poll HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;

    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let _ = stop.send(());
    let polled =
        tokio::time::timeout(Duration::from_secs(5), read_until(&mut poll, "\r\n\r\n")).await??;
    assert!(
        polled.starts_with("HTTP/1.1 204"),
        "a waiting long-poll answers at shutdown: {polled}"
    );
    tokio::time::timeout(Duration::from_secs(5), read_until(&mut sse, "\u{0}")).await??;
    drop((put, poll));
    tokio::time::timeout(Duration::from_secs(5), server).await???;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    store.shutdown()?;
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
    let mut stack = vec![dir.path().join("streams")];
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
