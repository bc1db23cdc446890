//! The operations routes of a real `brook serve`: metrics scraped over a socket and checked by
//! Prometheus' own parser (`promtool check metrics`), counters moving with the work, readiness
//! while the store opens, and the separate admin address.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::ops_support::{Proc, R, http};

/// The value of the sample line `name` (a metric name with its labels) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Runs `promtool check metrics` on `text`; fails with its complaint. promtool comes with
/// Debian's `prometheus` package (scripts/test installs it).
fn promtool_check(text: &str) -> R {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool not found ({e}): apt-get install prometheus"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!(
            "promtool refused the metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// A scrape parses as Prometheus text, and the counters move with the work done between two
/// scrapes.
#[test]
fn metrics_parse_with_promtool_and_move_with_the_work() -> R {
    if std::env::var_os("SKIP_PROMTOOL").is_some() {
        eprintln!("ops_admin::metrics_parse_with_promtool: skipped (SKIP_PROMTOOL is set)");
        return Ok(());
    }
    if Command::new("promtool").arg("--version").output().is_err() {
        crate::util::missing_prerequisite(
            "ops_admin::metrics_parse_with_promtool",
            "promtool not found (Debian's prometheus package; scripts/test installs it; \
             SKIP_PROMTOOL=1 skips this test)",
        )?;
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut p = Proc::serve(&dir.path().join("data"), &[], "info")?;
    let addr = p.addr()?;
    let text_plain = [("content-type", "text/plain")];
    assert_eq!(http(&addr, "PUT", "/m/s", &text_plain, b"")?.status, 201);
    let before = http(&addr, "GET", "/__brook/metrics", &[], b"")?;
    assert_eq!(before.status, 200);
    assert!(
        before
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        before.headers
    );
    let before = before.text();
    promtool_check(&before)?;

    for _ in 0..5 {
        assert_eq!(
            http(&addr, "POST", "/m/s", &text_plain, b"0123456789")?.status,
            204
        );
    }
    let read = http(&addr, "GET", "/m/s?offset=-1", &[], b"")?;
    assert_eq!(read.body.len(), 50);
    assert_eq!(http(&addr, "GET", "/m/none", &[], b"")?.status, 404);

    let after = http(&addr, "GET", "/__brook/metrics", &[], b"")?.text();
    promtool_check(&after)?;
    // Counts, as whole numbers: how much `name` grew between the scrapes.
    let delta = |name: &str| -> R<i64> {
        let a = sample(&after, name).ok_or_else(|| format!("{name} missing in\n{after}"))?;
        Ok((a - sample(&before, name).unwrap_or(0.0)).round() as i64)
    };
    assert_eq!(delta("brook_appends_total")?, 5);
    assert_eq!(delta("brook_append_bytes_total")?, 50);
    assert!(delta("brook_reads_total")? >= 1);
    assert!(delta("brook_read_bytes_total")? >= 50);
    assert_eq!(
        delta("brook_http_requests_total{route=\"append\",status=\"204\"}")?,
        5
    );
    assert_eq!(delta("brook_append_latency_seconds_count")?, 5);
    assert!(delta("brook_journal_sync_seconds_count")? >= 5);
    assert!(delta("brook_commit_batch_records_count")? >= 5);
    assert_eq!(
        delta("brook_http_errors_total{code=\"STREAM_NOT_FOUND\"}")?,
        1
    );
    assert!(sample(&after, "brook_open_streams").is_some_and(|n| n >= 1.0));
    assert!(sample(&after, "brook_open_fds").is_some_and(|n| n > 0.0));
    assert!(sample(&after, "brook_poisoned_shards").is_some_and(|n| n.abs() < 0.5));
    p.stop()?;
    Ok(())
}

/// While the store opens (held open by the test hook), the bound listener answers: live 200,
/// ready and every stream route 503 `STARTING`; once open, ready is 200 and streams are served.
#[test]
fn the_server_answers_while_the_store_opens() -> R {
    let dir = tempfile::tempdir()?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env("BROOK_TEST_OPEN_DELAY_MS", "1500");
    let mut p = Proc::spawn(cmd)?;
    let addr = p.bound()?;
    assert_eq!(http(&addr, "GET", "/__brook/live", &[], b"")?.status, 200);
    let ready = http(&addr, "GET", "/__brook/ready", &[], b"")?;
    assert_eq!(ready.status, 503);
    assert!(
        ready.text().contains("\"code\":\"STARTING\""),
        "{}",
        ready.text()
    );
    assert_eq!(ready.header("retry-after"), Some("1"));
    let put = http(
        &addr,
        "PUT",
        "/early",
        &[("content-type", "text/plain")],
        b"",
    )?;
    assert_eq!(put.status, 503);
    assert!(
        put.text().contains("\"code\":\"STARTING\""),
        "{}",
        put.text()
    );
    p.wait_for("listening on")?;
    assert_eq!(http(&addr, "GET", "/__brook/ready", &[], b"")?.status, 200);
    let put = http(
        &addr,
        "PUT",
        "/early",
        &[("content-type", "text/plain")],
        b"",
    )?;
    assert_eq!(put.status, 201);
    p.stop()?;
    Ok(())
}

/// `--admin-addr` serves the operations routes, and only those, on a second address.
#[test]
fn the_admin_address_serves_only_operations_routes() -> R {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let admin = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir()?;
    let mut p = Proc::serve(&dir.path().join("data"), &["--admin-addr", &admin], "info")?;
    let addr = p.addr()?;
    assert_eq!(http(&admin, "GET", "/__brook/ready", &[], b"")?.status, 200);
    let m = http(&admin, "GET", "/__brook/metrics", &[], b"")?;
    assert_eq!(m.status, 200);
    assert_eq!(
        http(&admin, "PUT", "/s", &[("content-type", "text/plain")], b"")?.status,
        404
    );
    // The main listener still serves both.
    assert_eq!(
        http(&addr, "PUT", "/s", &[("content-type", "text/plain")], b"")?.status,
        201
    );
    assert_eq!(http(&addr, "GET", "/__brook/ready", &[], b"")?.status, 200);
    p.stop()?;
    Ok(())
}
