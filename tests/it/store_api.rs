//! The `Store` API a server (or any embedding program on an async runtime) builds on: the
//! non-blocking paths (`try_append`, `try_read`, `try_head`), `watch`, the group-commit hint,
//! the webhook delivery interface, weak handles and the refused snapshot delete.

use std::time::Duration;

use brook::subscription::{SubscriptionConfig, WakeRef, WebhookResult};
use brook::{
    AppendRequest, AppendStatus, Commit, CreateOptions, Durability, Error, Guard, Incarnation,
    Offset, Options, PublishSnapshot, ReadFrom, ReadRequest, Store, StreamName, TryAppend,
};

type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn n(s: &str) -> StreamName {
    StreamName::new(s).expect("valid name")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

/// The pending outcome of a `try_append` answered in memory (a test failure otherwise).
fn done(t: TryAppend) -> brook::Pending<brook::AppendOutcome> {
    match t {
        TryAppend::Done(p) => p,
        TryAppend::WouldBlock(_) => panic!("expected the append to be answered in memory"),
    }
}

#[test]
fn try_append_answers_in_memory_or_hands_the_request_back() -> R {
    let dir = tempfile::tempdir()?;
    let a = n("a");
    {
        let store = Store::open(dir.path(), Options::default())?;
        let created = store.create(&a, CreateOptions::with_content_type("text/plain"))?;
        let out = done(store.try_append(&a, AppendRequest::new("hello"))).wait()?;
        assert_eq!(out.status, AppendStatus::Appended);
        assert_eq!(out.tail, Offset::new(1, 5));
        // Read back as durable as a blocking append's.
        assert_eq!(
            store
                .read(&a, &ReadRequest::from(ReadFrom::Start))?
                .to_vec(),
            b"hello"
        );
        // A body over 64 KiB is converted on a blocking thread: handed back, nothing written.
        let big = vec![b'x'; (64 << 10) + 1];
        match store.try_append(&a, AppendRequest::new(big.clone())) {
            TryAppend::WouldBlock(req) => assert_eq!(req.data, big),
            TryAppend::Done(_) => panic!("a large body should be handed back"),
        }
        assert_eq!(store.head(&a, &Guard::NONE)?.tail, out.tail);
        // A refusal is the pending's outcome.
        let stale = Incarnation::new("not-this-one")?;
        let refused = done(store.try_append(&a, AppendRequest::new("x").expect(stale))).wait();
        assert!(
            matches!(refused, Err(Error::IncarnationMismatch { ref current }) if *current == created.info.incarnation),
            "{refused:?}"
        );
        store.close(&a, &Guard::NONE)?;
        let closed = done(store.try_append(&a, AppendRequest::new("x"))).wait();
        assert!(
            matches!(closed, Err(Error::StreamClosed { .. })),
            "{closed:?}"
        );
    }
    // After a reopen the stream is not in memory: opening it reads its files.
    let store = Store::open(dir.path(), Options::default())?;
    let b = n("b");
    assert!(matches!(
        store.try_append(&a, AppendRequest::new("x")),
        TryAppend::WouldBlock(_)
    ));
    // So is a stream that does not exist (finding that out reads the disk).
    match store.try_append(&b, AppendRequest::new("x")) {
        TryAppend::WouldBlock(req) => {
            assert!(matches!(
                store.submit_append(&b, req).map(|_| ()),
                Err(Error::NotFound)
            ));
        }
        TryAppend::Done(_) => panic!("a stream not in memory should be handed back"),
    }
    store.head(&a, &Guard::NONE)?;
    let closed = done(store.try_append(&a, AppendRequest::new("x"))).wait();
    assert!(
        matches!(closed, Err(Error::StreamClosed { .. })),
        "{closed:?}"
    );
    Ok(())
}

#[test]
fn try_read_and_try_head_answer_only_from_memory() -> R {
    let dir = tempfile::tempdir()?;
    let a = n("a");
    let from_start = ReadRequest::from(ReadFrom::Start);
    {
        let store = Store::open(dir.path(), Options::default())?;
        store.create(&a, CreateOptions::with_content_type("text/plain"))?;
        store.append(&a, AppendRequest::new("abc"))?;
        // Written by this process: checked, so served from memory.
        let chunk = store.try_read(&a, &from_start).expect("in memory")?;
        assert_eq!(chunk.to_vec(), b"abc");
        assert!(chunk.up_to_date);
        let info = store.try_head(&a, &Guard::NONE).expect("in memory")?;
        assert_eq!(info.tail, Offset::new(1, 3));
        // Errors are answered too, as the blocking calls answer them.
        let beyond = ReadRequest::from(ReadFrom::At(Offset::new(9, 99)));
        assert!(matches!(
            store.try_read(&a, &beyond),
            Some(Err(Error::OffsetBeyondTail { .. }))
        ));
        let stale = Guard::expect(Incarnation::new("not-this-one")?);
        assert!(matches!(
            store.try_head(&a, &stale),
            Some(Err(Error::IncarnationMismatch { .. }))
        ));
    }
    let store = Store::open(dir.path(), Options::default())?;
    assert!(store.try_read(&a, &from_start).is_none());
    assert!(store.try_head(&a, &Guard::NONE).is_none());
    // Open, but its messages are not checked against their checksums yet: a read would touch
    // the data pages.
    assert_eq!(store.head(&a, &Guard::NONE)?.tail, Offset::new(1, 3));
    assert!(store.try_head(&a, &Guard::NONE).is_some());
    assert!(store.try_read(&a, &from_start).is_none());
    assert_eq!(store.read(&a, &from_start)?.to_vec(), b"abc");
    let chunk = store.try_read(&a, &from_start).expect("checked now")?;
    assert_eq!(chunk.to_vec(), b"abc");
    Ok(())
}

#[test]
fn a_watch_wakes_on_append_and_ends_with_the_stream() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let a = n("a");
    store.create(&a, CreateOptions::with_content_type("text/plain"))?;
    let watch = store.watch(&a)?;
    assert_eq!(watch.tail(), Some((Offset::ZERO, false)));
    let writer = {
        let (store, a) = (store.clone(), a.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            store.append(&a, AppendRequest::new("x"))
        })
    };
    // The timeout only keeps a broken wake from hanging the test.
    rt().block_on(async {
        tokio::time::timeout(Duration::from_secs(30), watch.wait(Offset::ZERO)).await
    })?;
    let appended = writer.join().expect("the writer thread")?;
    assert_eq!(watch.tail(), Some((appended.tail, false)));
    // Already past: resolves at once.
    rt().block_on(watch.wait(Offset::ZERO));
    store.delete(&a, &Guard::NONE)?;
    assert_eq!(watch.tail(), None);
    rt().block_on(async {
        tokio::time::timeout(Duration::from_secs(30), watch.wait(appended.tail)).await
    })?;
    // A recreated stream is another incarnation: the old watch does not follow it.
    store.create(&a, CreateOptions::with_content_type("text/plain"))?;
    assert_eq!(watch.tail(), None);
    Ok(())
}

#[test]
fn the_commit_hint_batches_only_buffered_appends_among_writers() -> R {
    let dir = tempfile::tempdir()?;
    {
        let store = Store::open(dir.path(), Options::default())?;
        assert_eq!(store.options().durability(), Durability::Sync);
        for writers in [0, 1, 2, 100] {
            assert_eq!(store.commit_hint(writers), Commit::Now, "{writers}");
        }
    }
    let store = Store::open(
        dir.path(),
        Options::default().with_durability(Durability::Buffered),
    )?;
    assert_eq!(store.commit_hint(0), Commit::Now);
    assert_eq!(store.commit_hint(1), Commit::Now);
    assert_eq!(store.commit_hint(2), Commit::Batch);
    assert_eq!(store.commit_hint(100), Commit::Batch);
    Ok(())
}

#[test]
fn webhook_jobs_are_taken_once_and_their_results_recorded() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    assert!(!store.has_subscriptions());
    assert!(store.take_webhook_jobs().is_empty());
    let e1 = n("e/1");
    store.create(&e1, CreateOptions::json())?;
    let change = store.subscription_change();
    store.create_subscription(
        "s",
        SubscriptionConfig::webhook("http://localhost:9/hook").pattern("e/*"),
    )?;
    assert!(store.has_subscriptions());
    // Creating it is a change (registered before, so it is not missed).
    rt().block_on(async { tokio::time::timeout(Duration::from_secs(30), change).await })?;
    let tail = store.append(&e1, AppendRequest::new("[1]"))?.tail;
    // The subscription thread issues the wake: look, then wait for the next change.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let job = loop {
        let change = store.subscription_change();
        if let Some(job) = store.take_webhook_jobs().pop() {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "no webhook job");
        let _ =
            rt().block_on(async { tokio::time::timeout(Duration::from_millis(200), change).await });
    };
    assert_eq!(job.url, "http://localhost:9/hook");
    assert_eq!(job.wake.subscription, "s");
    assert_eq!(job.wake.streams[0].tail, tail);
    // Being sent: not handed out again until its result is recorded.
    assert!(store.take_webhook_jobs().is_empty());
    assert!(store.wake_is_current(&job.wake));
    let stale = WakeRef {
        generation: job.wake.generation + 1,
        ..WakeRef::from(&job.wake)
    };
    assert!(!store.wake_is_current(stale));
    store.record_webhook(&job.wake, WebhookResult::Done)?;
    assert!(!store.wake_is_current(&job.wake));
    let info = store.subscription("s")?;
    assert_eq!(info.links[0].acked, tail);
    assert!(info.wake.is_none());
    // A late result for a wake that is no longer current changes nothing.
    store.record_webhook(&job.wake, WebhookResult::Failed)?;
    assert_eq!(store.subscription("s")?.links[0].acked, tail);
    Ok(())
}

#[test]
fn acks_and_releases_name_a_wake_by_reference() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    store.create(&n("wake"), CreateOptions::json())?;
    store.create(&n("e/1"), CreateOptions::json())?;
    store.create_subscription(
        "s",
        SubscriptionConfig::pull_wake(n("wake")).stream(n("e/1")),
    )?;
    let tail = store.append(&n("e/1"), AppendRequest::new("[1]"))?.tail;
    let wake = store.claim("s", "w")?;
    // What a callback token carries: the ids, not the whole wake.
    let (id, wake_id) = (wake.subscription.clone(), wake.wake_id.clone());
    let named = WakeRef {
        subscription: &id,
        generation: wake.generation,
        wake_id: &wake_id,
    };
    store.release(named)?;
    assert!(matches!(store.release(named), Err(Error::Fenced)));
    let again = store.claim("s", "w")?;
    assert!(
        !store
            .ack(WakeRef::from(&again), &[(n("e/1"), tail)], true)?
            .next_wake
    );
    Ok(())
}

#[test]
fn a_weak_store_does_not_keep_the_store_open() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    assert_eq!(store.dir(), dir.path().canonicalize()?);
    let weak = store.downgrade();
    assert!(weak.upgrade().is_some());
    drop(store);
    assert!(weak.upgrade().is_none());
    // Closed: the directory's lock is free again.
    Store::open(dir.path(), Options::default())?;
    Ok(())
}

#[test]
fn deleting_a_snapshot_is_always_refused() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let a = n("a");
    store.create(&a, CreateOptions::with_content_type("text/plain"))?;
    let tail = store.append(&a, AppendRequest::new("abc"))?.tail;
    assert!(matches!(
        store.delete_snapshot(&a, tail, &Guard::NONE),
        Err(Error::SnapshotNotFound)
    ));
    store.publish_snapshot(&a, PublishSnapshot::new(tail, &b"blob"[..]))?;
    assert!(matches!(
        store.delete_snapshot(&a, tail, &Guard::NONE),
        Err(Error::SnapshotDeleteRefused)
    ));
    assert!(matches!(
        store.delete_snapshot(&a, Offset::ZERO, &Guard::NONE),
        Err(Error::SnapshotNotFound)
    ));
    // Still there.
    assert_eq!(
        store
            .snapshot(&a, &brook::SnapshotRequest::default())?
            .data
            .as_ref(),
        b"blob"
    );
    Ok(())
}
