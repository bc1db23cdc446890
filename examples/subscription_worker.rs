//! A pull-wake worker over HTTP with the Rust client, and a webhook signature check.
//!
//! Start a server (`cargo run --release --features http -- serve`), then:
//!
//! ```text
//! cargo run --example subscription_worker --features client [-- http://127.0.0.1:4437]
//! ```
//!
//! (or set `BROOK_URL`). The example creates a wake stream and a pull-wake subscription over
//! `demo-<t>/jobs/*`, appends three jobs to two streams, and runs the client's worker loop:
//! claim, read each stream from its acknowledged offset, ack to where it read, done. Then it
//! fetches the server's JWKS and shows that `verify_webhook` refuses a forged signature.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brook::client::{Append, Client, Create, Read, SubscriptionSpec, verify_webhook};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BROOK_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:4437".to_owned());
    let client = Client::new(&url)?;
    let t = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let root = format!("demo-{t}");

    client
        .stream(&format!("{root}/wake"))
        .create(&Create::json())
        .await?;
    let sub = client.subscription(&format!("jobs-{t}"));
    let (created, _) = sub
        .create(
            &SubscriptionSpec::pull_wake(&format!("{root}/wake"))
                .pattern(&format!("{root}/jobs/*"))
                .lease_ttl(Duration::from_secs(30)),
        )
        .await?;
    assert!(created);
    for (stream, job) in [("a", 1), ("b", 2), ("a", 3)] {
        let s = client.stream(&format!("{root}/jobs/{stream}"));
        if job < 3 {
            s.create(&Create::json()).await?;
        }
        s.append(&Append::json(&json!({ "job": job }))).await?;
    }

    // Let the server link the new streams (at their start) before the worker claims.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reader = client.clone();
    let wakes = sub
        .run_worker(
            "worker-1",
            Duration::from_millis(200),
            Some(1),
            move |claim| {
                let reader = reader.clone();
                async move {
                    let mut acks = Vec::new();
                    for s in claim.streams.iter().filter(|s| s.has_pending) {
                        let read = reader
                            .stream(&s.path)
                            .read_to_tail(&Read::from(s.acked.clone()))
                            .await?;
                        println!("{}: {:?}", s.path, read.messages());
                        acks.push((s.path.clone(), read.next.clone()));
                    }
                    Ok((claim, acks))
                }
            },
        )
        .await?;
    println!(
        "worked {wakes} wake(s); subscription now: {}",
        sub.get().await?["streams"]
    );

    let jwks = client.webhook_jwks().await?;
    let forged = verify_webhook(
        &jwks,
        &format!("t={},kid=nope,ed25519=AAAA", t / 1000),
        b"{}",
        Duration::from_mins(5),
    );
    println!("a forged webhook signature is refused: {}", forged.is_err());
    sub.delete().await?;
    Ok(())
}
