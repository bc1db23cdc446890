//! Crash tests: a writer in a child process (this test binary, re-executed) is killed with
//! SIGKILL at random moments; the parent reopens the store and checks that every acknowledged
//! append is there exactly once and in order, that nothing never attempted is there, and that the
//! producer's retry of its in-flight append is answered as a duplicate or accepted, never as a gap
//! and never written twice.
//!
//! Replay a run with `BROOK_TEST_SEED`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brook::*;

use crate::util::{R, Rng, crash_image, name, read_to_tail, run_then_kill, typed};

const DIR: &str = "BROOK_CRASH_DIR";
const MODE: &str = "BROOK_CRASH_MODE";
const EPOCH: &str = "BROOK_CRASH_EPOCH";
const NEXT: &str = "BROOK_CRASH_NEXT";
const WRITERS: usize = 3;

fn options(sync: bool) -> Options {
    let d = if sync {
        Durability::Sync
    } else {
        Durability::Buffered
    };
    // Small segments and checkpoints, so kills land in rolls and checkpoints too; two journal
    // shards whatever the machine's default, so crashes land across shards.
    Options::default()
        .with_journal_shards(2)
        .with_durability(d)
        .with_segment_bytes(4096)
        .with_checkpoint_bytes(64 << 10)
}

fn stream(t: usize) -> StreamName {
    name(&format!("crash/{t}"))
}

/// Writer `t`'s stream is JSON except for writer 1's, which holds bytes.
fn is_json(t: usize) -> bool {
    t != 1
}

/// Writer 1's odd messages carry 2500 bytes of one letter (chosen by `k`), so in Buffered mode
/// they are placed appends, written to the segment only (`journal::PLACE_MIN`), and a body
/// replay took from the wrong place shows.
fn message(t: usize, k: u64) -> String {
    if is_json(t) {
        format!("{{\"t\":{t},\"k\":{k}}}")
    } else if k % 2 == 1 {
        format!("t{t}k{k:010}{};", pad(k))
    } else {
        format!("t{t}k{k:010};")
    }
}

fn pad(k: u64) -> String {
    char::from(b'a' + (k % 26) as u8).to_string().repeat(2500)
}

fn request(t: usize, k: u64, epoch: u64, pseq: u64) -> AppendRequest {
    AppendRequest::new(message(t, k))
        .stream_seq(format!("{k:020}"))
        .producer(Producer {
            id: format!("w{t}"),
            epoch,
            seq: pseq,
        })
}

/// The `k` of every message in writer `t`'s stream, in order.
fn ks(store: &Store, t: usize) -> std::result::Result<Vec<u64>, Box<dyn std::error::Error>> {
    let (data, _) = read_to_tail(store, &stream(t), Some(3000))?;
    let mut out = Vec::new();
    if is_json(t) {
        let v: Vec<serde_json::Value> = serde_json::from_slice(&[b"[", &data[..], b"]"].concat())?;
        for m in v {
            if m["t"] != t {
                return Err(format!("message {m} in stream {t}").into());
            }
            out.push(m["k"].as_u64().ok_or("k is not a number")?);
        }
    } else {
        for part in data.split(|&b| b == b';').filter(|p| !p.is_empty()) {
            let s = std::str::from_utf8(part)?;
            let rest = s
                .strip_prefix(&format!("t{t}k"))
                .ok_or_else(|| format!("bad message {s:?}"))?;
            let (k, tail) = rest.split_at(rest.len().min(10));
            let k: u64 = k.parse()?;
            if tail != if k % 2 == 1 { pad(k) } else { String::new() } {
                return Err(format!("message {k} of stream {t} has the wrong bytes").into());
            }
            out.push(k);
        }
    }
    Ok(out)
}

/// The writer, run only in a child process started by `sigkill_at_random_moments`.
#[test]
fn crash_writer_child() -> R {
    let Ok(dir) = std::env::var(DIR) else {
        return Ok(());
    };
    let sync = std::env::var(MODE)? == "sync";
    let epoch: u64 = std::env::var(EPOCH)?.parse()?;
    let next: Vec<u64> = std::env::var(NEXT)?
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let store = Store::open(&dir, options(sync))?;
    let out = Say::new();
    out.line("READY\n");
    let deadline = Instant::now() + Duration::from_mins(1);
    let threads: Vec<_> = (0..WRITERS)
        .map(|t| {
            let store = store.clone();
            let out = out.clone();
            let start = next[t];
            std::thread::spawn(move || {
                for k in start.. {
                    if Instant::now() > deadline {
                        return;
                    }
                    let pseq = k - start;
                    out.line(&format!("TRY {t} {k} {epoch} {pseq}\n"));
                    match store.append(&stream(t), request(t, k, epoch, pseq)) {
                        Ok(o) if o.status == AppendStatus::Appended => {
                            out.line(&format!("ACK {t} {k} {}\n", o.tail));
                        }
                        other => {
                            out.line(&format!("ERR {t} {k} {other:?}\n"));
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    for th in threads {
        let _ = th.join();
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Seen {
    acked: Vec<u64>,
    /// The last attempt: (k, epoch, producer seq).
    last_try: Option<(u64, u64, u64)>,
    errors: Vec<String>,
}

fn parse(lines: &[String]) -> HashMap<usize, Seen> {
    let mut seen: HashMap<usize, Seen> = HashMap::new();
    for l in lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| {
            f.get(i)
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        match f.first() {
            Some(&"TRY") => {
                seen.entry(num(1) as usize).or_default().last_try = Some((num(2), num(3), num(4)));
            }
            Some(&"ACK") => seen.entry(num(1) as usize).or_default().acked.push(num(2)),
            Some(&"ERR") => seen
                .entry(num(1) as usize)
                .or_default()
                .errors
                .push(l.clone()),
            _ => {}
        }
    }
    seen
}

#[test]
fn sigkill_at_random_moments() -> R {
    let mut rng = Rng::from_env("sigkill_at_random_moments");
    let dir = tempfile::tempdir()?;
    {
        let store = Store::open(dir.path(), options(true))?;
        for t in 0..WRITERS {
            let ct = if is_json(t) {
                "application/json"
            } else {
                "application/octet-stream"
            };
            store.create(&stream(t), typed(ct))?;
        }
    }
    let mut next = vec![0u64; WRITERS];
    let mut total_acked = 0;
    let rounds = 10;
    for round in 0..rounds {
        let sync = round % 2 == 0;
        let epoch = round as u64;
        let next_s: Vec<String> = next.iter().map(u64::to_string).collect();
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "crash::crash_writer_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR, dir.path())
            .env(MODE, if sync { "sync" } else { "buffered" })
            .env(EPOCH, epoch.to_string())
            .env(NEXT, next_s.join(","))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let ready = Arc::new(Mutex::new(false));
        let reader = {
            let lines = lines.clone();
            let ready = ready.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                    // libtest's "test ... " has no newline before the child's first line.
                    if l.ends_with("READY") {
                        *ready.lock().expect("lock") = true;
                    }
                    lines.lock().expect("lock").push(l);
                }
            })
        };
        if round % 4 == 3 {
            // Kill while the store opens and recovers.
            std::thread::sleep(Duration::from_millis(rng.below(40)));
        } else {
            let t0 = Instant::now();
            while !*ready.lock().expect("lock") && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(20 + rng.below(300)));
        }
        child.kill()?;
        child.wait()?;
        reader.join().map_err(|_| "reader panicked")?;
        let seen = parse(&lines.lock().expect("lock"));

        let store = Store::open(dir.path(), options(sync))?;
        #[expect(
            clippy::needless_range_loop,
            reason = "t names the writer, its stream and its slot in next"
        )]
        for t in 0..WRITERS {
            let s = seen.get(&t);
            if let Some(e) = s.and_then(|s| s.errors.first()) {
                return Err(format!("round {round}: the writer failed: {e}").into());
            }
            let got = ks(&store, t)?;
            let m = got.len() as u64;
            // Exactly once and in order: the stream holds 0..m.
            if got.iter().enumerate().any(|(i, &k)| k != i as u64) {
                return Err(format!(
                    "round {round} stream {t}: not the messages 0..{m} in order: {got:?}"
                )
                .into());
            }
            // Every acknowledged append survived.
            if let Some(&max) = s.and_then(|s| s.acked.iter().max())
                && max >= m
            {
                let mode = if sync { "sync" } else { "buffered" };
                return Err(format!(
                    "round {round} stream {t}: acked {max} but only {m} messages ({mode})"
                )
                .into());
            }
            total_acked += s.map_or(0, |s| s.acked.len());
            let Some((k, e, pseq)) = s.and_then(|s| s.last_try) else {
                if m != next[t] {
                    return Err(format!(
                        "round {round} stream {t}: {m} messages, none attempted past {}",
                        next[t]
                    )
                    .into());
                }
                continue;
            };
            // Nothing that was never attempted.
            if m > k + 1 || m < k {
                return Err(
                    format!("round {round} stream {t}: {m} messages, last attempt {k}").into(),
                );
            }
            // The producer retries its last attempt after the crash.
            let tail = store.head(&stream(t), &Guard::NONE)?.tail;
            let retry = store.append(&stream(t), request(t, k, e, pseq));
            match (m == k + 1, &retry) {
                (true, Ok(o))
                    if o.status
                        == AppendStatus::Duplicate {
                            original_tail: Some(tail),
                        }
                        && o.tail == tail => {}
                (false, Ok(o)) if o.status == AppendStatus::Appended => {}
                _ => {
                    return Err(format!(
                        "round {round} stream {t}: retry of {k} (present: {}) answered {retry:?}",
                        m == k + 1
                    )
                    .into());
                }
            }
            let after = ks(&store, t)?;
            if after.len() as u64 != k + 1 || after.iter().enumerate().any(|(i, &x)| x != i as u64)
            {
                return Err(format!("round {round} stream {t}: after the retry {after:?}").into());
            }
            if store.head(&stream(t), &Guard::NONE)?.stream_seq != Some(format!("{k:020}")) {
                return Err(format!(
                    "round {round} stream {t}: Stream-Seq is not the last attempt's"
                )
                .into());
            }
            next[t] = k + 1;
        }
        drop(store);
    }
    eprintln!(
        "sigkill_at_random_moments: {total_acked} acknowledged appends over {rounds} kills; final lengths {next:?}"
    );
    if next.iter().sum::<u64>() == 0 {
        return Err("no writer made progress in any round".into());
    }
    Ok(())
}

/// A snapshot published before a crash survives the replay of its stream's create.
#[test]
fn snapshot_blob_survives_replay_of_its_create() -> R {
    let d = tempfile::tempdir()?;
    let store = Store::open(d.path(), Options::default())?;
    let n = name("crash/snap");
    store.create(&n, CreateOptions::json().data("[1,2]"))?;
    let info = store
        .publish_snapshot(&n, PublishSnapshot::new(Offset::new(2, 4), &b"blob"[..]))?
        .snapshot;
    let copy = crash_image(store, d.path())?;
    let store = Store::open(copy.path(), Options::default())?;
    let snap = store.snapshot(&n, &SnapshotRequest::latest())?;
    assert_eq!(snap.info, info);
    assert_eq!(snap.data.as_ref(), b"blob");
    assert_eq!(read_to_tail(&store, &n, None)?.0, b"1,2");
    Ok(())
}

/// Acknowledged appends and their conditional state survive a crash in both modes, with
/// checkpoints and segment rolls in between; retries after the crash are duplicates.
#[test]
fn crash_after_checkpoints_and_rolls() -> R {
    for sync in [true, false] {
        let d = tempfile::tempdir()?;
        let store = Store::open(d.path(), options(sync))?;
        let n = name("crash/rolls");
        store.create(&n, typed("application/json"))?;
        for k in 0..400u64 {
            store.append(&n, request(0, k, 0, k))?;
            if k == 150 {
                store.checkpoint()?;
            }
        }
        let copy = crash_image(store, d.path())?;
        check_prefix(copy.path(), sync, 400)?;
    }
    Ok(())
}

/// A checkpoint lets the journal go only once the appends it held are in the segment files:
/// appends too few to fill a segment's write buffer, a checkpoint, then a crash image (the
/// journal they were in is gone) read back whole, in both modes.
#[test]
fn appends_buffered_by_segments_survive_a_checkpoint_then_a_crash() -> R {
    for sync in [true, false] {
        let d = tempfile::tempdir()?;
        let store = Store::open(d.path(), options(sync))?;
        let n = name("crash/rolls");
        store.create(&n, typed("application/json"))?;
        for k in 0..10u64 {
            store.append(&n, request(0, k, 0, k))?;
        }
        store.checkpoint()?;
        let copy = crash_image(store, d.path())?;
        check_prefix(copy.path(), sync, 10)?;
    }
    Ok(())
}

fn check_prefix(dir: &Path, sync: bool, n: u64) -> R {
    let store = Store::open(dir, options(sync))?;
    let got = ks_named(&store, &name("crash/rolls"))?;
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    let last = n - 1;
    let o = store.append(&name("crash/rolls"), request(0, last, 0, last))?;
    assert!(
        matches!(
            o.status,
            AppendStatus::Duplicate {
                original_tail: Some(_)
            }
        ),
        "{o:?}"
    );
    let e = store.append(
        &name("crash/rolls"),
        AppendRequest::new("1").stream_seq(format!("{last:020}")),
    );
    assert!(matches!(e, Err(Error::StreamSeqConflict { .. })), "{e:?}");
    Ok(())
}

fn ks_named(
    store: &Store,
    n: &StreamName,
) -> std::result::Result<Vec<u64>, Box<dyn std::error::Error>> {
    let (data, _) = read_to_tail(store, n, None)?;
    let v: Vec<serde_json::Value> = serde_json::from_slice(&[b"[", &data[..], b"]"].concat())?;
    Ok(v.iter().filter_map(|m| m["k"].as_u64()).collect())
}

/// Every stream directory under `streams/`.
fn stream_dirs(root: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for fan in std::fs::read_dir(root.join("streams"))? {
        for d in std::fs::read_dir(fan?.path())? {
            out.push(d?.path());
        }
    }
    Ok(out)
}

/// Churn between checkpoints (streams created, appended to and deleted), a checkpointed stream
/// deleted, and a name deleted and created again, then a crash: recovery skips the incarnations
/// the journal deletes, yet leaves no directory or trash of them, keeps the re-created stream's
/// data, and the names can be created again.
#[test]
fn churn_replays_without_rebuilding_deleted_streams() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_durability(Durability::Buffered)
        .with_checkpoint_bytes(1 << 30);
    let store = Store::open(dir.path(), opts)?;
    let kept = name("churn/checkpointed");
    store.create(&kept, typed("text/plain"))?;
    store.append(&kept, AppendRequest::new("old"))?;
    let again = name("churn/again");
    store.create(&again, typed("text/plain"))?;
    store.append(&again, AppendRequest::new("first life"))?;
    store.checkpoint()?;
    for i in 0..300 {
        let s = name(&format!("churn/{i}"));
        store.create(&s, typed("text/plain"))?;
        store.append(&s, AppendRequest::new(format!("hello {i}")))?;
        store.delete(&s, &Guard::NONE)?;
    }
    store.delete(&kept, &Guard::NONE)?;
    store.delete(&again, &Guard::NONE)?;
    store.create(&again, typed("text/plain"))?;
    store.append(&again, AppendRequest::new("second life"))?;
    let image = crash_image(store, dir.path())?;

    let store = Store::open(image.path(), Options::default())?;
    assert_eq!(read_to_tail(&store, &again, None)?.0, b"second life");
    for n in [name("churn/0"), name("churn/299"), kept.clone()] {
        assert!(
            matches!(store.head(&n, &Guard::NONE), Err(Error::NotFound)),
            "{n:?} survived its delete"
        );
    }
    // Every directory left has a sidecar (no orphaned churn), and only churn/again's names a
    // churn stream (the store's own system streams keep theirs).
    let mut churn_dirs = 0;
    for d in stream_dirs(image.path())? {
        let meta: Vec<u8> = ["meta.0", "meta.1"]
            .iter()
            .filter_map(|m| std::fs::read(d.join(m)).ok())
            .flatten()
            .collect();
        assert!(!meta.is_empty(), "{} has no sidecar", d.display());
        if meta.windows(6).any(|w| w == b"churn/") {
            churn_dirs += 1;
        }
    }
    assert_eq!(churn_dirs, 1, "only churn/again keeps a directory");
    assert_eq!(std::fs::read_dir(image.path().join("trash"))?.count(), 0);
    store.create(&name("churn/7"), typed("text/plain"))?;
    store.append(&name("churn/7"), AppendRequest::new("new"))?;
    store.shutdown()?;
    drop(store);
    let store = Store::open(image.path(), Options::default())?;
    assert_eq!(read_to_tail(&store, &name("churn/7"), None)?.0, b"new");
    assert_eq!(read_to_tail(&store, &again, None)?.0, b"second life");
    Ok(())
}

/// The header of a journal file of shard 0 (DESIGN.md 2.2) with the given flags.
fn journal_header(base_lsn: u64, flags: u32) -> Vec<u8> {
    let mut h = b"BRKJ".to_vec();
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&base_lsn.to_le_bytes());
    h
}

/// A Buffered rotation does not sync the old journal file, so a power loss may leave it torn,
/// or short of where the next file starts, with the next file on disk: recovery ends the
/// journal there and drops the later file (never replaying records past a gap), but only when
/// that file's header says its predecessor was unsynced; otherwise a torn older file is a
/// damaged synced record (`Corrupt`).
#[test]
fn a_torn_file_before_an_unsynced_rotation_ends_the_journal() -> R {
    // (next file flagged, first file torn rather than cut short at a frame boundary)
    for (flagged, torn) in [(true, true), (false, true), (true, false)] {
        let dir = tempfile::tempdir()?;
        let opts = Options::default()
            .with_durability(Durability::Buffered)
            .with_journal_shards(1);
        let store = Store::open(dir.path(), opts.clone())?;
        let s = name("rotated");
        store.create(&s, typed("text/plain"))?;
        store.append(&s, AppendRequest::new("a;"))?;
        // The checkpoint makes `a;` durable in the sidecar and starts a new journal file.
        store.checkpoint()?;
        for m in ["b;", "c;", "d;"] {
            store.append(&s, AppendRequest::new(m))?;
        }
        let image = crash_image(store, dir.path())?;
        let jdir = image.path().join("journal/00");
        let files = crate::util::files_under(&jdir)?;
        assert_eq!(
            files.len(),
            1,
            "one journal file after the checkpoint: {files:?}"
        );
        let file = &files[0];
        let bytes = std::fs::read(file)?;
        let base: u64 = file
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .parse()?;
        // Split it as a rotation would have: the first file ends in the middle of `d;`'s
        // frame (torn), the second starts where the first file ended whole and holds that
        // frame again, as if `d;` had been written after the rotation.
        let mut at = 24;
        let mut frames = Vec::new();
        // The file's zero tail is space set aside for later batches.
        while at < bytes.len() && bytes[at..at + 4] != [0; 4] {
            let len = 8 + u32::from_le_bytes(bytes[at..at + 4].try_into()?) as usize;
            frames.push(at..at + len);
            at += len;
        }
        assert_eq!(frames.len(), 3, "the frames of b, c and d");
        let last = frames[2].clone();
        let cut = if torn { last.start + 5 } else { last.start };
        std::fs::write(file, &bytes[..cut])?;
        let next_base = base + (at as u64 - 24);
        let mut next = journal_header(next_base, u32::from(flagged));
        next.extend_from_slice(&bytes[last]);
        let next_path = jdir.join(format!("{next_base:020}.wal"));
        std::fs::write(&next_path, next)?;

        let reopened = Store::open(image.path(), opts.clone());
        if !flagged {
            let err = reopened.err().expect("a torn synced file is refused");
            assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
            continue;
        }
        let store = reopened?;
        let (read, _) = read_to_tail(&store, &s, None)?;
        assert_eq!(read, b"a;b;c;", "the journal ends at the tear");
        assert!(!next_path.exists(), "the file after the tear is dropped");
        store.append(&s, AppendRequest::new("e;"))?;
        drop(store);
        let store = Store::open(image.path(), opts)?;
        assert_eq!(read_to_tail(&store, &s, None)?.0, b"a;b;c;e;");
    }
    Ok(())
}

/// Sync mode prepares the next journal file (zeros written and synced ahead of the writer)
/// once its syncs are small, and switches to it: the journal then lives in a file of the
/// prepared length (a checkpoint's worth and a quarter: 80 KiB here), not in one grown in
/// sparse 4 MiB steps. After a crash, a prepared file renamed into place whose header was lost
/// holds nothing, and open removes a prepared file left over; every acknowledged append is
/// there, in order.
#[test]
fn sync_journal_switches_to_a_prepared_file_and_recovers_around_it() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_journal_shards(1)
        .with_checkpoint_bytes(64 << 10);
    let store = Store::open(dir.path(), opts.clone())?;
    let s = name("prepared");
    store.create(&s, typed("text/plain"))?;
    let jdir = dir.path().join("journal/00");
    let prepared_len = 80 << 10;
    let is_prepared = |f: &Path| {
        f.extension().is_some_and(|e| e == "wal")
            && std::fs::metadata(f).is_ok_and(|m| m.len() == prepared_len)
    };
    let mut sent = Vec::new();
    let mut switches = 0;
    let deadline = Instant::now() + Duration::from_mins(1);
    for k in 0.. {
        let m = format!("m{k:06};");
        store.append(&s, AppendRequest::new(m.clone()))?;
        sent.extend_from_slice(m.as_bytes());
        if crate::util::files_under(&jdir)?
            .iter()
            .any(|f| is_prepared(f))
        {
            switches += 1;
        }
        if switches >= 100 && k >= 3000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {k} appends, no journal file of the prepared length: {:?}",
            crate::util::files_under(&jdir)?
        );
    }
    let image = crash_image(store, dir.path())?;
    let ijdir = image.path().join("journal/00");
    // The newest journal file's records end at `end`: a prepared file renamed to start there,
    // whose header the power took before its first sync, is all zeros.
    let mut files: Vec<_> = crate::util::files_under(&ijdir)?
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    let newest = files.last().ok_or("no journal file")?;
    let base: u64 = newest
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .parse()?;
    let bytes = std::fs::read(newest)?;
    let mut at = 24;
    while at + 4 <= bytes.len() && bytes[at..at + 4] != [0; 4] {
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into()?) as usize;
    }
    let end = base + (at as u64 - 24);
    // (A newest file without records is itself such a file.)
    std::fs::write(ijdir.join(format!("{end:020}.wal")), vec![0u8; 80 << 10])?;
    std::fs::write(ijdir.join("prepared.tmp"), vec![0u8; 80 << 10])?;
    let reopened = Store::open(image.path(), opts.clone())?;
    assert_eq!(read_to_tail(&reopened, &s, None)?.0, sent);
    assert!(
        !ijdir.join("prepared.tmp").exists(),
        "a leftover prepared file"
    );
    // A clean shutdown leaves no prepared file either, and loses nothing.
    let m = "after;";
    reopened.append(&s, AppendRequest::new(m))?;
    sent.extend_from_slice(m.as_bytes());
    drop(reopened);
    assert!(
        !ijdir.join("prepared.tmp").exists(),
        "a prepared file after shutdown"
    );
    let again = Store::open(image.path(), opts)?;
    assert_eq!(read_to_tail(&again, &s, None)?.0, sent);
    Ok(())
}

/// Buffered mode writes a body of 2 KiB or more to its segment only (a placed append): the
/// journal keeps its length and CRC. After a crash, replay reads the bytes back from the logs,
/// across the segment rolls the writer made. Where a placed append's bytes are not what its
/// record says (here: damaged on purpose, as a power loss may leave them), that stream ends
/// just before it, with the Stream-Seq and producer state of what it kept, and takes writes
/// there; the other streams replay whole.
#[test]
fn placed_appends_replay_from_their_logs_and_end_their_stream_where_missing() -> R {
    let options = || {
        Options::default()
            .with_journal_shards(1)
            .with_durability(Durability::Buffered)
            .with_segment_bytes(8192)
            .with_checkpoint_bytes(64 << 20)
    };
    let body = |k: u64| format!("{k:04}{}", pad(k)[..2496].to_owned());
    let append = |k: u64| {
        AppendRequest::new(body(k))
            .stream_seq(format!("{k:04}"))
            .producer(Producer {
                id: "w".into(),
                epoch: 0,
                seq: k,
            })
    };
    let (a, b) = (name("placed/a"), name("placed/b"));
    let d = tempfile::tempdir()?;
    let store = Store::open(d.path(), options())?;
    for n in [&a, &b] {
        store.create(n, typed("application/octet-stream"))?;
    }
    store.checkpoint()?;
    for k in 0..6u64 {
        store.append(&a, append(k))?;
        if k % 2 == 0 {
            store.append(&b, append(k / 2))?;
        }
    }
    // 9 bodies of 2500 bytes were appended since the checkpoint; the journal holds their
    // records, not their bytes.
    let journal: u64 = std::fs::read_dir(d.path().join("journal/00"))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".wal"))
        .map(|e| {
            let bytes = std::fs::read(e.path()).unwrap_or_default();
            bytes
                .iter()
                .rposition(|&x| x != 0)
                .map_or(0, |p| p as u64 + 1)
        })
        .sum();
    assert!(
        journal < 4 * 2500,
        "{journal} journal bytes for 9 placed appends"
    );
    let whole = |k: std::ops::Range<u64>| k.map(body).collect::<String>().into_bytes();
    let copy = crash_image(store, d.path())?;
    let damaged = tempfile::tempdir()?;
    crate::util::copy_dir(copy.path(), damaged.path())?;

    // Whole: both streams, across a's roll at byte 10000 (a's fifth body).
    {
        let store = Store::open(copy.path(), options())?;
        assert_eq!(read_to_tail(&store, &a, None)?.0, whole(0..6));
        assert_eq!(read_to_tail(&store, &b, None)?.0, whole(0..3));
    }

    // a's fifth body (the first of its second segment) damaged: a ends before it.
    let mut logs = Vec::new();
    for shard in std::fs::read_dir(damaged.path().join("streams"))? {
        for s in std::fs::read_dir(shard?.path())? {
            let p = s?.path().join("00000000000000010000.log");
            if p.exists() {
                logs.push(p);
            }
        }
    }
    assert_eq!(logs.len(), 1, "only a rolled at 10000: {logs:?}");
    let mut log = std::fs::read(&logs[0])?;
    log[100] ^= 0xff;
    std::fs::write(&logs[0], &log)?;
    let store = Store::open(damaged.path(), options())?;
    assert_eq!(read_to_tail(&store, &a, None)?.0, whole(0..4));
    assert_eq!(read_to_tail(&store, &b, None)?.0, whole(0..3));
    let info = store.head(&a, &Guard::NONE)?;
    assert_eq!(info.stream_seq.as_deref(), Some("0003"));
    // The producer's state is that of the fourth body: its retry is a duplicate, the next
    // sequence number is appended where the stream ends.
    let retry = store.append(&a, append(3))?;
    assert!(
        matches!(retry.status, AppendStatus::Duplicate { .. }),
        "{retry:?}"
    );
    let next = store.append(&a, append(4))?;
    assert!(matches!(next.status, AppendStatus::Appended), "{next:?}");
    drop(store);
    let store = Store::open(damaged.path(), options())?;
    assert_eq!(read_to_tail(&store, &a, None)?.0, whole(0..5));
    Ok(())
}

const SNAP_WRITERS: usize = 4;

/// A child's lines to its parent on standard output, each written whole and flushed (the
/// parent reads what was said before it killed the child).
#[derive(Clone)]
struct Say(Arc<Mutex<std::io::Stdout>>);

impl Say {
    fn new() -> Say {
        Say(Arc::new(Mutex::new(std::io::stdout())))
    }

    fn line(&self, line: &str) {
        let mut o = self.0.lock().expect("stdout lock");
        let _ = o.write_all(line.as_bytes());
        let _ = o.flush();
    }
}

fn snap_stream(t: usize) -> StreamName {
    name(&format!("crash/snap/{t}"))
}

/// The content of writer `t`'s snapshot after its message `k`.
fn snap_blob(t: usize, k: u64) -> String {
    format!("snapshot of writer {t} after message {k}")
}

/// The writer of `sigkill_while_snapshots_and_retention_move`, run only in its child process:
/// each of four threads appends to its own stream and, after every third message, publishes a
/// snapshot at its tail and moves retention to the snapshot before it (the order issue 50's
/// loss needed: S1, retention to S1, S2).
#[test]
fn crash_snapshot_writer_child() -> R {
    let Ok(dir) = std::env::var(DIR) else {
        return Ok(());
    };
    let start: u64 = std::env::var(NEXT)?.parse()?;
    let store = Store::open(&dir, options(true))?;
    let out = Say::new();
    out.line("READY\n");
    let deadline = Instant::now() + Duration::from_mins(1);
    let threads: Vec<_> = (0..SNAP_WRITERS)
        .map(|t| {
            let store = store.clone();
            let out = out.clone();
            std::thread::spawn(move || -> brook::Result<()> {
                let n = snap_stream(t);
                let mut previous = store.head(&n, &Guard::NONE)?.snapshot.map(|s| s.offset);
                for k in start.. {
                    if Instant::now() > deadline {
                        return Ok(());
                    }
                    let o = store.append(&n, AppendRequest::new(format!("t{t}k{k};")))?;
                    if k % 3 != 2 {
                        continue;
                    }
                    let blob = snap_blob(t, k);
                    out.line(&format!("TRYSNAP {t} {k}\n"));
                    store.publish_snapshot(&n, PublishSnapshot::new(o.tail, blob.as_bytes()))?;
                    out.line(&format!("SNAP {t} {k}\n"));
                    if let Some(p) = previous {
                        store.set_retention(&n, &RetentionRequest::to(p))?;
                    }
                    previous = Some(o.tail);
                }
                Ok(())
            })
        })
        .collect();
    for (t, th) in threads.into_iter().enumerate() {
        if let Ok(Err(e)) = th.join() {
            out.line(&format!("ERR {t} {e}\n"));
        }
    }
    Ok(())
}

/// Found by a kill -9 loop (issue 50): four writers appending, publishing snapshots and moving
/// retention, killed at random moments. After every restart each stream's latest snapshot must
/// read back (never a missing blob), be at least the last one acknowledged, hold its writer's
/// content, and the retained start must be at or before it.
#[test]
fn sigkill_while_snapshots_and_retention_move() -> R {
    let mut rng = Rng::from_env("sigkill_while_snapshots_and_retention_move");
    let dir = tempfile::tempdir()?;
    {
        let store = Store::open(dir.path(), options(true))?;
        for t in 0..SNAP_WRITERS {
            store.create(&snap_stream(t), typed("text/plain"))?;
        }
    }
    let mut next = 0u64;
    let mut snapshots = 0usize;
    for round in 0..6 {
        let lines = run_then_kill(
            "crash::crash_snapshot_writer_child",
            &[
                (DIR, dir.path().display().to_string()),
                (NEXT, next.to_string()),
            ],
            Duration::from_millis(100 + rng.below(400)),
        )?;
        if let Some(e) = lines.iter().find(|l| l.starts_with("ERR")) {
            return Err(format!("round {round}: a writer failed: {e}").into());
        }
        // The newest acknowledged snapshot of each writer.
        let mut acked = [None; SNAP_WRITERS];
        for l in &lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let ["SNAP", t, k] = f[..] {
                let (t, k): (usize, u64) = (t.parse()?, k.parse()?);
                acked[t] = Some(k);
                snapshots += 1;
            }
        }
        let store = Store::open(dir.path(), options(true))?;
        let mut longest = 0;
        for (t, acked) in acked.iter().enumerate() {
            let n = snap_stream(t);
            let info = store.head(&n, &Guard::NONE)?;
            longest = longest.max(info.tail.messages);
            let latest = match store.snapshot(&n, &SnapshotRequest::latest()) {
                Ok(s) => Some(s),
                Err(Error::SnapshotNotFound) => None,
                Err(e) => {
                    return Err(format!("round {round} stream {t}: latest snapshot: {e}").into());
                }
            };
            let Some(latest) = latest else {
                if let Some(k) = acked {
                    return Err(format!("round {round} stream {t}: snapshot {k} lost").into());
                }
                continue;
            };
            // Published after message k, which its content names.
            let text = String::from_utf8_lossy(&latest.data).into_owned();
            let k: u64 = text
                .strip_prefix(&format!("snapshot of writer {t} after message "))
                .and_then(|k| k.parse().ok())
                .ok_or_else(|| format!("round {round} stream {t}: snapshot bytes {text:?}"))?;
            if acked.is_some_and(|a| k < a) {
                return Err(format!(
                    "round {round} stream {t}: latest snapshot {k}, but {acked:?} was acknowledged"
                )
                .into());
            }
            if info.earliest > latest.info.offset {
                return Err(format!(
                    "round {round} stream {t}: retained start {} past the latest snapshot {}",
                    info.earliest, latest.info.offset
                )
                .into());
            }
        }
        // Each round's writers start past every message any stream holds.
        next = longest + 3 - longest % 3;
        drop(store);
    }
    eprintln!("sigkill_while_snapshots_and_retention_move: {snapshots} acknowledged snapshots");
    if snapshots == 0 {
        return Err("no snapshot was acknowledged in any round".into());
    }
    Ok(())
}
