//! Paths into routes, and the header names the server writes.

use super::*;

/// Paths split into routes on their reserved last segments; invalid names are refused.
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
    // Ursula 0.11's routes, under streams of any depth.
    assert_eq!(
        parse_route("/a/b/incarnation/t/chunk/o").ok(),
        Some(Route::IncarnationChunk(n("a/b"), "t".into(), "o".into()))
    );
    assert_eq!(
        parse_route("/a/incarnation/t/snapshot/o").ok(),
        Some(Route::IncarnationSnapshot(n("a"), "t".into(), "o".into()))
    );
    assert_eq!(
        parse_route("/a/b/snapshot/o/parts").ok(),
        Some(Route::SnapshotPart(n("a/b"), "o".into()))
    );
    assert_eq!(
        parse_route("/a/snapshot/parts").ok(),
        Some(Route::SnapshotParts(n("a")))
    );
    assert_eq!(
        parse_route("/a/incarnation/t/other/o").ok(),
        Some(Route::Stream(n("a/incarnation/t/other/o")))
    );
    assert_eq!(
        parse_route("/__ds/subscriptions/s1").ok(),
        Some(Route::Protocol(String::new(), "subscriptions/s1".into()))
    );
    // Under a stream root: the root is everything before `__ds/`.
    assert_eq!(
        parse_route("/v1/stream/__ds/subscriptions/s1/streams/a%2Fb").ok(),
        Some(Route::Protocol(
            "v1/stream/".into(),
            "subscriptions/s1/streams/a%2Fb".into()
        ))
    );
    assert_eq!(
        parse_route("/__brook/metrics").ok(),
        Some(Route::Admin("metrics".into()))
    );
    // The bare prefixes are reserved names, not routes.
    let code = |p| parse_route(p).err().map(|e| e.code());
    assert_eq!(code("/__ds"), Some("INVALID_STREAM_NAME"));
    assert_eq!(code("/__brook"), Some("INVALID_STREAM_NAME"));
    for bad in [
        "/",
        "/snapshot",
        "/snapshot/x",
        "/a/retention",
        "/a//b",
        "/a/../b",
        "/a/%2e%2e/b",
        "/a/%00",
        "/incarnation/t/chunk/o",
        "/incarnation/t/snapshot/o",
        "/snapshot/o/parts",
        "/a/incarnation/t",
    ] {
        assert!(parse_route(bad).is_err(), "{bad}");
    }
}

/// Every header-name constant the server writes is a valid lower-case `HeaderName` (the invariant
/// `IntoHeaderName for &'static str` relies on).
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
