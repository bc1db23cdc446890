//! `ds-pool`: ds-bench's multi-stream append workload over a fixed pool of connections.
//!
//! ```text
//! ds-pool --target http://127.0.0.1:4437 --streams 100000 --connections 256 \
//!         [--payload-bytes 256] [--warmup-secs 3] [--settle-secs 1] [--duration-secs 5] \
//!         [--setup-concurrency 32] [--prefix s] [--setup yes|no|only]
//! ```
//!
//! What it keeps of ds-bench's `multi-stream` (electric-sql/ds-bench, `--api-style durable`):
//! the streams `{target}/v1/stream/{prefix}{index:08}` created first (`PUT`, octet-stream);
//! every stream written by its own idempotent producer (`Producer-Id: bench-{index}`, epoch 0,
//! `Producer-Seq` counting from 0 and advancing on every success, warm-up included); 256-byte
//! binary bodies; a warm-up whose appends are not counted, an idle settle, then the measured
//! window; latency from request sent to response head read, in an HDR histogram of
//! microseconds; throughput as the measured window's successes over its length; 503 and 429
//! counted as back-pressure and retried after 20 ms (creates too: `create_refused`).
//!
//! What differs: ds-bench runs one task, and so one connection, per stream. Here `connections`
//! tasks each own the streams `c, c + connections, c + 2 * connections, ...` and write them in
//! turn, one request in flight per connection, so consecutive requests on a connection go to
//! different streams and every stream is written at the same rate.
//!
//! `--setup only` creates the streams, prints `{"scenario": "pool-setup", "created", "setup_secs",
//! "creates_per_sec"}` and exits; `--setup no` skips the creates (the streams exist already).
//! scripts/bench-streams uses both, so the create rate is its own figure and the same streams
//! serve the plain (oha) and the producer load.
//!
//! Prints one JSON object on stdout. Only loopback targets are accepted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use tokio::sync::Mutex;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The command line.
struct Args {
    target: String,
    streams: usize,
    connections: usize,
    payload_bytes: usize,
    warmup_secs: u64,
    settle_secs: u64,
    duration_secs: u64,
    setup_concurrency: usize,
    prefix: String,
    /// `yes` (create, then load), `no` (load only), `only` (create only).
    setup: String,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        target: String::new(),
        streams: 1000,
        connections: 256,
        payload_bytes: 256,
        warmup_secs: 3,
        settle_secs: 1,
        duration_secs: 5,
        setup_concurrency: 32,
        prefix: "s".into(),
        setup: "yes".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--target" => a.target = value.trim_end_matches('/').to_string(),
            "--streams" => a.streams = value.parse()?,
            "--connections" => a.connections = value.parse()?,
            "--payload-bytes" => a.payload_bytes = value.parse()?,
            "--warmup-secs" => a.warmup_secs = value.parse()?,
            "--settle-secs" => a.settle_secs = value.parse()?,
            "--duration-secs" => a.duration_secs = value.parse()?,
            "--setup-concurrency" => a.setup_concurrency = value.parse()?,
            "--prefix" => a.prefix = value,
            "--setup" => {
                if !["yes", "no", "only"].contains(&value.as_str()) {
                    return Err(format!("--setup {value}: yes, no or only").into());
                }
                a.setup = value;
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let host = a
        .target
        .strip_prefix("http://")
        .ok_or("--target must be an http:// URL")?;
    if !(host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]")) {
        return Err(format!("--target {} is not a loopback address", a.target).into());
    }
    if a.streams == 0 || a.connections == 0 || a.duration_secs == 0 {
        return Err("--streams, --connections and --duration-secs must be at least 1".into());
    }
    a.connections = a.connections.min(a.streams);
    Ok(a)
}

/// Latency histogram in microseconds, 1 us to 60 s, three significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("the bounds are valid constants")
}

/// Deterministic, incompressible-looking body bytes (a xorshift sequence).
fn payload(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

fn stream_url(a: &Args, index: usize) -> String {
    format!("{}/v1/stream/{}{index:08}", a.target, a.prefix)
}

/// One create: `PUT` of stream `index` (after a 20 ms pause when it retries a refusal).
async fn put(
    client: reqwest::Client,
    url: String,
    index: usize,
    retry: bool,
) -> (usize, reqwest::Result<reqwest::StatusCode>) {
    if retry {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = client
        .put(url)
        .header("content-type", "application/octet-stream")
        .send()
        .await;
    (index, sent.map(|r| r.status()))
}

/// Creates every stream, `setup_concurrency` at a time; a create refused with 503 or 429
/// (back-pressure: the server asks to retry) is retried after 20 ms and counted. Returns the
/// number of refusals.
async fn create_streams(client: &reqwest::Client, a: &Args) -> Res<u64> {
    let mut pending = FuturesUnordered::new();
    let mut next = 0usize;
    let mut created = 0usize;
    let mut refused = 0u64;
    loop {
        while next < a.streams && pending.len() < a.setup_concurrency.max(1) {
            pending.push(put(client.clone(), stream_url(a, next), next, false));
            next += 1;
        }
        let Some((index, done)) = pending.next().await else {
            return Ok(refused);
        };
        let status = match done {
            Ok(status) => status,
            Err(e) => return Err(format!("after {created} streams created: {e}").into()),
        };
        if status.as_u16() == 503 || status.as_u16() == 429 {
            refused += 1;
            pending.push(put(client.clone(), stream_url(a, index), index, true));
            continue;
        }
        if !(status.is_success() || status == reqwest::StatusCode::CONFLICT) {
            return Err(
                format!("after {created} streams created, a create answered {status}").into(),
            );
        }
        created += 1;
    }
}

/// What every connection's task adds to.
struct Totals {
    ok: AtomicU64,
    backpressure: AtomicU64,
    other_err: AtomicU64,
    /// Answers other than success in any phase (warm-up and settle included).
    refused_any_phase: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    hist: Mutex<Histogram<u64>>,
}

struct Phases {
    warmup_end: Instant,
    measure_start: Instant,
    deadline: Instant,
}

async fn connection(
    client: reqwest::Client,
    a: Arc<Args>,
    c: usize,
    body: bytes::Bytes,
    phases: Arc<Phases>,
    totals: Arc<Totals>,
) {
    let own: Vec<usize> = (c..a.streams).step_by(a.connections).collect();
    let urls: Vec<String> = own.iter().map(|&i| stream_url(&a, i)).collect();
    let producers: Vec<String> = own.iter().map(|i| format!("bench-{i}")).collect();
    let mut seqs = vec![0u64; own.len()];
    let mut local = histogram();
    let mut turn = 0usize;
    loop {
        let now = Instant::now();
        if now >= phases.deadline {
            break;
        }
        if now >= phases.warmup_end && now < phases.measure_start {
            tokio::time::sleep_until(phases.measure_start.into()).await;
            continue;
        }
        let counting = now >= phases.measure_start;
        // Every outcome moves the connection to its next stream; a stream's sequence number
        // advances only on success, so a refused append is retried (same number) on its
        // stream's next turn.
        let k = turn % own.len();
        turn += 1;
        let started = Instant::now();
        let sent = client
            .post(&urls[k])
            .header("content-type", "application/octet-stream")
            .header("producer-id", &producers[k])
            .header("producer-epoch", "0")
            .header("producer-seq", seqs[k].to_string())
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) => {
                let status = resp.status();
                // Read the (empty or small) body so the connection goes back to the pool.
                let _ = resp.bytes().await;
                if !status.is_success() {
                    totals.refused_any_phase.fetch_add(1, Ordering::Relaxed);
                }
                if status.is_success() {
                    seqs[k] += 1;
                    if counting {
                        totals.ok.fetch_add(1, Ordering::Relaxed);
                        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                        let _ = local.record(us.clamp(1, local.high()));
                    }
                } else if status.as_u16() == 503 || status.as_u16() == 429 {
                    if counting {
                        totals.backpressure.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                } else if counting {
                    totals.other_err.fetch_add(1, Ordering::Relaxed);
                    let key = format!("http_status_{}", status.as_u16());
                    *totals.errors.lock().await.entry(key).or_default() += 1;
                }
            }
            Err(e) => {
                totals.refused_any_phase.fetch_add(1, Ordering::Relaxed);
                if counting {
                    totals.other_err.fetch_add(1, Ordering::Relaxed);
                    *totals.errors.lock().await.entry(e.to_string()).or_default() += 1;
                }
            }
        }
    }
    let mut h = totals.hist.lock().await;
    h.add(&local).expect("every histogram has the same bounds");
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("ds-pool: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Res<()> {
    let a = Arc::new(parse_args()?);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .build()?;
    let setup = Instant::now();
    let create_refused = if a.setup == "no" {
        0
    } else {
        create_streams(&client, &a).await?
    };
    let setup_secs = setup.elapsed().as_secs_f64();
    if a.setup == "only" {
        let out = serde_json::json!({
            "scenario": "pool-setup",
            "target": a.target,
            "created": a.streams,
            "setup_concurrency": a.setup_concurrency,
            "setup_secs": setup_secs,
            "creates_per_sec": a.streams as f64 / setup_secs.max(1e-9),
            "create_refused": create_refused,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    let base = Instant::now();
    let base_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let warmup_end = base + Duration::from_secs(a.warmup_secs);
    let measure_start = warmup_end + Duration::from_secs(a.settle_secs);
    let phases = Arc::new(Phases {
        warmup_end,
        measure_start,
        deadline: measure_start + Duration::from_secs(a.duration_secs),
    });
    let totals = Arc::new(Totals {
        ok: AtomicU64::new(0),
        backpressure: AtomicU64::new(0),
        other_err: AtomicU64::new(0),
        refused_any_phase: AtomicU64::new(0),
        errors: Mutex::new(BTreeMap::new()),
        hist: Mutex::new(histogram()),
    });
    let body = bytes::Bytes::from(payload(a.payload_bytes));
    let tasks: Vec<_> = (0..a.connections)
        .map(|c| {
            tokio::spawn(connection(
                client.clone(),
                a.clone(),
                c,
                body.clone(),
                phases.clone(),
                totals.clone(),
            ))
        })
        .collect();
    for t in tasks {
        t.await?;
    }

    let h = totals.hist.lock().await;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let ok = totals.ok.load(Ordering::Relaxed);
    let out = serde_json::json!({
        "scenario": "pool-multi-stream",
        "target": a.target,
        "streams": a.streams,
        "connections": a.connections,
        "payload_bytes": a.payload_bytes,
        "duration_secs": a.duration_secs,
        "setup_secs": setup_secs,
        "create_refused": create_refused,
        // The measured window in wall-clock seconds, for a sampler of the server's CPU.
        "measure_start_unix": base_unix + (a.warmup_secs + a.settle_secs) as f64,
        "measure_end_unix": base_unix + (a.warmup_secs + a.settle_secs + a.duration_secs) as f64,
        "counts": {
            "ok": ok,
            "backpressure": totals.backpressure.load(Ordering::Relaxed),
            "other_err": totals.other_err.load(Ordering::Relaxed),
            "refused_any_phase": totals.refused_any_phase.load(Ordering::Relaxed),
        },
        "errors": *totals.errors.lock().await,
        "aggregate_ops_per_sec": ok as f64 / a.duration_secs as f64,
        "latency_ms": {
            "count": h.len(),
            "mean_ms": h.mean() / 1000.0,
            "p50_ms": ms(0.5),
            "p90_ms": ms(0.9),
            "p99_ms": ms(0.99),
            "p999_ms": ms(0.999),
            "max_ms": h.max() as f64 / 1000.0,
        },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
