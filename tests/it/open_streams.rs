//! The open-stream cache under more streams than it holds (`max_open_streams`): in buffered
//! mode a stream written since the last checkpoint cannot be closed, so reaching the cap asks
//! for a checkpoint instead of refusing; concurrent first lookups of one closed stream end with
//! one open stream.

use std::sync::Arc;

use brook::*;

use crate::util::typed as text;

type R = std::result::Result<(), Box<dyn std::error::Error>>;

fn name(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

fn read_all(store: &Store, n: &StreamName) -> brook::Result<Vec<u8>> {
    Ok(store.read(n, &ReadRequest::from(ReadFrom::Start))?.to_vec())
}

/// Buffered, a cap of 16 and checkpoints far apart: 200 streams created and appended to in a
/// row all succeed (the cap asks for a checkpoint rather than answering `TooManyOpenStreams`),
/// then, reopened, 200 appends to streams that are all closed succeed too, and every byte
/// reads back after a second reopen.
#[test]
fn buffered_writes_to_more_streams_than_the_cap_all_succeed() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_durability(Durability::Buffered)
        .with_max_open_streams(16)
        .with_checkpoint_bytes(1 << 30);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        store.create(&n, text("text/plain"))?;
        store.append(&n, AppendRequest::new(format!("a{i},")))?;
    }
    drop(store);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        store.append(&n, AppendRequest::new(format!("b{i},")))?;
    }
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for i in 0..200 {
        let n = name(&format!("cap/{i}"));
        assert_eq!(read_all(&store, &n)?, format!("a{i},b{i},").as_bytes());
    }
    Ok(())
}

/// Many threads looking up the same closed streams at once (after a reopen, so none is open)
/// all see one stream per name: every append lands in the one stream, none is lost.
#[test]
fn concurrent_first_lookups_of_a_closed_stream_share_one_stream() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_durability(Durability::Buffered)
        .with_max_open_streams(16);
    let store = Store::open(dir.path(), opts.clone())?;
    for i in 0..8 {
        store.create(&name(&format!("race/{i}")), text("text/plain"))?;
    }
    drop(store);
    let store = Arc::new(Store::open(dir.path(), opts.clone())?);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> brook::Result<()> {
                for i in 0..8 {
                    let n = name(&format!("race/{i}"));
                    store.append(&n, AppendRequest::new(format!("{t}")))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("an appending thread panicked")?;
    }
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    for i in 0..8 {
        let mut got = read_all(&store, &name(&format!("race/{i}")))?;
        got.sort_unstable();
        assert_eq!(got, b"01234567", "race/{i} lost or doubled an append");
    }
    Ok(())
}

/// A cap of 64 (target 56, and a scan known to find nothing is skipped for up to 4 opens) with
/// checkpoints far apart: 60 checkpointed streams held by watches and 10 written ones take the
/// registry past the cap, where no scan can close anything. A checkpoint makes the 10
/// closable, and the very next open closes them, though the last scan was 2 opens before. Once
/// the watches go, the registry is back under its target within 4 opens.
#[test]
fn streams_past_the_cap_close_once_a_checkpoint_or_their_release_lets_them() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_max_open_streams(64)
        .with_checkpoint_bytes(1 << 30);
    let store = Store::open(dir.path(), opts)?;
    let n = |i: usize| name(&format!("past/{i}"));
    let write = |i: usize| -> brook::Result<()> {
        store.create(&n(i), text("text/plain"))?;
        store.append(&n(i), AppendRequest::new(format!("{i}")))?;
        Ok(())
    };
    let mut held = Vec::new();
    for i in 0..60 {
        write(i)?;
        if i % 20 == 19 {
            // Below the dirty-stream bound (a checkpoint per 32 written streams).
            store.checkpoint()?;
        }
        held.push(store.watch(&n(i))?);
    }
    for i in 60..70 {
        write(i)?;
    }
    assert_eq!(store.stats().open_streams, 70, "nothing closable yet");
    store.checkpoint()?;
    write(70)?;
    assert_eq!(
        store.stats().open_streams,
        61,
        "the checkpoint made the ten written streams closable, and the next open closed them"
    );
    drop(held);
    for i in 71..75 {
        write(i)?;
    }
    let open = store.stats().open_streams;
    assert!(
        open <= 56 + 3,
        "released streams closed within 4 opens: {open} open"
    );
    for i in 0..75 {
        assert_eq!(read_all(&store, &n(i))?, format!("{i}").as_bytes());
    }
    Ok(())
}

/// Streams the cache closed open again from their resident records, with all of their state:
/// 100 streams over a cap of 16, each with data, a producer, a Stream-Seq, every fifth closed,
/// every seventh rolled over several segments. After a checkpoint and a pass over all of them
/// (closing most), each reads back whole, a producer's retry is still a duplicate, a lower
/// Stream-Seq is still a conflict, a closed stream still refuses appends, and a delete and a
/// create of one leaves no trace of the old incarnation; a reopened store agrees.
#[test]
fn streams_closed_by_the_cache_open_again_with_all_their_state() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_max_open_streams(16)
        .with_segment_bytes(4096);
    let store = Store::open(dir.path(), opts.clone())?;
    let n = |i: usize| name(&format!("resident/{i}"));
    let mut want = Vec::new();
    for i in 0..100 {
        store.create(&n(i), text("text/plain"))?;
        let mut held = Vec::new();
        let rounds = if i % 7 == 0 { 12 } else { 2 };
        for k in 0..rounds {
            let body = if i % 7 == 0 {
                vec![b'a' + (k % 26) as u8; 1000]
            } else {
                format!("{i}.{k};").into_bytes()
            };
            store.append(
                &n(i),
                AppendRequest::new(body.clone())
                    .producer(Producer::new("p", 0, k))
                    .stream_seq(format!("{k:03}")),
            )?;
            held.extend_from_slice(&body);
        }
        if i % 5 == 0 {
            store.close(&n(i), &Guard::NONE)?;
        }
        want.push((held, rounds - 1));
    }
    store.checkpoint()?;
    for i in 0..100 {
        store.head(&n(i), &Guard::NONE)?;
    }
    let stats = store.stats();
    assert!(
        stats.resident_streams >= 80 && stats.open_streams <= 16 + 32,
        "most streams closed with their records: {} resident, {} open",
        stats.resident_streams,
        stats.open_streams
    );
    let check = |store: &Store| -> R {
        for (i, (held, last)) in want.iter().enumerate() {
            if i == 3 {
                continue;
            }
            assert_eq!(read_all(store, &n(i))?, *held, "resident/{i}'s data");
            if i % 5 == 0 {
                let e = store.append(&n(i), AppendRequest::new("x")).unwrap_err();
                assert!(
                    matches!(e, Error::StreamClosed { .. }),
                    "resident/{i}: {e:?}"
                );
                continue;
            }
            let retry = store.append(
                &n(i),
                AppendRequest::new("again").producer(Producer::new("p", 0, *last)),
            )?;
            assert!(
                matches!(retry.status, AppendStatus::Duplicate { .. }),
                "resident/{i}: the producer's retry is a duplicate"
            );
            let e = store
                .append(&n(i), AppendRequest::new("x").stream_seq("000"))
                .unwrap_err();
            assert!(
                matches!(e, Error::StreamSeqConflict { .. }),
                "resident/{i}: {e:?}"
            );
        }
        Ok(())
    };
    check(&store)?;
    // Delete one and create it again: the new incarnation is empty.
    store.delete(&n(3), &Guard::NONE)?;
    store.create(&n(3), text("text/plain"))?;
    for i in 0..100 {
        store.head(&n(i), &Guard::NONE)?;
    }
    assert_eq!(read_all(&store, &n(3))?, b"");
    store.append(&n(3), AppendRequest::new("new"))?;
    check(&store)?;
    drop(store);
    let store = Store::open(dir.path(), opts)?;
    check(&store)?;
    assert_eq!(read_all(&store, &n(3))?, b"new");
    Ok(())
}

/// A stream with a sliding TTL that the cache closed keeps its last access: left idle past its
/// TTL while closed, it has expired when looked up (before, opening it again counted as an
/// access, and a closed stream never expired).
#[test]
fn a_closed_stream_keeps_its_last_access_for_its_ttl() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().with_max_open_streams(16);
    let store = Store::open(dir.path(), opts)?;
    let ttl = name("ttl/short");
    store.create(&ttl, text("text/plain").ttl(1))?;
    store.append(&ttl, AppendRequest::new("soon gone"))?;
    store.checkpoint()?;
    for i in 0..40 {
        let n = name(&format!("ttl/other/{i}"));
        store.create(&n, text("text/plain"))?;
    }
    store.checkpoint()?;
    for i in 0..40 {
        store.head(&name(&format!("ttl/other/{i}")), &Guard::NONE)?;
    }
    assert!(store.stats().open_streams < 41, "the cache closed streams");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let e = store.head(&ttl, &Guard::NONE).unwrap_err();
    assert!(matches!(e, Error::NotFound), "expired while closed: {e:?}");
    Ok(())
}

/// The index files under `dir` this process maps.
fn index_maps_under(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            p.starts_with(&dir)
                && std::path::Path::new(p)
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("idx"))
        })
        .map(str::to_owned)
        .collect()
}

/// The descriptors of this process that name a file under `dir`.
fn fds_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
            .count()
    })
}

/// A stream the cache closed opens again from its resident record with one file open (its
/// last log) and no index mapped: a small append to it is buffered (the checkpoint writes it
/// back), and a read maps its index first. JSON streams, some over several segments,
/// read back whole, from the start and from an offset inside (a boundary check answered from
/// the index), before and after a crash.
#[test]
fn appends_to_closed_streams_open_their_log_alone() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default()
        .with_max_open_streams(16)
        .with_segment_bytes(4096);
    let store = Store::open(dir.path(), opts.clone())?;
    let n = |i: usize| name(&format!("lazy/{i}"));
    let msg = |i: usize, k: usize| {
        format!(
            "{{\"s\":{i},\"k\":{k},\"pad\":\"{}\"}}",
            "x".repeat(k % 5 * 40)
        )
    };
    let mut want: Vec<Vec<String>> = Vec::new();
    let mut mid: Vec<Offset> = Vec::new();
    for i in 0..60 {
        store.create(&n(i), text("application/json"))?;
        let rounds = if i % 6 == 0 { 60 } else { 3 };
        let mut msgs = Vec::new();
        let mut at = Offset::default();
        for k in 0..rounds {
            let m = msg(i, k);
            let out = store.append(&n(i), AppendRequest::new(format!("[{m}]")))?;
            msgs.push(m);
            if k == rounds / 2 {
                at = out.tail;
            }
        }
        want.push(msgs);
        mid.push(at);
    }
    store.checkpoint()?;
    for i in 0..60 {
        store.head(&n(i), &Guard::NONE)?;
    }
    assert!(store.stats().resident_streams >= 40, "most streams closed");
    // Ten appends to closed streams, each between two looks at the files held and the index
    // files mapped: the cache makes room by closing clean streams, so an append opens one
    // file (its log) and maps nothing. A checkpoint in between or just after (which opens the
    // logs it writes back) spoils the look at descriptors, and is skipped.
    let held = |store: &Store| {
        let st = store.stats();
        (
            st.stream_files,
            fds_under(dir.path()),
            st.checkpoint_seconds.count,
        )
    };
    // The first ten were looked up longest ago: closed.
    let closed: Vec<usize> = (0..10).collect();
    let mut looked = 0;
    for &i in &closed {
        let maps = index_maps_under(dir.path());
        let before = held(&store);
        let m = msg(i, 1000);
        store.append(&n(i), AppendRequest::new(format!("[{m}]")))?;
        want[i].push(m);
        let after = held(&store);
        let mapped: Vec<String> = index_maps_under(dir.path())
            .into_iter()
            .filter(|p| !maps.contains(p))
            .collect();
        assert!(
            mapped.is_empty(),
            "an append to closed stream lazy/{i} mapped {mapped:?}"
        );
        // A checkpoint running at the second look ends (and counts) soon after it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        if held(&store).2 != before.2 {
            continue;
        }
        looked += 1;
        assert!(
            after.0 <= before.0 + 1 && after.1 <= before.1 + 1,
            "an append to closed stream lazy/{i} opened more than its log: (stream files, \
             descriptors) {:?} before, {:?} after",
            (before.0, before.1),
            (after.0, after.1)
        );
    }
    assert!(looked >= 3, "checkpoints spoiled all but {looked} looks");
    for (i, msgs) in want.iter_mut().enumerate() {
        if !closed.contains(&i) {
            let m = msg(i, 1000);
            store.append(&n(i), AppendRequest::new(format!("[{m}]")))?;
            msgs.push(m);
        }
    }
    let check = |store: &Store| -> R {
        for (i, msgs) in want.iter().enumerate() {
            let whole = format!("[{}]", msgs.join(","));
            assert_eq!(read_all(store, &n(i))?, whole.as_bytes(), "lazy/{i}");
            let chunk = store.read(&n(i), &ReadRequest::from(ReadFrom::At(mid[i])))?;
            // `mid` is the tail after message `rounds / 2`.
            let rounds = msgs.len() - 1;
            let rest = format!("[{}]", msgs[rounds / 2 + 1..].join(","));
            let got = String::from_utf8(chunk.to_vec())?;
            assert!(
                rest.starts_with(got.trim_end_matches(']')),
                "lazy/{i} from {}: {got}",
                mid[i]
            );
        }
        Ok(())
    };
    // Closed again, then read: each read maps the index it needs.
    store.checkpoint()?;
    for i in 0..60 {
        store.head(&n(i), &Guard::NONE)?;
    }
    check(&store)?;
    let crashed = crate::util::crash_image(store, dir.path())?;
    let store = Store::open(crashed.path(), opts)?;
    check(&store)?;
    Ok(())
}

/// A closed stream whose lookup finds the cache full of streams written since the last
/// checkpoint waits for room with the state its record gave: it does not read its sidecar and
/// directory again. (Over 100,000 streams one cold lookup in six went back to the files this
/// way, a third of the engine's CPU per append; `stream_loads` counts such reads.)
#[test]
fn a_closed_stream_opened_into_a_full_cache_reads_no_file() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().with_max_open_streams(16);
    let store = Store::open(dir.path(), opts)?;
    let n = |i: usize| name(&format!("full/{i}"));
    for i in 0..150 {
        store.create(&n(i), text("text/plain"))?;
    }
    store.checkpoint()?;
    for i in 0..150 {
        store.head(&n(i), &Guard::NONE)?;
    }
    let before = store.stats();
    assert!(
        before.resident_streams >= 100,
        "most streams closed: {before:?}"
    );
    // Each append leaves its stream written since the checkpoint, so not closable: past 48
    // streams every open waits for a checkpoint to make room.
    for i in 0..150 {
        store.append(&n(i), AppendRequest::new(format!("{i};")))?;
    }
    let after = store.stats();
    assert_eq!(
        after.stream_loads, before.stream_loads,
        "opened from their records alone"
    );
    for i in 0..150 {
        assert_eq!(read_all(&store, &n(i))?, format!("{i};").into_bytes());
    }
    Ok(())
}
