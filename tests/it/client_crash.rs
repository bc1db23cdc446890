//! A crash under the outbox recipe: the real `brook` binary is killed with SIGKILL while several
//! producers append through `brook::client` with both guards (producer tuple and Stream-Seq),
//! then restarted on the same data directory. Each producer retries its in-flight append with the
//! same guards: it must be answered as a duplicate or accepted, never as a gap, and every
//! acknowledged append must be in the stream exactly once, in order.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brook::client::{Client, Create, Error, Outbox, PrefixCount, Published, Read};
use serde_json::json;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PRODUCERS: usize = 4;

/// A `brook serve` child process, killed (SIGKILL) when dropped.
struct Brook(Child);

impl Brook {
    fn spawn(dir: &Path, port: u16) -> R<Brook> {
        let child = Command::new(env!("CARGO_BIN_EXE_brook"))
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--data-dir",
            ])
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Brook(child))
    }

    /// SIGKILL: no shutdown, no checkpoint, nothing flushed by brook itself.
    fn kill(mut self) -> R {
        self.0.kill()?;
        self.0.wait()?;
        Ok(())
    }
}

impl Drop for Brook {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test's client: brook's, over an HTTP client with a request timeout. Once in a full-suite
/// run the second test hung for good after the SIGKILL: no socket open to the server, no timer
/// pending, the runtime idle, which points at a request waiting in the HTTP client's pool for
/// a connection that never came. A request that times out is a transport error, retried like
/// the crash itself.
fn client_of(port: u16) -> R<Client> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(20))
        .build()?;
    Ok(Client::with_http_client(
        http,
        &format!("http://127.0.0.1:{port}"),
    )?)
}

fn free_port() -> R<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until the server is ready (`/__brook/ready` answers 200: the port may take a moment
/// to be free again, and the listener answers 503 while the store recovers).
async fn ready(port: u16) -> R {
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = format!("http://127.0.0.1:{port}/__brook/ready");
    let probe = reqwest::Client::new();
    while !matches!(probe.get(&url).send().await, Ok(r) if r.status() == 200) {
        if Instant::now() > deadline {
            return Err("brook did not start listening within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Publishes `n` until the stream answers it definitively: retries while the response is lost
/// or the server is not back yet. Never skips, never moves on.
async fn publish_until_answered(out: &mut Outbox, n: u64) -> Result<Published, Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match out.publish_json(n, &json!({"fact": n})).await {
            Err(e)
                if (e.outcome_unknown() || matches!(&e, Error::Transport(_)))
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_producer_appends_loses_and_repeats_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::spawn(dir.path(), port)?;
    ready(port).await?;
    let client = client_of(port)?;
    for p in 0..PRODUCERS {
        client
            .stream(&format!("crash/p{p}"))
            .create(&Create::json())
            .await?;
    }

    // Every producer appends facts 0, 1, 2, ... with both guards until the server dies under it.
    let acked_total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let mut out = Outbox::new(
            client.stream(&format!("crash/p{p}")),
            format!("producer-{p}"),
            0,
            "application/json",
        );
        let acked_total = acked_total.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0..1_000_000u64 {
                match out.publish_json(n, &json!({"fact": n})).await {
                    Ok(Published::Appended { .. }) => {
                        acked.push(n);
                        acked_total.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(other) => {
                        return Err(format!(
                            "producer {p}: fact {n} answered {other:?} before the crash"
                        ));
                    }
                    // The server died: this fact is in flight (sent or not, answered or not).
                    Err(e) => return Ok((out, acked, n, e)),
                }
            }
            Err(format!("producer {p} was never interrupted"))
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked_total.load(Ordering::SeqCst) < 60 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill()?;

    let mut producers = Vec::new();
    for t in tasks {
        producers.push(t.await??);
    }
    let server = Brook::spawn(dir.path(), port)?;
    ready(port).await?;

    let mut duplicates = 0;
    for (out, acked, in_flight, crash_error) in &mut producers {
        assert!(
            matches!(crash_error, Error::Transport(_)),
            "the crash surfaced as a transport error, not {crash_error:?}"
        );
        // The retry of the in-flight append, with the same producer tuple and Stream-Seq.
        match publish_until_answered(out, *in_flight).await? {
            Published::Appended { .. } => {}
            Published::Duplicate => duplicates += 1,
            other @ Published::AlreadyPublished { .. } => {
                return Err(format!("the retry of fact {in_flight} answered {other:?}").into());
            }
        }
        acked.push(*in_flight);
        // The producer goes on where it was: the next facts are accepted in order.
        for n in *in_flight + 1..*in_flight + 3 {
            assert!(matches!(
                publish_until_answered(out, n).await?,
                Published::Appended { .. }
            ));
            acked.push(n);
        }
        let log = out.stream().read_to_tail(&Read::default()).await?;
        let facts: Vec<u64> = log
            .messages()
            .iter()
            .filter_map(|m| m["fact"].as_u64())
            .collect();
        assert_eq!(facts.len(), log.messages().len());
        assert_eq!(
            &facts, acked,
            "every acknowledged append exactly once, in order, nothing else"
        );
    }
    eprintln!(
        "crash test: {} appends acknowledged before SIGKILL, {duplicates} of {PRODUCERS} in-flight retries were duplicates",
        acked_total.load(Ordering::SeqCst)
    );
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_prefix_count_commits_keeps_a_serial_history() -> R {
    const WRITERS: u64 = 4;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::spawn(dir.path(), port)?;
    ready(port).await?;
    let client = client_of(port)?;
    PrefixCount::create(client.stream("crash/log")).await?;

    // Writers commit until the server dies, then retry their in-flight commit (same operation
    // id) once it is back: found in the log or appended, never twice.
    let committed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let handle = client.stream("crash/log");
        let committed = committed.clone();
        tasks.push(tokio::spawn(async move {
            let mut writer = PrefixCount::open(handle).await?;
            let mut ops = Vec::new();
            let mut c = 0u64;
            let mut crashed = false;
            let deadline = Instant::now() + Duration::from_mins(1);
            while Instant::now() < deadline {
                let op = format!("w{w}-c{c}");
                let build = |n: u64, _: &[serde_json::Value]| {
                    Ok::<_, String>(vec![json!({"seen": n}); (1 + c % 2) as usize])
                };
                match writer.commit(&op, build).await {
                    Ok(_) => {
                        ops.push(op);
                        c += 1;
                        committed.fetch_add(1, Ordering::SeqCst);
                        if crashed {
                            break;
                        }
                    }
                    // The server is gone (no connection) or still recovering (503 STARTING):
                    // retry the same operation id.
                    Err(e) if matches!(e, Error::Transport(_)) || e.outcome_unknown() => {
                        crashed = true;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok::<_, Error>(ops)
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while committed.load(Ordering::SeqCst) < 30 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let server = Brook::spawn(dir.path(), port)?;
    ready(port).await?;

    let mut acknowledged = Vec::new();
    for t in tasks {
        acknowledged.extend(t.await??);
    }
    let log = client
        .stream("crash/log")
        .read_to_tail(&Read::default())
        .await?;
    let mut seen_ops = std::collections::HashSet::new();
    let mut prev: Option<&str> = None;
    for (i, e) in log.messages().iter().enumerate() {
        let op = e["op_id"].as_str().ok_or("an event without op_id")?;
        if prev != Some(op) {
            assert!(seen_ops.insert(op.to_owned()), "commit {op} appears twice");
            assert_eq!(
                e["seen"].as_u64(),
                Some(i as u64),
                "commit {op} was not validated against the whole log"
            );
        }
        prev = Some(op);
    }
    for op in &acknowledged {
        assert!(seen_ops.contains(op), "acknowledged commit {op} is missing");
    }
    drop(server);
    Ok(())
}
