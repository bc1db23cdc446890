//! CORS: preflights, and which responses carry the CORS and security headers.

use super::*;

/// A preflight allows every method and the headers asked for; GET responses and responses to
/// requests with `Origin` expose the protocol's headers; every response has the security headers.
#[tokio::test]
async fn cors_preflight_and_response_headers() -> TestResult {
    let options = Options::default().with_max_append_bytes(16);
    let t = harness_with(options, ServerConfig::default())?;
    t.text_stream("/s/l", "").await;
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
