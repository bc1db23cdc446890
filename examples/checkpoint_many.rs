//! The work of one checkpoint of many dirty streams, for profiling (DESIGN.md, checkpoints;
//! docs/benchmarks/ds-bench.md, "Work per append at 100k streams").
//!
//! ```text
//! cargo build --release --example checkpoint_many
//! target/release/examples/checkpoint_many DIR [STREAMS] [measure|skip]
//! ```
//!
//! Creates `STREAMS` (default 10,000) streams in a fresh store at `DIR` (one journal shard),
//! checkpoints, appends one 256-byte producer append to each and checkpoints, appends one more to
//! each, then checkpoints again (the one to measure) unless `skip` is given, so a second run with `skip` gives the baseline to subtract.
//! The checkpoint runs on the thread `brook-checkpoint-0`.

use std::time::Instant;

use brook::{AppendRequest, CreateOptions, Durability, Options, Producer, Store, StreamName};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: checkpoint_many DIR [STREAMS] [measure|skip]")?;
    let n: usize = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let measure = args.next().as_deref() != Some("skip");
    let options = Options::default()
        .with_durability(Durability::Buffered)
        .with_journal_shards(1)
        .with_max_open_streams(4 * n)
        .with_checkpoint_bytes(16 << 30);
    let store = Store::open(&dir, options)?;
    let names: Vec<StreamName> = (0..n)
        .map(|i| StreamName::new(&format!("s/{i:06}")))
        .collect::<Result<_, _>>()?;
    for name in &names {
        store.create(name, CreateOptions::with_content_type("text/plain"))?;
    }
    store.checkpoint()?;
    let body = vec![b'x'; 256];
    // Round 0 fills the second sidecar slot, so the measured round rewrites existing files, as
    // every checkpoint of a long-lived stream does.
    for round in 0..2 {
        let pending = names
            .iter()
            .map(|name| {
                let req = AppendRequest::new(body.clone()).producer(Producer::new("p", 0, round));
                store.submit_append(name, req)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for p in pending {
            p.wait()?;
        }
        if round == 0 {
            store.checkpoint()?;
        }
    }
    if measure {
        let (cpu, started) = (checkpoint_cpu_ms(), Instant::now());
        store.checkpoint()?;
        eprintln!(
            "checkpoint of {n} dirty streams: {:?}, checkpoint thread CPU (user, system): {:?} ms",
            started.elapsed(),
            checkpoint_cpu_ms()
                .zip(cpu)
                .map(|((u1, s1), (u0, s0))| (u1 - u0, s1 - s0)),
        );
    }
    // No shutdown checkpoint: the process ends as a killed one would.
    std::mem::forget(store);
    Ok(())
}

/// The user and system CPU time of the thread `brook-checkpoint-0` so far, in milliseconds
/// (Linux, from `/proc/self/task/*/stat`; clock ticks taken as 10 ms).
fn checkpoint_cpu_ms() -> Option<(u64, u64)> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        if comm.trim() != "brook-checkpoin" {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
        return Some((ticks(11)? * 10, ticks(12)? * 10));
    }
    None
}
