//! Refusals before the engine: body limits, methods, stream names, reserved routes.

use super::*;

/// Bodies over the limit (declared or streamed), unserved methods, invalid and reserved names.
#[tokio::test]
async fn bad_requests_methods_and_limits() -> TestResult {
    let options = Options::default().with_max_append_bytes(16);
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
    Ok(())
}
