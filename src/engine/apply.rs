//! Applying a journal record to a stream's files and applied state (write-path step 3, and
//! recovery's replay: the same function, so a checkpoint stores exactly what replay rebuilds),
//! and removing the files a durable record made obsolete.

use std::path::{Path, PathBuf};

use crate::engine::journal::Record;
use crate::error::{Error, Result};
use crate::fs;
use crate::name::Offset;
use crate::options::Options;
use crate::segment::SegmentSet;
use crate::state::AppendRecord;

use super::stream::Stream;

/// Applies one record at `lsn` to a stream's files and applied state (under its `data` lock).
/// Paths to remove once the record is durable are pushed to `after`.
///
/// Idempotent: a record at or below the stream's applied LSN is skipped (replay after a
/// checkpoint), except a Create for a stream with no segments yet. Deletes move the directory
/// to the trash now; it is emptied only once the delete is durable (see [`discard_all`]).
///
/// A placed append (`journal::Placed`) applied by the writer leaves its bytes for
/// `SegmentSet::write_placed`; replayed (`replaying`: recovery applies it), its bytes are taken
/// from the segment log (`SegmentSet::adopt`). Returns false, applying nothing, when they are
/// not there: the stream's replay ends before this record.
pub(super) fn apply(
    root: &Path,
    options: &Options,
    stream: &Stream,
    (lsn, record): (u64, &Record),
    replaying: bool,
    after: &mut Vec<PathBuf>,
) -> Result<bool> {
    let mut d = stream.data.lock();
    if lsn <= d.applied_lsn && !matches!(record, Record::Create { .. }) {
        return Ok(true);
    }
    if !matches!(record, Record::Append { .. }) {
        // A change of configuration (create, delete, snapshot, retention, forks): the next
        // checkpoint writes the stream's sidecar, not an image in its checkpoint file (2.8).
        d.sidecar_due = true;
    }
    match record {
        Record::Create { state, initial } => {
            if d.segs.is_some() && lsn <= d.applied_lsn {
                return Ok(true);
            }
            // Replay may find the directory already there, holding this incarnation's files
            // from before the crash (an earlier incarnation's directory went to the trash with
            // its delete, which precedes this create in the same journal). Its segments are
            // rebuilt from here: their logs from this create's base on are kept, for the bytes
            // of placed appends that follow (any other log would be opened as this stream's);
            // its snapshot blobs were made durable before their records and stay. The writer
            // may find one too, left by a create whose record a power loss took: it keeps none
            // of its segment files.
            fs::no_symlinks(&stream.dir)?;
            if stream.dir.exists() {
                for e in std::fs::read_dir(&stream.dir)?.flatten() {
                    let name = e.file_name();
                    let name = name.to_str().unwrap_or("");
                    let own_log = replaying
                        && crate::segment::parse_log_name(name)
                            .is_some_and(|b| b >= state.base.bytes);
                    let keep = own_log
                        || parse_snapshot_file(name).is_some()
                        || name == crate::tier::manifest::FILE;
                    if keep {
                        continue;
                    }
                    if e.path().is_dir() {
                        fs::remove_dir_all(&e.path())?;
                    } else {
                        fs::remove_file(&e.path())?;
                    }
                }
            }
            fs::create_dir_all(&stream.dir)?;
            let mut segs = if replaying {
                SegmentSet::create_replaying(&stream.dir, state.base, options.segment_bytes)?
            } else {
                SegmentSet::create(&stream.dir, state.base, options.segment_bytes)?
            };
            segs.append(initial.start, &initial.body)?;
            d.state = (**state).clone();
            d.state.apply_append(initial);
            d.segs = Some(segs);
        }
        Record::Append { rec, placed, .. } => {
            let segs = d
                .segs
                .as_mut()
                .ok_or_else(|| Error::corrupt(&stream.dir, "append before create"))?;
            match placed {
                None => segs.append(rec.start, &rec.body)?,
                // The writer's record holds the bytes.
                Some(_) if !replaying => segs.append_placed(rec.start, &rec.body)?,
                // A replayed one does not: they are in the log, or the stream ends here.
                Some(p) => match segs.adopt(rec.start, &rec.body.ends, *p)? {
                    Some(body) => {
                        let whole = AppendRecord {
                            body,
                            ..rec.clone()
                        };
                        d.state.apply_append(&whole);
                        d.applied_lsn = lsn;
                        return Ok(true);
                    }
                    None => return Ok(false),
                },
            }
            d.state.apply_append(rec);
        }
        Record::Delete { soft: true, .. } => d.state.soft_deleted = true,
        Record::Delete { soft: false, .. } => {
            d.deleted = true;
            d.segs = None;
            // Move the directory aside now, so a later create of the same name starts clean; the
            // trash is emptied once the delete is durable (and restored by recovery if it is not).
            let trash =
                root.join("trash")
                    .join(format!("{}-{}", dir_key(&stream.dir), stream.incarnation));
            if stream.dir.exists() {
                fs::rename(&stream.dir, &trash)?;
            }
            after.push(trash);
        }
        Record::Snapshot { info, .. } => d.state.apply_snapshot(info),
        Record::Retention { to, .. } => {
            d.state.apply_retention(*to);
            // Forks read their inherited range from this stream's segments: while any fork
            // exists, retention moves the earliest offset but reclaims nothing.
            let reclaim = d.state.forks.is_empty();
            if let Some(segs) = d.segs.as_mut().filter(|_| reclaim) {
                after.extend(segs.retain(to.bytes));
            }
            after.extend(snapshots_behind(&stream.dir, &d.state.snapshots, *to));
        }
        Record::ForkRef { fork, add, .. } => {
            if *add {
                d.state.forks.insert(fork.clone());
            } else {
                d.state.forks.remove(fork);
            }
        }
    }
    d.applied_lsn = lsn;
    Ok(true)
}

/// The snapshot blobs in `dir` that a retention move to `to` made obsolete: those at an offset
/// before `to` that `kept` (the stream's snapshots once the move is applied) no longer lists.
///
/// Only offsets before `to` are candidates. A blob is made durable before its record is
/// queued, so while a retention record is applied (by the writer, or by replay after a crash)
/// the directory may already hold the blobs of snapshots whose records come after it. Those
/// are never before `to`: a snapshot is published only at or past the stream's earliest offset
/// and past every snapshot before it, and retention stops at or before the latest snapshot or
/// moves the earliest offset to `to` itself, so every later publication is at or past `to`.
pub(super) fn snapshots_behind(
    dir: &Path,
    kept: &[crate::types::SnapshotInfo],
    to: Offset,
) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(parse_snapshot_file)
                .is_some_and(|o| o.bytes < to.bytes && !kept.iter().any(|s| s.offset == o))
        })
        .map(|e| e.path())
        .collect()
}

/// The last component of a stream directory (its key), naming its trash directory.
pub(super) fn dir_key(dir: &Path) -> String {
    dir.file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("unknown")
        .to_owned()
}

/// The file name of the snapshot blob at `offset` (`snap-{offset}.blob`).
pub(super) fn snapshot_file(offset: Offset) -> String {
    format!("snap-{offset}.blob")
}

/// The offset of a snapshot blob's file name written by [`snapshot_file`], else `None`.
pub(super) fn parse_snapshot_file(name: &str) -> Option<Offset> {
    name.strip_prefix("snap-")?
        .strip_suffix(".blob")?
        .parse()
        .ok()
}

/// Before a deleted stream's trash directory `{root}/trash/{key}-{incarnation}` goes: in a
/// store with a cold tier (it has `{root}/tier-gone/`), leaves the marker
/// `tier-gone/{key}-{incarnation}`, durably, so the tier deletes the incarnation's objects
/// (all of them, by prefix), even after a crash.
fn leave_tier_marker(trash: &Path) {
    let (Some(name), Some(root)) = (
        trash.file_name().and_then(|n| n.to_str()),
        trash.parent().and_then(Path::parent),
    ) else {
        return;
    };
    let gone = root.join("tier-gone");
    let in_trash = trash.parent().and_then(Path::file_name) == Some("trash".as_ref());
    let discarding = Path::new(name).extension().is_some_and(|x| x == "gone");
    if !in_trash || discarding || !gone.is_dir() {
        return;
    }
    if fs::create(&gone.join(name)).is_ok() {
        let _ = fs::sync_dir(&gone);
    }
}

/// Removes the files and trash directories that durable records made obsolete. Every directory
/// is renamed to `*.gone` first, each parent
/// synced once, and only then are they emptied, so a crash part-way leaves only `*.gone`
/// directories (which recovery removes), never a partly emptied one it would restore.
///
/// Segment logs go first, and their removal is made durable before any other file goes: a
/// segment whose index is gone but whose log came back (unsynced unlinks are reordered by a
/// power loss) would be a damaged segment, while an index without its log is ignored.
pub(super) fn discard_all(paths: &[PathBuf]) {
    let mut gone = Vec::new();
    let mut parents: Vec<&Path> = Vec::new();
    let mut log_dirs: Vec<&Path> = Vec::new();
    for p in paths.iter().filter(|p| crate::segment::is_log(p)) {
        if fs::remove_file(p).is_ok()
            && let Some(d) = p.parent()
            && !log_dirs.contains(&d)
        {
            log_dirs.push(d);
        }
    }
    if log_dirs.iter().any(|d| fs::sync_dir(d).is_err()) {
        return;
    }
    for p in paths {
        if crate::segment::is_log(p) {
            continue;
        }
        if !p.is_dir() {
            let _ = fs::remove_file(p);
            continue;
        }
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        leave_tier_marker(p);
        let to = p.with_file_name(format!("{name}.gone"));
        if fs::rename(p, &to).is_ok() {
            if let Some(parent) = p.parent()
                && !parents.contains(&parent)
            {
                parents.push(parent);
            }
            gone.push(to);
        }
    }
    let synced: Vec<bool> = parents.iter().map(|d| fs::sync_dir(d).is_ok()).collect();
    for g in gone {
        let parent_synced = g
            .parent()
            .and_then(|p| parents.iter().position(|q| *q == p))
            .is_some_and(|i| synced[i]);
        if parent_synced {
            let _ = fs::remove_dir_all(&g);
        }
    }
}
