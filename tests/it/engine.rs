//! The engine's behaviour through `Store`, with the reopen pattern wherever state must survive.

use std::time::Duration;

use brook::*;

use crate::util::typed as text;

type R = std::result::Result<(), Box<dyn std::error::Error>>;

fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, Options::default()).expect("open")
}

fn append(data: &str) -> AppendRequest {
    AppendRequest::new(data.to_owned())
}

fn read_all(store: &Store, n: &StreamName) -> brook::Result<Vec<u8>> {
    Ok(store.read(n, &ReadRequest::from(ReadFrom::Start))?.to_vec())
}

#[test]
fn create_append_read_survive_reopen() -> R {
    let dir = tempfile::tempdir()?;
    let n = name("docs/a");
    let tail;
    {
        let store = open(dir.path());
        let c = store.create(&n, text("text/plain"))?;
        assert!(c.created);
        assert_eq!(c.info.tail, Offset::ZERO);
        store.append(&n, append("hello "))?;
        let out = store.append(&n, append("world"))?;
        assert_eq!(out.tail, Offset::new(2, 11));
        tail = out.tail;
        assert_eq!(read_all(&store, &n)?, b"hello world");
    }
    let store = open(dir.path());
    assert_eq!(read_all(&store, &n)?, b"hello world");
    let info = store.head(&n, &Guard::NONE)?;
    assert_eq!(info.tail, tail);
    assert_eq!(info.content_type, "text/plain");
    // Reading from an offset continues exactly there.
    let chunk = store.read(&n, &ReadRequest::from(ReadFrom::At(Offset::new(1, 6))))?;
    assert_eq!(chunk.to_vec(), b"world");
    assert!(chunk.up_to_date);
    Ok(())
}

#[test]
fn crash_without_shutdown_replays_the_journal() -> R {
    let dir = tempfile::tempdir()?;
    let n = name("crash/me");
    {
        let store = open(dir.path());
        store.create(&n, text("application/json"))?;
        for i in 0..100 {
            let p = Producer::new("p", 0, i);
            store.append(
                &n,
                AppendRequest::new(format!("{{\"i\":{i}}}"))
                    .producer(p)
                    .stream_seq(format!("{i:05}")),
            )?;
        }
        std::mem::forget(store); // no clean shutdown: the journal must carry everything
    }
    // The forgotten store still holds the lock in this process; a real crash releases it. Simulate
    // by copying the directory, as the files stood at the crash.
    let copy = tempfile::tempdir()?;
    copy_dir(dir.path(), copy.path())?;
    std::fs::remove_file(copy.path().join("LOCK"))?;
    let store = open(copy.path());
    let chunk = store.read(&n, &ReadRequest::from(ReadFrom::Start))?;
    let v: Vec<serde_json::Value> = serde_json::from_slice(&chunk.to_vec())?;
    assert_eq!(v.len(), 100);
    // The producer's retry of its last append is a duplicate carrying the original tail.
    let retry = store.append(
        &n,
        AppendRequest::new("{\"i\":99}")
            .producer(Producer::new("p", 0, 99))
            .stream_seq("00099"),
    )?;
    assert_eq!(
        retry.status,
        AppendStatus::Duplicate {
            original_tail: Some(chunk.next)
        }
    );
    // Stream-Seq survived with the data.
    let e = store
        .append(&n, AppendRequest::new("1").stream_seq("00099"))
        .unwrap_err();
    assert!(matches!(e, Error::StreamSeqConflict { ref last_seq, .. } if last_seq == "00099"));
    Ok(())
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &t)?;
        } else {
            std::fs::copy(e.path(), t)?;
        }
    }
    Ok(())
}

#[test]
fn json_streams_keep_message_boundaries() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let n = name("j");
    store.create(&n, CreateOptions::json().data("[]"))?;
    assert_eq!(read_all(&store, &n)?, b"[]");
    store.append(&n, append(r#"[{"a":1},{"b":2}]"#))?;
    store.append(&n, append(r"[[1,2]]"))?;
    assert_eq!(read_all(&store, &n)?, br#"[{"a":1},{"b":2},[1,2]]"#);
    assert!(matches!(
        store.append(&n, append("[]")),
        Err(Error::EmptyJsonArray)
    ));
    assert!(matches!(
        store.append(&n, append("{nope")),
        Err(Error::InvalidJson(_))
    ));
    // A bounded read returns whole messages, at least one.
    let c = store.read(&n, &ReadRequest::from(ReadFrom::Start).max_bytes(3))?;
    assert_eq!(c.to_vec(), br#"[{"a":1}]"#);
    assert!(!c.up_to_date);
    let c2 = store.read(&n, &ReadRequest::from(ReadFrom::At(c.next)))?;
    assert_eq!(c2.to_vec(), br#"[{"b":2},[1,2]]"#);
    let tail = store.read(&n, &ReadRequest::from(ReadFrom::Tail))?;
    assert_eq!(tail.to_vec(), b"[]");
    assert!(tail.up_to_date);
    Ok(())
}

#[test]
fn closure_and_conflicts_change_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let n = name("c");
    store.create(&n, text("text/plain"))?;
    store.append(&n, AppendRequest::new("x").stream_seq("b"))?;
    let e = store
        .append(&n, AppendRequest::new("y").stream_seq("a"))
        .unwrap_err();
    assert!(
        matches!(e, Error::StreamSeqConflict { tail, ref last_seq } if tail == Offset::new(1, 1) && last_seq == "b")
    );
    let e = store
        .append(&n, AppendRequest::new("y").content_type("text/html"))
        .unwrap_err();
    assert!(matches!(e, Error::ContentTypeMismatch { .. }));
    // A non-printable Stream-Seq is ignored: not checked, not stored.
    store.append(&n, AppendRequest::new("z").stream_seq("\u{1}"))?;
    assert_eq!(
        store.head(&n, &Guard::NONE)?.stream_seq.as_deref(),
        Some("b")
    );
    let closed = store.append(&n, AppendRequest::new("!").closing())?;
    assert!(closed.closed);
    assert!(matches!(
        store.append(&n, append("more")),
        Err(Error::StreamClosed { .. })
    ));
    assert_eq!(
        store.close(&n, &Guard::NONE)?.status,
        AppendStatus::AlreadyClosed
    );
    assert_eq!(read_all(&store, &n)?, b"xz!");
    let c = store.read(&n, &ReadRequest::from(ReadFrom::Start))?;
    assert!(c.closed);
    drop(store);
    let store = open(dir.path());
    assert!(store.head(&n, &Guard::NONE)?.closed);
    Ok(())
}

#[test]
fn create_is_idempotent_and_incarnations_change() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let n = name("inc");
    let a = store.create(&n, text("text/plain"))?;
    let again = store.create(&n, text("text/plain").stream_seq("zzz"))?;
    assert!(!again.created);
    assert_eq!(again.info.incarnation, a.info.incarnation);
    assert_eq!(
        again.info.stream_seq, None,
        "a PUT of an existing stream ignores Stream-Seq"
    );
    assert!(matches!(
        store.create(&n, text("application/json")),
        Err(Error::ConfigMismatch(_))
    ));
    let e = store
        .append(
            &n,
            AppendRequest::new("x").expect(Incarnation::new("nope")?),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::IncarnationMismatch { ref current } if *current == a.info.incarnation)
    );
    store.delete(&n, &Guard::expect(a.info.incarnation.clone()))?;
    assert!(matches!(store.head(&n, &Guard::NONE), Err(Error::NotFound)));
    let missing = store.create(&n, text("text/plain").expect(a.info.incarnation.clone()));
    assert!(matches!(missing, Err(Error::IncarnationMissing)));
    let b = store.create(&n, text("text/plain").stream_seq("5"))?;
    assert_ne!(b.info.incarnation, a.info.incarnation);
    assert_eq!(b.info.stream_seq.as_deref(), Some("5"));
    drop(store);
    let store = open(dir.path());
    let h = store.head(&n, &Guard::NONE)?;
    assert_eq!(h.incarnation, b.info.incarnation);
    assert_eq!(h.stream_seq.as_deref(), Some("5"));
    Ok(())
}

/// A fork chain stops at `MAX_FORK_DEPTH` forks: the next fork is `ForkTooDeep` and creates
/// nothing, the deepest fork reads every ancestor's data, and the store stays open within a
/// small descriptor budget (a read holds at most the chain's streams).
#[test]
fn fork_chains_stop_at_the_maximum_depth() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default().with_max_open_streams(16))?;
    let mut prev = name("deep/0");
    store.create(&prev, text("text/plain"))?;
    store.append(&prev, append("0,"))?;
    let mut want = b"0,".to_vec();
    for depth in 1..=MAX_FORK_DEPTH {
        let next = name(&format!("deep/{depth}"));
        let tail = store.head(&prev, &Guard::NONE)?.tail;
        store.create(
            &next,
            CreateOptions::new().fork(ForkFrom::at(prev.clone(), tail)),
        )?;
        let piece = format!("{depth},");
        store.append(&next, append(&piece))?;
        want.extend_from_slice(piece.as_bytes());
        prev = next;
    }
    assert_eq!(read_all(&store, &prev)?, want);
    let tail = store.head(&prev, &Guard::NONE)?.tail;
    let too_deep = name("deep/too-deep");
    match store.create(
        &too_deep,
        CreateOptions::new().fork(ForkFrom::at(prev.clone(), tail)),
    ) {
        Err(Error::ForkTooDeep { max }) => assert_eq!(max, MAX_FORK_DEPTH),
        other => panic!("a fork past the maximum depth: {other:?}"),
    }
    assert!(matches!(
        store.head(&too_deep, &Guard::NONE),
        Err(Error::NotFound)
    ));
    // Forking a shallower stream of the chain still works.
    let side = name("deep/side");
    let mid = name(&format!("deep/{}", MAX_FORK_DEPTH / 2));
    let at = store.head(&mid, &Guard::NONE)?.tail;
    store.create(&side, CreateOptions::new().fork(ForkFrom::at(mid, at)))?;
    drop(store);
    let store = open(dir.path());
    assert_eq!(read_all(&store, &prev)?, want);
    Ok(())
}

#[test]
fn forks_stitch_source_data_and_soft_delete() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let src = name("src");
    store.create(&src, text("text/plain"))?;
    store.append(&src, append("abc"))?;
    let mid = store.append(&src, append("def"))?.tail;
    store.append(&src, append("ghi"))?;
    let f = name("fork");
    let fork = CreateOptions::new().fork(ForkFrom::at(src.clone(), mid));
    let c = store.create(&f, fork.clone())?;
    assert_eq!(c.info.tail, mid);
    assert_eq!(c.info.content_type, "text/plain");
    store.append(&f, append("XYZ"))?;
    assert_eq!(read_all(&store, &f)?, b"abcdefXYZ");
    assert_eq!(read_all(&store, &src)?, b"abcdefghi");
    assert!(!store.create(&f, fork)?.created);
    // Deleting the source soft-deletes it: gone for clients, kept for the fork.
    store.delete(&src, &Guard::NONE)?;
    assert!(matches!(store.head(&src, &Guard::NONE), Err(Error::Gone)));
    assert!(matches!(
        store.create(&src, text("text/plain")),
        Err(Error::ConfigMismatch(_))
    ));
    drop(store);
    let store = open(dir.path());
    assert_eq!(read_all(&store, &f)?, b"abcdefXYZ");
    assert!(matches!(store.head(&src, &Guard::NONE), Err(Error::Gone)));
    store.delete(&f, &Guard::NONE)?;
    assert!(matches!(
        store.head(&src, &Guard::NONE),
        Err(Error::NotFound)
    ));
    // Sub-offsets refine the point inside the next message.
    let s2 = name("src2");
    store.create(&s2, text("text/plain"))?;
    store.append(&s2, append("hello"))?;
    let sub = CreateOptions::new().fork(ForkFrom::at(s2.clone(), Offset::ZERO).sub_offset(2));
    store.create(&name("f2"), sub)?;
    assert_eq!(read_all(&store, &name("f2"))?, b"he");
    let over = CreateOptions::new().fork(ForkFrom::at(s2.clone(), Offset::ZERO).sub_offset(6));
    assert!(matches!(
        store.create(&name("f3"), over),
        Err(Error::InvalidForkPosition(_))
    ));
    let past = CreateOptions::new().fork(ForkFrom::at(
        s2,
        Offset::new(9_999_999_999_999_999, 9_999_999_999_999_999),
    ));
    assert!(matches!(
        store.create(&name("f4"), past),
        Err(Error::InvalidForkPosition(_))
    ));
    Ok(())
}

#[test]
fn snapshots_and_retention() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default().with_segment_bytes(4096))?;
    let n = name("snap");
    store.create(&n, text("application/json"))?;
    let mut last = Offset::ZERO;
    for i in 0..300 {
        last = store
            .append(
                &n,
                append(&format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(40))),
            )?
            .tail;
    }
    let info = store
        .publish_snapshot(
            &n,
            PublishSnapshot::new(last, &b"{\"count\":300}"[..]).content_type("application/json"),
        )?
        .snapshot;
    let again = store
        .publish_snapshot(
            &n,
            PublishSnapshot::new(last, &b"{\"count\":300}"[..]).content_type("application/json"),
        )?
        .snapshot;
    assert_eq!(info.digest, again.digest);
    assert!(matches!(
        store.publish_snapshot(
            &n,
            PublishSnapshot::new(last, &b"{}"[..]).content_type("application/json")
        ),
        Err(Error::SnapshotConflict)
    ));
    assert_eq!(
        store
            .snapshot(&n, &SnapshotRequest::latest())?
            .data
            .as_ref(),
        b"{\"count\":300}"
    );
    let before = store.head(&n, &Guard::NONE)?;
    assert_eq!(before.snapshot.as_ref().map(|s| s.offset), Some(last));
    store.set_retention(&n, &RetentionRequest::to(last))?;
    assert!(matches!(
        store.read(&n, &ReadRequest::from(ReadFrom::At(Offset::ZERO))),
        Err(Error::OffsetGone { .. })
    ));
    // Once retention trimmed the start, a read from the start is refused with the earliest offset.
    assert!(
        matches!(store.read(&n, &ReadRequest::from(ReadFrom::Start)), Err(Error::OffsetGone { earliest }) if earliest == last)
    );
    let c = store.read(&n, &ReadRequest::from(ReadFrom::At(last)))?;
    assert_eq!(c.to_vec(), b"[]");
    let beyond = Offset::new(301, last.bytes + 10);
    assert!(matches!(
        store.set_retention(&n, &RetentionRequest::to(beyond)),
        Err(Error::NotOnBoundary(o)) if o == beyond
    ));
    drop(store);
    let store = Store::open(dir.path(), Options::default().with_segment_bytes(4096))?;
    assert_eq!(store.head(&n, &Guard::NONE)?.earliest, last);
    assert_eq!(
        store.snapshot(&n, &SnapshotRequest::at(last))?.info.digest,
        info.digest
    );
    Ok(())
}

#[test]
fn expiry_to_the_millisecond() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let n = name("ttl");
    let at = std::time::SystemTime::now() + Duration::from_millis(300);
    store.create(&n, text("text/plain").expires_at(at))?;
    store.head(&n, &Guard::NONE)?;
    std::thread::sleep(Duration::from_millis(350));
    assert!(matches!(store.head(&n, &Guard::NONE), Err(Error::NotFound)));
    store.create(&n, text("text/plain"))?;
    Ok(())
}

#[test]
fn waiters_wake_on_append_and_close() -> R {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path());
    let n = name("w");
    store.create(&n, text("text/plain"))?;
    let s2 = store.clone();
    let n2 = n.clone();
    let t =
        std::thread::spawn(move || s2.wait_blocking(&n2, Offset::ZERO, Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(50));
    store.append(&n, append("x"))?;
    assert!(t.join().expect("join")?);
    assert!(!store.wait_blocking(&n, Offset::new(1, 1), Duration::from_millis(50))?);
    store.close(&n, &Guard::NONE)?;
    assert!(store.wait_blocking(&n, Offset::new(1, 1), Duration::from_secs(5))?);
    Ok(())
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() -> R {
    let dir = tempfile::tempdir()?;
    let _a = open(dir.path());
    assert!(matches!(
        Store::open(dir.path(), Options::default()),
        Err(Error::Locked(_))
    ));
    Ok(())
}

#[test]
fn many_streams_with_a_small_cache() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_max_open_streams(16)
        .with_checkpoint_bytes(64 << 10);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..200 {
        let n = name(&format!("many/{i}"));
        store.create(&n, text("text/plain"))?;
        store.append(&n, append(&format!("v{i}")))?;
    }
    for i in (0..200).step_by(7) {
        assert_eq!(
            read_all(&store, &name(&format!("many/{i}")))?,
            format!("v{i}").as_bytes()
        );
    }
    assert_eq!(store.list("many/")?.len(), 200);
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for i in 0..200 {
        assert_eq!(
            read_all(&store, &name(&format!("many/{i}")))?,
            format!("v{i}").as_bytes()
        );
    }
    Ok(())
}

/// Buffered mode commits a batch on the thread that waits for it; a write nobody waits for
/// still becomes durable and readable: at once when its `Pending` is dropped, and within the
/// shard thread's linger while a caller holds it unwaited.
#[test]
fn buffered_writes_commit_without_a_waiter() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().with_durability(Durability::Buffered);
    let n = name("buffered/unwaited");
    {
        let store = Store::open(dir.path(), opts.clone())?;
        store.create(&n, text("text/plain"))?;
        // Dropped without waiting: committed by the drop.
        drop(store.submit_append(&n, append("one "))?);
        assert_eq!(read_all(&store, &n)?, b"one ");
        // Held without waiting: the shard thread commits it.
        let held = store.submit_append(&n, append("two"))?;
        let before = Offset::new(1, 4);
        assert!(
            store.wait_blocking(&n, before, Duration::from_secs(5))?,
            "a held write was never committed"
        );
        assert_eq!(read_all(&store, &n)?, b"one two");
        let out = held.wait()?;
        assert_eq!(out.tail, Offset::new(2, 7));
        // Many writers on many threads, each committing for the others now and then.
        std::thread::scope(|sc| {
            for t in 0..8 {
                let (store, n) = (&store, &n);
                sc.spawn(move || {
                    for k in 0..200 {
                        store
                            .append(n, append(&format!("<{t}.{k}>")))
                            .expect("append");
                    }
                });
            }
        });
        let all = String::from_utf8(read_all(&store, &n)?)?;
        for t in 0..8 {
            for k in 0..200 {
                assert_eq!(all.matches(&format!("<{t}.{k}>")).count(), 1);
            }
        }
    }
    // A clean shutdown checkpointed all of it.
    let store = Store::open(dir.path(), opts)?;
    let all = String::from_utf8(read_all(&store, &n)?)?;
    assert!(all.starts_with("one two"));
    assert_eq!(all.matches('<').count(), 1600);
    Ok(())
}

/// The nice value of a thread of this process (field 19 of `/proc/self/task/TID/stat`).
#[cfg(target_os = "linux")]
fn thread_nice(task: &std::path::Path) -> std::io::Result<i64> {
    let stat = std::fs::read_to_string(task.join("stat"))?;
    // The name (field 2) may hold spaces; every field after its closing parenthesis does not.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    Ok(after
        .split_whitespace()
        .nth(16)
        .and_then(|f| f.parse().ok())
        .expect("a nice value in the stat line"))
}

#[cfg(target_os = "linux")]
#[test]
fn checkpoint_threads_run_below_the_request_threads_priority() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default().with_journal_shards(2))?;
    let own = thread_nice(std::path::Path::new("/proc/thread-self"))?;
    let (mut checkpoint, mut journal) = (Vec::new(), Vec::new());
    // A thread names itself once it runs: look until every shard's two threads are found.
    for _ in 0..200 {
        checkpoint.clear();
        journal.clear();
        for task in std::fs::read_dir("/proc/self/task")? {
            let task = task?.path();
            let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
                continue;
            };
            if comm.starts_with("brook-checkpoi") {
                checkpoint.push(thread_nice(&task)?);
            } else if comm.starts_with("brook-journal-") {
                journal.push(thread_nice(&task)?);
            }
        }
        if checkpoint.len() >= 2 && journal.len() >= 2 && checkpoint.iter().all(|&n| n > own) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        checkpoint.len() >= 2 && journal.len() >= 2,
        "{checkpoint:?} {journal:?}"
    );
    // Other tests of this process may have stores open too: each of theirs counts the same.
    let lowered = (own + 10).min(19);
    assert!(
        checkpoint.iter().all(|&n| n == lowered),
        "checkpoint threads: {checkpoint:?}, own {own}"
    );
    assert!(
        journal.iter().all(|&n| n == own),
        "journal threads: {journal:?}, own {own}"
    );
    drop(store);
    Ok(())
}

/// The stream-file budget changes at run time: lowered, the next lookup puts the least
/// recently used idle streams at rest (down to 7/8 of it); raised, streams woken (by a read: a
/// small append buffers without a file) stay awake.
/// `shed_stream_files` closes what it is asked for whatever the budget, and every stream still
/// reads what was written.
#[test]
fn the_stream_file_budget_moves_and_streams_can_be_shed() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default().with_max_stream_files(1000))?;
    assert_eq!(store.max_stream_files(), 1000);
    let names: Vec<StreamName> = (0..200).map(|i| name(&format!("budget/{i:03}"))).collect();
    for (i, n) in names.iter().enumerate() {
        store.create(n, text("text/plain"))?;
        store.append(n, append(&format!("s{i}")))?;
    }
    assert_eq!(store.stats().stream_files, 200, "one descriptor per stream");
    assert_eq!(store.set_max_stream_files(100), 100);
    assert_eq!(store.stats().stream_file_budget, 100);
    store.head(&names[0], &Guard::NONE)?;
    assert!(
        store.stats().stream_files <= 88,
        "a lookup rests streams down to 7/8 of the lowered budget: {}",
        store.stats().stream_files
    );
    // Not below 16.
    assert_eq!(store.set_max_stream_files(3), 16);
    assert_eq!(store.set_max_stream_files(1000), 1000);
    let resting = store.stats().stream_files;
    for n in &names {
        store.append(n, append("+"))?;
    }
    assert_eq!(
        store.stats().stream_files,
        resting,
        "a small append to a resting stream is buffered: it opens no file"
    );
    for (i, n) in names.iter().enumerate() {
        assert_eq!(read_all(&store, n)?, format!("s{i}+").as_bytes());
    }
    assert_eq!(store.stats().stream_files, 200, "woken streams stay awake");
    let shed = store.shed_stream_files(50);
    assert!(shed >= 50, "shed {shed}");
    assert_eq!(store.stats().stream_files, 200 - shed as u64);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(read_all(&store, n)?, format!("s{i}+").as_bytes());
    }
    Ok(())
}
