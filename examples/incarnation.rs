//! Guarding against a recreated stream with Stream-Incarnation.
//!
//! Start a server (`cargo run --release --features http -- serve`), then:
//!
//! ```text
//! cargo run --example incarnation --features client [-- http://127.0.0.1:4437]
//! ```
//!
//! (or set `BROOK_URL`). A reader keeps state derived from a stream (here, a running total).
//! Someone deletes the stream and creates a new one at the same URL. The reader's handle sends
//! the incarnation it knows on every request, so its next read answers 412, which the client
//! turns into `IncarnationChanged { current }`: the reader discards its state, adopts the new
//! token and starts over from the new stream's start.

use std::time::{SystemTime, UNIX_EPOCH};

use brook::client::{Append, Client, Create, Error, Position, Read};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BROOK_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:4437".to_owned());
    let client = Client::new(&url)?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let path = format!("demo/ledger-{millis}");

    let reader = client.stream(&path);
    reader.create(&Create::json()).await?;
    reader
        .append(&Append::json(&json!([{"amount": 5}, {"amount": 7}])))
        .await?;
    let read = reader.read_to_tail(&Read::default()).await?;
    let mut total: i64 = read
        .messages()
        .iter()
        .filter_map(|m| m["amount"].as_i64())
        .sum();
    let mut next = read.next;
    println!(
        "reader: total {total} from incarnation {:?}",
        reader.incarnation()
    );

    // Meanwhile, someone else recreates the stream at the same URL.
    let admin = client.stream(&path);
    admin.delete().await?;
    admin.create(&Create::json()).await?;
    admin
        .append(&Append::json(&json!([{"amount": 100}])))
        .await?;
    println!(
        "admin: deleted and recreated the stream as {:?}",
        admin.incarnation()
    );

    // The reader's next request names the incarnation it knows: 412, nothing read or applied.
    match reader.read(&Read::from(next.clone())).await {
        Err(Error::IncarnationChanged {
            current: Some(current),
        }) => {
            println!("reader: the stream was recreated ({current}); discarding the total {total}");
            total = 0;
            next = Position::start();
            reader.accept_incarnation(current);
        }
        other => return Err(format!("expected IncarnationChanged, got {other:?}").into()),
    }
    let read = reader.read_to_tail(&Read::from(next)).await?;
    total += read
        .messages()
        .iter()
        .filter_map(|m| m["amount"].as_i64())
        .sum::<i64>();
    println!(
        "reader: total {total} from incarnation {:?}",
        reader.incarnation()
    );
    Ok(())
}
