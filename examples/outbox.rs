//! The outbox recipe: publish facts committed elsewhere (here, a list standing in for a
//! database's committed transactions) exactly once and in commit order, across a failover.
//!
//! Start a server (`cargo run --release --features http -- serve`), then:
//!
//! ```text
//! cargo run --example outbox --features client [-- http://127.0.0.1:4437]
//! ```
//!
//! (or set `BROOK_URL`). The first owner publishes facts 0..5 and stalls; a new owner takes over
//! with a higher Producer-Epoch, republishes from fact 3 (its last checkpoint), and the stream
//! answers 409 with Stream-Last-Seq for the facts already there ("already published"). Once the
//! new owner's first append is accepted, the old owner is fenced with 403.

use std::time::{SystemTime, UNIX_EPOCH};

use brook::client::{Client, Create, Error, Outbox, Published, Read};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BROOK_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:4437".to_owned());
    let client = Client::new(&url)?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let path = format!("demo/orders-{millis}");
    client.stream(&path).create(&Create::json()).await?;

    // The source of truth: commits numbered in commit order.
    let facts: Vec<(u64, serde_json::Value)> = (0..10)
        .map(|n| (n, json!({"order": 1000 + n, "status": "paid"})))
        .collect();

    let mut old = Outbox::new(client.stream(&path), "orders-db", 0, "application/json");
    for (n, fact) in &facts[..5] {
        println!(
            "old owner (epoch 0): fact {n}: {:?}",
            old.publish_json(*n, fact).await?
        );
    }

    // Failover: the new owner resumes from its own checkpoint (fact 3), with epoch 1.
    let mut new = Outbox::take_over(
        client.stream(&path),
        "orders-db",
        old.epoch(),
        "application/json",
    );
    for (n, fact) in &facts[3..] {
        match new.publish_json(*n, fact).await? {
            Published::AlreadyPublished { last_seq, .. } => {
                println!(
                    "new owner (epoch 1): fact {n}: already published (Stream-Last-Seq {last_seq})"
                );
            }
            other => println!("new owner (epoch 1): fact {n}: {other:?}"),
        }
    }

    match old.publish_json(5, &facts[5].1).await {
        Err(Error::ProducerEpochStale { current }) => {
            println!("old owner: fenced (403), the current epoch is {current}");
        }
        other => return Err(format!("the old owner was not fenced: {other:?}").into()),
    }

    let log = client.stream(&path).read_to_tail(&Read::default()).await?;
    let orders: Vec<u64> = log
        .messages()
        .iter()
        .filter_map(|m| m["order"].as_u64())
        .collect();
    println!(
        "{url}/{path}: {} facts, each once and in order: {orders:?}",
        orders.len()
    );
    Ok(())
}
