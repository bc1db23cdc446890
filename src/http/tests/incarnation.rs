//! `Stream-Incarnation` on every route.

use super::*;

/// The current `Stream-Incarnation` passes on every method; an old one is 412 with the current
/// token and applies nothing; on a missing stream it is 404 for reads and 412 for a PUT; a
/// malformed one is 400.
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
