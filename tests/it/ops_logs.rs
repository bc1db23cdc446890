//! What `brook serve` logs for an operator: a line per request at debug (in JSON with
//! `--log-format json`), and the recovery after a crash with what it replayed.

use crate::ops_support::{Proc, R, http};

/// At `RUST_LOG=debug` with `--log-format json`, every request is one JSON line with its
/// method, path, status, bytes and time.
#[test]
fn a_request_is_one_json_debug_line() -> R {
    let dir = tempfile::tempdir()?;
    let mut p = Proc::serve(&dir.path().join("data"), &["--log-format", "json"], "debug")?;
    let addr = p.addr()?;
    let r = http(
        &addr,
        "PUT",
        "/logs/a",
        &[("content-type", "text/plain")],
        b"hi",
    )?;
    assert_eq!(r.status, 201);
    let line = p.wait_for("\"path\":\"/logs/a\"")?;
    let v: serde_json::Value = serde_json::from_str(&line)?;
    let f = &v["fields"];
    assert_eq!(f["message"], "request", "{line}");
    assert_eq!(f["method"], "PUT", "{line}");
    assert_eq!(f["status"], 201, "{line}");
    assert!(f["micros"].is_u64(), "{line}");
    assert!(f.get("bytes").is_some(), "{line}");
    p.stop()?;
    Ok(())
}

/// At the default `info` level no request is logged.
#[test]
fn requests_are_not_logged_at_info() -> R {
    let dir = tempfile::tempdir()?;
    let mut p = Proc::serve(&dir.path().join("data"), &[], "info")?;
    let addr = p.addr()?;
    assert_eq!(http(&addr, "GET", "/nothing/here", &[], b"")?.status, 404);
    let log = p.stop()?;
    assert!(log.iter().any(|l| l.contains("brook stopped")), "{log:?}");
    assert!(!log.iter().any(|l| l.contains("/nothing/here")), "{log:?}");
    Ok(())
}

/// After a SIGKILL, the next start logs its recovery at info: journal bytes replayed, streams
/// touched and the time it took.
#[test]
fn recovery_after_a_crash_is_logged_with_what_it_replayed() -> R {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let mut p = Proc::serve(&data, &[], "info")?;
    let addr = p.addr()?;
    for i in 0..3 {
        let path = format!("/crash/{i}");
        assert_eq!(
            http(&addr, "PUT", &path, &[("content-type", "text/plain")], b"x")?.status,
            201
        );
        assert_eq!(
            http(
                &addr,
                "POST",
                &path,
                &[("content-type", "text/plain")],
                b"more"
            )?
            .status,
            204
        );
    }
    p.crash()?;
    let mut p = Proc::serve(&data, &["--log-format", "json"], "info")?;
    let line = p.wait_for("recovered store")?;
    let v: serde_json::Value = serde_json::from_str(&line)?;
    let f = &v["fields"];
    assert_eq!(v["level"], "INFO", "{line}");
    assert!(f["journal_bytes"].as_u64().is_some_and(|b| b > 0), "{line}");
    assert_eq!(f["streams"], 3, "{line}");
    assert!(f["elapsed"].is_string(), "{line}");
    p.stop()?;
    Ok(())
}
