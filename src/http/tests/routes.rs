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

/// The routes as they were split before the one scan from the end (`rsplit_once` and
/// `rsplitn` on the path): the reference the scan is checked against.
fn split_by_rsplit(p: &str) -> Result<Route, &'static str> {
    let name =
        |s: Option<&str>| StreamName::new(s.unwrap_or("")).map_err(|_| "INVALID_STREAM_NAME");
    let mut segs = p.rsplitn(5, '/');
    let last = segs.next().unwrap_or("");
    let (s2, s3, s4, rest) = (segs.next(), segs.next(), segs.next(), segs.next());
    if let (Some(kind @ ("chunk" | "snapshot")), Some(token), Some("incarnation"), Some(_)) =
        (s2, s3, s4, rest)
    {
        let n = name(rest)?;
        return Ok(if kind == "chunk" {
            Route::IncarnationChunk(n, token.into(), last.into())
        } else {
            Route::IncarnationSnapshot(n, token.into(), last.into())
        });
    }
    if last == "parts" {
        match (s2, s3) {
            (Some("snapshot"), Some(_)) => {
                return Ok(Route::SnapshotParts(name(p.rsplitn(3, '/').nth(2))?));
            }
            (Some(offset), Some("snapshot")) if s4.is_some() => {
                let n = name(p.rsplitn(4, '/').nth(3))?;
                return Ok(Route::SnapshotPart(n, offset.into()));
            }
            _ => {}
        }
    }
    let (head, last) = match p.rsplit_once('/') {
        Some((h, l)) => (Some(h), l),
        None => (None, p),
    };
    match last {
        "bootstrap" => return name(head).map(Route::Bootstrap),
        "snapshot" => return name(head).map(Route::SnapshotLatest),
        "retention" => return Err("INVALID_ARGUMENT"),
        _ => {}
    }
    if let Some(head) = head {
        let (stream, mid) = match head.rsplit_once('/') {
            Some((s, m)) => (Some(s), m),
            None => (None, head),
        };
        match mid {
            "snapshot" => return Ok(Route::SnapshotAt(name(stream)?, last.into())),
            "retention" => return Ok(Route::Retention(name(stream)?, last.into())),
            _ => {}
        }
    }
    name(Some(p)).map(Route::Stream)
}

/// Every path of up to five segments over the words the routes reserve splits as the
/// `rsplit`-based parse split it: the same route, or a refusal with the same code.
#[test]
fn the_scan_from_the_end_splits_as_rsplit_did() {
    let words = [
        "a",
        "",
        "snapshot",
        "parts",
        "incarnation",
        "chunk",
        "retention",
        "bootstrap",
        "..",
    ];
    let mut paths: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
    let mut checked = 0;
    for depth in 1..=5 {
        for q in &paths {
            let got = parse_route(&format!("/{q}")).map_err(|e| e.code());
            assert_eq!(got, split_by_rsplit(q), "/{q}");
            checked += 1;
        }
        if depth < 5 {
            paths = paths
                .iter()
                .flat_map(|p| words.iter().map(move |w| format!("{p}/{w}")))
                .collect();
        }
    }
    assert!(checked > 60_000, "{checked} paths");
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
