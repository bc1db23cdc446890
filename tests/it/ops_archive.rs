//! `Store::export` then `Store::import` into a new directory: byte-identical reads, the same
//! offsets, incarnations, closure, expiry, retention, snapshots, Stream-Seq and producer state
//! (a producer's retry is still a duplicate, a stale Stream-Seq still a conflict), across a
//! reopen; and the archive refused when damaged.

use std::time::{Duration, SystemTime};

use brook::*;

use crate::util::{R, name, typed};

/// Every byte of `n` from its earliest offset, and where it ends.
fn read_all(store: &Store, n: &StreamName) -> Result<(Vec<u8>, Offset), Error> {
    let info = store.head(n, &Guard::default())?;
    let mut from = if info.earliest == Offset::ZERO {
        ReadFrom::Start
    } else {
        ReadFrom::At(info.earliest)
    };
    let mut out = Vec::new();
    loop {
        let c = store.read(n, &ReadRequest::from(from))?;
        for b in &c.body {
            out.extend_from_slice(b);
        }
        if c.up_to_date {
            return Ok((out, c.next));
        }
        from = ReadFrom::At(c.next);
    }
}

/// A store with one stream of every kind of state.
fn populate(store: &Store) -> R {
    let json = name("arc/json");
    store.create(
        &json,
        CreateOptions::json().data(r#"[{"a":1},{"b":[2,3]}]"#),
    )?;
    store.append(
        &json,
        AppendRequest::new(r#"{"c":"x"}"#)
            .stream_seq("00000000000000000005")
            .producer(Producer::new("writer-1", 3, 0)),
    )?;
    let bytes = name("arc/bytes");
    store.create(&bytes, typed("text/plain").ttl(3600))?;
    for i in 0..50 {
        store.append(&bytes, AppendRequest::new(format!("line {i}\n")))?;
    }
    store.append(&bytes, AppendRequest::close())?;
    let until = SystemTime::now() + Duration::from_hours(24);
    store.create(
        &name("arc/dated"),
        typed("text/plain").expires_at(until).data("d"),
    )?;
    let snap = name("arc/snap");
    store.create(&snap, typed("text/plain"))?;
    let mut at = Offset::ZERO;
    for i in 0..10 {
        at = store
            .append(&snap, AppendRequest::new(format!("event {i};")))?
            .tail;
        if i == 5 {
            store.publish_snapshot(
                &snap,
                PublishSnapshot::new(at, &b"state after 6 events"[..]).content_type("text/plain"),
            )?;
            store.set_retention(&snap, &RetentionRequest::to(at))?;
        }
    }
    store.publish_snapshot(&snap, PublishSnapshot::new(at, &b"state after 10"[..]))?;
    store.create(&name("arc/empty"), CreateOptions::new())?;
    store.create(
        &name("arc/fork"),
        CreateOptions::new().fork(ForkFrom::tail(bytes.clone())),
    )?;
    Ok(())
}

/// Asserts `a` and `b` hold the same streams with the same state and bytes, and that the
/// guards answer the same on both.
fn assert_same(a: &Store, b: &Store) -> R {
    let names = a.list("")?;
    assert_eq!(names, b.list("")?);
    assert_eq!(names.len(), 6);
    for n in &names {
        let (ia, ib) = (a.head(n, &Guard::default())?, b.head(n, &Guard::default())?);
        assert_eq!(ia.content_type, ib.content_type, "{n}");
        assert_eq!(ia.tail, ib.tail, "{n}");
        assert_eq!(ia.closed, ib.closed, "{n}");
        assert_eq!(ia.incarnation, ib.incarnation, "{n}");
        assert_eq!(ia.earliest, ib.earliest, "{n}");
        assert_eq!(ia.expiry, ib.expiry, "{n}");
        assert_eq!(ia.snapshot, ib.snapshot, "{n}");
        assert_eq!(ia.stream_seq, ib.stream_seq, "{n}");
        assert_eq!(read_all(a, n)?, read_all(b, n)?, "{n}");
        // The incarnation guards the copy as it guarded the original.
        b.head(n, &Guard::expect(ia.incarnation.clone()))?;
    }
    let snap = name("arc/snap");
    let info = b.head(&snap, &Guard::default())?;
    assert!(matches!(
        b.read(&snap, &ReadRequest::from(ReadFrom::At(Offset::ZERO))),
        Err(Error::OffsetGone { .. })
    ));
    for s in [a, b] {
        let older = s.snapshot(&snap, &SnapshotRequest::at(info.earliest))?;
        assert_eq!(&older.data[..], b"state after 6 events");
        let latest = s.snapshot(&snap, &SnapshotRequest::latest())?;
        assert_eq!(&latest.data[..], b"state after 10");
    }
    // Producer state and Stream-Seq: a retry is a duplicate, an old Stream-Seq a conflict.
    let json = name("arc/json");
    for s in [a, b] {
        let retry = AppendRequest::new(r#"{"c":"x"}"#).producer(Producer::new("writer-1", 3, 0));
        let out = s.append(&json, retry)?;
        assert!(
            matches!(out.status, AppendStatus::Duplicate { .. }),
            "{:?}",
            out.status
        );
        let stale = AppendRequest::new(r#"{"d":1}"#).stream_seq("00000000000000000004");
        assert!(matches!(
            s.append(&json, stale),
            Err(Error::StreamSeqConflict { .. })
        ));
        assert!(matches!(
            s.append(&name("arc/bytes"), AppendRequest::new("more")),
            Err(Error::StreamClosed { .. })
        ));
    }
    Ok(())
}

#[test]
fn export_then_import_gives_the_same_streams_state_and_bytes() -> R {
    let (src_dir, dst_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let src = Store::open(src_dir.path(), Options::default())?;
    populate(&src)?;
    let mut archive = Vec::new();
    let exported = src.export(&mut archive, &mut |_| {})?;
    assert_eq!(exported, 6);

    let dst = Store::open(dst_dir.path(), Options::default())?;
    let mut seen = 0;
    let imported = dst.import(&mut &archive[..], &mut |n| seen = n)?;
    assert_eq!((imported, seen), (6, 6));
    assert_same(&src, &dst)?;

    // The imported store is durable as it stands: reopened, it answers the same.
    dst.shutdown()?;
    drop(dst);
    let dst = Store::open(dst_dir.path(), Options::default())?;
    assert_eq!(
        read_all(&src, &name("arc/bytes"))?,
        read_all(&dst, &name("arc/bytes"))?
    );
    // A second import into the same store refuses the names it already has.
    assert!(matches!(
        dst.import(&mut &archive[..], &mut |_| {}),
        Err(Error::InvalidArgument(_))
    ));
    Ok(())
}

#[test]
fn a_damaged_archive_is_refused() -> R {
    let (src_dir, dst_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let src = Store::open(src_dir.path(), Options::default())?;
    src.create(&name("d/1"), typed("text/plain").data("some data here"))?;
    let mut archive = Vec::new();
    src.export(&mut archive, &mut |_| {})?;
    let dst = Store::open(dst_dir.path(), Options::default())?;
    let mut flipped = archive.clone();
    let i = flipped.len() / 2;
    flipped[i] ^= 1;
    assert!(matches!(
        dst.import(&mut &flipped[..], &mut |_| {}),
        Err(Error::InvalidArgument(m)) if m.contains("not a valid brook archive")
    ));
    let cut = &archive[..archive.len() - 3];
    let other = tempfile::tempdir()?;
    let fresh = Store::open(other.path(), Options::default())?;
    let e = fresh
        .import(&mut &cut[..], &mut |_| {})
        .expect_err("a cut archive is refused");
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("not a valid brook archive")),
        "{e}"
    );
    Ok(())
}
