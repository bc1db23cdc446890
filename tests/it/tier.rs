//! The cold tier (feature `tier`): uploads, eviction under the local budget, cold reads that
//! span local and tiered segments byte-exactly, recovery with the tiered files gone, retention,
//! deletes and forks across tiers. Against the `file://` backend here (fast, in process), and
//! against a real S3-compatible server in `tier_s3.rs`.

use std::path::{Path, PathBuf};

use brook::*;

use crate::util::{R, name, read_to_tail, typed};

/// A test helper's result.
type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Every file under `dir` (the tier's objects of a `file://` tier), as paths relative to it.
pub fn objects(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Whether object or file name `o` ends in `.{x}`.
fn ext(o: &str, x: &str) -> bool {
    Path::new(o).extension().is_some_and(|e| e == x)
}

/// Options with small segments and a `file://` tier at `bucket` with local budget `budget`.
fn options(bucket: &Path, budget: u64) -> Options {
    Options::default().with_segment_bytes(4096).with_tier(
        TierOptions::new(format!("file://{}", bucket.display()))
            .with_local_budget(budget)
            .with_cache_bytes(1 << 20),
    )
}

/// The local `.log` files of every stream under `data`.
fn local_logs(data: &Path) -> Res<Vec<PathBuf>> {
    Ok(crate::util::files_under(data)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect())
}

/// Appends `n` distinct messages of about 100 bytes to `s`; returns what the stream holds.
fn fill(store: &Store, s: &StreamName, n: usize) -> Res<Vec<u8>> {
    let mut all = Vec::new();
    for i in 0..n {
        let m = format!("message {i:06} {}\n", "x".repeat(80 + i % 17));
        store.append(s, AppendRequest::new(m.clone()))?;
        all.extend_from_slice(m.as_bytes());
    }
    Ok(all)
}

#[test]
fn uploads_evicts_and_reads_back_across_local_and_cold() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let s = name("tier/one");
    let expect = {
        let store = Store::open(data.path(), options(bucket.path(), 0))?;
        store.create(&s, typed("text/plain"))?;
        let expect = fill(&store, &s, 400)?;
        store.sync_tier()?;
        let st = store.stats();
        assert!(st.tier_uploads >= 2 * 8, "{st:?}");
        assert!(st.tier_evictions >= 8, "{st:?}");
        assert_eq!(st.tier_local_bytes, 0, "budget 0: every uploaded log left");
        // Only the open segment's log (and any sealed after the checkpoint) stays local.
        assert!(local_logs(data.path())?.len() <= 2);
        let objs = objects(bucket.path());
        assert!(objs.iter().any(|o| ext(o, "log")) && objs.iter().any(|o| ext(o, "idx")));
        // Every read, at every boundary, in small chunks, is byte-exact across the tiers.
        let (got, _) = read_to_tail(&store, &s, Some(1000))?;
        assert_eq!(got, expect);
        let (got, _) = read_to_tail(&store, &s, None)?;
        assert_eq!(got, expect);
        let st = store.stats();
        assert!(st.tier_cache_misses > 0 && st.tier_cache_hits > 0, "{st:?}");
        assert!(st.tier_fetch_bytes > 0);
        // A read spanning a cold segment and the local one.
        let tail = store.head(&s, &Guard::NONE)?.tail;
        let mid = store.read(
            &s,
            &ReadRequest::from(ReadFrom::Start).max_bytes(tail.bytes),
        )?;
        assert_eq!(mid.to_vec(), expect);
        expect
    };
    // Reopened: the cold segments open cold (their logs are not here) and read the same.
    let store = Store::open(data.path(), options(bucket.path(), 0))?;
    assert_eq!(read_to_tail(&store, &s, Some(4096))?.0, expect);
    let more = fill(&store, &s, 50)?;
    store.sync_tier()?;
    let mut all = expect.clone();
    all.extend_from_slice(&more);
    assert_eq!(read_to_tail(&store, &s, None)?.0, all);
    Ok(())
}

#[test]
fn recovery_restores_indexes_of_tiered_segments_removed_locally() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let s = name("tier/lost");
    let expect = {
        // A big budget: the logs stay local, and are lost below instead.
        let store = Store::open(data.path(), options(bucket.path(), u64::MAX))?;
        store.create(&s, typed("application/octet-stream"))?;
        let expect = fill(&store, &s, 300)?;
        store.sync_tier()?;
        assert_eq!(store.stats().tier_evictions, 0);
        expect
    };
    // Lose every local file of the tiered segments: their logs and indexes.
    let tiered: Vec<String> = objects(bucket.path())
        .into_iter()
        .filter_map(|o| o.rsplit('/').next().map(str::to_owned))
        .filter(|f| ext(f, "log") || ext(f, "idx"))
        .collect();
    assert!(tiered.len() >= 4, "{tiered:?}");
    let mut removed = 0;
    for p in crate::util::files_under(data.path())? {
        let f = p
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_owned();
        if tiered.contains(&f) {
            std::fs::remove_file(&p)?;
            removed += 1;
        }
    }
    assert_eq!(removed, tiered.len());
    let store = Store::open(data.path(), options(bucket.path(), u64::MAX))?;
    assert_eq!(read_to_tail(&store, &s, Some(3000))?.0, expect);
    assert!(store.stats().tier_cache_misses > 0);
    // And the engine's own check reads it end to end.
    let report = store.check(&mut |_| {})?;
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);
    Ok(())
}

/// A tiered segment whose local index lost entries (written, not yet durable, when the tier
/// uploaded it; then a power cut: found by the cold-tier power-loss simulation, seed 35, about
/// one run in sixty on a loaded machine) opens from the tier's copy instead of as `CORRUPT`.
#[test]
fn recovery_replaces_a_tiered_index_that_lost_entries() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let s = name("tier/torn");
    let expect = {
        let store = Store::open(data.path(), options(bucket.path(), u64::MAX))?;
        store.create(&s, typed("application/octet-stream"))?;
        let expect = fill(&store, &s, 300)?;
        store.sync_tier()?;
        expect
    };
    let tiered: Vec<String> = objects(bucket.path())
        .into_iter()
        .filter_map(|o| o.rsplit('/').next().map(str::to_owned))
        .filter(|f| ext(f, "idx"))
        .collect();
    assert!(!tiered.is_empty());
    // The entries of every tiered index zeroed, as a power cut leaves unsynced pages of a
    // sparse file; the lengths kept.
    let mut torn = 0;
    for p in crate::util::files_under(data.path())? {
        let f = p.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        if tiered.iter().any(|t| t == f) {
            let len = std::fs::metadata(&p)?.len();
            let file = std::fs::OpenOptions::new().write(true).open(&p)?;
            std::os::unix::fs::FileExt::write_all_at(&file, &vec![0u8; (len - 32) as usize], 32)?;
            torn += 1;
        }
    }
    assert_eq!(torn, tiered.len());
    let store = Store::open(data.path(), options(bucket.path(), u64::MAX))?;
    assert_eq!(read_to_tail(&store, &s, Some(3000))?.0, expect);
    let report = store.check(&mut |_| {})?;
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);
    Ok(())
}

#[test]
fn retention_and_delete_remove_objects() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let store = Store::open(data.path(), options(bucket.path(), 0))?;
    let (s, other) = (name("tier/ret"), name("tier/del"));
    store.create(&s, typed("text/plain"))?;
    store.create(&other, typed("text/plain"))?;
    fill(&store, &s, 300)?;
    let keep = fill(&store, &other, 300)?;
    store.sync_tier()?;
    let before = objects(bucket.path());
    let dirs_of = |objs: &[String]| -> std::collections::BTreeSet<String> {
        objs.iter()
            .filter_map(|o| o.split('/').next().map(str::to_owned))
            .collect()
    };
    assert_eq!(dirs_of(&before).len(), 2);
    // A snapshot, then retention up to it: segments wholly before it go from the tier.
    let tail = store.head(&s, &Guard::NONE)?.tail;
    let cut = store
        .read(
            &s,
            &ReadRequest::from(ReadFrom::Start)
                .max_bytes(tail.bytes / 2)
                .whole_messages(),
        )?
        .next;
    store.publish_snapshot(&s, PublishSnapshot::new(cut, &b"state"[..]))?;
    store.set_retention(&s, &RetentionRequest::to(cut))?;
    store.sync_tier()?;
    let after = objects(bucket.path());
    assert!(
        after
            .iter()
            .any(|o| o.ends_with(&format!("snap-{cut}.blob"))),
        "{after:?}"
    );
    let logs = |objs: &[String]| objs.iter().filter(|o| ext(o, "log")).count();
    assert!(logs(&after) < logs(&before), "retention removed objects");
    assert!(read_to_tail(&store, &s, None).is_ok());
    // Delete: every object of that stream goes, the other's stay.
    store.delete(&s, &Guard::NONE)?;
    store.sync_tier()?;
    let left = objects(bucket.path());
    assert_eq!(dirs_of(&left).len(), 1, "{left:?}");
    assert_eq!(read_to_tail(&store, &other, None)?.0, keep);
    Ok(())
}

#[test]
fn a_fork_reads_its_sources_cold_segments() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let store = Store::open(data.path(), options(bucket.path(), 0))?;
    let (src, fork) = (name("tier/src"), name("tier/fork"));
    store.create(&src, typed("text/plain"))?;
    let inherited = fill(&store, &src, 300)?;
    store.create(&fork, typed("text/plain").fork(ForkFrom::tail(src.clone())))?;
    let own = fill(&store, &fork, 100)?;
    store.sync_tier()?;
    assert!(store.stats().tier_evictions > 0);
    let mut expect = inherited.clone();
    expect.extend_from_slice(&own);
    assert_eq!(read_to_tail(&store, &fork, Some(2500))?.0, expect);
    // The source deleted (kept for its fork), the store reopened: the fork still reads it.
    store.delete(&src, &Guard::NONE)?;
    drop(store);
    let store = Store::open(data.path(), options(bucket.path(), 0))?;
    assert_eq!(read_to_tail(&store, &fork, None)?.0, expect);
    Ok(())
}

#[test]
fn a_damaged_manifest_holds_up_only_its_own_stream() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let store = Store::open(data.path(), options(bucket.path(), u64::MAX))?;
    let (a, b) = (name("tier/a"), name("tier/b"));
    store.create(&a, typed("text/plain"))?;
    store.create(&b, typed("text/plain"))?;
    fill(&store, &a, 100)?;
    fill(&store, &b, 100)?;
    store.sync_tier()?;
    // Damage a's manifest (its directory is the one whose sidecar names it).
    let count = |objs: &[String], key: &str| objs.iter().filter(|o| o.starts_with(key)).count();
    let before = objects(bucket.path());
    let b_more = fill(&store, &b, 300)?;
    let mut damaged = 0;
    for p in crate::util::files_under(data.path())? {
        if p.file_name().is_some_and(|f| f == "tier") {
            let dir = p.parent().ok_or("no parent")?;
            let key = dir
                .file_name()
                .and_then(|k| k.to_str())
                .ok_or("key")?
                .to_owned();
            let mut sidecars = std::fs::read(dir.join("meta.0")).unwrap_or_default();
            sidecars.extend(std::fs::read(dir.join("meta.1")).unwrap_or_default());
            if sidecars.windows(6).any(|w| w == b"tier/a") {
                std::fs::write(&p, b"not a manifest")?;
                damaged += 1;
                assert!(count(&before, &key) > 0);
            }
        }
    }
    assert_eq!(damaged, 1);
    assert!(matches!(
        store.sync_tier(),
        Err(Error::TierUnavailable { .. })
    ));
    let after = objects(bucket.path());
    assert!(
        after.len() > before.len(),
        "b's new segments were uploaded all the same"
    );
    assert!(read_to_tail(&store, &b, None)?.0.ends_with(&b_more));
    Ok(())
}

#[test]
fn json_streams_read_whole_messages_across_tiers() -> R {
    let (data, bucket) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let store = Store::open(data.path(), options(bucket.path(), 0))?;
    let s = name("tier/json");
    store.create(&s, CreateOptions::json())?;
    let mut msgs = Vec::new();
    for i in 0..400 {
        let m = format!(r#"{{"n":{i},"pad":"{}"}}"#, "z".repeat(60 + i % 11));
        store.append(&s, AppendRequest::new(format!("[{m}]")))?;
        msgs.push(m);
    }
    store.sync_tier()?;
    assert!(store.stats().tier_evictions > 0);
    let (got, _) = read_to_tail(&store, &s, Some(1500))?;
    assert_eq!(String::from_utf8(got)?, msgs.join(","));
    // One read of everything: a JSON array of every message, across cold and local segments.
    let tail = store.head(&s, &Guard::NONE)?.tail;
    let all = store.read(
        &s,
        &ReadRequest::from(ReadFrom::Start).max_bytes(tail.bytes),
    )?;
    assert_eq!(
        String::from_utf8(all.to_vec())?,
        format!("[{}]", msgs.join(","))
    );
    Ok(())
}
