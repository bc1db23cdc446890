//! Recovery (DESIGN.md, "Recovery"): the store manifest, restoring the trash of deletes that
//! never became durable, and replaying each shard's journal into the registry with the same
//! `apply` the write path uses. The checkpoint that follows (`Engine::open`) makes the replayed
//! state durable in sidecars, so each journal is replayed at most once.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::{self, Record};
use crate::options::Options;

use super::apply::{apply, discard};
use super::names::Names;
use super::stream::{Stream, Visible};

/// The first 8 bytes of `STORE`; a shard count (`u32`) follows.
const STORE_MAGIC: &[u8; 8] = b"BROOK\0\0\x01";

/// Reads or writes the store manifest (`STORE`): magic and the journal shard count.
pub(super) fn store_manifest(root: &Path, shards: usize) -> Result<usize> {
    let path = root.join("STORE");
    match std::fs::read(&path) {
        Ok(b) => {
            if b.len() != 12 || &b[..8] != STORE_MAGIC {
                return Err(Error::corrupt(&path, "not a brook store manifest"));
            }
            let n = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
            if !(1..=64).contains(&n) {
                return Err(Error::corrupt(&path, "bad shard count"));
            }
            // The journal directories, made before the manifest, say the count again: a damaged
            // count would hash streams to other shards, whose LSNs their sidecars do not know.
            let mut dirs: Vec<usize> = Vec::new();
            for e in std::fs::read_dir(root.join("journal"))? {
                let name = e?.file_name();
                if let Some(id) = name
                    .to_str()
                    .filter(|s| s.len() == 2)
                    .and_then(|s| s.parse().ok())
                {
                    dirs.push(id);
                }
            }
            dirs.sort_unstable();
            if dirs != (0..n).collect::<Vec<_>>() {
                return Err(Error::corrupt(
                    &path,
                    "the shard count disagrees with the journal directories",
                ));
            }
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Journal directories first: the manifest's rename makes the store's layout durable.
            std::fs::create_dir_all(root.join("journal"))?;
            for id in 0..shards {
                std::fs::create_dir_all(root.join("journal").join(format!("{id:02}")))?;
            }
            fs::sync_dir(&root.join("journal"))?;
            let mut b = STORE_MAGIC.to_vec();
            b.extend_from_slice(&(shards as u32).to_le_bytes());
            let tmp = root.join("STORE.tmp");
            let mut f = File::create(&tmp)?;
            f.write_all(&b)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            fs::sync_dir(root)?;
            Ok(shards)
        }
        Err(e) => Err(e.into()),
    }
}

/// journal replay that follows deletes them again if their delete record is durable.
pub(super) fn restore_trash(root: &Path) -> Result<()> {
    for e in std::fs::read_dir(root.join("trash"))?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if Path::new(name).extension().is_some_and(|x| x == "gone") {
            // Its delete was durable and it was being emptied (see `discard`): finish.
            std::fs::remove_dir_all(e.path())?;
            continue;
        }
        let Some((key, _inc)) = name.split_once('-') else {
            std::fs::remove_dir_all(e.path())?;
            continue;
        };
        if key.len() < 2 {
            std::fs::remove_dir_all(e.path())?;
            continue;
        }
        let dest = root.join("streams").join(&key[..2]).join(key);
        if dest.exists() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::create_dir_all(root.join("streams").join(&key[..2]))?;
            std::fs::rename(e.path(), &dest)?;
        }
    }
    Ok(())
}

/// What replaying the journals found, for the recovery log line.
#[derive(Default)]
pub(super) struct Replayed {
    /// Journal bytes scanned (valid frames only).
    pub(super) bytes: u64,
    /// Valid records scanned, applied or skipped.
    pub(super) records: u64,
    /// The streams a replayed record was applied to.
    pub(super) streams: HashSet<String>,
}

/// Replays one shard's journal (directory `dir`) into `registry`; returns the LSN after its
/// last valid record.
///
/// Files are scanned in LSN order. Only the newest may end in a torn or corrupt frame: that
/// tail is cut off (it was never acknowledged); a bad frame in an older file is `Corrupt` (it
/// was synced before rotation). A record is applied to the stream of its incarnation, loaded
/// from its sidecar on first mention (or created from a Create record); records of other
/// incarnations are skipped, and so are records at or below a stream's sidecar LSN (inside
/// `apply`). Each stream's staged state and view are set to the replayed state.
pub(super) fn replay_shard(
    root: &Path,
    options: &Options,
    id: usize,
    dir: &Path,
    registry: &mut HashMap<String, Arc<Stream>>,
    names: &Names,
    replayed: &mut Replayed,
) -> Result<u64> {
    let files = journal::list_files(dir)?;
    let mut end = 0;
    let count = files.len();
    for (i, (_, path)) in files.iter().enumerate() {
        let scanned = journal::scan(path, id as u32)?;
        if scanned.torn && i + 1 < count {
            return Err(Error::corrupt(
                path,
                "corrupt record in a journal file that is not the newest",
            ));
        }
        if scanned.torn {
            // Cut the torn tail off now, so a crash during this recovery cannot leave it in a
            // journal file that is no longer the newest.
            if std::fs::metadata(path)?.len() < journal::HEADER_LEN {
                // Its header never became durable: it holds nothing.
                std::fs::remove_file(path)?;
                fs::sync_dir(dir)?;
            } else {
                let f = OpenOptions::new().write(true).open(path)?;
                f.set_len(journal::HEADER_LEN + (scanned.end_lsn - scanned.base_lsn))?;
                f.sync_all()?;
            }
        }
        if i == 0 || scanned.base_lsn >= end {
            end = end.max(scanned.base_lsn);
        }
        replayed.bytes += scanned.end_lsn.saturating_sub(scanned.base_lsn);
        for (lsn, record) in scanned.records {
            end = lsn;
            replayed.records += 1;
            let name = record.name().to_owned();
            let target = replay_target(root, options, id, registry, lsn, &record)?;
            // A create is indexed again (a no-op when its frame survived), so a frame lost
            // from the index's unsynced tail comes back with the record.
            if matches!(record, Record::Create { .. }) && registry.contains_key(&name) {
                names.add(&name)?;
            }
            let Some(stream) = target else {
                continue;
            };
            if stream.incarnation.as_str() != record.incarnation() {
                continue;
            }
            let mut after = Vec::new();
            apply(root, options, &stream, lsn, &record, &mut after)?;
            for p in after {
                discard(&p);
            }
            let d = stream.data.lock();
            let deleted = d.deleted;
            let state = d.state.clone();
            drop(d);
            {
                let mut core = stream.core.lock();
                core.state = state.clone();
                core.last_lsn = lsn;
                core.gone = deleted;
            }
            *stream.visible.lock() = Visible::of(&state, deleted);
            if deleted {
                registry.remove(&name);
                names.remove(&name)?;
            }
            replayed.streams.insert(name);
        }
        end = end.max(scanned.end_lsn);
    }
    Ok(end)
}

/// The stream a replayed `record` at `lsn` applies to, registering it on first mention; `None`
/// when the record has nothing to apply to.
///
/// A Create makes its stream unless that incarnation is already registered at or past `lsn`
/// (then `None`), or its sidecar shows the create checkpointed (then the stream is loaded from
/// it, and the record itself is not applied: `None`). Any other record applies to the
/// registered stream, else to the stream loaded from its sidecar if that is the record's
/// incarnation (`None` if there is no such sidecar: the stream was deleted since).
fn replay_target(
    root: &Path,
    options: &Options,
    id: usize,
    registry: &mut HashMap<String, Arc<Stream>>,
    lsn: u64,
    record: &Record,
) -> Result<Option<Arc<Stream>>> {
    let name = record.name();
    let sdir = fs::stream_dir(root, name);
    if let Record::Create { state, .. } = record {
        let registered = registry.get(name).is_some_and(|s| {
            s.incarnation.as_str() == state.config.incarnation && s.data.lock().applied_lsn >= lsn
        });
        if registered {
            return Ok(None);
        }
        // A sidecar of this very incarnation at or past this LSN means the create is
        // checkpointed.
        let checkpointed = Stream::load(sdir.clone(), id, options.segment_bytes, |sc| {
            Ok(sc.state.config.incarnation == state.config.incarnation && sc.applied_lsn >= lsn)
        })?;
        if let Some(s) = checkpointed {
            registry.insert(name.to_owned(), s);
            return Ok(None);
        }
        let s = Stream::new((**state).clone(), sdir, id, None, 0, 0, true);
        registry.insert(name.to_owned(), s.clone());
        return Ok(Some(s));
    }
    if let Some(s) = registry.get(name) {
        return Ok(Some(s.clone()));
    }
    let loaded = Stream::load(sdir, id, options.segment_bytes, |sc| {
        Ok(sc.state.config.incarnation == record.incarnation())
    })?;
    if let Some(s) = &loaded {
        registry.insert(name.to_owned(), s.clone());
    }
    Ok(loaded)
}
