//! Open-file limits (issue 13): `brook serve` raises its soft limit to the hard one, and under a
//! low hard limit it keeps fewer streams open instead of running out of descriptors and
//! poisoning the store.

use std::process::Command;

use crate::http_support::{R, Served, metric, spawn_serve};

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

/// `brook serve`'s stream-file budget and the descriptors its streams hold, from its metrics.
async fn stream_files(client: &reqwest::Client, base: &str) -> R<(u64, u64)> {
    let page = client
        .get(format!("{base}/__brook/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let budget = metric(&page, "brook_stream_file_budget").ok_or("no budget metric")?;
    let held = metric(&page, "brook_stream_files").ok_or("no stream files metric")?;
    Ok((budget, held))
}

/// Polls the metrics until `want` holds of (budget, held) or 10 s pass; the last reading.
/// Each poll first reads a stream (a lookup, which is where streams over the budget are put at
/// rest).
async fn until(
    client: &reqwest::Client,
    base: &str,
    want: impl Fn(u64, u64) -> bool,
) -> R<(u64, u64)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        client.get(format!("{base}/lend/0-0")).send().await?;
        let (budget, held) = stream_files(client, base).await?;
        if want(budget, held) || std::time::Instant::now() > deadline {
            return Ok((budget, held));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Without `--max-stream-files`, `brook serve` lends its streams the descriptors its
/// connections leave: under a limit of 3,000 and no connections but the test's, 3,000 - 256 -
/// (256 + 1024) = 1,464 (one step of connections open: the client's). 1,300 streams written
/// then all keep their logs open (one descriptor each). 600 idle connections more take the
/// budget down two steps, to 952, and the next requests put the surplus at rest; closing them
/// gives the descriptors back, and every stream still reads what was written. A fixed budget
/// (`--max-stream-files`, or the formula from `--max-connections`, 10,000 here: the floor,
/// 128) fails each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_files_borrow_the_descriptors_connections_leave() -> R {
    let dir = tempfile::tempdir()?;
    let served = serve_limited("-n 3000", dir.path())?;
    let (mut child, base) = (served.child, format!("http://{}", served.addr));
    let result = async {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(8)
            .build()?;
        let (idle_budget, _) = until(&client, &base, |b, _| b == 1464).await?;
        assert_eq!(
            idle_budget, 1464,
            "the budget lent with one step of connections"
        );
        for chunk in 0..13 {
            let mut tasks = Vec::new();
            for i in 0..100 {
                let (client, base) = (client.clone(), base.clone());
                tasks.push(tokio::spawn(async move {
                    let url = format!("{base}/lend/{chunk}-{i}");
                    let put = client.put(&url).header("content-type", "text/plain");
                    let put = put.body(format!("s{chunk}-{i}")).send().await?.status();
                    Ok::<_, reqwest::Error>(put.as_u16())
                }));
            }
            for t in tasks {
                assert_eq!(t.await??, 201);
            }
        }
        let (_, held) = stream_files(&client, &base).await?;
        assert!(
            held >= 1300,
            "every stream written keeps its log open: {held}"
        );
        // 600 idle connections.
        let addr = base.trim_start_matches("http://").to_owned();
        let mut idle = Vec::new();
        for _ in 0..600 {
            idle.push(tokio::net::TcpStream::connect(&addr).await?);
        }
        let (lowered, _) = until(&client, &base, |b, _| b == 952).await?;
        assert_eq!(
            lowered, 952,
            "the budget with three steps of connections open"
        );
        // The next lookups put streams at rest down to 7/8 of the lowered budget.
        let (_, held) = until(&client, &base, |_, h| h <= 952).await?;
        assert!(
            held <= 952,
            "streams over the lowered budget stay awake: {held}"
        );
        drop(idle);
        let (back, _) = until(&client, &base, |b, _| b == 1464).await?;
        assert_eq!(
            back, 1464,
            "the descriptors come back when the connections close"
        );
        for (chunk, i) in [(0, 0), (6, 42), (12, 99)] {
            let got = client
                .get(format!("{base}/lend/{chunk}-{i}"))
                .send()
                .await?;
            assert_eq!(got.text().await?, format!("s{chunk}-{i}"));
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// A journal that names more streams than the descriptors allow open: 600 streams written
/// under a hard limit of 300 descriptors, the server killed with SIGKILL before a checkpoint
/// took their records from the journal, and started again under the same limit. Replay keeps
/// to the stream-file budget (it writes the sidecars of what it replayed and closes those
/// streams whenever it holds that many), so the store opens, rather than failing with
/// "Too many open files", and every acknowledged append reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replays_more_streams_than_it_may_hold_open() -> R {
    let dir = tempfile::tempdir()?;
    let served = serve_limited("-n 300", dir.path())?;
    let (mut child, base) = (served.child, format!("http://{}", served.addr));
    let client = reqwest::Client::new();
    for round in 0..15 {
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (client, base) = (client.clone(), base.clone());
            tasks.push(tokio::spawn(async move {
                let url = format!("{base}/replay/{round}-{i}");
                let put = client
                    .put(&url)
                    .header("content-type", "text/plain")
                    .body(format!("{round}-{i}:"))
                    .send()
                    .await?
                    .status()
                    .as_u16();
                let post = client
                    .post(&url)
                    .header("content-type", "text/plain")
                    .body("appended")
                    .send()
                    .await?
                    .status()
                    .as_u16();
                Ok::<_, reqwest::Error>((put, post))
            }));
        }
        for t in tasks {
            assert_eq!(t.await??, (201, 204));
        }
    }
    let _ = child.kill();
    let _ = child.wait();

    let served = serve_limited("-n 300", dir.path())
        .map_err(|e| format!("no start after SIGKILL under the same limit: {e}"))?;
    let replayed = served
        .log_text()
        .lines()
        .find(|l| l.contains("recovered store"))
        .unwrap_or_default()
        .to_owned();
    let (mut child, base) = (served.child, format!("http://{}", served.addr));
    let mut wrong = Vec::new();
    for round in 0..15 {
        for i in 0..40 {
            let got = client
                .get(format!("{base}/replay/{round}-{i}"))
                .send()
                .await?;
            let status = got.status().as_u16();
            let body = got.text().await?;
            if (status, body.as_str()) != (200, format!("{round}-{i}:appended").as_str()) {
                wrong.push(format!("{round}-{i}: {status} {body}"));
            }
        }
    }
    let (budget, files) = stream_files(&client, &base).await?;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        replayed.contains("streams=600") || replayed.contains("streams: 600"),
        "the restart did not replay the 600 streams from the journal: {replayed}"
    );
    assert!(
        wrong.is_empty(),
        "{} of 600 wrong: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        files <= budget,
        "{files} stream files over the budget of {budget}"
    );
    Ok(())
}
