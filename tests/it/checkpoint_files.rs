//! Checkpoint files (DESIGN.md 2.8): a checkpoint of streams that were only appended to writes
//! their images to one file per shard instead of a sidecar each; recovery takes the newer of a
//! stream's sidecar and its image; files whose images were all replaced go; deleted streams'
//! images never come back.

use std::path::{Path, PathBuf};

use brook::*;

use crate::util::{R, crash_image, name, read_to_tail, typed as text};

fn options() -> Options {
    Options::default()
        .with_journal_shards(1)
        .with_checkpoint_bytes(64 << 10)
}

/// Every checkpoint file of the store in `root`, with its length.
fn ckpt_files(root: &Path) -> std::io::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(root.join("journal"))? {
        for f in std::fs::read_dir(shard?.path())? {
            let f = f?;
            if f.file_name().to_string_lossy().ends_with(".ckpt") {
                out.push((f.path(), f.metadata()?.len()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every sidecar slot under `root` with its bytes.
fn sidecars(root: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    for top in std::fs::read_dir(root.join("streams"))? {
        for dir in std::fs::read_dir(top?.path())? {
            for f in std::fs::read_dir(dir?.path())? {
                let f = f?;
                if f.file_name().to_string_lossy().starts_with("meta.") {
                    out.push((f.path(), std::fs::read(f.path())?));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

fn body(i: usize, k: u64) -> String {
    format!("{i}.{k};")
}

/// What stream `i` holds after appends `0..rounds` by producer `p`, epoch 0.
fn expected(i: usize, rounds: u64) -> Vec<u8> {
    (0..rounds).flat_map(|k| body(i, k).into_bytes()).collect()
}

/// Checks stream `i` of `store`: its bytes, a retried last append answered as a duplicate,
/// an older Stream-Seq refused.
fn check_stream(store: &Store, n: &StreamName, i: usize, rounds: u64) -> R {
    let (data, _) = read_to_tail(store, n, None)?;
    assert_eq!(data, expected(i, rounds), "{n}'s bytes");
    let retry = store.append(
        n,
        AppendRequest::new(body(i, rounds - 1)).producer(Producer::new("p", 0, rounds - 1)),
    )?;
    assert!(
        matches!(retry.status, AppendStatus::Duplicate { .. }),
        "{n}: the producer's last append is known"
    );
    let stale = store
        .append(
            n,
            AppendRequest::new("x").stream_seq(format!("{:03}", rounds - 1)),
        )
        .expect_err("an older Stream-Seq is refused");
    assert!(
        matches!(stale, Error::StreamSeqConflict { .. }),
        "{n}: Stream-Seq {rounds} is known: {stale:?}"
    );
    Ok(())
}

fn append_round(store: &Store, n: &StreamName, i: usize, k: u64) -> brook::Result<()> {
    store.append(
        n,
        AppendRequest::new(body(i, k))
            .producer(Producer::new("p", 0, k))
            .stream_seq(format!("{k:03}")),
    )?;
    Ok(())
}

/// Streams appended to since their sidecar was written are checkpointed into one file: no
/// sidecar changes, and after a crash every stream has its bytes, its producer and its
/// Stream-Seq, from that file.
#[test]
fn appends_are_checkpointed_into_one_file_not_a_sidecar_each() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let n = |i: usize| name(&format!("ck/{i}"));
    for i in 0..50 {
        store.create(&n(i), text("text/plain"))?;
        append_round(&store, &n(i), i, 0)?;
    }
    store.checkpoint()?;
    let before = sidecars(dir.path())?;
    assert_eq!(
        before.len(),
        50,
        "one sidecar slot per stream after the first checkpoint"
    );
    for k in 1..3 {
        for i in 0..50 {
            append_round(&store, &n(i), i, k)?;
        }
        store.checkpoint()?;
    }
    assert_eq!(sidecars(dir.path())?, before, "appends rewrote no sidecar");
    let files = ckpt_files(dir.path())?;
    assert_eq!(
        files.len(),
        1,
        "the second checkpoint replaced every image of the first: {files:?}"
    );
    let image = crash_image(store, dir.path())?;
    let store = Store::open(image.path(), options())?;
    for i in 0..50 {
        check_stream(&store, &n(i), i, 3)?;
    }
    // A clean stop and open read the same.
    store.shutdown()?;
    drop(store);
    let store = Store::open(image.path(), options())?;
    for i in 0..50 {
        let (data, _) = read_to_tail(&store, &n(i), None)?;
        assert!(
            data.starts_with(&expected(i, 3)),
            "ck/{i} after a clean reopen"
        );
    }
    Ok(())
}

/// Each checkpoint records a new group of streams, written once, and the same hot streams:
/// every file keeps the group's images as the newest while the hot streams' images in it die.
/// Without folding those dead images would pile up a file at a time; past the bound
/// (`checkpoint_bytes`, 64 KiB here) a checkpoint folds the file with the most of them into its
/// own, so the files hold the live images and at most about the bound besides, and every
/// stream reads back after a crash.
#[test]
fn checkpoint_files_are_folded_past_their_bound() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let n = |i: usize| name(&format!("fold/{i:04}"));
    let (groups, group, hot) = (16, 100, 50);
    let streams = hot + groups * group;
    for i in 0..streams {
        store.create(&n(i), text("text/plain"))?;
        append_round(&store, &n(i), i, 0)?;
    }
    store.checkpoint()?;
    let mut rounds = vec![1u64; streams];
    let mut image = 0u64;
    let mut most_extra = 0u64;
    for g in 0..groups {
        let touched: Vec<usize> = (0..hot)
            .chain(hot + g * group..hot + (g + 1) * group)
            .collect();
        for &i in &touched {
            append_round(&store, &n(i), i, rounds[i])?;
            rounds[i] += 1;
        }
        store.checkpoint()?;
        let files = ckpt_files(dir.path())?;
        let bytes: u64 = files.iter().map(|f| f.1).sum();
        assert_eq!(store.stats().checkpoint_file_bytes, bytes);
        if g == 0 {
            // One file of equally long images (the names are as long, and so is the rest).
            image = (bytes - 24) / touched.len() as u64;
        }
        let live = (hot + (g + 1) * group) as u64 * image;
        most_extra = most_extra.max(bytes.saturating_sub(live));
    }
    let bound = (64 << 10) + 2 * hot as u64 * image + 24 * 8;
    assert!(
        most_extra <= bound,
        "dead images stayed within the bound: at most {most_extra} bytes besides the live ones (bound {bound}, images of {image} bytes)"
    );
    assert!(
        most_extra > 0,
        "the hot streams left some dead images before a fold"
    );
    let crashed = crash_image(store, dir.path())?;
    let store = Store::open(crashed.path(), options())?;
    for (i, &r) in rounds.iter().enumerate() {
        check_stream(&store, &n(i), i, r)?;
    }
    Ok(())
}

/// A stream whose newest image is in a checkpoint file, then deleted: the image does not bring
/// it back after a crash, before or after the next checkpoint, and a new incarnation of the
/// name starts empty.
#[test]
fn a_deleted_stream_does_not_come_back_from_its_image() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let (a, b) = (name("del/a"), name("del/b"));
    for n in [&a, &b] {
        store.create(n, text("text/plain"))?;
        append_round(&store, n, 0, 0)?;
    }
    store.checkpoint()?;
    for n in [&a, &b] {
        append_round(&store, n, 0, 1)?;
    }
    store.checkpoint()?;
    assert_eq!(ckpt_files(dir.path())?.len(), 1);
    store.delete(&a, &Guard::NONE)?;
    // Before a checkpoint: the journal deletes it again.
    let crashed = crash_image(store, dir.path())?;
    let store = Store::open(crashed.path(), options())?;
    assert!(matches!(store.head(&a, &Guard::NONE), Err(Error::NotFound)));
    check_stream(&store, &b, 0, 2)?;
    store.delete(&b, &Guard::NONE)?;
    store.checkpoint()?;
    assert!(
        ckpt_files(crashed.path())?.is_empty(),
        "a checkpoint after the deletes drops the file of their images"
    );
    store.create(&b, text("text/plain"))?;
    store.append(&b, AppendRequest::new("new;"))?;
    let again = crash_image(store, crashed.path())?;
    let store = Store::open(again.path(), options())?;
    assert!(matches!(store.head(&a, &Guard::NONE), Err(Error::NotFound)));
    let (data, _) = read_to_tail(&store, &b, None)?;
    assert_eq!(
        data, b"new;",
        "the new incarnation holds only its own bytes"
    );
    Ok(())
}

/// An import of a stream deleted since its export, with the delete and a newer image of the
/// old stream still in the journal and a checkpoint file when the process dies: the imported
/// stream is what recovery finds (its sidecar is at the shard's newest LSN, above both).
#[test]
fn an_import_over_a_deleted_stream_survives_a_crash() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let n = name("imp/a");
    store.create(&n, text("text/plain"))?;
    append_round(&store, &n, 0, 0)?;
    store.checkpoint()?;
    let mut archive = Vec::new();
    store.export(&mut archive, &mut |_| {})?;
    append_round(&store, &n, 0, 1)?;
    store.checkpoint()?;
    store.delete(&n, &Guard::NONE)?;
    assert_eq!(store.import(&mut &archive[..], &mut |_| {})?, 1);
    let image = crash_image(store, dir.path())?;
    let store = Store::open(image.path(), options())?;
    let (data, _) = read_to_tail(&store, &n, None)?;
    assert_eq!(data, expected(0, 1), "the imported stream, as exported");
    Ok(())
}

/// The journal file version of `root`'s only shard's newest journal file (bytes 4..8).
fn newest_journal_version(root: &Path) -> std::io::Result<u32> {
    let mut wals: Vec<PathBuf> = std::fs::read_dir(root.join("journal/00"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    wals.retain(|p| p.extension().is_some_and(|e| e == "wal"));
    wals.sort();
    let b = std::fs::read(wals.last().expect("a journal file"))?;
    Ok(u32::from_le_bytes([b[4], b[5], b[6], b[7]]))
}

/// A store written by brook before checkpoint files (journal version 3, brook at `1e212ef`),
/// checked in as `tests/fixtures/store-v3`. Made with that build's `brook serve --data-dir`
/// (stream names `v1/stream/...`): in Sync mode, `fx/text` created and appended `text 0;` to `text 2;` by producer `p` (epoch 0,
/// seq 0-2, Stream-Seq `000`-`002`), `fx/json` created and given `[{"a":1},{"b":2}]`, `fx/closed`
/// created and closed with `last`; a clean stop (every state in its sidecar); then in Buffered
/// mode `text 3;` (seq 3, Stream-Seq `003`), `[{"c":3}]` to `fx/json`, `fx/late` created with
/// `late;`, and `kill -9`: those are only in the version 3 journal (the server's `keys` taken
/// out). It opens with every acknowledged byte and producer state, and its first checkpoint
/// writes a checkpoint file and version 4 journal files.
#[test]
fn a_store_written_before_checkpoint_files_opens_and_upgrades() -> R {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v3");
    let dir = tempfile::tempdir()?;
    crate::util::copy_dir(&fixture, dir.path())?;
    assert_eq!(newest_journal_version(dir.path())?, 3);
    let opts = Options::default();
    let check =
        |store: &Store, text_rounds: u64| -> R {
            let text_bytes: Vec<u8> = (0..text_rounds)
                .flat_map(|k| format!("text {k};").into_bytes())
                .collect();
            let (data, _) = read_to_tail(store, &name("v1/stream/fx/text"), None)?;
            assert_eq!(data, text_bytes);
            let retry =
                store.append(
                    &name("v1/stream/fx/text"),
                    AppendRequest::new(format!("text {};", text_rounds - 1))
                        .producer(Producer::new("p", 0, text_rounds - 1)),
                )?;
            assert!(matches!(retry.status, AppendStatus::Duplicate { .. }));
            let stale = store
                .append(
                    &name("v1/stream/fx/text"),
                    AppendRequest::new("x").stream_seq(format!("{:03}", text_rounds - 1)),
                )
                .expect_err("an older Stream-Seq is refused");
            assert!(
                matches!(stale, Error::StreamSeqConflict { .. }),
                "{stale:?}"
            );
            let (json, _) = read_to_tail(store, &name("v1/stream/fx/json"), None)?;
            let json = String::from_utf8(json)?;
            for m in [r#"{"a":1}"#, r#"{"b":2}"#, r#"{"c":3}"#] {
                assert!(json.contains(m), "fx/json holds {m}: {json}");
            }
            let closed = store.head(&name("v1/stream/fx/closed"), &Guard::NONE)?;
            assert!(closed.closed);
            assert_eq!(
                read_to_tail(store, &name("v1/stream/fx/closed"), None)?.0,
                b"last"
            );
            assert_eq!(
                read_to_tail(store, &name("v1/stream/fx/late"), None)?.0,
                b"late;"
            );
            Ok(())
        };
    let store = Store::open(dir.path(), opts.clone())?;
    check(&store, 4)?;
    assert_eq!(
        newest_journal_version(dir.path())?,
        4,
        "an older brook refuses the store from now on"
    );
    store.append(
        &name("v1/stream/fx/text"),
        AppendRequest::new("text 4;")
            .producer(Producer::new("p", 0, 4))
            .stream_seq("004"),
    )?;
    store.checkpoint()?;
    assert!(
        !ckpt_files(dir.path())?.is_empty(),
        "the append went to a checkpoint file"
    );
    let crashed = crash_image(store, dir.path())?;
    let store = Store::open(crashed.path(), opts)?;
    check(&store, 5)?;
    Ok(())
}

/// A store whose checkpoint files hold the newest state of its streams, opened with a cold
/// tier (whose thread reads a stream's state from its sidecar): the images are written into the
/// sidecars and the files go, every checkpoint with the tier writes sidecars, and the store
/// opens again without the tier with every stream as acknowledged.
#[cfg(feature = "tier")]
#[test]
fn a_cold_tier_gets_the_checkpoint_files_written_into_sidecars() -> R {
    let dir = tempfile::tempdir()?;
    let bucket = tempfile::tempdir()?;
    let n = |i: usize| name(&format!("tiered/{i}"));
    let store = Store::open(dir.path(), options())?;
    for i in 0..20 {
        store.create(&n(i), text("text/plain"))?;
        append_round(&store, &n(i), i, 0)?;
    }
    store.checkpoint()?;
    for i in 0..20 {
        append_round(&store, &n(i), i, 1)?;
    }
    store.shutdown()?;
    drop(store);
    assert!(!ckpt_files(dir.path())?.is_empty());
    let before = sidecars(dir.path())?;
    let tiered = options().with_tier(TierOptions::new(format!(
        "file://{}",
        bucket.path().display()
    )));
    let store = Store::open(dir.path(), tiered)?;
    assert!(
        ckpt_files(dir.path())?.is_empty(),
        "the files were written into sidecars"
    );
    assert_ne!(
        sidecars(dir.path())?,
        before,
        "the sidecars took the images"
    );
    for i in 0..20 {
        check_stream(&store, &n(i), i, 2)?;
        append_round(&store, &n(i), i, 2)?;
    }
    store.checkpoint()?;
    assert!(
        ckpt_files(dir.path())?.is_empty(),
        "with a tier, checkpoints write sidecars"
    );
    store.shutdown()?;
    drop(store);
    let store = Store::open(dir.path(), options())?;
    for i in 0..20 {
        check_stream(&store, &n(i), i, 3)?;
    }
    Ok(())
}

/// A power cut during a checkpoint, before its second `syncfs`, may tear its file anywhere,
/// the header included: while the journal it would replace is left, recovery drops the file
/// and replays the journal. A committed file with a damaged header is an error instead.
#[test]
fn a_torn_file_of_an_unfinished_checkpoint_is_dropped() -> R {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let names: Vec<StreamName> = (0..4).map(|i| name(&format!("torn/{i}"))).collect();
    for (i, n) in names.iter().enumerate() {
        store.create(n, text("text/plain"))?;
        append_round(&store, n, i, 0)?;
    }
    store.checkpoint()?;
    for (i, n) in names.iter().enumerate() {
        append_round(&store, n, i, 1)?;
    }
    store.checkpoint()?;
    for (i, n) in names.iter().enumerate() {
        append_round(&store, n, i, 2)?;
    }
    let committed = ckpt_files(dir.path())?;
    assert_eq!(committed.len(), 1, "{committed:?}");
    let crashed = crash_image(store, dir.path())?;
    let shard = crashed.path().join("journal").join("00");
    let oldest_journal = std::fs::read_dir(&shard)?
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".wal")?.parse::<u64>().ok()
        })
        .min()
        .ok_or("no journal file")?;
    // What a cut leaves of an unfinished checkpoint's file: zeroed pages where its bytes were.
    let torn = shard.join(format!("{:020}.ckpt", oldest_journal + 1));
    std::fs::write(&torn, vec![0u8; 8192])?;
    let store = Store::open(crashed.path(), options())?;
    assert!(!torn.exists(), "the torn file is dropped");
    for (i, n) in names.iter().enumerate() {
        check_stream(&store, n, i, 3)?;
    }
    drop(store);
    // The committed file's header damaged: nothing may silently replace its images.
    let (path, _) = &ckpt_files(crashed.path())?[0];
    let mut bytes = std::fs::read(path)?;
    bytes[0] ^= 0xff;
    std::fs::write(path, bytes)?;
    match Store::open(crashed.path(), options()) {
        Err(Error::Corrupt { .. }) => {}
        Err(e) => panic!("a damaged committed checkpoint file is corrupt, not {e}"),
        Ok(_) => panic!("a damaged committed checkpoint file must be refused"),
    }
    Ok(())
}
