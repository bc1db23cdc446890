//! Retention policies over a real socket, against the `brook serve` binary: a stream created
//! with `Stream-Retention-Max-Age` or `Stream-Retention-Max-Bytes` is trimmed by the server by
//! itself, across restarts of the server between the steps; the server default
//! (`--retention-max-bytes`) applies to streams without a policy of their own; reads below the
//! new start answer 410 with `Stream-Earliest-Offset`, `offset=-1` too (the seed); the metrics
//! count what was trimmed; bad policies are refused.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::ops_support::{Proc, R, Resp, http};

/// Every message is this long; segments roll at 4 KiB, so each holds five messages.
const LEN: usize = 1000;

/// `brook serve` over `data` whose enforcer runs every 50 ms, with `extra` arguments.
fn serve(data: &Path, extra: &[&str]) -> R<(Proc, String)> {
    serve_every(data, "50", extra)
}

/// `brook serve` over `data` whose enforcer runs every `interval_ms`.
fn serve_every(data: &Path, interval_ms: &str, extra: &[&str]) -> R<(Proc, String)> {
    let mut args = vec![
        "--segment-bytes",
        "4096",
        "--retention-interval-ms",
        interval_ms,
    ];
    args.extend_from_slice(extra);
    let mut p = Proc::serve(data, &args, "info")?;
    let addr = p.addr()?;
    Ok((p, addr))
}

/// The offset of message `k` (every message is [`LEN`] bytes).
fn at(k: u64) -> String {
    format!("{k:016}_{:016}", k * LEN as u64)
}

fn append(addr: &str, path: &str, from: u64, n: u64) -> R {
    for k in from..from + n {
        let mut m = format!("{k:08};").into_bytes();
        m.resize(LEN, b'.');
        let r = http(
            addr,
            "POST",
            path,
            &[("Content-Type", "application/octet-stream")],
            &m,
        )?;
        assert_eq!(r.status, 204, "append {k}: {}", r.text());
    }
    Ok(())
}

/// HEAD until `Stream-Earliest-Offset` is `want` (the enforcer runs every 50 ms), for at most
/// 20 s; the last HEAD.
fn earliest_becomes(addr: &str, path: &str, want: &str) -> R<Resp> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http(addr, "HEAD", path, &[], b"")?;
        if r.header("stream-earliest-offset") == Some(want) || Instant::now() > deadline {
            assert_eq!(r.header("stream-earliest-offset"), Some(want), "{path}");
            return Ok(r);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads below `earliest` answer 410 with it, `offset=-1` as well; a read from it answers 200
/// starting with message `first`.
fn trimmed_reads(addr: &str, path: &str, earliest: &str, first: u64) -> R {
    for from in ["-1".to_owned(), at(0), at(first - 1)] {
        let r = http(addr, "GET", &format!("{path}?offset={from}"), &[], b"")?;
        assert_eq!(r.status, 410, "read from {from}: {}", r.text());
        assert_eq!(r.header("stream-earliest-offset"), Some(earliest));
        assert!(r.text().contains("OFFSET_GONE"), "{}", r.text());
    }
    let r = http(addr, "GET", &format!("{path}?offset={earliest}"), &[], b"")?;
    assert_eq!(r.status, 200);
    assert!(r.body.starts_with(format!("{first:08};").as_bytes()));
    Ok(())
}

/// The value of the counter sample `sample` (name and labels) in `/__brook/metrics`.
fn metric(addr: &str, sample: &str) -> R<u64> {
    let r = http(addr, "GET", "/__brook/metrics", &[], b"")?;
    let text = r.text();
    let line = text
        .lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .ok_or(format!("no {sample} in the metrics"))?;
    Ok(line[sample.len()..].trim().parse()?)
}

#[test]
fn an_age_limit_trims_a_stream_after_a_restart() -> R {
    let data = tempfile::tempdir()?;
    // The first server's enforcer waits an hour: however slow the appends, only the restarted
    // server trims.
    let (a, addr) = serve_every(data.path(), "3600000", &[])?;
    let r = http(
        &addr,
        "PUT",
        "/r/aged",
        &[
            ("Content-Type", "application/octet-stream"),
            ("Stream-Retention-Max-Age", "2"),
        ],
        b"",
    )?;
    assert_eq!(r.status, 201, "{}", r.text());
    let head = http(&addr, "HEAD", "/r/aged", &[], b"")?;
    assert_eq!(head.header("stream-retention-max-age"), Some("2"));
    assert_eq!(head.header("stream-retention-max-bytes"), None);
    // 22 messages: four sealed segments of five, and the one being written.
    append(&addr, "/r/aged", 0, 22)?;
    a.stop()?;
    // Past the age limit while the server is down; the restarted server trims by itself.
    std::thread::sleep(Duration::from_millis(2500));
    let (b, addr) = serve(data.path(), &[])?;
    let head = earliest_becomes(&addr, "/r/aged", &at(20))?;
    assert_eq!(head.header("stream-retention-max-age"), Some("2"));
    assert_eq!(head.header("stream-next-offset"), Some(at(22).as_str()));
    trimmed_reads(&addr, "/r/aged", &at(20), 20)?;
    assert!(metric(&addr, "brook_retention_runs_total{policy=\"age\"}")? >= 1);
    assert_eq!(metric(&addr, "brook_retention_trimmed_segments_total")?, 4);
    assert_eq!(
        metric(&addr, "brook_retention_trimmed_bytes_total")?,
        20_000
    );
    b.stop()?;
    Ok(())
}

#[test]
fn a_size_limit_and_the_server_default_trim_across_restarts() -> R {
    let data = tempfile::tempdir()?;
    let (a, addr) = serve(data.path(), &[])?;
    let sized = [
        ("Content-Type", "application/octet-stream"),
        ("Stream-Retention-Max-Bytes", "10000"),
    ];
    assert_eq!(http(&addr, "PUT", "/r/sized", &sized, b"")?.status, 201);
    let plain = [("Content-Type", "application/octet-stream")];
    assert_eq!(http(&addr, "PUT", "/r/plain", &plain, b"")?.status, 201);
    append(&addr, "/r/sized", 0, 40)?;
    append(&addr, "/r/plain", 0, 30)?;
    // The stream's own limit: 40000 bytes in segments of 5000, 10000 kept.
    earliest_becomes(&addr, "/r/sized", &at(30))?;
    // Without a policy and without a server default, nothing is trimmed.
    let head = http(&addr, "HEAD", "/r/plain", &[], b"")?;
    assert_eq!(head.header("stream-earliest-offset"), Some(at(0).as_str()));
    assert_eq!(head.header("stream-retention-max-bytes"), None);
    a.stop()?;

    // Restarted with a default: it trims the stream without a policy of its own, and HEAD
    // shows the limit in force; the stream's own limit stays its own.
    let (b, addr) = serve(data.path(), &["--retention-max-bytes", "5000"])?;
    let head = earliest_becomes(&addr, "/r/plain", &at(25))?;
    assert_eq!(head.header("stream-retention-max-bytes"), Some("5000"));
    trimmed_reads(&addr, "/r/plain", &at(25), 25)?;
    assert!(metric(&addr, "brook_retention_runs_total{policy=\"bytes\"}")? >= 1);
    let head = http(&addr, "HEAD", "/r/sized", &[], b"")?;
    assert_eq!(head.header("stream-earliest-offset"), Some(at(30).as_str()));
    assert_eq!(head.header("stream-retention-max-bytes"), Some("10000"));
    // The same create again is the same stream; a different policy is another configuration.
    assert_eq!(http(&addr, "PUT", "/r/sized", &sized, b"")?.status, 200);
    let r = http(
        &addr,
        "PUT",
        "/r/sized",
        &[
            ("Content-Type", "application/octet-stream"),
            ("Stream-Retention-Max-Bytes", "20000"),
        ],
        b"",
    )?;
    assert_eq!(r.status, 409, "{}", r.text());
    append(&addr, "/r/sized", 40, 10)?;
    b.stop()?;

    // Once more across a restart: the appends made before it are trimmed after it (or before
    // it, by the enforcer of the server before, which runs every 50 ms: then this one's
    // counts no run, so the run is counted above, where it cannot have happened elsewhere).
    let (c, addr) = serve(data.path(), &[])?;
    earliest_becomes(&addr, "/r/sized", &at(40))?;
    trimmed_reads(&addr, "/r/sized", &at(40), 40)?;
    c.stop()?;
    Ok(())
}

#[test]
fn bad_retention_limits_are_refused() -> R {
    let data = tempfile::tempdir()?;
    let (p, addr) = serve(data.path(), &[])?;
    for (name, value) in [
        ("Stream-Retention-Max-Age", "0"),
        ("Stream-Retention-Max-Age", "-1"),
        ("Stream-Retention-Max-Bytes", "010"),
        ("Stream-Retention-Max-Bytes", "9007199254740992"),
        ("Stream-Retention-Max-Bytes", "lots"),
    ] {
        let r = http(&addr, "PUT", "/r/bad", &[(name, value)], b"")?;
        assert_eq!(r.status, 400, "{name}: {value}");
        assert!(r.text().contains("INVALID_RETENTION"), "{}", r.text());
    }
    assert_eq!(http(&addr, "HEAD", "/r/bad", &[], b"")?.status, 404);
    p.stop()?;
    Ok(())
}

/// Found by a kill -9 loop (issue 50): publish snapshot S1, move retention to it, publish S2
/// (204), SIGKILL, restart. The restarted server lost S2's blob while HEAD still named S2 as the
/// latest: `GET {s}/snapshot/{S2}` answered 404 and `GET {s}/bootstrap` 200 with an empty
/// snapshot part and only the messages after the retention point. S2 must read back, and
/// bootstrap must start from it.
#[test]
fn a_snapshot_published_after_a_retention_move_survives_sigkill() -> R {
    let data = tempfile::tempdir()?;
    let (a, addr) = serve_every(data.path(), "3600000", &["--durability", "sync"])?;
    let r = http(
        &addr,
        "PUT",
        "/r/snap",
        &[("Content-Type", "application/octet-stream")],
        b"",
    )?;
    assert_eq!(r.status, 201, "{}", r.text());
    append(&addr, "/r/snap", 0, 2)?;
    let put = |path: &str, body: &[u8]| -> R {
        let r = http(&addr, "PUT", path, &[("Content-Type", "text/plain")], body)?;
        assert_eq!(r.status, 204, "PUT {path}: {}", r.text());
        Ok(())
    };
    put(&format!("/r/snap/snapshot/{}", at(1)), b"state after one")?;
    put(&format!("/r/snap/retention/{}", at(1)), b"")?;
    put(&format!("/r/snap/snapshot/{}", at(2)), b"state after two")?;
    a.crash()?;

    let (_b, addr) = serve_every(data.path(), "3600000", &["--durability", "sync"])?;
    let head = http(&addr, "HEAD", "/r/snap", &[], b"")?;
    assert_eq!(head.header("stream-snapshot-offset"), Some(at(2).as_str()));
    for path in [
        "/r/snap/snapshot".to_owned(),
        format!("/r/snap/snapshot/{}", at(2)),
    ] {
        let r = http(&addr, "GET", &path, &[], b"")?;
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        assert_eq!(r.body, b"state after two", "GET {path}");
    }
    let r = http(&addr, "GET", "/r/snap/bootstrap", &[], b"")?;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.text();
    assert!(
        body.contains("state after two"),
        "bootstrap without its snapshot: {body}"
    );
    assert!(
        !body.contains("00000001;"),
        "bootstrap served a message behind its snapshot"
    );
    Ok(())
}
