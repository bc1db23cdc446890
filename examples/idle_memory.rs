//! Memory and file descriptors per idle stream: opens a store, creates N streams, appends a
//! small message to each and reads it back ("touching" it), then prints the growth of this
//! process's resident memory and open file descriptors, in total and per stream.
//!
//! ```text
//! cargo run --release --example idle_memory -- [N=100000] [max_open_streams=4096]
//! ```
//!
//! Streams beyond `max_open_streams` are closed (least recently used first), so the per-stream
//! figure is the cost of a stream the store is not holding open, plus the open ones' share.
//! The open ones' segment files hold at most `max_stream_files` descriptors (8192 by default):
//! idle streams past it are put at rest, their files closed.

use std::time::Instant;

use brook::{
    AppendRequest, CreateOptions, Durability, Options, ReadFrom, ReadRequest, Store, StreamName,
};

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, std::iter::Iterator::count)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    let max_open: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(4096);
    let dir = tempfile::tempdir()?;
    let store = Store::open(
        dir.path(),
        Options::default()
            .with_durability(Durability::Buffered)
            .with_max_open_streams(max_open),
    )?;
    let (rss0, fds0) = (rss_bytes(), open_fds());
    let started = Instant::now();
    let names: Vec<StreamName> = (0..n)
        .map(|i| StreamName::new(&format!("idle/stream-{i:07}")))
        .collect::<Result<_, _>>()?;
    std::thread::scope(|sc| -> Result<(), brook::Error> {
        let per = n.div_ceil(8);
        let handles: Vec<_> = names
            .chunks(per.max(1))
            .map(|chunk| {
                let store = store.clone();
                sc.spawn(move || -> Result<(), brook::Error> {
                    for w in chunk.chunks(64) {
                        let mut pending = Vec::new();
                        for name in w {
                            let req = CreateOptions::with_content_type("text/plain");
                            pending.push(store.submit_create(name, req)?);
                        }
                        for p in pending {
                            p.wait()?;
                        }
                        let mut pending = Vec::new();
                        for name in w {
                            let req = AppendRequest::new("hello, idle stream");
                            pending.push(store.submit_append(name, req)?);
                        }
                        for p in pending {
                            p.wait()?;
                        }
                        for name in w {
                            store.read(name, &ReadRequest::from(ReadFrom::Start))?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked")?;
        }
        Ok(())
    })?;
    let made = started.elapsed();
    store.checkpoint()?;
    let (rss1, fds1) = (rss_bytes(), open_fds());
    let drss = rss1.saturating_sub(rss0);
    println!(
        "streams: {n} (max_open_streams {max_open}), created+appended+read in {:.2} s",
        made.as_secs_f64()
    );
    println!(
        "rss: {:.1} MiB -> {:.1} MiB, delta {:.1} MiB = {:.0} bytes/stream",
        rss0 as f64 / 1_048_576.0,
        rss1 as f64 / 1_048_576.0,
        drss as f64 / 1_048_576.0,
        drss as f64 / n as f64
    );
    println!(
        "open fds: {fds0} -> {fds1} (delta {})",
        i64::try_from(fds1)? - i64::try_from(fds0)?
    );
    println!("disk: {} files", count_files(dir.path()));
    store.shutdown()?;
    Ok(())
}

fn count_files(dir: &std::path::Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}
