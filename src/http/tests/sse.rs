//! `live=sse`: event pairs, lifetime, keep-alives, whole characters.

use super::*;

/// The `(event, data)` pairs of an SSE body, with multi-line data joined by LF.
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

/// Each SSE data event is followed by its control event; closure ends the stream with `streamClosed`.
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

/// An SSE connection ends once `sse_max_duration` is up.
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

/// A size-bounded text chunk is cut before a multi-byte character, never inside it.
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
