//! Retention policies through the `Store` API: by size and by age (segments aged by setting their
//! index files' modification time back, the clock the enforcer reads), held back by the latest
//! snapshot and by a subscription's acknowledged offset, the store's default, the policy kept
//! across a restart, and trimming killed mid-way (SIGKILL of a child process) leaving a
//! consistent stream.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use brook::subscription::SubscriptionConfig;
use brook::*;

use crate::util::{R, Rng, crash_image, name};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Every message is this long, so message `k` starts at byte `k * LEN`.
const LEN: usize = 1000;
/// Segments roll at 4 KiB: five messages each (a roll happens once a segment holds 4096 bytes).
const SEGMENT: u64 = 4096;
const PER_SEGMENT: u64 = 5;

fn options() -> Options {
    // The enforcer thread stays out of the way: each test runs its passes itself.
    Options::default()
        .with_segment_bytes(SEGMENT)
        .with_retention_interval(Duration::from_hours(1))
}

/// Message `k`: its number, padded to [`LEN`] bytes.
fn message(k: u64) -> Vec<u8> {
    let mut m = format!("{k:08};").into_bytes();
    m.resize(LEN, b'.');
    m
}

fn append_n(store: &Store, s: &StreamName, from: u64, n: u64) -> R {
    for k in from..from + n {
        store.append(s, AppendRequest::new(message(k)))?;
    }
    Ok(())
}

/// The numbers of the messages from `from` to the tail, checked to be whole and in order.
fn numbers_from(store: &Store, s: &StreamName, from: Offset) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let c = store.read(s, &ReadRequest::from(ReadFrom::At(at)))?;
        let bytes = c.to_vec();
        assert_eq!(bytes.len() % LEN, 0, "a read of whole messages");
        for m in bytes.chunks(LEN) {
            let k: u64 = std::str::from_utf8(&m[..8])?.parse()?;
            assert_eq!(m, message(k).as_slice());
            out.push(k);
        }
        if c.up_to_date {
            return Ok(out);
        }
        at = c.next;
    }
}

/// The stream's segment index files, oldest first (the store holds only this stream).
fn index_files(dir: &Path) -> Res<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = crate::util::files_under(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    v.sort();
    Ok(v)
}

fn at_message(k: u64) -> Offset {
    Offset::new(k, k * LEN as u64)
}

#[test]
fn a_size_limit_drops_the_oldest_whole_segments_and_survives_a_restart() -> R {
    let dir = tempfile::tempdir()?;
    let s = name("sized");
    let policy = RetentionPolicy::new().max_bytes(10_000);
    {
        let store = Store::open(dir.path(), options())?;
        store.create(&s, CreateOptions::new().retention(policy))?;
        append_n(&store, &s, 0, 40)?;
        assert_eq!(index_files(dir.path())?.len(), 8);
        assert_eq!(store.enforce_retention()?, 1);
        // 40000 bytes in segments of 5000: the six oldest go (30000 bytes), the stream keeps
        // 10000, and its start is the seventh segment's.
        let info = store.head(&s, &Guard::NONE)?;
        assert_eq!(info.earliest, at_message(30));
        assert_eq!(info.retention, policy);
        assert_eq!(
            index_files(dir.path())?.len(),
            2,
            "dropped segments are gone"
        );
        let r = store.stats().retention;
        assert_eq!((r.trimmed_segments, r.trimmed_bytes), (6, 30_000));
        assert_eq!((r.bytes_runs, r.age_runs), (1, 0));
        // Nothing more to drop: a second pass changes nothing.
        assert_eq!(store.enforce_retention()?, 0);
    }
    let store = Store::open(dir.path(), options())?;
    let info = store.head(&s, &Guard::NONE)?;
    assert_eq!((info.earliest, info.retention), (at_message(30), policy));
    // The seed: once retention trimmed the start, a read from the start is refused.
    match store.read(&s, &ReadRequest::from(ReadFrom::Start)) {
        Err(Error::OffsetGone { earliest }) => assert_eq!(earliest, at_message(30)),
        other => panic!("expected OffsetGone, got {other:?}"),
    }
    match store.read(&s, &ReadRequest::from(ReadFrom::At(at_message(29)))) {
        Err(Error::OffsetGone { earliest }) => assert_eq!(earliest, at_message(30)),
        other => panic!("expected OffsetGone, got {other:?}"),
    }
    assert_eq!(
        numbers_from(&store, &s, at_message(30))?,
        (30..40).collect::<Vec<_>>()
    );
    // An export carries the policy and the trimmed start to another store.
    let mut archive = Vec::new();
    store.export(&mut archive, &mut |_| {})?;
    let copy_dir = tempfile::tempdir()?;
    let copy = Store::open(copy_dir.path(), options())?;
    copy.import(&mut archive.as_slice(), &mut |_| {})?;
    let copied = copy.head(&s, &Guard::NONE)?;
    assert_eq!(
        (copied.earliest, copied.retention),
        (at_message(30), policy)
    );
    // The same policy again is the same stream; another one is a different configuration.
    assert!(
        !store
            .create(&s, CreateOptions::new().retention(policy))?
            .created
    );
    assert!(matches!(
        store.create(&s, CreateOptions::new()),
        Err(Error::ConfigMismatch(_))
    ));
    Ok(())
}

#[test]
fn an_age_limit_drops_the_segments_whose_newest_message_is_older() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let s = name("aged");
    store.create(
        &s,
        CreateOptions::new().retention(RetentionPolicy::new().max_age(3600)),
    )?;
    append_n(&store, &s, 0, 22)?;
    assert_eq!(store.enforce_retention()?, 0, "nothing is an hour old yet");
    // Age the three oldest segments by two hours (the time their index was last written).
    let old = SystemTime::now() - Duration::from_hours(2);
    for p in &index_files(dir.path())?[..3] {
        std::fs::File::options()
            .write(true)
            .open(p)?
            .set_modified(old)?;
    }
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(
        store.head(&s, &Guard::NONE)?.earliest,
        at_message(3 * PER_SEGMENT)
    );
    let r = store.stats().retention;
    assert_eq!((r.age_runs, r.bytes_runs, r.trimmed_segments), (1, 0, 3));
    // The segment being written is never dropped, however old.
    for p in index_files(dir.path())? {
        std::fs::File::options()
            .write(true)
            .open(&p)?
            .set_modified(old)?;
    }
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(
        store.head(&s, &Guard::NONE)?.earliest,
        at_message(4 * PER_SEGMENT)
    );
    assert_eq!(numbers_from(&store, &s, at_message(20))?, vec![20, 21]);
    Ok(())
}

#[test]
fn the_latest_snapshot_and_a_subscription_hold_retention_back() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let s = name("held");
    store.create(
        &s,
        CreateOptions::new().retention(RetentionPolicy::new().max_bytes(1)),
    )?;
    append_n(&store, &s, 0, 30)?;
    // A snapshot at message 12 covers the first two segments (0..10) and part of the third:
    // retention stops at the third's start, 10.
    store.publish_snapshot(
        &s,
        PublishSnapshot::new(at_message(12), &b"state at 12"[..]),
    )?;
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(store.head(&s, &Guard::NONE)?.earliest, at_message(10));
    assert!(store.stats().retention.held_by_snapshot >= 1);

    // A subscription linked at the start holds the stream until it acknowledges.
    let t = name("subscribed");
    store.create(
        &t,
        CreateOptions::new().retention(RetentionPolicy::new().max_bytes(1)),
    )?;
    store.create(&name("wake"), CreateOptions::json())?;
    store.create_subscription(
        "sub",
        SubscriptionConfig::pull_wake(name("wake")).stream(t.clone()),
    )?;
    append_n(&store, &t, 0, 30)?;
    assert_eq!(store.enforce_retention()?, 0);
    assert_eq!(store.head(&t, &Guard::NONE)?.earliest, Offset::ZERO);
    assert!(store.stats().retention.held_by_subscription >= 1);
    assert!(store.wait_for_work("sub", Duration::from_secs(10))?);
    let wake = store.claim("sub", "worker")?;
    store.ack(&wake, &[(t.clone(), at_message(17))], false)?;
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(store.head(&t, &Guard::NONE)?.earliest, at_message(15));
    store.delete_subscription("sub")?;
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(store.head(&t, &Guard::NONE)?.earliest, at_message(25));
    Ok(())
}

#[test]
fn the_store_default_fills_the_limits_a_stream_leaves_unset() -> R {
    let dir = tempfile::tempdir()?;
    let s = name("defaulted");
    let own = name("own");
    {
        let store = Store::open(dir.path(), options())?;
        store.create(&s, CreateOptions::new())?;
        store.create(
            &own,
            CreateOptions::new().retention(RetentionPolicy::new().max_bytes(20_000)),
        )?;
        append_n(&store, &s, 0, 30)?;
        append_n(&store, &own, 0, 30)?;
        assert_eq!(
            store.enforce_retention()?,
            1,
            "only the stream with a policy"
        );
        assert_eq!(store.head(&s, &Guard::NONE)?.earliest, Offset::ZERO);
    }
    // Reopened with a default: it applies to the stream without a policy of its own, and the
    // stream's own limit wins over it. Neither stream is open when the pass runs.
    let store = Store::open(
        dir.path(),
        options().with_retention_default(RetentionPolicy::new().max_bytes(5_000)),
    )?;
    assert_eq!(store.enforce_retention()?, 1);
    assert_eq!(store.head(&s, &Guard::NONE)?.earliest, at_message(25));
    assert_eq!(store.head(&own, &Guard::NONE)?.earliest, at_message(10));
    assert_eq!(
        store.head(&s, &Guard::NONE)?.retention,
        RetentionPolicy::new()
    );
    // Limits of 0 are refused (leave a limit unset for none).
    assert!(matches!(
        store.create(
            &name("zero"),
            CreateOptions::new().retention(RetentionPolicy::new().max_age(0))
        ),
        Err(Error::InvalidArgument(_))
    ));
    assert!(
        Store::open(
            tempfile::tempdir()?.path(),
            options().with_retention_default(RetentionPolicy::new().max_bytes(0))
        )
        .is_err()
    );
    Ok(())
}

#[test]
fn a_crash_after_the_trim_but_before_its_files_go_recovers_the_trimmed_stream() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let s = name("crashed");
    store.create(
        &s,
        CreateOptions::new().retention(RetentionPolicy::new().max_bytes(10_000)),
    )?;
    append_n(&store, &s, 0, 40)?;
    store.checkpoint()?;
    // The files as they stand before the trim.
    let before = crash_image(store.clone(), dir.path())?;
    assert_eq!(store.enforce_retention()?, 1);
    let after = crash_image(store, dir.path())?;
    // The states a crash leaves between the durable move and the unlinks: the new start, and
    // every file of the dropped segments still there (the first three), or only their indexes
    // (the other three: logs are removed first).
    for p in crate::util::files_under(before.path())? {
        let rel = p.strip_prefix(before.path())?;
        let ext = p.extension().and_then(|e| e.to_str());
        let base: u64 = p
            .file_stem()
            .and_then(|s| s.to_str()?.parse().ok())
            .unwrap_or(0);
        let keep = ext == Some("idx") || (ext == Some("log") && base < 15_000);
        if keep && !after.path().join(rel).exists() {
            std::fs::copy(&p, after.path().join(rel))?;
        }
    }
    assert_eq!(index_files(after.path())?.len(), 8);
    let store = Store::open(after.path(), options())?;
    assert_eq!(store.head(&s, &Guard::NONE)?.earliest, at_message(30));
    assert_eq!(
        numbers_from(&store, &s, at_message(30))?,
        (30..40).collect::<Vec<_>>()
    );
    assert_eq!(index_files(after.path())?.len(), 2, "recovery removed them");
    Ok(())
}

const DIR: &str = "BROOK_RETENTION_CRASH_DIR";

/// The child of [`sigkill_while_trimming_leaves_a_consistent_stream`]: appends numbered messages
/// and runs enforcement passes as fast as it can, until it is killed.
#[test]
fn retention_crash_child() -> R {
    let Ok(dir) = std::env::var(DIR) else {
        return Ok(());
    };
    let store = Store::open(Path::new(&dir), options())?;
    let s = name("killed");
    let next = store.head(&s, &Guard::NONE)?.tail.messages;
    println!("READY");
    let trimmer = {
        let store = store.clone();
        std::thread::spawn(move || {
            loop {
                let _ = store.enforce_retention();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    for k in next.. {
        store.append(&s, AppendRequest::new(message(k)))?;
    }
    drop(trimmer);
    Ok(())
}

#[test]
fn sigkill_while_trimming_leaves_a_consistent_stream() -> R {
    let mut rng = Rng::from_env("sigkill_while_trimming");
    let dir = tempfile::tempdir()?;
    let s = name("killed");
    {
        let store = Store::open(dir.path(), options())?;
        store.create(
            &s,
            CreateOptions::new().retention(RetentionPolicy::new().max_bytes(12_000)),
        )?;
    }
    let mut trimmed = 0;
    for _ in 0..6 {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "retention::retention_crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let t0 = Instant::now();
        while let Some(Ok(l)) = lines.next() {
            if l.ends_with("READY") || t0.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100 + rng.below(400)));
        child.kill()?;
        child.wait()?;

        let store = Store::open(dir.path(), options())?;
        let info = store.head(&s, &Guard::NONE)?;
        let earliest = info.earliest;
        // The start is a segment's first offset (or the stream's), and nothing before it is
        // left on disk once the store is open.
        assert_eq!(earliest.bytes, earliest.messages * LEN as u64);
        let bases: Vec<u64> = index_files(dir.path())?
            .iter()
            .filter_map(|p| p.file_stem()?.to_str()?.parse().ok())
            .collect();
        assert!(
            earliest == Offset::ZERO || bases.first() == Some(&earliest.bytes),
            "earliest {earliest} and segments {bases:?}"
        );
        // Everything from the start to the tail is there, whole and in order.
        let got = numbers_from(&store, &s, earliest)?;
        let want: Vec<u64> = (earliest.messages..info.tail.messages).collect();
        assert_eq!(got, want);
        if earliest > Offset::ZERO {
            trimmed += 1;
            assert!(matches!(
                store.read(&s, &ReadRequest::from(ReadFrom::Start)),
                Err(Error::OffsetGone { .. })
            ));
        }
    }
    assert!(trimmed > 0, "the children trimmed the stream");
    Ok(())
}

/// Found by a kill -9 loop of writers publishing snapshots and moving retention (issue 50): a
/// snapshot published after a retention move lost its blob when the process was killed before
/// a checkpoint. Replay of the retention record removed every blob the stream's state did not
/// list as of that record, the later snapshot's too (its blob is made durable before its own
/// record), so the stream named a latest snapshot whose blob was gone: reads of it answered
/// 404 and a bootstrap served the messages after the retention point without it.
#[test]
fn a_snapshot_published_after_a_retention_move_survives_a_crash() -> R {
    let dir = tempfile::tempdir()?;
    let opts = || options().with_durability(Durability::Sync);
    let store = Store::open(dir.path(), opts())?;
    let n = name("trim/snapshot-after-move");
    store.create(
        &n,
        CreateOptions::with_content_type("text/plain").data("one;"),
    )?;
    let s1 = store.head(&n, &Guard::NONE)?.tail;
    store.publish_snapshot(&n, PublishSnapshot::new(s1, &b"state after one"[..]))?;
    store.set_retention(&n, &RetentionRequest::to(s1))?;
    store.append(&n, AppendRequest::new("two;"))?;
    let s2 = store.head(&n, &Guard::NONE)?.tail;
    store.publish_snapshot(&n, PublishSnapshot::new(s2, &b"state after two"[..]))?;

    let image = crash_image(store, dir.path())?;
    let store = Store::open(image.path(), opts())?;
    let latest = store.snapshot(&n, &SnapshotRequest::latest())?;
    assert_eq!(latest.info.offset, s2);
    assert_eq!(&latest.data[..], b"state after two");
    let at = store.snapshot(&n, &SnapshotRequest::at(s2))?;
    assert_eq!(&at.data[..], b"state after two");
    // Once a checkpoint has recorded the move, the first snapshot's blob is reclaimed and the
    // second still reads.
    store.checkpoint()?;
    assert_eq!(
        &store.snapshot(&n, &SnapshotRequest::latest())?.data[..],
        b"state after two"
    );
    Ok(())
}

/// A snapshot the stream lists whose blob is gone (a damaged disk, or a copy that left it out)
/// is an error naming the blob, never "no snapshot": a bootstrap must not serve the messages
/// after it as if the stream had none. Republishing the same content puts the blob back.
#[test]
fn a_listed_snapshot_whose_blob_is_gone_is_corrupt_until_republished() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let n = name("trim/blob-gone");
    store.create(
        &n,
        CreateOptions::with_content_type("text/plain").data("one;"),
    )?;
    let s1 = store.head(&n, &Guard::NONE)?.tail;
    store.publish_snapshot(&n, PublishSnapshot::new(s1, &b"state"[..]))?;
    let blob = find_blob(dir.path())?.ok_or("no snapshot blob on disk")?;
    std::fs::remove_file(&blob)?;
    match store.snapshot(&n, &SnapshotRequest::latest()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(path, blob),
        other => panic!("a missing blob read as {other:?}"),
    }
    store.publish_snapshot(&n, PublishSnapshot::new(s1, &b"state"[..]))?;
    assert_eq!(
        &store.snapshot(&n, &SnapshotRequest::latest())?.data[..],
        b"state"
    );
    Ok(())
}

/// The first `snap-*.blob` file under `dir`.
fn find_blob(dir: &Path) -> Res<Option<PathBuf>> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            if let Some(found) = find_blob(&p)? {
                return Ok(Some(found));
            }
        } else if p.file_name().and_then(|f| f.to_str()).is_some_and(|f| {
            f.starts_with("snap-") && Path::new(f).extension().is_some_and(|x| x == "blob")
        }) {
            return Ok(Some(p));
        }
    }
    Ok(None)
}
