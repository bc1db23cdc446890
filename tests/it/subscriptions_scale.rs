//! Subscriptions at scale, over a real socket against the `brook serve` binary (issue 50): a
//! wake cycle of a `**` pull-wake subscription over thousands of streams writes what the cycle
//! changes, not the subscription's whole state; claims and webhooks carry only the streams with
//! pending work; the limits on subscriptions per root and links per subscription refuse with
//! named codes; subscription ids belong to the root that owns them.
//!
//! `a_wake_cycle_over_many_links_writes_what_it_changes` prints its measurements (bytes written
//! and time per cycle, restart time, RSS); `BROOK_SUBS_STREAMS=20000` runs it at that size
//! (default 2000), e.g.
//! `BROOK_SUBS_STREAMS=20000 cargo test --release --all-features --test it a_wake_cycle -- --nocapture`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::subscriptions_http::{Api, Brook, Mode, R, Receiver, free_port};

/// Bytes the process has passed to write-family system calls (`wchar` of `/proc/{pid}/io`):
/// journal records, snapshot files and socket writes alike.
fn written(pid: u32) -> R<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .ok_or("no wchar")?
        .trim()
        .parse()
        .map_err(Into::into)
}

/// The resident set of the process, in KiB.
fn rss_kib(pid: u32) -> R<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .map_err(Into::into)
}

/// Waits until the process writes next to nothing (under 16 KiB in half a second, at most 60 s):
/// creating thousands of streams leaves a checkpoint of their files running for a while, which
/// is not what a wake cycle costs.
async fn settle(pid: u32) -> R {
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let before = written(pid)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if written(pid)? - before < 16 << 10 || Instant::now() > deadline {
            return Ok(());
        }
    }
}

/// Creates `n` JSON streams `{prefix}{i}` under `base`, 32 requests at a time.
async fn many_streams(base: &str, prefix: &str, n: usize) -> R {
    let client = reqwest::Client::new();
    let mut started = 0;
    while started < n {
        let batch: Vec<_> = (started..n.min(started + 32))
            .map(|i| {
                let req = client
                    .put(format!("{base}{prefix}{i}"))
                    .header("content-type", "application/json")
                    .body("[]");
                tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) })
            })
            .collect();
        for t in batch {
            assert_eq!(t.await??, 201);
        }
        started += 32;
    }
    Ok(())
}

/// One wake cycle: an append to `stream`, a claim that must name exactly that stream, and a
/// done ack at its tail. Returns the claim's body length.
async fn cycle(api: &Api, id: &str, stream: &str) -> R<usize> {
    let tail = api.append(stream, "[1]").await?;
    let (status, claim) = api
        .post(
            &format!("__ds/subscriptions/{id}/claim"),
            None,
            &json!({"worker": "w"}),
        )
        .await?;
    assert_eq!(status, 200, "{claim}");
    let streams = claim["streams"].as_array().ok_or("streams")?;
    let paths: Vec<&str> = streams.iter().filter_map(|s| s["path"].as_str()).collect();
    assert_eq!(
        paths,
        vec![stream],
        "a claim names the streams with pending work"
    );
    assert_eq!(streams[0]["tail_offset"], tail.as_str());
    assert_eq!(streams[0]["has_pending"], true);
    let token = claim["token"].as_str().ok_or("token")?;
    let done = json!({"wake_id": claim["wake_id"], "generation": claim["generation"],
                      "acks": [{"stream": stream, "offset": tail}], "done": true});
    let (status, ok) = api
        .post(&format!("__ds/subscriptions/{id}/ack"), Some(token), &done)
        .await?;
    assert_eq!(
        (status, ok),
        (200, json!({"ok": true, "next_wake": false})),
        "{stream}"
    );
    Ok(claim.to_string().len())
}

/// Issue 50: each wake cycle of a `**` subscription over 20,000 streams wrote 9-15 MB (the
/// whole state, three times) and its claim listed every link. Now a cycle writes a few small
/// records: the bound below is far under one copy of the state (about 100 bytes a link).
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_cycle_over_many_links_writes_what_it_changes() -> R {
    let n: usize = std::env::var("BROOK_SUBS_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::start(dir.path(), port, &[]).await?;
    let api = Api::new(&server.base);
    api.stream("wake/all", "[]").await?;
    many_streams(&server.base, "s/", n).await?;
    let made = Instant::now();
    let (status, v) = api
        .put(
            "__ds/subscriptions/all",
            &json!({"type": "pull-wake", "pattern": "**", "wake_stream": "wake/all"}),
        )
        .await?;
    assert_eq!(status, 201, "{v}");
    let create_ms = made.elapsed().as_millis();
    assert_eq!(v["streams"].as_array().map(Vec::len), Some(n));
    // Another tenant's small subscription, cycled between the big one's cycles.
    let small = Api::new(&server.base.replace("/v1/stream/", "/t2/"));
    small.stream("wake", "[]").await?;
    small.stream("one", "[]").await?;
    let (status, v) = small
        .put(
            "__ds/subscriptions/small",
            &json!({"type": "pull-wake", "streams": ["one"], "wake_stream": "wake"}),
        )
        .await?;
    assert_eq!(status, 201, "{v}");
    // Warm up (the first cycle after the create may compact the create's record).
    cycle(&api, "all", "s/0").await?;
    settle(server.pid()).await?;
    let cycles = 20;
    let before = written(server.pid())?;
    let started = Instant::now();
    let mut claim_bytes = 0;
    let mut small_worst = Duration::ZERO;
    for i in 0..cycles {
        claim_bytes += cycle(&api, "all", &format!("s/{}", (i * 7919) % n)).await?;
        let t = Instant::now();
        cycle(&small, "small", "one").await?;
        small_worst = small_worst.max(t.elapsed());
    }
    let per_cycle_ms = started.elapsed().as_millis() / cycles as u128;
    let per_cycle_bytes = (written(server.pid())? - before) / cycles as u64;
    let rss = rss_kib(server.pid())?;
    server.kill()?;
    let restarted = Instant::now();
    let server = Brook::start(dir.path(), port, &[]).await?;
    let restart_ms = restarted.elapsed().as_millis();
    let (status, v) = api.get("__ds/subscriptions/all").await?;
    assert_eq!(status, 200);
    assert_eq!(v["streams"].as_array().map(Vec::len), Some(n));
    println!(
        "subscription over {n} streams: create {create_ms} ms; per wake cycle (append, claim, \
         ack; with one small cycle of another root) {per_cycle_ms} ms and {per_cycle_bytes} bytes \
         written (wchar, both cycles with their HTTP answers); claim body {} bytes; small cycle \
         at worst {} ms; RSS {} MiB; restart (kill -9) to ready {restart_ms} ms",
        claim_bytes / cycles,
        small_worst.as_millis(),
        rss / 1024
    );
    assert!(
        per_cycle_bytes < 64 << 10,
        "{per_cycle_bytes} bytes written per cycle over {n} links"
    );
    drop(server);
    Ok(())
}

/// Issue 50: a webhook body listed every link. Now it lists the streams with pending work.
#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_names_only_the_streams_with_pending_work() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &[]).await?;
    let api = Api::new(&server.base);
    many_streams(&server.base, "h/", 300).await?;
    let rx = Receiver::start(Mode::Answer(r#"{"done":true}"#)).await?;
    let (status, v) = api
        .put(
            "__ds/subscriptions/hook",
            &json!({"type": "webhook", "pattern": "h/*", "webhook": {"url": rx.url}}),
        )
        .await?;
    assert_eq!(status, 201, "{v}");
    let tail = api.append("h/17", "[1]").await?;
    let got = rx.wait_for(1).await?;
    let body: Value = serde_json::from_str(&got.body)?;
    assert_eq!(
        body["streams"],
        json!([{"path": "h/17", "link_type": "glob",
                "acked_offset": "0000000000000000_0000000000000000",
                "tail_offset": tail, "has_pending": true}]),
        "{} bytes",
        got.body.len()
    );
    // `done` acked the wake's streams.
    api.wait_sub("hook", |v| {
        crate::subscriptions_http::acked(v, "h/17").as_deref() == Some(tail.as_str())
    })
    .await?;
    Ok(())
}

fn code(v: &Value) -> &Value {
    &v["error"]["code"]
}

/// Issue 50: nothing bounded the subscriptions of a root or the links of a subscription.
/// `--max-subscriptions-per-root` and `--max-links-per-subscription` refuse past them with 429
/// `SUBSCRIPTION_LIMIT` and `LINK_LIMIT`; a pattern that matches more streams later stops
/// linking at the limit.
#[tokio::test(flavor = "multi_thread")]
async fn limits_refuse_with_named_codes() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(
        dir.path(),
        free_port()?,
        &[
            "--max-subscriptions-per-root",
            "2",
            "--max-links-per-subscription",
            "3",
        ],
    )
    .await?;
    let api = Api::new(&server.base);
    api.stream("wake", "[]").await?;
    for s in ["l/1", "l/2", "l/3", "l/4", "m/1", "m/2", "m/3"] {
        api.stream(s, "[]").await?;
    }
    // Links: a pattern over 4 streams is refused whole.
    let (status, v) = api
        .put(
            "__ds/subscriptions/wide",
            &json!({"type": "pull-wake", "pattern": "l/*", "wake_stream": "wake"}),
        )
        .await?;
    assert_eq!((status, code(&v)), (429, &json!("LINK_LIMIT")), "{v}");
    assert_eq!(v["limit"], 3, "{v}");
    assert_eq!(api.get("__ds/subscriptions/wide").await?.0, 404);
    let (status, v) = api
        .put(
            "__ds/subscriptions/a",
            &json!({"type": "pull-wake", "streams": ["l/1", "l/2"], "wake_stream": "wake"}),
        )
        .await?;
    assert_eq!(status, 201, "{v}");
    let link = |s: &str| json!({"streams": [s]});
    let (status, _) = api
        .post("__ds/subscriptions/a/streams", None, &link("l/3"))
        .await?;
    assert_eq!(status, 204);
    // Linking a stream linked already takes no room.
    let (status, _) = api
        .post("__ds/subscriptions/a/streams", None, &link("l/3"))
        .await?;
    assert_eq!(status, 204);
    let (status, v) = api
        .post("__ds/subscriptions/a/streams", None, &link("l/4"))
        .await?;
    assert_eq!((status, code(&v)), (429, &json!("LINK_LIMIT")), "{v}");
    let (_, v) = api.get("__ds/subscriptions/a").await?;
    assert_eq!(v["streams"].as_array().map(Vec::len), Some(3), "{v}");
    // A pattern at its limit links no more matching streams (they are not refused).
    let (status, v) = api
        .put(
            "__ds/subscriptions/b",
            &json!({"type": "pull-wake", "pattern": "m/*", "wake_stream": "wake"}),
        )
        .await?;
    assert_eq!(status, 201, "{v}");
    api.stream("m/4", "[1]").await?;
    api.append("m/1", "[1]").await?;
    api.wait_sub("b", |v| v["generation"] == 1).await?;
    let (_, v) = api.get("__ds/subscriptions/b").await?;
    assert_eq!(v["streams"].as_array().map(Vec::len), Some(3), "{v}");
    // Subscriptions: two per root; a re-confirmation is no new one; another root has its own.
    let sub = json!({"type": "pull-wake", "streams": ["l/1"], "wake_stream": "wake"});
    let (status, v) = api.put("__ds/subscriptions/c", &sub).await?;
    assert_eq!(
        (status, code(&v)),
        (429, &json!("SUBSCRIPTION_LIMIT")),
        "{v}"
    );
    assert_eq!(v["limit"], 2, "{v}");
    let (status, _) = api
        .put(
            "__ds/subscriptions/a",
            &json!({"type": "pull-wake", "streams": ["l/1", "l/2"], "wake_stream": "wake"}),
        )
        .await?;
    assert_eq!(status, 200);
    let other = Api::new(&server.base.replace("/v1/stream/", "/v2/"));
    other.stream("wake", "[]").await?;
    other.stream("l/1", "[]").await?;
    assert_eq!(other.put("__ds/subscriptions/c", &sub).await?.0, 201);
    let res = reqwest::Client::new()
        .delete(format!("{}__ds/subscriptions/b", server.base))
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 204);
    assert_eq!(api.put("__ds/subscriptions/c", &sub).await?.0, 201);
    Ok(())
}

/// Issue 50: subscription ids were one namespace for the whole server, first come first
/// served across tenants. Two roots now each have their own `orders`, with their own
/// configuration, cursor and wakes, across a restart.
#[tokio::test(flavor = "multi_thread")]
async fn subscription_ids_are_scoped_to_their_root() -> R {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::start(dir.path(), port, &[]).await?;
    let alice = Api::new(&server.base.replace("/v1/stream/", "/alice/"));
    let bob = Api::new(&server.base.replace("/v1/stream/", "/bob/"));
    for (api, pattern) in [(&alice, "a/*"), (&bob, "b/*")] {
        api.stream("wake", "[]").await?;
        api.stream(&pattern.replace('*', "1"), "[]").await?;
        let (status, v) = api
            .put(
                "__ds/subscriptions/orders",
                &json!({"type": "pull-wake", "pattern": pattern, "wake_stream": "wake"}),
            )
            .await?;
        assert_eq!(status, 201, "{v}");
    }
    alice.append("a/1", "[1]").await?;
    let (status, claim) = alice
        .post(
            "__ds/subscriptions/orders/claim",
            None,
            &json!({"worker": "w"}),
        )
        .await?;
    assert_eq!(status, 200, "{claim}");
    // Bob's `orders` has nothing pending, and alice's claim token is not his.
    let (status, v) = bob
        .post(
            "__ds/subscriptions/orders/claim",
            None,
            &json!({"worker": "w"}),
        )
        .await?;
    assert_eq!((status, code(&v)), (409, &json!("NO_PENDING_WORK")), "{v}");
    let fence = json!({"wake_id": claim["wake_id"], "generation": claim["generation"]});
    let (status, v) = bob
        .post(
            "__ds/subscriptions/orders/release",
            claim["token"].as_str(),
            &fence,
        )
        .await?;
    assert_eq!(status, 401, "{v}");
    server.kill()?;
    let server = Brook::start(dir.path(), port, &[]).await?;
    for (api, path) in [(&alice, "a/1"), (&bob, "b/1")] {
        let (status, v) = api.get("__ds/subscriptions/orders").await?;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["id"], "orders");
        assert_eq!(v["streams"][0]["path"], path, "{v}");
    }
    let (status, _) = alice
        .post(
            "__ds/subscriptions/orders/release",
            claim["token"].as_str(),
            &fence,
        )
        .await?;
    assert_eq!(status, 204);
    let res = reqwest::Client::new()
        .delete(format!(
            "{}__ds/subscriptions/orders",
            server.base.replace("/v1/stream/", "/bob/")
        ))
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 204);
    assert_eq!(bob.get("__ds/subscriptions/orders").await?.0, 404);
    assert_eq!(alice.get("__ds/subscriptions/orders").await?.0, 200);
    Ok(())
}
