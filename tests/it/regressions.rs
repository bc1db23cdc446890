//! Targeted tests for engine bugs found by the model, crash and corruption tests, kept as plain
//! scenarios so each failure names its bug.

use brook::*;

use crate::util::{R, crash_image, name, read_to_tail};

fn json() -> CreateOptions {
    CreateOptions {
        content_type: Some("application/json".into()),
        ..Default::default()
    }
}

/// A source's retention must not reclaim segments that a live fork still reads.
#[test]
fn source_retention_keeps_what_live_forks_read() -> R {
    let dir = tempfile::tempdir()?;
    let opts = Options::default().segment_bytes(4096);
    let store = Store::open(dir.path(), opts.clone())?;
    let (src, fork) = (name("r/src"), name("r/fork"));
    store.create(&src, json())?;
    let mut at = Offset::ZERO;
    let mut last = Offset::ZERO;
    for i in 0..400u64 {
        last = store
            .append(
                &src,
                AppendRequest {
                    data: format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(30)).into(),
                    ..Default::default()
                },
            )?
            .tail;
        if i == 99 {
            at = last;
        }
    }
    store.create(
        &fork,
        CreateOptions {
            fork: Some(ForkFrom {
                source: src.clone(),
                offset: Some(at),
                sub_offset: 0,
            }),
            ..Default::default()
        },
    )?;
    let before = read_to_tail(&store, &fork, None)?.0;
    assert!(before.starts_with(b"{\"i\":0,"));
    store.publish_snapshot(&src, last, None, &mut &b"s"[..], None, None)?;
    store.set_retention(&src, last, None)?;
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
    store.delete(&fork, None)?;
    store.set_retention(&src, last, None)?;
    Ok(())
}
