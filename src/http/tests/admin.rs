//! The operations routes under `/__brook/`: health, metrics, and that they are refused on
//! the admin-only paths they do not serve.

use super::*;

/// A harness whose store the test keeps a handle on.
fn harness_and_store() -> Result<(Harness, Store), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let h = Harness {
        app: router(store.clone(), ServerConfig::default()),
        _dir: dir,
    };
    Ok((h, store))
}

#[tokio::test]
async fn live_and_ready_answer_200_on_a_healthy_store() -> TestResult {
    let h = harness()?;
    let live = h.get("/__brook/live", &[]).await;
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(live.text(), r#"{"status":"live"}"#);
    let ready = h.get("/__brook/ready", &[]).await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.h("cache-control"), Some("no-store"));
    Ok(())
}

#[tokio::test]
async fn a_poisoned_shard_makes_the_server_not_ready() -> TestResult {
    let (h, store) = harness_and_store()?;
    store.poison_for_test();
    let ready = h.get("/__brook/ready", &[]).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.code().as_deref(), Some("POISONED"));
    // Still live: the process answers; restarting it is the cure.
    assert_eq!(h.get("/__brook/live", &[]).await.status, StatusCode::OK);
    let m = h.get("/__brook/metrics", &[]).await.text();
    assert!(m.contains("\nbrook_poisoned_shards 1\n"), "{m}");
    Ok(())
}

#[tokio::test]
async fn admin_routes_refuse_writes_and_unknown_names() -> TestResult {
    let h = harness()?;
    let r = h.post("/__brook/metrics", &[], "x").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.h("allow"), Some("GET, HEAD, OPTIONS"));
    let r = h.get("/__brook/nothing", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.code().as_deref(), Some("NOT_FOUND"));
    Ok(())
}

#[tokio::test]
async fn errors_are_counted_by_code_and_requests_by_route_and_status() -> TestResult {
    let h = harness()?;
    // The store's own system streams (subscriptions) count too: compare with a first scrape.
    let created = |m: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix("brook_streams_created_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let before = created(&h.get("/__brook/metrics", &[]).await.text());
    assert_eq!(
        h.get("/no/such/stream", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    h.put("/m/a", &[("content-type", "text/plain")], "x").await;
    let m = h.get("/__brook/metrics", &[]).await.text();
    assert!(
        m.contains("brook_http_errors_total{code=\"STREAM_NOT_FOUND\"} 1\n"),
        "{m}"
    );
    assert!(
        m.contains("brook_http_requests_total{route=\"read\",status=\"404\"} 1\n"),
        "{m}"
    );
    assert!(
        m.contains("brook_http_requests_total{route=\"create\",status=\"201\"} 1\n"),
        "{m}"
    );
    assert_eq!(created(&m), before + 1, "{m}");
    Ok(())
}

#[tokio::test]
async fn streams_are_listed_by_prefix_in_pages_with_their_metadata() -> TestResult {
    let h = harness()?;
    for i in 0..25 {
        let r = h
            .put(
                &format!("/ls/{i:02}"),
                &[("content-type", "text/plain")],
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    h.put("/other", &[("content-type", "application/json")], "")
        .await;
    let r = h
        .send(
            "POST",
            "/ls/03",
            &[("content-type", "text/plain"), ("stream-closed", "true")],
            "abc",
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let uri = match &after {
            Some(a) => format!("/__brook/streams?prefix=ls/&limit=10&after={a}"),
            None => "/__brook/streams?prefix=ls/&limit=10".to_owned(),
        };
        let r = h.get(&uri, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.h("content-type"), Some("application/json"));
        let v: serde_json::Value = serde_json::from_slice(&r.body)?;
        pages += 1;
        for s in v["streams"].as_array().ok_or("no streams")? {
            names.push(s["name"].as_str().ok_or("no name")?.to_owned());
            if s["name"] == "ls/03" {
                assert_eq!(s["closed"], true);
                assert_eq!(s["contentType"], "text/plain");
                assert_eq!(s["tail"], "0000000000000001_0000000000000003");
            }
        }
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("ls/{i:02}")).collect();
    assert_eq!(names, expected);
    let all: serde_json::Value =
        serde_json::from_slice(&h.get("/__brook/streams", &[]).await.body)?;
    assert_eq!(all["streams"].as_array().map(Vec::len), Some(26));
    let bad = h.get("/__brook/streams?limit=0", &[]).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.code().as_deref(), Some("INVALID_ARGUMENT"));
    Ok(())
}

#[test]
fn route_kinds_index_their_own_row() {
    use super::super::admin::{KINDS, RouteKind};
    // `Metrics::request` indexes its table by `kind as usize`: the table's order must be the
    // declaration order.
    for (i, k) in KINDS.iter().enumerate() {
        assert_eq!(*k as usize, i, "{k:?}");
    }
    assert_eq!(RouteKind::Other as usize, KINDS.len() - 1);
}
