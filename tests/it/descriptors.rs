//! Open-file limits (issue 13): `brook serve` raises its soft limit to the hard one, and under a
//! low hard limit it keeps fewer streams open instead of running out of descriptors and
//! poisoning the store.

use std::process::Command;

use crate::http_support::{R, Served, spawn_serve};

/// `brook serve` in a shell that first runs `ulimit` with `limits`, serving streams.
fn serve_limited(limits: &str, dir: &std::path::Path) -> R<Served> {
    let script = format!(
        "ulimit {limits} && exec \"$0\" serve --host 127.0.0.1 --port 0 --data-dir \"$1\"",
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, env!("CARGO_BIN_EXE_brook")])
        .arg(dir)
        .env("RUST_LOG", "info");
    spawn_serve(cmd)
}

/// The soft and hard "Max open files" of a process.
fn open_file_limits(pid: u32) -> R<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .ok_or("no Max open files line")?;
    let mut nums = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    Ok((nums.next().ok_or("soft")?, nums.next().ok_or("hard")?))
}

/// A soft limit below the hard one is raised to it at start.
#[test]
fn the_soft_open_file_limit_is_raised_to_the_hard_one() -> R {
    let hard: u64 = String::from_utf8(
        Command::new("sh")
            .args(["-c", "ulimit -Hn"])
            .output()?
            .stdout,
    )?
    .trim()
    .parse()
    .unwrap_or(0);
    if hard <= 300 {
        return Err(format!("this test needs a hard open-file limit above 300, not {hard}").into());
    }
    let dir = tempfile::tempdir()?;
    let mut child = serve_limited("-Sn 256", dir.path())?.child;
    let got = open_file_limits(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let (soft, hard_now) = got?;
    assert_eq!(soft, hard_now, "the soft limit stayed below the hard one");
    assert!(soft > 256);
    Ok(())
}

/// Under a hard limit of 300 descriptors, 600 streams created and appended to by 40 concurrent
/// clients all succeed: with no `--max-stream-files` brook lets the streams' files hold what
/// the limit leaves after `--max-connections` (here nothing, so its floor of 128, below the
/// store's own half of the limit, 150) and puts idle streams at rest past it, rather than
/// failing journal writes and poisoning the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_open_file_limit_bounds_open_streams_instead_of_poisoning() -> R {
    let dir = tempfile::tempdir()?;
    let served = serve_limited("-n 300", dir.path())?;
    let log = served.log_text();
    let warned = log.lines().any(|l| l.contains("open-file limit"));
    let (mut child, base) = (served.child, format!("http://{}", served.addr));
    let client = reqwest::Client::new();
    let mut failures = Vec::new();
    for round in 0..15 {
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (client, base) = (client.clone(), base.clone());
            tasks.push(tokio::spawn(async move {
                let url = format!("{base}/fd/{round}-{i}");
                let put = client
                    .put(&url)
                    .header("content-type", "text/plain")
                    .body("first")
                    .send()
                    .await?;
                let post = client
                    .post(&url)
                    .header("content-type", "text/plain")
                    .body("second")
                    .send()
                    .await?;
                let put_status = put.status().as_u16();
                let post_status = post.status().as_u16();
                let why = if post_status == 204 {
                    String::new()
                } else {
                    post.text().await?
                };
                Ok::<_, reqwest::Error>((url, put_status, post_status, why))
            }));
        }
        for t in tasks {
            let (url, put, post, why) = t.await??;
            if (put, post) != (201, 204) {
                failures.push(format!("{url}: PUT {put}, POST {post} {why}"));
            }
        }
    }
    let check = client.get(format!("{base}/fd/0-0")).send().await?;
    let status = check.status().as_u16();
    let body = check.text().await?;
    let _ = child.kill();
    let _ = child.wait();
    assert!(!warned, "the default was lowered again by the store: {log}");
    assert!(
        failures.is_empty(),
        "{} of 600 failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!((status, body.as_str()), (200, "firstsecond"));
    Ok(())
}
