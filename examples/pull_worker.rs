//! An embedded pull-wake worker: no HTTP, one process. A subscription follows every stream under
//! `orders/`; producers append; the worker waits for work, claims it, reads what is new on each
//! stream, acknowledges it, and finishes the wake. Acknowledged offsets are durable: a worker
//! started after a crash resumes where the last ack left off.
//!
//! Run with `cargo run --example pull_worker`.

use std::time::Duration;

use brook::subscription::SubscriptionConfig;
use brook::{
    AppendRequest, CreateOptions, Error, Options, ReadFrom, ReadRequest, Store, StreamName,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let wake = StreamName::new("wake/orders")?;
    store.create(&wake, CreateOptions::json())?;
    store.create_subscription(
        "order-worker",
        SubscriptionConfig::pull_wake(wake).pattern("orders/*"),
    )?;

    // Producers: streams created after the subscription are followed from their start.
    let producer = {
        let store = store.clone();
        std::thread::spawn(move || -> brook::Result<()> {
            for i in 0..3 {
                let name = StreamName::new(&format!("orders/{i}"))?;
                store.create(&name, CreateOptions::json())?;
                store.append(&name, AppendRequest::new(format!(r#"{{"order":{i}}}"#)))?;
            }
            Ok(())
        })
    };

    let mut processed = 0;
    while processed < 3 {
        if !store.wait_for_work("order-worker", Duration::from_secs(5))? {
            break;
        }
        let wake = match store.claim("order-worker", "worker-1") {
            Ok(w) => w,
            // Another worker got there first, or a release left nothing: wait again.
            Err(Error::AlreadyClaimed { .. } | Error::NoPendingWork) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut acks = Vec::new();
        for s in wake.streams.iter().filter(|s| s.has_pending()) {
            let chunk = store.read(&s.stream, &ReadRequest::from(ReadFrom::At(s.acked)))?;
            let messages: Vec<serde_json::Value> = serde_json::from_slice(&chunk.to_vec())?;
            println!("{}: {messages:?}", s.stream.as_str());
            processed += messages.len();
            acks.push((s.stream.clone(), chunk.next));
        }
        let outcome = store.ack(&wake, &acks, true)?;
        println!(
            "generation {} done; another wake follows: {}",
            wake.generation, outcome.next_wake
        );
    }
    producer.join().map_err(|_| "producer panicked")??;
    println!("processed {processed} orders");
    Ok(())
}
