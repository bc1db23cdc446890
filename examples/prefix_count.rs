//! The prefix-count compare-and-set recipe: several writers extend one JSON log, and every
//! commit is validated against the whole log before it.
//!
//! Start a server (`cargo run --release --features http -- serve`), then:
//!
//! ```text
//! cargo run --example prefix_count --features client [-- http://127.0.0.1:4437]
//! ```
//!
//! (or set `BROOK_URL`). Four writers each append three "step" commits of one or two events to a
//! new stream at the same time. Each commit carries `Stream-Seq` = the number of events its
//! writer read, zero-padded; a writer that loses the race gets a 409, reads on, validates again
//! and retries. The log that results is a serial history: every commit saw everything before it.

use std::time::{SystemTime, UNIX_EPOCH};

use brook::client::{Client, PrefixCount, Read};
use serde_json::{Value, json};

/// The log's rule, checked before every commit: steps are numbered 0, 1, 2, ... with no gap.
fn validate(events: &[Value]) -> Result<u64, String> {
    for (i, e) in events.iter().enumerate() {
        if e["step"].as_u64() != Some(i as u64) {
            return Err(format!(
                "event {i} is step {}, the log is not serial",
                e["step"]
            ));
        }
    }
    Ok(events.len() as u64)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BROOK_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:4437".to_owned());
    let client = Client::new(&url)?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let path = format!("demo/run-{millis}");

    // Created without Stream-Seq, so the first commit's 0 is accepted.
    PrefixCount::create(client.stream(&path)).await?;

    let mut writers = Vec::new();
    for w in 0..4u64 {
        let handle = client.stream(&path);
        writers.push(tokio::spawn(async move {
            let mut writer = PrefixCount::open(handle).await?;
            for c in 0..3u64 {
                let op = format!("writer-{w}-commit-{c}");
                let commit = writer
                    .commit(&op, |n, events| {
                        let next = validate(events)?;
                        debug_assert_eq!(next, n);
                        let size = 1 + (w + c) % 2;
                        Ok::<_, String>(
                            (0..size)
                                .map(|i| json!({"step": n + i, "writer": w}))
                                .collect(),
                        )
                    })
                    .await?;
                println!(
                    "writer {w}: commit {c} of {} event(s) at count {} after {} attempt(s)",
                    commit.events, commit.count, commit.attempts
                );
            }
            Ok::<_, brook::client::Error>(())
        }));
    }
    for w in writers {
        w.await??;
    }

    let log = client.stream(&path).read_to_tail(&Read::default()).await?;
    let n = validate(log.messages())?;
    println!("{url}/{path}: {n} events, a serial history");
    Ok(())
}
