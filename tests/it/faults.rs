//! Injected faults on the file-system seam (issue 13), through `brook::sim::Disk`: a failed
//! `fsync` poisons its shard until the store is reopened (the kernel may have dropped what it
//! could not write); a full disk on a journal write or a checkpoint refuses writes cleanly, and
//! the store takes writes again once the fault is gone, without a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use brook::sim::{Disk, Kind};
use brook::*;

use crate::util::{R, name, read_to_tail, typed, watched};

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn open(root: &Path) -> brook::Result<Store> {
    Store::open(root, Options::default().with_journal_shards(1))
}

/// The errno an error carries as its source.
fn errno(e: &Error) -> Option<i32> {
    let source = std::error::Error::source(e)?;
    let io = source
        .downcast_ref::<std::sync::Arc<std::io::Error>>()
        .map(AsRef::as_ref)
        .or_else(|| source.downcast_ref::<std::io::Error>())?;
    io.raw_os_error()
}

/// How long [`until_ok`] waits without progress before it gives up.
const STALL: Duration = Duration::from_secs(5);

/// Retries `f` until it succeeds; returns its failures. It gives up only on a stall: [`STALL`]
/// with neither a success nor another fault fired on `disk`. A test's faults are spent one a
/// try, a few tries apart (a refusal wakes the shard to heal, the next try meets the next
/// fault), so the time they take grows with their number and the machine's load: a bound on
/// the whole retry would fail a slow run that is still making progress.
fn until_ok<T>(
    disk: &Disk,
    mut f: impl FnMut() -> brook::Result<T>,
) -> Result<(T, Vec<Error>), String> {
    let mut progress = Instant::now();
    let mut fired = disk.fired().len();
    let mut failures = Vec::new();
    loop {
        match f() {
            Ok(v) => return Ok((v, failures)),
            Err(e) => {
                let now = disk.fired().len();
                if now != fired {
                    fired = now;
                    progress = Instant::now();
                } else if progress.elapsed() >= STALL {
                    return Err(format!(
                        "still failing after {STALL:?} without another fault fired: {e}"
                    ));
                }
                failures.push(e);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

#[test]
fn a_failed_fsync_poisons_the_shard_until_the_store_is_reopened() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/eio");
    {
        let store = open(&root)?;
        store.create(&s, typed("text/plain"))?;
        store.append(&s, AppendRequest::new("one;"))?;
        disk.fail(Kind::SyncFile, ".wal", EIO, 1);
        let e = store
            .append(&s, AppendRequest::new("two;"))
            .expect_err("the journal sync failed");
        assert!(matches!(e, Error::OutcomeUnknown { .. }), "{e}");
        assert_eq!(errno(&e), Some(EIO), "the cause is surfaced: {e:?}");
        assert_eq!(disk.fired().len(), 1);
        // Well past the heal interval: still refused, with the same cause.
        std::thread::sleep(Duration::from_millis(600));
        let e = store
            .append(&s, AppendRequest::new("three;"))
            .expect_err("poisoned");
        assert_eq!(e.code(), "POISONED");
        assert_eq!(errno(&e), Some(EIO));
        let e = store.checkpoint().expect_err("poisoned");
        assert_eq!(e.code(), "POISONED");
    }
    disk.uninstall();
    let store = open(&root)?;
    let (data, _) = read_to_tail(&store, &s, None)?;
    assert!(data == b"one;" || data == b"one;two;", "{data:?}");
    store.append(&s, AppendRequest::new("four;"))?;
    Ok(())
}

#[test]
fn a_failed_checkpoint_sync_poisons_the_shard() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/syncfs");
    let store = open(&root)?;
    store.create(&s, typed("text/plain"))?;
    store.append(&s, AppendRequest::new("one;"))?;
    disk.fail(Kind::SyncFs, "", EIO, 1);
    let e = store
        .checkpoint()
        .expect_err("the checkpoint's syncfs failed");
    assert_eq!(e.code(), "POISONED");
    assert_eq!(errno(&e), Some(EIO));
    std::thread::sleep(Duration::from_millis(600));
    let e = store
        .append(&s, AppendRequest::new("two;"))
        .expect_err("poisoned for good");
    assert_eq!(errno(&e), Some(EIO));
    drop(store);
    disk.uninstall();
    let store = open(&root)?;
    assert_eq!(read_to_tail(&store, &s, None)?.0, b"one;");
    Ok(())
}

#[test]
fn a_full_disk_refuses_cleanly_and_writes_resume_once_space_exists() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/enospc");
    let send = |store: &Store, seq: u64| {
        let req = AppendRequest::new(format!("p{seq};"))
            .producer(Producer::new("p", 0, seq))
            .stream_seq(format!("{seq:04}"));
        store.append(&s, req)
    };
    {
        let store = open(&root)?;
        store.create(&s, typed("text/plain"))?;
        send(&store, 0)?;
        // The next three journal writes find the disk full.
        disk.fail(Kind::Write, ".wal", ENOSPC, 3);
        let (o, refused) = until_ok(&disk, || send(&store, 1))?;
        assert_eq!(disk.fired().len(), 3, "{:?}", disk.fired());
        assert!(refused.len() >= 3, "{refused:?}");
        for e in &refused {
            assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
            assert_eq!(errno(e), Some(ENOSPC));
        }
        // The refused tries changed nothing: the same producer sequence and Stream-Seq are
        // taken as new, once, without a restart.
        assert_eq!(o.status, AppendStatus::Appended);
        assert_eq!(
            send(&store, 1)?.status,
            AppendStatus::Duplicate {
                original_tail: Some(o.tail)
            }
        );
        send(&store, 2)?;
        store.checkpoint()?;
        let info = store.head(&s, &Guard::NONE)?;
        assert_eq!(info.stream_seq.as_deref(), Some("0002"));
    }
    disk.uninstall();
    let store = open(&root)?;
    assert_eq!(read_to_tail(&store, &s, None)?.0, b"p0;p1;p2;");
    Ok(())
}

#[test]
fn a_full_disk_at_a_checkpoint_refuses_until_it_heals() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/rotation");
    {
        let store = open(&root)?;
        store.create(&s, typed("text/plain"))?;
        store.append(&s, AppendRequest::new("one;"))?;
        // The checkpoint's new journal file cannot be made, then a sidecar cannot be.
        disk.fail(Kind::Create, ".wal", ENOSPC, 1);
        let e = store.checkpoint().expect_err("the rotation failed");
        assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
        until_ok(&disk, || store.append(&s, AppendRequest::new("two;")))?;
        disk.fail(Kind::Create, "meta.", ENOSPC, 1);
        let e = store.checkpoint().expect_err("the sidecar write failed");
        assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{e}");
        until_ok(&disk, || store.checkpoint())?;
        store.append(&s, AppendRequest::new("three;"))?;
        assert_eq!(disk.fired().len(), 2);
    }
    disk.uninstall();
    let store = open(&root)?;
    assert_eq!(read_to_tail(&store, &s, None)?.0, b"one;two;three;");
    Ok(())
}

/// The journal's space is set aside (`fallocate`) before a batch is written: a full disk shows
/// there, before any byte of the batch is in the journal, so in both modes the append is
/// refused `INSUFFICIENT_STORAGE` (never an unknown outcome), the shard heals once space
/// exists, and nothing acknowledged is lost.
#[test]
fn a_full_disk_at_the_journal_reservation_refuses_and_heals_in_both_modes() -> R {
    for durability in [Durability::Sync, Durability::Buffered] {
        let (_tmp, root, disk) = watched()?;
        let s = name("faults/reserve");
        let options = Options::default()
            .with_journal_shards(1)
            .with_durability(durability);
        {
            let store = Store::open(&root, options.clone())?;
            store.create(&s, typed("text/plain"))?;
            store.checkpoint()?;
            // The next three reservations find the disk full (a refused batch tries a whole
            // step, then exactly what it needs).
            disk.fail(Kind::Allocate, ".wal", ENOSPC, 3);
            let (_, refused) = until_ok(&disk, || store.append(&s, AppendRequest::new("one;")))?;
            assert_eq!(disk.fired().len(), 3, "{durability:?}: {:?}", disk.fired());
            assert!(!refused.is_empty(), "{durability:?}: never refused");
            for e in &refused {
                assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{durability:?}: {e}");
                assert_eq!(errno(e), Some(ENOSPC));
            }
            store.append(&s, AppendRequest::new("two;"))?;
            assert_eq!(store.stats().poisoned_shards, 0);
        }
        disk.uninstall();
        let store = Store::open(&root, options)?;
        assert_eq!(
            read_to_tail(&store, &s, None)?.0,
            b"one;two;",
            "{durability:?}"
        );
    }
    Ok(())
}

/// Fails the test (rather than hang it) when `f` does not return within five seconds.
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .map_err(|_| "no answer within 5 s: a waiter hangs".to_owned())
}

/// A panic in a journal shard's thread (a bug, injected at the batch's sync) poisons the shard
/// as an I/O error does: the writers waiting on it get an error rather than waiting forever,
/// later writers get `POISONED`, and the store counts the shard as poisoned.
#[test]
fn a_panic_in_a_shard_thread_poisons_the_shard_and_wakes_its_writers() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/panic");
    let store = std::sync::Arc::new(open(&root)?);
    store.create(&s, typed("text/plain"))?;
    store.append(&s, AppendRequest::new("one;"))?;
    disk.panic_at(Kind::SyncFile, ".wal");
    // Writers that leave the commit to the shard thread (an async wait never commits itself).
    let mut pending = Vec::new();
    for i in 0..4 {
        match store.submit_append(&s, AppendRequest::new(format!("w{i};"))) {
            Ok(p) => pending.push(p),
            Err(e) => assert_eq!(e.code(), "POISONED", "{e}"),
        }
    }
    assert!(!pending.is_empty(), "the first write was taken");
    let waited = within_5s(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let mut out = Vec::new();
            for p in pending {
                out.push(p.wait_async().await);
            }
            out
        })
    });
    let waited = match waited {
        Ok(w) => w,
        Err(e) => {
            // The store's threads are stuck: leave it rather than hang in its shutdown.
            std::mem::forget(store);
            return Err(e.into());
        }
    };
    assert_eq!(disk.fired().len(), 1, "{:?}", disk.fired());
    for r in &waited {
        let e = r.as_ref().expect_err("the batch's commit panicked");
        assert!(
            matches!(e.code(), "OUTCOME_UNKNOWN" | "POISONED"),
            "a waiter's error: {e}"
        );
    }
    let e = store
        .append(&s, AppendRequest::new("later;"))
        .expect_err("poisoned");
    assert_eq!(e.code(), "POISONED", "{e}");
    assert_eq!(store.stats().poisoned_shards, 1);
    let st = store.clone();
    let e = within_5s(move || st.checkpoint())?.expect_err("poisoned");
    assert_eq!(e.code(), "POISONED", "{e}");
    let st = store.clone();
    drop(store);
    let shut = within_5s(move || st.shutdown())?;
    assert!(shut.is_err(), "shutdown reports the poisoned shard");
    disk.uninstall();
    let store = open(&root)?;
    let (data, _) = read_to_tail(&store, &s, None)?;
    assert!(data.starts_with(b"one;"), "{data:?}");
    store.append(&s, AppendRequest::new("after;"))?;
    Ok(())
}

/// A panic in a shard's checkpoint thread (injected at the checkpoint's `syncfs`) poisons the
/// shard too: the checkpoint's caller gets `POISONED` instead of waiting forever, and so do
/// later writes; the store still shuts down.
#[test]
fn a_panic_in_a_checkpoint_thread_poisons_the_shard() -> R {
    let (_tmp, root, disk) = watched()?;
    let s = name("faults/cpanic");
    let store = std::sync::Arc::new(open(&root)?);
    store.create(&s, typed("text/plain"))?;
    store.append(&s, AppendRequest::new("one;"))?;
    disk.panic_at(Kind::SyncFs, "");
    let st = store.clone();
    let e = match within_5s(move || st.checkpoint()) {
        Ok(r) => r.expect_err("the checkpoint panicked"),
        Err(e) => {
            std::mem::forget(store);
            return Err(e.into());
        }
    };
    assert_eq!(e.code(), "POISONED", "{e}");
    let e = store
        .append(&s, AppendRequest::new("two;"))
        .expect_err("poisoned");
    assert_eq!(e.code(), "POISONED", "{e}");
    assert_eq!(store.stats().poisoned_shards, 1);
    let st = store.clone();
    drop(store);
    let shut = within_5s(move || st.shutdown())?;
    assert!(shut.is_err(), "shutdown reports the poisoned shard");
    disk.uninstall();
    let store = open(&root)?;
    assert_eq!(read_to_tail(&store, &s, None)?.0, b"one;");
    Ok(())
}

/// The errors of refused tries are each a full disk, refused before anything was written.
fn all_insufficient_storage(refused: &[Error], what: &str) {
    assert!(!refused.is_empty(), "{what}: never refused");
    for e in refused {
        assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{what}: {e}");
        assert_eq!(errno(e), Some(ENOSPC), "{what}: {e:?}");
    }
}

/// Both durability modes, each on a fresh directory watched by the simulated disk.
fn in_both_modes(mut test: impl FnMut(&Path, &Disk, Options, &str) -> R) -> R {
    for durability in [Durability::Sync, Durability::Buffered] {
        let (_tmp, root, disk) = watched()?;
        let options = Options::default()
            .with_journal_shards(1)
            .with_durability(durability);
        test(&root, &disk, options, &format!("{durability:?}"))?;
        disk.uninstall();
    }
    Ok(())
}

/// A segment log's blocks are set aside before the batch is written: a full disk met growing
/// the log (whether by a sparse length or by allocated blocks) refuses the append with
/// `INSUFFICIENT_STORAGE`, never `OUTCOME_UNKNOWN` after its record reached the journal, and
/// the shard heals.
#[test]
fn a_full_disk_growing_a_segment_log_refuses_before_the_journal_write() -> R {
    in_both_modes(|root, disk, options, mode| {
        let s = name("faults/log-growth");
        // Past the first log's 64 KiB, and written through (not buffered).
        let big = "x".repeat(100 << 10);
        {
            let store = Store::open(root, options.clone())?;
            store.create(&s, typed("text/plain"))?;
            store.append(&s, AppendRequest::new("one;"))?;
            disk.fail(Kind::SetLen, ".log", ENOSPC, 100);
            disk.fail(Kind::Allocate, ".log", ENOSPC, 4);
            let (_, refused) =
                until_ok(disk, || store.append(&s, AppendRequest::new(big.clone())))?;
            all_insufficient_storage(&refused, mode);
            disk.clear_faults();
            store.append(&s, AppendRequest::new("two;"))?;
            assert_eq!(store.stats().poisoned_shards, 0, "{mode}");
        }
        disk.uninstall();
        let store = Store::open(root, options)?;
        assert_eq!(
            read_to_tail(&store, &s, None)?.0,
            format!("one;{big}two;").as_bytes(),
            "{mode}"
        );
        Ok(())
    })
}

/// A segment index's growth (an append of more messages than its entries have room for) is
/// set aside before the batch is written too: a full disk there refuses the append cleanly.
#[test]
fn a_full_disk_growing_a_segment_index_refuses_before_the_journal_write() -> R {
    in_both_modes(|root, disk, options, mode| {
        let s = name("faults/index-growth");
        // 1500 messages in one append: more than a new index's 1024 entries.
        let many: Vec<String> = (0..1500).map(|i| i.to_string()).collect();
        let many = format!("[{}]", many.join(","));
        {
            let store = Store::open(root, options.clone())?;
            store.create(&s, typed("application/json"))?;
            store.append(&s, AppendRequest::new("[-1]"))?;
            disk.fail(Kind::SetLen, ".idx", ENOSPC, 100);
            disk.fail(Kind::Allocate, ".idx", ENOSPC, 4);
            let (_, refused) =
                until_ok(disk, || store.append(&s, AppendRequest::new(many.clone())))?;
            all_insufficient_storage(&refused, mode);
            disk.clear_faults();
            store.append(&s, AppendRequest::new("[1500]"))?;
            assert_eq!(store.stats().poisoned_shards, 0, "{mode}");
        }
        disk.uninstall();
        let store = Store::open(root, options)?;
        let info = store.head(&s, &Guard::NONE)?;
        assert_eq!(info.tail.messages, 1502, "{mode}");
        Ok(())
    })
}

/// A full segment's roll (the next segment's files) is made before the batch is written: a
/// full disk met creating them refuses the append cleanly, and the next try rolls.
#[test]
fn a_full_disk_rolling_to_a_new_segment_refuses_before_the_journal_write() -> R {
    in_both_modes(|root, disk, options, mode| {
        let s = name("faults/roll");
        let options = options.with_segment_bytes(64 << 10);
        let big = "y".repeat(70 << 10);
        {
            let store = Store::open(root, options.clone())?;
            store.create(&s, typed("text/plain"))?;
            // The first segment is full after this one.
            store.append(&s, AppendRequest::new(big.clone()))?;
            disk.fail(Kind::Create, ".log", ENOSPC, 2);
            let (_, refused) = until_ok(disk, || store.append(&s, AppendRequest::new("two;")))?;
            all_insufficient_storage(&refused, mode);
            assert_eq!(disk.fired().len(), 2, "{mode}: {:?}", disk.fired());
            store.append(&s, AppendRequest::new("three;"))?;
        }
        disk.uninstall();
        let store = Store::open(root, options)?;
        assert_eq!(
            read_to_tail(&store, &s, None)?.0,
            format!("{big}two;three;").as_bytes(),
            "{mode}"
        );
        let dir = crate::util::files_under(root)?;
        let logs = dir
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "log"));
        assert_eq!(logs.count(), 2, "{mode}: the stream rolled once: {dir:?}");
        Ok(())
    })
}

/// On a small disk (the simulated one reports its free space), what a batch takes (the
/// journal's 4 MiB reservation step, segment blocks) is looked at before it is admitted:
/// every acknowledged append leaves the 1 MiB floor free (`engine/journal/space.rs`), the first
/// refusal is `INSUFFICIENT_STORAGE`, the shard goes on refusing (counted, not flapping) while
/// the disk stays full, and takes writes again once space comes back, without a restart.
#[test]
fn a_small_disk_keeps_its_floor_free_and_heals_once_space_comes_back() -> R {
    in_both_modes(|root, disk, options, mode| {
        const FLOOR: u64 = 1 << 20;
        let s = name("faults/small-disk");
        let piece = "z".repeat(64 << 10);
        let mut acked = 0usize;
        {
            let store = Store::open(root, options.clone())?;
            // Room for the journal's first 4 MiB step and some data past the floor.
            disk.limit_space(6 << 20)?;
            store.create(&s, typed("text/plain"))?;
            let refusal = loop {
                match store.append(&s, AppendRequest::new(piece.clone())) {
                    Ok(_) => acked += 1,
                    Err(e) => break e,
                }
                let free = disk.free().unwrap_or(0);
                assert!(
                    free >= FLOOR,
                    "{mode}: after {acked} appends only {free} bytes free: the floor was taken"
                );
                assert!(acked < 200, "{mode}: the disk never filled");
            };
            assert_eq!(refusal.code(), "INSUFFICIENT_STORAGE", "{mode}: {refusal}");
            assert!(acked > 0, "{mode}: nothing was taken");
            // Still full: still refused, and counted, past the heal interval.
            std::thread::sleep(Duration::from_millis(500));
            let e = store
                .append(&s, AppendRequest::new(piece.clone()))
                .expect_err("the disk is still full");
            assert_eq!(e.code(), "INSUFFICIENT_STORAGE", "{mode}: {e}");
            assert_eq!(store.stats().poisoned_shards, 1, "{mode}");
            disk.limit_space(64 << 20)?;
            until_ok(disk, || store.append(&s, AppendRequest::new(piece.clone())))?;
            acked += 1;
            assert_eq!(store.stats().poisoned_shards, 0, "{mode}");
        }
        disk.uninstall();
        let store = Store::open(root, options)?;
        let (data, _) = read_to_tail(&store, &s, None)?;
        assert_eq!(
            data.len(),
            acked * piece.len(),
            "{mode}: exactly the acknowledged"
        );
        Ok(())
    })
}
