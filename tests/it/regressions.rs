//! Targeted tests for engine bugs found by the model, crash and corruption tests, kept as plain
//! scenarios so each failure names its bug.

use brook::*;

use crate::util::{R, crash_image, name, read_to_tail, typed};

fn json() -> CreateOptions {
    typed("application/json")
}

/// A source's retention must not reclaim segments that a live fork still reads.
#[test]
fn source_retention_keeps_what_live_forks_read() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().with_segment_bytes(4096);
    let store = Store::open(dir.path(), opts.clone())?;
    let (src, fork) = (name("r/src"), name("r/fork"));
    store.create(&src, json())?;
    let mut at = Offset::ZERO;
    let mut last = Offset::ZERO;
    for i in 0..400u64 {
        last = store
            .append(
                &src,
                AppendRequest::new(format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(30))),
            )?
            .tail;
        if i == 99 {
            at = last;
        }
    }
    store.create(
        &fork,
        CreateOptions::new().fork(ForkFrom::at(src.clone(), at)),
    )?;
    let before = read_to_tail(&store, &fork, None)?.0;
    assert!(before.starts_with(b"{\"i\":0,"));
    store.publish_snapshot(&src, PublishSnapshot::new(last, &b"s"[..]))?;
    store.set_retention(&src, &RetentionRequest::to(last))?;
    assert!(matches!(
        store.read(&src, &ReadRequest::from(ReadFrom::At(Offset::ZERO))),
        Err(Error::OffsetGone { .. })
    ));
    // The fork still serves everything it inherited, now and after a reopen and a crash.
    assert_eq!(read_to_tail(&store, &fork, Some(1000))?.0, before);
    drop(store);
    let store = Store::open(dir.path(), opts.clone())?;
    assert_eq!(read_to_tail(&store, &fork, Some(1000))?.0, before);
    let image = crash_image(store, dir.path())?;
    let store = Store::open(image.path(), opts)?;
    assert_eq!(read_to_tail(&store, &fork, None)?.0, before);
    // Once the fork is gone, retention reclaims the source's old segments.
    store.delete(&fork, &Guard::NONE)?;
    store.set_retention(&src, &RetentionRequest::to(last))?;
    Ok(())
}

/// A fork of a stream whose start was trimmed by retention starts where its source's readable
/// data starts: its earliest offset says so, and it never serves what the source retired.
#[test]
fn a_fork_of_a_trimmed_stream_starts_at_its_earliest_offset() -> R {
    for segment_bytes in [4096, 64 << 20] {
        let dir = tempfile::tempdir()?;
        let store = Store::open(
            dir.path(),
            Options::default().with_segment_bytes(segment_bytes),
        )?;
        let (src, fork) = (name("t/src"), name("t/fork"));
        store.create(&src, json())?;
        let mut cut = Offset::ZERO;
        for i in 0..300u64 {
            let o = store.append(
                &src,
                AppendRequest::new(format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(30))),
            )?;
            if i == 199 {
                cut = o.tail;
            }
        }
        store.publish_snapshot(&src, PublishSnapshot::new(cut, &b"s"[..]))?;
        store.set_retention(&src, &RetentionRequest::to(cut))?;
        store.create(
            &fork,
            CreateOptions::new().fork(ForkFrom::tail(src.clone())),
        )?;
        let info = store.head(&fork, &Guard::NONE)?;
        assert_eq!(info.earliest, cut, "segment_bytes {segment_bytes}");
        // From the start: gone, as on the source (the seed: offset=-1 after retention is 410).
        let e = store.read(&fork, &ReadRequest::from(ReadFrom::Start));
        assert!(
            matches!(e, Err(Error::OffsetGone { earliest }) if earliest == cut),
            "{e:?}"
        );
        let e = store.read(&fork, &ReadRequest::from(ReadFrom::At(Offset::ZERO)));
        assert!(
            matches!(e, Err(Error::OffsetGone { earliest }) if earliest == cut),
            "{e:?}"
        );
        // From the earliest offset: exactly what the source still serves.
        let at = ReadRequest::from(ReadFrom::At(cut));
        assert_eq!(
            store.read(&fork, &at)?.to_vec(),
            store.read(&src, &at)?.to_vec()
        );
        drop(store);
        let store = Store::open(
            dir.path(),
            Options::default().with_segment_bytes(segment_bytes),
        )?;
        assert_eq!(store.head(&fork, &Guard::NONE)?.earliest, cut);
    }
    Ok(())
}

/// A crash while a deleted stream's directory is being emptied from the trash, or just before,
/// leaves a store that opens with the stream deleted (a partly emptied directory was restored
/// and then failed recovery with "stream has no segment").
#[test]
fn a_crash_while_emptying_the_trash_recovers() -> R {
    for marked in [true, false] {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), Options::default())?;
        let n = name("trash/x");
        let c = store.create(&n, json())?;
        store.append(&n, AppendRequest::new("[1,2,3]"))?;
        store.checkpoint()?;
        let sdir = crate::util::files_under(&dir.path().join("streams"))?
            .first()
            .and_then(|f| f.parent().map(std::path::Path::to_path_buf))
            .ok_or("no stream directory")?;
        let aside = tempfile::tempdir()?;
        crate::util::copy_dir(&sdir, aside.path())?;
        store.delete(&n, &Guard::NONE)?;
        let image = crash_image(store, dir.path())?;
        // The trash entry as a crash would leave it: renamed `.gone` and partly emptied, or
        // whole and unmarked (its removal not begun).
        let key = sdir.file_name().and_then(|k| k.to_str()).ok_or("key")?;
        let entry = format!("{key}-{}", c.info.incarnation);
        let trash = image.path().join("trash").join(if marked {
            format!("{entry}.gone")
        } else {
            entry
        });
        std::fs::create_dir_all(&trash)?;
        for f in std::fs::read_dir(aside.path())? {
            let f = f?;
            let keep = !marked
                || f.file_name()
                    .to_str()
                    .is_some_and(|s| s.starts_with("meta."));
            if keep {
                std::fs::copy(f.path(), trash.join(f.file_name()))?;
            }
        }
        let store = Store::open(image.path(), Options::default())?;
        assert!(
            matches!(store.head(&n, &Guard::NONE), Err(Error::NotFound)),
            "marked {marked}"
        );
        assert_eq!(
            std::fs::read_dir(image.path().join("trash"))?.count(),
            0,
            "marked {marked}"
        );
        store.create(&n, json())?;
        assert_eq!(read_to_tail(&store, &n, None)?.0, b"");
    }
    Ok(())
}
