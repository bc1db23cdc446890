//! Concurrency tests: the seed's prefix-count recipe run by many threads on one stream, and many
//! threads appending to many streams at once (with readers tailing them), then a reopen.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use brook::*;
use serde_json::{Value, json};

use crate::util::{R, Rng, name, read_to_tail, typed};

fn messages(chunk: &ReadChunk) -> std::result::Result<Vec<Value>, serde_json::Error> {
    serde_json::from_slice(&chunk.to_vec())
}

/// One writer of the prefix-count recipe: read to the tail counting messages, append a commit
/// with Stream-Seq = the count, and on a Stream-Seq conflict read on and retry.
fn committer(
    store: &Store,
    n: &StreamName,
    w: u64,
    commits: u64,
    seed: u64,
    conflicts: &AtomicU64,
) -> brook::Result<()> {
    let mut rng = Rng::new(seed);
    let mut next = Offset::ZERO;
    let mut count = 0u64;
    for c in 0..commits {
        let size = 1 + rng.below(3);
        loop {
            // Read to the tail (small chunks, so reads stop inside commits too).
            loop {
                let chunk = store.read(n, &ReadRequest::from(ReadFrom::At(next)).max_bytes(200))?;
                count += messages(&chunk)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?
                    .len() as u64;
                next = chunk.next;
                if chunk.up_to_date {
                    break;
                }
            }
            let body: Vec<Value> = (0..size)
                .map(|j| json!({"w": w, "c": c, "j": j, "size": size, "seq": count}))
                .collect();
            let req = AppendRequest::new(
                serde_json::to_vec(&body).map_err(|e| Error::InvalidArgument(e.to_string()))?,
            )
            .stream_seq(format!("{count:020}"));
            match store.append(n, req) {
                Ok(_) => break,
                Err(Error::StreamSeqConflict { last_seq, .. }) => {
                    // Another writer committed first; its count is at least ours.
                    assert!(
                        last_seq.as_str() >= format!("{count:020}").as_str(),
                        "conflict with a smaller Stream-Seq {last_seq}"
                    );
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The log must be a serial history: commits contiguous, each commit's Stream-Seq equal to the
/// number of messages before it, every commit exactly once.
fn check_serial(store: &Store, n: &StreamName, writers: u64, commits: u64) -> R {
    let (data, _) = read_to_tail(store, n, None)?;
    let all: Vec<Value> = serde_json::from_slice(&[b"[", &data[..], b"]"].concat())?;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut i = 0usize;
    let mut last_seq = None;
    while i < all.len() {
        let m = &all[i];
        let (w, c, size, seq) = (
            m["w"].as_u64(),
            m["c"].as_u64(),
            m["size"].as_u64(),
            m["seq"].as_u64(),
        );
        let (Some(w), Some(c), Some(size), Some(seq)) = (w, c, size, seq) else {
            return Err(format!("bad message {m}").into());
        };
        if seq != i as u64 {
            return Err(format!(
                "commit ({w},{c}) carries Stream-Seq {seq} but {i} messages precede it"
            )
            .into());
        }
        for j in 0..size {
            let x = all.get(i + j as usize).ok_or("commit cut short")?;
            if x["w"] != w || x["c"] != c || x["j"] != j {
                return Err(format!(
                    "commit ({w},{c}) is not contiguous at message {}",
                    i + j as usize
                )
                .into());
            }
        }
        if !seen.insert((w, c)) {
            return Err(format!("commit ({w},{c}) appears twice").into());
        }
        last_seq = Some(seq);
        i += size as usize;
    }
    if seen.len() as u64 != writers * commits {
        return Err(format!(
            "{} commits in the log, {} made",
            seen.len(),
            writers * commits
        )
        .into());
    }
    let stored = store.head(n, &Guard::NONE)?.stream_seq;
    if stored != last_seq.map(|s| format!("{s:020}")) {
        return Err(
            format!("stored Stream-Seq {stored:?} is not the last commit's {last_seq:?}").into(),
        );
    }
    Ok(())
}

#[test]
fn prefix_count_commits_form_a_serial_history() -> R {
    let dir = tempfile::tempdir()?;
    let n = name("pc/log");
    let (writers, commits) = (8u64, 40u64);
    let conflicts = Arc::new(AtomicU64::new(0));
    {
        let store = Store::open(dir.path(), Options::default())?;
        store.create(&n, typed("application/json"))?;
        let seed = Rng::from_env("prefix_count").next();
        let threads: Vec<_> = (0..writers)
            .map(|w| {
                let (store, n, conflicts) = (store.clone(), n.clone(), conflicts.clone());
                std::thread::spawn(move || committer(&store, &n, w, commits, seed ^ w, &conflicts))
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| "a committer panicked")??;
        }
        check_serial(&store, &n, writers, commits)?;
    }
    eprintln!(
        "prefix_count: {} Stream-Seq conflicts retried",
        conflicts.load(Ordering::Relaxed)
    );
    let store = Store::open(dir.path(), Options::default())?;
    check_serial(&store, &n, writers, commits)?;
    Ok(())
}

#[test]
fn many_threads_many_streams_then_reopen() -> R {
    let dir = tempfile::tempdir()?;
    let (threads, streams, appends) = (8u64, 48u64, 150u64);
    // A small cache and small checkpoints, so evictions and checkpoints run under the writers.
    // Two journal shards whatever the machine's default, so batches span both.
    let opts = Options::default()
        .with_journal_shards(2)
        .with_max_open_streams(16)
        .with_checkpoint_bytes(64 << 10)
        .with_segment_bytes(4096);
    let stream = |s: u64| name(&format!("many/{s:02}"));
    let store = Store::open(dir.path(), opts.clone())?;
    for s in 0..streams {
        let ct = if s % 3 == 0 {
            "text/plain"
        } else {
            "application/json"
        };
        store.create(&stream(s), typed(ct))?;
    }
    let seed = Rng::from_env("many_streams").next();
    let stop = Arc::new(AtomicBool::new(false));
    // Readers tail streams while they grow: what they see must always parse and be in order.
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || -> std::result::Result<u64, String> {
                let mut rng = Rng::new(seed ^ (100 + r));
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    let s = rng.below(streams);
                    let (data, _) =
                        read_to_tail(&store, &stream(s), Some(512)).map_err(|e| e.to_string())?;
                    check_stream(s, &data, None)?;
                    reads += 1;
                }
                Ok(reads)
            })
        })
        .collect();
    let writers: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> std::result::Result<HashMap<u64, u64>, String> {
                let mut rng = Rng::new(seed ^ t);
                let mut counts: HashMap<u64, u64> = HashMap::new();
                for _ in 0..appends {
                    let s = rng.below(streams);
                    let i = counts.entry(s).or_default();
                    let data = if s.is_multiple_of(3) {
                        format!("t{t}i{i:06};")
                    } else {
                        format!("{{\"t\":{t},\"i\":{i}}}")
                    };
                    let req =
                        AppendRequest::new(data).producer(Producer::new(format!("t{t}"), 0, *i));
                    let o = store
                        .append(&stream(s), req)
                        .map_err(|e| format!("append: {e}"))?;
                    if o.status != AppendStatus::Appended {
                        return Err(format!("append answered {:?}", o.status));
                    }
                    *i += 1;
                }
                Ok(counts)
            })
        })
        .collect();
    let mut totals: HashMap<u64, HashMap<u64, u64>> = HashMap::new();
    for (t, w) in writers.into_iter().enumerate() {
        for (s, c) in w.join().map_err(|_| "a writer panicked")?? {
            totals.entry(s).or_default().insert(t as u64, c);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let reads = r.join().map_err(|_| "a reader panicked")??;
        assert!(reads > 0);
    }
    for s in 0..streams {
        let (data, _) = read_to_tail(&store, &stream(s), Some(700))?;
        check_stream(s, &data, totals.get(&s))?;
    }
    store.shutdown()?;
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for s in 0..streams {
        let (data, _) = read_to_tail(&store, &stream(s), Some(700))?;
        check_stream(s, &data, totals.get(&s))?;
    }
    Ok(())
}

/// Each writer's messages in stream `s` are 0, 1, 2, ... in order; with `want`, exactly that many.
fn check_stream(
    s: u64,
    data: &[u8],
    want: Option<&HashMap<u64, u64>>,
) -> std::result::Result<(), String> {
    let mut next: HashMap<u64, u64> = HashMap::new();
    let mut see = |t: u64, i: u64| -> std::result::Result<(), String> {
        let n = next.entry(t).or_default();
        if i != *n {
            return Err(format!(
                "stream {s}: writer {t}'s message {i} where {n} was due"
            ));
        }
        *n += 1;
        Ok(())
    };
    if s.is_multiple_of(3) {
        for part in data.split(|&b| b == b';').filter(|p| !p.is_empty()) {
            let p = std::str::from_utf8(part).map_err(|e| e.to_string())?;
            let (t, i) = p
                .strip_prefix('t')
                .and_then(|x| x.split_once('i'))
                .ok_or(format!("bad message {p:?}"))?;
            see(
                t.parse().map_err(|_| "bad t")?,
                i.parse().map_err(|_| "bad i")?,
            )?;
        }
    } else {
        let v: Vec<Value> = serde_json::from_slice(&[b"[", data, b"]"].concat())
            .map_err(|e| format!("stream {s}: {e}"))?;
        for m in v {
            see(
                m["t"].as_u64().ok_or("bad t")?,
                m["i"].as_u64().ok_or("bad i")?,
            )?;
        }
    }
    if let Some(want) = want {
        for (t, c) in want {
            if next.get(t).copied().unwrap_or(0) != *c {
                return Err(format!(
                    "stream {s}: writer {t} appended {c}, {} present",
                    next.get(t).copied().unwrap_or(0)
                ));
            }
        }
        if next.values().sum::<u64>() != want.values().sum::<u64>() {
            return Err(format!("stream {s}: messages nobody acknowledged"));
        }
    }
    Ok(())
}

#[test]
fn waiters_see_only_acknowledged_data_under_concurrent_appends() -> R {
    let dir = tempfile::tempdir()?;
    // Two journal shards whatever the machine's default: the noise streams share shards.
    let store = Store::open(dir.path(), Options::default().with_journal_shards(2))?;
    let n = name("wait/log");
    let total = 200u64;
    for s in ["wait/log", "wait/noise-1", "wait/noise-2"] {
        store.create(&name(s), typed("application/json"))?;
    }
    let acked = Arc::new(AtomicU64::new(0));
    let waiter = {
        let (store, n, acked) = (store.clone(), n.clone(), acked.clone());
        std::thread::spawn(move || -> std::result::Result<(), String> {
            let mut at = Offset::ZERO;
            let mut seen = 0u64;
            while seen < total {
                if !store
                    .wait_blocking(&n, at, Duration::from_secs(10))
                    .map_err(|e| e.to_string())?
                {
                    return Err("a waiter was not woken".into());
                }
                let c = store
                    .read(&n, &ReadRequest::from(ReadFrom::At(at)))
                    .map_err(|e| e.to_string())?;
                let v: Vec<Value> =
                    serde_json::from_slice(&c.to_vec()).map_err(|e| e.to_string())?;
                for m in v {
                    if m["i"] != seen {
                        return Err(format!("message {m} where {seen} was due"));
                    }
                    seen += 1;
                }
                // Readers see only durable data: at most the one append whose acknowledgement
                // the writer has not counted yet.
                let a = acked.load(Ordering::Acquire);
                if seen > a + 1 {
                    return Err(format!("read {seen} messages, only {a} acknowledged"));
                }
                at = c.next;
            }
            Ok(())
        })
    };
    // Noise on other streams of the same shards, so batches hold several streams' records.
    let noise: Vec<_> = ["wait/noise-1", "wait/noise-2"]
        .into_iter()
        .map(|s| {
            let store = store.clone();
            std::thread::spawn(move || -> brook::Result<()> {
                for i in 0..total {
                    store.append(&name(s), AppendRequest::new(format!("{{\"i\":{i}}}")))?;
                }
                Ok(())
            })
        })
        .collect();
    for i in 0..total {
        store.append(&n, AppendRequest::new(format!("{{\"i\":{i}}}")))?;
        acked.store(i + 1, Ordering::Release);
    }
    for t in noise {
        t.join().map_err(|_| "a noise writer panicked")??;
    }
    waiter.join().map_err(|_| "the waiter panicked")??;
    Ok(())
}
