//! Recovery.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::{self, Record};
use crate::options::Options;
use crate::segment::SegmentSet;
use crate::sidecar;

use super::apply::{apply, discard};
use super::stream::{Stream, Visible};

pub(super) const STORE_MAGIC: &[u8; 8] = b"BROOK\0\0\x01";

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
        if name.ends_with(".gone") {
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

/// Replays one shard's journal into the registry; returns the LSN after its last valid record.
pub(super) fn replay_shard(
    root: &Path,
    options: &Options,
    id: usize,
    dir: &Path,
    registry: &mut HashMap<String, Arc<Stream>>,
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
        for (lsn, record) in scanned.records {
            end = lsn;
            let name = record.name().to_owned();
            let stream = match (&record, registry.get(&name)) {
                (Record::Create { state, .. }, existing) => {
                    let same = existing.is_some_and(|s| {
                        s.incarnation.as_str() == state.config.incarnation
                            && s.data.lock().applied_lsn >= lsn
                    });
                    if same {
                        continue;
                    }
                    let sdir = fs::stream_dir(root, &name);
                    // A sidecar of this very incarnation at or past this LSN means the create is checkpointed.
                    if let Some(sc) = sidecar::load(&sdir)?
                        && sc.state.config.incarnation == state.config.incarnation
                        && sc.applied_lsn >= lsn
                    {
                        let segs = SegmentSet::open(
                            &sdir,
                            sc.state.base,
                            sc.state.tail,
                            options.segment_bytes,
                        )?;
                        let s = Stream::new(
                            sc.state,
                            sdir,
                            id,
                            Some(segs),
                            sc.applied_lsn,
                            sc.generation,
                            true,
                        );
                        registry.insert(name.clone(), s);
                        continue;
                    }
                    let s = Stream::new((**state).clone(), sdir, id, None, 0, 0, true);
                    registry.insert(name.clone(), s.clone());
                    s
                }
                (_, Some(s)) => s.clone(),
                (_, None) => {
                    let sdir = fs::stream_dir(root, &name);
                    let Some(sc) = sidecar::load(&sdir)? else {
                        continue;
                    };
                    if sc.state.config.incarnation != record.incarnation() {
                        continue;
                    }
                    let segs = SegmentSet::open(
                        &sdir,
                        sc.state.base,
                        sc.state.tail,
                        options.segment_bytes,
                    )?;
                    let s = Stream::new(
                        sc.state,
                        sdir,
                        id,
                        Some(segs),
                        sc.applied_lsn,
                        sc.generation,
                        true,
                    );
                    registry.insert(name.clone(), s.clone());
                    s
                }
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
            }
        }
        end = end.max(scanned.end_lsn);
    }
    // Streams replayed here must be checkpointed; mark them by leaving checkpointed_lsn behind.
    Ok(end)
}
