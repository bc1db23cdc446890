//! Recovery (DESIGN.md, "Recovery"): the store manifest, restoring the trash of deletes that
//! never became durable, and replaying each shard's journal into the registry with the same
//! `apply` the write path uses. The checkpoint that follows (`Engine::open`) makes the replayed
//! state durable in sidecars, so each journal is replayed at most once.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::engine::journal::{self, Record};
use crate::error::{Error, Result};
use crate::fs;
use crate::options::Options;
use crate::segment::SegmentSet;
use crate::sidecar;

use super::apply::{apply, dir_key, discard_all};
use super::journal::images::Images;
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
            fs::create_dir_all(&root.join("journal"))?;
            for id in 0..shards {
                fs::create_dir_all(&root.join("journal").join(format!("{id:02}")))?;
            }
            fs::sync_dir(&root.join("journal"))?;
            let mut b = STORE_MAGIC.to_vec();
            b.extend_from_slice(&(shards as u32).to_le_bytes());
            let tmp = root.join("STORE.tmp");
            let mut f = fs::create(&tmp)?;
            f.write_all(&b)?;
            fs::sync_all(&f, &tmp)?;
            fs::rename(&tmp, &path)?;
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
            // Its delete was durable and it was being emptied (see `discard_all`): finish.
            fs::remove_dir_all(&e.path())?;
            continue;
        }
        let Some((key, _inc)) = name.split_once('-') else {
            fs::remove_dir_all(&e.path())?;
            continue;
        };
        if key.len() < 2 {
            fs::remove_dir_all(&e.path())?;
            continue;
        }
        let dest = root.join("streams").join(&key[..2]).join(key);
        if dest.exists() {
            fs::remove_dir_all(&e.path())?;
        } else {
            fs::create_dir_all(&root.join("streams").join(&key[..2]))?;
            fs::rename(&e.path(), &dest)?;
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
    /// Files replayed records made obsolete (segments and snapshots behind retention), with
    /// their stream: removed once the recovery checkpoint's sidecars no longer refer to them
    /// (see [`reclaim`]).
    pub(super) reclaim: Vec<(Arc<Stream>, PathBuf)>,
    /// The streams replay closed before its end to stay within its bound (see [`spill`]), by
    /// name: what [`end_spilled`] needs to finish their replay.
    pub(super) spilled: HashMap<String, Spilled>,
}

/// A stream [`spill`] closed while replaying: its directory, incarnation and segment bases.
pub(super) struct Spilled {
    dir: PathBuf,
    incarnation: String,
    bases: Vec<u64>,
}

/// Replays one shard's journal (directory `dir`) into `registry`; returns the LSN after its
/// last valid record.
///
/// Files are scanned in LSN order. Only the newest may end in a torn or corrupt frame: that
/// tail is cut off (it was never synced). A torn older file is `Corrupt` (it was synced before
/// rotation), unless the file after it carries [`journal::FLAG_PREV_UNSYNCED`] (a Buffered
/// rotation, which does not sync the old file): then the journal ends at that tear and the
/// later files, never synced either, are removed. A record is applied to the stream of its incarnation, loaded
/// from its sidecar on first mention (or created from a Create record); records of other
/// incarnations are skipped, and so are records at or below a stream's sidecar LSN (inside
/// `apply`). Each stream's staged state and view are set to the replayed state.
///
/// An incarnation that the journal itself deletes for good is not rebuilt only to be removed:
/// its records are skipped but for that delete, which removes what of it is on disk (see
/// [`replay_doomed_delete`]). Churn (streams created and deleted between checkpoints) then
/// costs recovery no file operations, only the scan.
pub(super) fn replay_shard(
    root: &Path,
    options: &Options,
    images: &Images,
    dir: &Path,
    registry: &mut HashMap<String, Arc<Stream>>,
    names: &Names,
    replayed: &mut Replayed,
) -> Result<u64> {
    let id = images.shard() as usize;
    let mut files = journal::list_files(dir)?;
    let mut scans = Vec::with_capacity(files.len());
    for (_, path) in &files {
        scans.push(journal::scan(path, id as u32)?);
    }
    // Where one file ends and the next begins, two things can be found. A gap (the later
    // file says its predecessor was synced whole) is replayed across: a checkpoint's removals
    // leave none (`Shard::drop_journal_before` makes them durable one by one), and a power cut
    // that undid the rename of a prepared file holding nothing acknowledged (its name is
    // synced before its first batch is answered) while keeping the file started after it
    // leaves a gap whose earlier files are all still needed. A file that ends torn, or short
    // of where the next starts, is an unsynced Buffered rotation when the next file says so
    // (its tail and every later file were never synced, and the journal ends there), and
    // otherwise a damaged synced record.
    let unsynced_end = |t: usize| {
        let (this, next) = (&scans[t], &scans[t + 1]);
        (this.torn || this.end_lsn < next.base_lsn) && next.flags & journal::FLAG_PREV_UNSYNCED != 0
    };
    if let Some(t) = (0..scans.len().saturating_sub(1)).find(|&t| scans[t].torn || unsynced_end(t))
    {
        if !unsynced_end(t) {
            return Err(Error::corrupt(
                &files[t].1,
                "corrupt record in a journal file that is not the newest",
            ));
        }
        // The later files go first: were the torn one cut first, a crash now would leave a
        // clean end followed by records past a gap.
        for (_, path) in files.drain(t + 1..) {
            tracing::warn!(
                file = %path.display(),
                "dropping a journal file that follows an unsynced file torn by a power loss"
            );
            fs::remove_file(&path)?;
        }
        fs::sync_dir(dir)?;
        scans.truncate(t + 1);
    }
    let mut end = 0;
    let mut records = Vec::new();
    for (i, ((_, path), scanned)) in files.iter().zip(scans).enumerate() {
        if scanned.torn {
            // Cut the torn tail off now (it is the newest file), so a crash during this
            // recovery cannot leave it in a journal file that is no longer the newest.
            if scanned.headerless {
                // Its header never became durable: it holds nothing.
                fs::remove_file(path)?;
                fs::sync_dir(dir)?;
            } else {
                let f = OpenOptions::new().write(true).open(path)?;
                fs::set_len(
                    &f,
                    path,
                    journal::HEADER_LEN + (scanned.end_lsn - scanned.base_lsn),
                )?;
                fs::sync_all(&f, path)?;
            }
        } else if scanned.end_lsn > scanned.base_lsn {
            // Its batches may never have been synced (Buffered mode, or a crash between a
            // batch's write and its sync), and the file recovery starts next says that the file
            // before it was synced whole (no FLAG_PREV_UNSYNCED): make that true before it
            // exists, or a power cut during this open could leave this file short of the next
            // one's start or torn inside it.
            let f = File::open(path)?;
            fs::sync_data(&f, path)?;
        }
        if i == 0 || scanned.base_lsn >= end {
            end = end.max(scanned.base_lsn);
        }
        replayed.bytes += scanned.end_lsn.saturating_sub(scanned.base_lsn);
        if let Some(&(lsn, _)) = scanned.records.last() {
            end = end.max(lsn);
        }
        records.extend(scanned.records);
        end = end.max(scanned.end_lsn);
    }

    // The incarnations this journal deletes for good, and the last Create of each name.
    let mut doomed: HashSet<(&str, &str)> = HashSet::new();
    let mut last_create: HashMap<&str, usize> = HashMap::new();
    for (i, (_, r)) in records.iter().enumerate() {
        match r {
            Record::Delete { soft: false, .. } => {
                doomed.insert((r.name(), r.incarnation()));
            }
            Record::Create { .. } => {
                last_create.insert(r.name(), i);
            }
            _ => {}
        }
    }

    // What durable records made obsolete, removed together once the whole journal is replayed
    // (one directory sync for all of them, not one per delete).
    let mut obsolete = Vec::new();
    // Streams whose records could not be applied (a damaged stream directory), with the
    // records kept for them.
    let mut damaged: HashMap<&str, Vec<(u64, &Record)>> = HashMap::new();
    let lookahead = Lookahead {
        doomed: &doomed,
        last_create: &last_create,
    };
    // Incarnations whose replay ended at a placed append whose bytes were not in the log: their
    // later records are skipped (each stream keeps a prefix of its records).
    let mut ended: HashSet<(&str, &str)> = HashSet::new();
    for (i, (lsn, record)) in records.iter().enumerate() {
        let lsn = *lsn;
        replayed.records += 1;
        let name = record.name();
        if let Some(kept) = damaged.get_mut(name) {
            kept.push((lsn, record));
            continue;
        }
        if ended.contains(&(name, record.incarnation())) {
            continue;
        }
        let at = Position { i, lsn };
        let before = obsolete.len();
        match replay_one(
            root,
            options,
            images,
            registry,
            names,
            at,
            record,
            &lookahead,
            &mut obsolete,
        ) {
            Ok(false) => {
                tracing::warn!(
                    stream = name,
                    lsn,
                    "the stream ends before a journaled append whose bytes are not in its segment log (never acknowledged, or lost with the power in Buffered mode): its later records are dropped"
                );
                ended.insert((name, record.incarnation()));
            }
            Ok(true) => {
                replayed.streams.insert(name.to_owned());
                if registry.len() > replay_bound(options) {
                    spill(root, images, registry, &mut replayed.spilled)?;
                }
                // Files behind retention wait for the recovery checkpoint, with their stream.
                let mut i = before;
                while i < obsolete.len() {
                    if obsolete[i].is_dir() {
                        i += 1;
                    } else if let Some(s) = registry.get(name) {
                        replayed.reclaim.push((s.clone(), obsolete.swap_remove(i)));
                    } else {
                        i += 1;
                    }
                }
            }
            Err(e) if is_damage(&e) => {
                tracing::error!(
                    stream = name,
                    error = %e,
                    "stream damaged: its journal records are kept in quarantine/, and it answers CORRUPT until repaired"
                );
                registry.remove(name);
                damaged.insert(name, vec![(lsn, record)]);
            }
            Err(e) => return Err(e),
        }
    }
    for (name, kept) in &damaged {
        keep_records(root, id, name, kept)?;
    }
    discard_all(&obsolete);
    Ok(end)
}

/// The most streams replay keeps open: as many as the store keeps open when running
/// (`max_open_streams`), and no more than its stream files may hold descriptors
/// (`max_stream_files`, one per open segment log), so a journal naming more streams than that
/// replays in the descriptors and memory maps the running store is given (see [`spill`]).
fn replay_bound(options: &Options) -> usize {
    options
        .max_open_streams
        .min(options.max_stream_files)
        .max(16)
}

/// Makes the replayed state of every stream `registry` holds durable in its sidecar, as the
/// recovery checkpoint would (segments written and synced, then the sidecars, synced), and
/// closes them all. A later record of a closed stream loads it again from that sidecar, and
/// applies only if it is past the sidecar's LSN, as after any checkpoint; a crash before the
/// recovery checkpoint finds the same sidecars and the whole journal, which replays the same.
/// Streams of the shards replayed before are clean already and are only closed.
fn spill(
    root: &Path,
    images: &Images,
    registry: &mut HashMap<String, Arc<Stream>>,
    spilled: &mut HashMap<String, Spilled>,
) -> Result<()> {
    let dirty: Vec<Arc<Stream>> = registry
        .values()
        .filter(|s| {
            let d = s.data.lock();
            !d.deleted && d.applied_lsn > d.checkpointed_lsn
        })
        .cloned()
        .collect();
    for s in &dirty {
        if let Some(segs) = s.data.lock().segs.as_mut() {
            segs.flush()?;
        }
    }
    let syncer = File::open(root)?;
    fs::sync_fs(&syncer, root)?;
    let mut scratch = Vec::new();
    for s in &dirty {
        let mut d = s.data.lock();
        let generation = d.generation + 1;
        sidecar::write_with(&mut scratch, &s.dir, generation, d.applied_lsn, &d.state)?;
        d.generation = generation;
        d.checkpointed_lsn = d.applied_lsn;
    }
    fs::sync_fs(&syncer, root)?;
    for s in &dirty {
        images.superseded(s.name.as_str(), s.data.lock().applied_lsn);
    }
    tracing::debug!(
        written = dirty.len(),
        closed = registry.len(),
        "replay spilled its streams to their sidecars"
    );
    for (name, s) in registry.drain() {
        let d = s.data.lock();
        if let Some(segs) = d.segs.as_ref().filter(|_| !d.deleted) {
            let bases = segs.bases();
            spilled.insert(
                name,
                Spilled {
                    dir: s.dir.clone(),
                    incarnation: s.incarnation.as_str().to_owned(),
                    bases,
                },
            );
        }
    }
    Ok(())
}

/// Finishes the replay of the streams [`spill`] closed and replay did not open again
/// (`registry`, the streams open at its end, finish their own): what
/// [`SegmentSet::end_replay`] removes goes, once the recovery checkpoints made every
/// replayed state durable. A stream whose directory now holds another incarnation, or none,
/// is left alone.
pub(super) fn end_spilled(
    registry: &HashMap<String, Arc<Stream>>,
    spilled: HashMap<String, Spilled>,
) -> Result<()> {
    for (name, sp) in spilled {
        if registry.contains_key(&name) {
            continue;
        }
        match sidecar::load(&sp.dir)? {
            Some(sc) if sc.state.config.incarnation == sp.incarnation => {
                SegmentSet::end_replay_of(&sp.dir, &sp.bases)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Removes files behind retention whose removal waited for a checkpoint, except those of a
/// stream deleted since (its directory, now in the trash, goes with it: the path may already
/// name a file of a new incarnation).
pub(super) fn reclaim(files: Vec<(Arc<Stream>, PathBuf)>) {
    let live: Vec<PathBuf> = files
        .into_iter()
        .filter(|(s, _)| !s.data.lock().deleted)
        .map(|(_, p)| p)
        .collect();
    if !live.is_empty() {
        discard_all(&live);
    }
}

/// Whether a replay failure means the stream's own files are damaged (isolate the stream), not
/// that the store cannot work now (a full disk, no descriptors: the open fails and is retried).
fn is_damage(e: &Error) -> bool {
    match e {
        Error::Corrupt { .. } => true,
        Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData
        ),
        _ => false,
    }
}

/// What replay knows of the whole journal before it applies any record.
struct Lookahead<'a> {
    /// The incarnations the journal deletes for good.
    doomed: &'a HashSet<(&'a str, &'a str)>,
    /// The index of the last Create of each name.
    last_create: &'a HashMap<&'a str, usize>,
}

/// Where a record is in the replayed journal: its index among the records, and its LSN.
#[derive(Clone, Copy)]
struct Position {
    i: usize,
    lsn: u64,
}

/// Replays one record (see [`replay_shard`]): skipped, applied, or for a doomed incarnation's
/// final delete, [`replay_doomed_delete`]. False when it is a placed append whose bytes are
/// not in the log (see [`apply`]): nothing was applied, and the stream ends before it. An error
/// concerns this record's stream only, unless the caller decides otherwise.
#[expect(
    clippy::too_many_arguments,
    reason = "the replay's context, passed through"
)]
fn replay_one(
    root: &Path,
    options: &Options,
    images: &Images,
    registry: &mut HashMap<String, Arc<Stream>>,
    names: &Names,
    at: Position,
    record: &Record,
    ahead: &Lookahead<'_>,
    obsolete: &mut Vec<PathBuf>,
) -> Result<bool> {
    let (name, lsn) = (record.name(), at.lsn);
    if matches!(record, Record::Delete { soft: false, .. }) {
        images.deleted(name, lsn);
    }
    if ahead.doomed.contains(&(name, record.incarnation())) {
        if matches!(record, Record::Delete { soft: false, .. }) {
            let recreated = ahead.last_create.get(name).is_some_and(|&c| c > at.i);
            replay_doomed_delete(
                root, options, images, registry, lsn, record, recreated, obsolete,
            )?;
            // Not listed any more, unless another incarnation holds the name (a later Create of
            // the name lists it again).
            if !registry.contains_key(name) {
                names.remove(name)?;
            }
        }
        return Ok(true);
    }
    let target = replay_target(root, options, images, registry, lsn, record)?;
    // A create is indexed again (a no-op when its frame survived), so a frame lost from the
    // index's unsynced tail comes back with the record.
    if matches!(record, Record::Create { .. }) && registry.contains_key(name) {
        names.add(name)?;
    }
    let Some(stream) = target else {
        return Ok(true);
    };
    if stream.incarnation.as_str() != record.incarnation() {
        return Ok(true);
    }
    if !apply(root, options, &stream, (lsn, record), true, obsolete)? {
        return Ok(false);
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
        registry.remove(name);
        names.remove(name)?;
    }
    Ok(true)
}

/// Keeps the journal records of a stream that replay could not apply in
/// `quarantine/{shard:02}-{key}-{first lsn:020}.wal` (a journal file of just those records,
/// synced), so the checkpoint that follows recovery does not take them away with the old
/// journal.
fn keep_records(root: &Path, id: usize, name: &str, kept: &[(u64, &Record)]) -> Result<()> {
    let Some(&(first, _)) = kept.first() else {
        return Ok(());
    };
    let qdir = root.join("quarantine");
    fs::create_dir_all(&qdir)?;
    let key = dir_key(&fs::stream_dir(root, name));
    let path = qdir.join(format!("{id:02}-{key}-{first:020}.wal"));
    let mut buf = journal::file_header(id as u32, first, 0);
    for (_, r) in kept {
        r.encode_frame(&mut buf);
    }
    let mut f = fs::create(&path)?;
    f.write_all(&buf)?;
    fs::sync_all(&f, &path)?;
    fs::sync_dir(&qdir)?;
    fs::sync_dir(root)?;
    tracing::error!(
        stream = name,
        records = kept.len(),
        path = %path.display(),
        "journal records of a damaged stream kept"
    );
    Ok(())
}

/// Replays the delete that ends an incarnation whose earlier records were skipped: what of it
/// is on disk goes to `obsolete`. That is its directory when its sidecar names it (it was
/// checkpointed), or when the directory has no sidecar at all and no later Create of the name
/// in this journal will clear it (its files were written after the last checkpoint). A
/// directory with another incarnation's sidecar, or one a later Create rebuilds, is left alone.
#[expect(
    clippy::too_many_arguments,
    reason = "the replay's context, passed through"
)]
fn replay_doomed_delete(
    root: &Path,
    options: &Options,
    images: &Images,
    registry: &mut HashMap<String, Arc<Stream>>,
    lsn: u64,
    record: &Record,
    recreated: bool,
    obsolete: &mut Vec<PathBuf>,
) -> Result<()> {
    let name = record.name();
    if let Some(s) = registry.get(name).cloned() {
        // Registered by an earlier record of another incarnation: not this one's to remove.
        if s.incarnation.as_str() != record.incarnation() {
            return Ok(());
        }
    }
    let sdir = fs::stream_dir(root, name);
    fs::no_symlinks(&sdir)?;
    match sidecar::load(&sdir)? {
        Some(sc) if sc.state.config.incarnation == record.incarnation() => {
            if let Some(s) = Stream::load(sdir, images, options.segment_bytes, true, |_| Ok(true))?
            {
                apply(root, options, &s, (lsn, record), true, obsolete)?;
            }
            registry.remove(name);
        }
        Some(_) => {}
        None if sdir.exists() && !recreated => {
            let trash =
                root.join("trash")
                    .join(format!("{}-{}", dir_key(&sdir), record.incarnation()));
            fs::rename(&sdir, &trash)?;
            obsolete.push(trash);
        }
        None => {}
    }
    Ok(())
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
    images: &Images,
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
        let checkpointed = Stream::load(sdir.clone(), images, options.segment_bytes, true, |sc| {
            Ok(sc.state.config.incarnation == state.config.incarnation && sc.applied_lsn >= lsn)
        })?;
        if let Some(s) = checkpointed {
            registry.insert(name.to_owned(), s);
            return Ok(None);
        }
        let s = Stream::new(
            (**state).clone(),
            sdir,
            images.shard() as usize,
            None,
            0,
            0,
            true,
        );
        registry.insert(name.to_owned(), s.clone());
        return Ok(Some(s));
    }
    if let Some(s) = registry.get(name) {
        return Ok(Some(s.clone()));
    }
    let loaded = Stream::load(sdir, images, options.segment_bytes, true, |sc| {
        Ok(sc.state.config.incarnation == record.incarnation())
    })?;
    if let Some(s) = &loaded {
        registry.insert(name.to_owned(), s.clone());
    }
    Ok(loaded)
}
