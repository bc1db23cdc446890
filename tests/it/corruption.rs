//! Corruption tests: bit flips and truncations of every kind of file a store keeps (`STORE`,
//! journal `*.wal`, sidecars `meta.0`/`meta.1`, segment `*.log` and `*.idx`, snapshot blobs),
//! applied to the image of a crashed store. The store must then either open and serve, for every
//! stream, a prefix of what was acknowledged (at an append boundary, with offsets that agree), or
//! answer an `Error`: never panic, hang or return bytes that were never written.
//!
//! Replay a run with `BROOK_TEST_SEED`; damage more with `BROOK_CORRUPTION_SCALE`.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use brook::*;

use crate::util::{R, Rng, copy_dir, crash_image, files_under, name, read_to_tail, typed};

fn options() -> Options {
    // Two journal shards whatever the machine's default, so damage is found in either.
    Options::default()
        .with_journal_shards(2)
        .with_segment_bytes(4096)
        .with_durability(Durability::Buffered)
}

/// What was acknowledged: per stream, its messages (JSON texts or byte appends) in order.
#[derive(Clone)]
struct Expected {
    streams: Vec<(StreamName, bool, Vec<Vec<u8>>)>,
    snapshot: (StreamName, Offset, Vec<u8>),
}

fn json_msg(s: &str, i: u64) -> String {
    format!(
        "{{\"s\":\"{s}\",\"i\":{i},\"pad\":\"{}\"}}",
        "p".repeat((i % 13) as usize)
    )
}

/// Builds a store with streams checkpointed and not, rolled segments, a fork, a closed stream,
/// a snapshot with retention, and producer and Stream-Seq state, then crashes it.
fn build() -> std::result::Result<(tempfile::TempDir, Expected), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), options())?;
    let json = typed("application/json");
    let mut streams = Vec::new();

    let a = name("c/json");
    store.create(&a, json.clone())?;
    let mut msgs = Vec::new();
    for i in 0..160u64 {
        let m = json_msg("a", i);
        let p = Producer::new("pa", 1, i);
        store.append(
            &a,
            AppendRequest::new(m.clone())
                .producer(p)
                .stream_seq(format!("{i:020}")),
        )?;
        msgs.push(m.into_bytes());
        if i == 90 {
            store.checkpoint()?;
        }
    }
    streams.push((a.clone(), true, msgs.clone()));

    let f = name("c/fork");
    let at = store
        .read(&a, &ReadRequest::from(ReadFrom::Start).max_bytes(1500))?
        .next;
    store.create(&f, CreateOptions::new().fork(ForkFrom::at(a.clone(), at)))?;
    let mut fmsgs: Vec<Vec<u8>> = msgs[..at.messages as usize].to_vec();
    for i in 0..30u64 {
        let m = json_msg("f", i);
        store.append(&f, AppendRequest::new(m.clone()))?;
        fmsgs.push(m.into_bytes());
    }
    streams.push((f, true, fmsgs));

    let b = name("c/bytes");
    store.create(
        &b,
        CreateOptions::with_content_type("text/plain").data("first;"),
    )?;
    let mut bm = vec![b"first;".to_vec()];
    for i in 0..120u64 {
        let m = format!("bytes-{i:05}-{};", "z".repeat((i % 40) as usize));
        store.append(
            &b,
            AppendRequest::new(m.clone()).producer(Producer::new("pb", 0, i)),
        )?;
        bm.push(m.into_bytes());
    }
    store.close(&b, &Guard::NONE)?;
    streams.push((b, false, bm));

    let s = name("c/snap");
    store.create(&s, json.clone())?;
    let mut sm = Vec::new();
    let mut snap_at = Offset::ZERO;
    for i in 0..200u64 {
        let m = json_msg("s", i);
        let o = store.append(&s, AppendRequest::new(m.clone()))?;
        sm.push(m.into_bytes());
        if i == 149 {
            snap_at = o.tail;
        }
    }
    store.publish_snapshot(
        &s,
        PublishSnapshot::new(snap_at, &b"{\"count\":150}"[..]).content_type("application/json"),
    )?;
    store.set_retention(&s, &RetentionRequest::to(snap_at))?;
    store.checkpoint()?;
    streams.push((s.clone(), true, sm));

    let l = name("c/late");
    store.create(&l, json)?;
    let mut lm = Vec::new();
    for i in 0..20u64 {
        let m = json_msg("l", i);
        store.append(&l, AppendRequest::new(format!("[{m}]")))?;
        lm.push(m.into_bytes());
    }
    streams.push((l, true, lm));

    let image = crash_image(store, dir.path())?;
    Ok((
        image,
        Expected {
            streams,
            snapshot: (s, snap_at, b"{\"count\":150}".to_vec()),
        },
    ))
}

/// What a store opened on a damaged image serves must be a prefix of what was acknowledged.
fn check_store(store: &Store, exp: &Expected) -> std::result::Result<(), String> {
    for (n, json, msgs) in &exp.streams {
        let Ok(info) = store.head(n, &Guard::NONE) else {
            continue;
        };
        let start = info.earliest;
        let Ok((data, _)) = read_to_tail(store, n, Some(700)) else {
            continue;
        };
        // The acknowledged messages from the earliest readable one on.
        let mut pos = 0u64;
        let mut first = 0usize;
        while first < msgs.len() && pos < start.bytes {
            pos += msgs[first].len() as u64 + u64::from(*json);
            first += 1;
        }
        if pos != start.bytes || first as u64 != start.messages {
            return Err(format!(
                "{n}: earliest {start} is not a message boundary of what was written"
            ));
        }
        let got: Vec<Vec<u8>> = if *json {
            let v: Vec<Box<serde_json::value::RawValue>> =
                serde_json::from_slice(&[b"[", &data[..], b"]"].concat())
                    .map_err(|e| format!("{n}: served invalid JSON: {e}"))?;
            v.into_iter().map(|r| r.get().as_bytes().to_vec()).collect()
        } else {
            let mut out = Vec::new();
            let mut rest = &data[..];
            for m in &msgs[first..] {
                if rest.is_empty() {
                    break;
                }
                if !rest.starts_with(m) {
                    return Err(format!("{n}: served bytes that were never appended there"));
                }
                out.push(m.clone());
                rest = &rest[m.len()..];
            }
            if !rest.is_empty() {
                return Err(format!(
                    "{n}: served bytes past or between acknowledged appends"
                ));
            }
            out
        };
        let want = &msgs[first..];
        if got.len() > want.len() || got[..] != want[..got.len()] {
            return Err(format!(
                "{n}: served {} messages that are not a prefix of the {} written",
                got.len(),
                want.len()
            ));
        }
        let bytes: u64 = pos
            + got
                .iter()
                .map(|m| m.len() as u64 + u64::from(*json))
                .sum::<u64>();
        let tail = Offset::new((first + got.len()) as u64, bytes);
        if info.tail != tail {
            return Err(format!(
                "{n}: tail {} but the data served ends at {tail}",
                info.tail
            ));
        }
    }
    let (n, at, blob) = &exp.snapshot;
    if let Ok(snap) = store.snapshot(n, &SnapshotRequest::latest())
        && (snap.info.offset != *at || snap.data.as_ref() != &blob[..])
    {
        return Err(format!(
            "{n}: snapshot {:?} is not the one published",
            snap.info
        ));
    }
    Ok(())
}

/// After recovery from damage, new acknowledged writes must survive the next crash.
fn check_writes_after_recovery(
    store: Store,
    dir: &Path,
    exp: &Expected,
) -> std::result::Result<(), String> {
    let mut written = Vec::new();
    for (n, json, _) in &exp.streams {
        let data = if *json { "{\"after\":true}" } else { "after;" };
        if let Ok(o) = store.append(n, AppendRequest::new(data)) {
            written.push((n.clone(), o.tail));
        }
    }
    let image = crash_image(store, dir).map_err(|e| e.to_string())?;
    let store = Store::open(image.path(), options())
        .map_err(|e| format!("reopen after writing on a recovered store: {e}"))?;
    for (n, tail) in written {
        match store.head(&n, &Guard::NONE) {
            Ok(i) if i.tail == tail => {}
            other => {
                return Err(format!(
                    "{n}: an append acknowledged at {tail} after recovery is lost: {other:?}"
                ));
            }
        }
    }
    Ok(())
}

enum Damage {
    Flip(usize, u8),
    Truncate(u64),
}

/// Opens a damaged copy of `image` and checks it, on a thread, so a hang fails the test.
fn try_damage(
    image: &Path,
    file: &Path,
    damage: &Damage,
    exp: &Expected,
    write_after: bool,
) -> std::result::Result<String, String> {
    let copy = tempfile::tempdir().map_err(|e| e.to_string())?;
    copy_dir(image, copy.path()).map_err(|e| e.to_string())?;
    let target = copy
        .path()
        .join(file.strip_prefix(image).map_err(|e| e.to_string())?);
    let mut bytes = std::fs::read(&target).map_err(|e| e.to_string())?;
    match damage {
        Damage::Flip(at, mask) => {
            if bytes.is_empty() {
                return Ok("empty".into());
            }
            let i = at % bytes.len();
            bytes[i] ^= mask;
        }
        Damage::Truncate(len) => bytes.truncate(*len as usize),
    }
    std::fs::write(&target, &bytes).map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    let exp = exp.clone();
    let path = copy.path().to_path_buf();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match Store::open(&path, options()) {
                Err(e) => Ok(format!("refused: {}", e.code())),
                Ok(store) => {
                    check_store(&store, &exp)?;
                    if write_after {
                        check_writes_after_recovery(store, &path, &exp)?;
                    }
                    Ok("opened".to_owned())
                }
            }
        }));
        let _ = tx.send(r.unwrap_or_else(|_| Err("panicked".into())));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| Err("hung for 30 s".into()));
    drop(copy);
    r
}

fn kind(p: &Path) -> &'static str {
    let n = p.file_name().and_then(|s| s.to_str()).unwrap_or("");
    // brook names its files itself, in lower case: an exact comparison is the right one.
    match p.extension().and_then(|s| s.to_str()) {
        _ if n == "STORE" => "STORE",
        Some("wal") => "wal",
        _ if n.starts_with("meta.") => "meta",
        Some("log") => "log",
        Some("idx") => "idx",
        Some("blob") => "blob",
        _ => "other",
    }
}

/// The bytes of a file that hold data (segment logs and indexes are preallocated past it).
fn used_len(p: &Path) -> std::io::Result<u64> {
    let b = std::fs::read(p)?;
    let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    Ok(n as u64)
}

/// `BROOK_CORRUPTION_SCALE` multiplies the flips per file (default 1).
fn run_damage(kinds: &[&str], per_file: usize) -> R {
    let scale: usize = std::env::var("BROOK_CORRUPTION_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let per_file = per_file * scale;
    let mut rng = Rng::from_env("corruption");
    let (image, exp) = build()?;
    // The undamaged image serves everything (opened on a copy: recovery rewrites files).
    {
        let copy = tempfile::tempdir()?;
        copy_dir(image.path(), copy.path())?;
        let store = Store::open(copy.path(), options())?;
        check_store(&store, &exp)?;
        for (n, _, msgs) in &exp.streams {
            assert_eq!(
                store.head(n, &Guard::NONE)?.tail.messages,
                msgs.len() as u64,
                "{n}"
            );
        }
    }
    let files: Vec<PathBuf> = files_under(image.path())?
        .into_iter()
        .filter(|p| kinds.contains(&kind(p)))
        .collect();
    assert!(!files.is_empty(), "no files of kinds {kinds:?}");
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    let mut failures = Vec::new();
    for file in &files {
        let len = std::fs::metadata(file)?.len();
        let used = used_len(file)?.max(1);
        let mut damages = Vec::new();
        for j in 0..per_file {
            // Headers first, then anywhere in the used bytes.
            let at = if j < 3 {
                rng.below(used.min(32))
            } else {
                rng.below(used)
            };
            damages.push(Damage::Flip(at as usize, 1 << rng.below(8)));
        }
        for cut in [
            0,
            used / 2,
            used.saturating_sub(1),
            rng.below(used),
            used.saturating_sub(rng.below(40)),
        ] {
            if cut < len {
                damages.push(Damage::Truncate(cut));
            }
        }
        for (j, d) in damages.iter().enumerate() {
            let what = match d {
                Damage::Flip(at, m) => format!(
                    "flip {m:#04x} at {} of {}",
                    at % len.max(1) as usize,
                    file.display()
                ),
                Damage::Truncate(l) => format!("truncate {} to {l}", file.display()),
            };
            match try_damage(image.path(), file, d, &exp, j % 3 == 0) {
                Ok(outcome) => {
                    *tally
                        .entry(format!("{} {outcome}", kind(file)))
                        .or_default() += 1;
                }
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    eprintln!("corruption {kinds:?}: {tally:?}");
    if !failures.is_empty() {
        return Err(format!(
            "{} of the damaged images were mishandled:\n{}",
            failures.len(),
            failures.join("\n")
        )
        .into());
    }
    Ok(())
}

#[test]
fn damaged_manifest_and_journal() -> R {
    run_damage(&["STORE", "wal"], 24)
}

#[test]
fn damaged_sidecars() -> R {
    run_damage(&["meta"], 10)
}

#[test]
fn damaged_segments_and_blobs() -> R {
    run_damage(&["log", "idx", "blob"], 8)
}

/// Every bit of the manifest's shard count and of the journal headers' base LSNs, flipped in
/// turn: each such image is refused or served correctly, and writes after it survive.
#[test]
fn damaged_shard_count_and_journal_base_lsn() -> R {
    let (image, exp) = build()?;
    let mut cases: Vec<(PathBuf, Damage)> = (0..8)
        .map(|bit| (image.path().join("STORE"), Damage::Flip(8, 1 << bit)))
        .collect();
    for wal in files_under(image.path())?
        .into_iter()
        .filter(|p| kind(p) == "wal")
    {
        if std::fs::metadata(&wal)?.len() > 24 {
            for (at, bit) in [(16, 0), (16, 5), (17, 0), (17, 3), (18, 1), (19, 7)] {
                cases.push((wal.clone(), Damage::Flip(at, 1 << bit)));
            }
        }
    }
    let mut failures = Vec::new();
    for (file, d) in &cases {
        if let Err(e) = try_damage(image.path(), file, d, &exp, true) {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// A stream directory replaced by a symbolic link to a copy outside the data directory: the
/// stream is refused as corrupt (naming the link), nothing is read from or removed at the
/// link's target, and the store's other streams are served.
#[test]
fn a_stream_directory_that_is_a_symlink_is_not_followed() -> R {
    let dir = tempfile::tempdir()?;
    let outside = tempfile::tempdir()?;
    let (a, b) = (name("link/a"), name("link/b"));
    {
        let store = Store::open(dir.path(), Options::default())?;
        store.create(&a, typed("text/plain"))?;
        store.append(&a, AppendRequest::new("from-inside"))?;
        store.create(&b, typed("text/plain"))?;
        store.append(&b, AppendRequest::new("b"))?;
        store.checkpoint()?;
        store.shutdown()?;
    }
    // Find a's directory: the one whose sidecar names it.
    let mut a_dir = None;
    for fan in std::fs::read_dir(dir.path().join("streams"))? {
        for d in std::fs::read_dir(fan?.path())? {
            let d = d?.path();
            let meta = std::fs::read(d.join("meta.0")).or_else(|_| std::fs::read(d.join("meta.1")));
            if meta.is_ok_and(|m| m.windows(6).any(|w| w == b"link/a")) {
                a_dir = Some(d);
            }
        }
    }
    let a_dir = a_dir.ok_or("no directory for link/a")?;
    let target = outside.path().join("copy");
    copy_dir(&a_dir, &target)?;
    std::fs::remove_dir_all(&a_dir)?;
    std::os::unix::fs::symlink(&target, &a_dir)?;
    let before = files_under(&target)?;

    let store = Store::open(dir.path(), Options::default())?;
    match store.read(&a, &ReadRequest::from(ReadFrom::Start)) {
        Err(Error::Corrupt { path, reason }) => {
            assert_eq!(path, a_dir);
            assert!(reason.contains("symbolic link"), "{reason}");
        }
        other => panic!("read through a symlinked stream directory: {other:?}"),
    }
    assert_eq!(read_to_tail(&store, &b, None)?.0, b"b");
    store.shutdown()?;
    assert_eq!(
        files_under(&target)?,
        before,
        "files at the link's target changed"
    );
    Ok(())
}

/// The directory of the stream `n` under `root` (the one whose sidecar names it).
fn dir_of(root: &Path, n: &str) -> std::io::Result<Option<PathBuf>> {
    for fan in std::fs::read_dir(root.join("streams"))? {
        for d in std::fs::read_dir(fan?.path())? {
            let d = d?.path();
            for slot in ["meta.0", "meta.1"] {
                if std::fs::read(d.join(slot))
                    .is_ok_and(|m| m.windows(n.len()).any(|w| w == n.as_bytes()))
                {
                    return Ok(Some(d));
                }
            }
        }
    }
    Ok(None)
}

/// A stream whose segment log or index was lost while the journal still held its records: the
/// store opens anyway, the other streams are served, that stream is `Corrupt`, and its journal
/// records are kept in `quarantine/` (a second restart still opens).
#[test]
fn a_damaged_stream_is_isolated_and_its_records_kept() -> R {
    for victim_ext in ["log", "idx"] {
        let dir = tempfile::tempdir()?;
        let (a, b) = (name("iso/a"), name("iso/b"));
        let store = Store::open(dir.path(), options())?;
        for n in [&a, &b] {
            store.create(n, typed("text/plain"))?;
            store.append(n, AppendRequest::new("checkpointed,"))?;
        }
        store.checkpoint()?;
        for n in [&a, &b] {
            store.append(n, AppendRequest::new("journal only"))?;
        }
        let image = crash_image(store, dir.path())?;
        let a_dir = dir_of(image.path(), "iso/a")?.ok_or("no directory for iso/a")?;
        for e in std::fs::read_dir(&a_dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == victim_ext) {
                std::fs::remove_file(p)?;
            }
        }
        for round in 0..2 {
            let store = Store::open(image.path(), options())?;
            assert_eq!(
                read_to_tail(&store, &b, None)?.0,
                b"checkpointed,journal only",
                "{victim_ext} round {round}"
            );
            match store.read(&a, &ReadRequest::from(ReadFrom::Start)) {
                Err(Error::Corrupt { path, .. }) => {
                    assert!(path.starts_with(&a_dir), "{victim_ext}: {}", path.display());
                }
                other => {
                    panic!("{victim_ext} round {round}: read of the damaged stream: {other:?}")
                }
            }
            store.shutdown()?;
        }
        let kept: Vec<_> =
            std::fs::read_dir(image.path().join("quarantine"))?.collect::<std::io::Result<_>>()?;
        assert_eq!(kept.len(), 1, "{victim_ext}: one quarantined journal");
        let bytes = std::fs::read(kept[0].path())?;
        assert!(
            bytes.windows(12).any(|w| w == b"journal only"),
            "{victim_ext}: the quarantined journal lacks the record"
        );
    }
    Ok(())
}
