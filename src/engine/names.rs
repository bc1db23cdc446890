//! The name index: every stream name in the store, sorted in memory, so listing by prefix reads
//! only the sidecars of the page it returns, never every stream's (DESIGN.md 2.6).
//!
//! The file `NAMES` is derived and disposable: the journal and the sidecars are the truth. It
//! is a log of add and remove frames, appended (without a sync of its own) by the committer as
//! it applies Create records and completed deletes, and by recovery as it replays them. The
//! checkpoint's first `syncfs` (step 6b) makes every frame appended before the journal rotation
//! durable before the journal that holds the same creates and deletes is dropped, so after a
//! crash a frame lost from the file's tail is replayed from the journal. Frames of a create that
//! never became durable may remain: the index is a superset, and listing skips names whose
//! stream is missing. A missing or unreadable file is rebuilt at open from the sidecars.
//!
//! Layout (little-endian; the byte table is DESIGN.md 2.6):
//!
//! ```text
//! 0..4   magic "BRKN"         4..8  version (u32) = 1      8..16  reserved, 0
//! 16..   frames: len u32 | crc32(payload) u32 | payload = op u8 (1 add, 2 remove), name bytes
//! ```

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::Result;
use crate::fs;
use crate::sidecar;

/// The first bytes of `NAMES`.
const MAGIC: &[u8; 4] = b"BRKN";
/// The file format's version.
const VERSION: u32 = 1;
/// Header bytes before the first frame.
const HEADER_LEN: usize = 16;
/// A frame adding a name.
const ADD: u8 = 1;
/// A frame removing a name.
const REMOVE: u8 = 2;

/// The name index (see the module docs). Its lock is a leaf: taken under a shard's `writer` (by
/// the committer) and never while waiting for anything else.
pub(crate) struct Names {
    path: PathBuf,
    inner: Mutex<Inner>,
}

/// The index's state under its lock.
struct Inner {
    /// Every indexed name.
    set: BTreeSet<String>,
    /// `NAMES`, open for appending.
    file: File,
    /// Frames in the file (for compaction).
    frames: u64,
}

impl Names {
    /// Loads `NAMES` in `root`, cutting a torn tail off, or rebuilds it from every sidecar when
    /// it is missing or not a names file. Runs at open, before the journal replay.
    pub(crate) fn open(root: &Path) -> Result<Names> {
        let path = root.join("NAMES");
        let loaded = match std::fs::read(&path) {
            Ok(buf) => parse(&buf),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let (set, frames) = if let Some((set, frames, valid)) = loaded {
            let f = OpenOptions::new().write(true).open(&path)?;
            if f.metadata()?.len() != valid as u64 {
                fs::set_len(&f, &path, valid as u64)?;
            }
            (set, frames)
        } else {
            let set = scan_sidecars(root)?;
            write_compact(&path, &set)?;
            tracing::info!(
                streams = set.len(),
                "rebuilt the name index from the sidecars"
            );
            let frames = set.len() as u64;
            (set, frames)
        };
        let file = OpenOptions::new().append(true).open(&path)?;
        Ok(Names {
            path,
            inner: Mutex::new(Inner { set, file, frames }),
        })
    }

    /// Indexes `name` (nothing is written if it already is).
    pub(crate) fn add(&self, name: &str) -> Result<()> {
        let mut g = self.inner.lock();
        if g.set.contains(name) {
            return Ok(());
        }
        g.file.write_all(&frame(ADD, name))?;
        g.frames += 1;
        g.set.insert(name.to_owned());
        Ok(())
    }

    /// Drops `name` from the index (nothing is written if it is not there).
    pub(crate) fn remove(&self, name: &str) -> Result<()> {
        let mut g = self.inner.lock();
        if !g.set.remove(name) {
            return Ok(());
        }
        g.file.write_all(&frame(REMOVE, name))?;
        g.frames += 1;
        Ok(())
    }

    /// Up to `n` indexed names starting with `prefix`, after `after` (exclusive), in order.
    pub(crate) fn page(&self, prefix: &str, after: Option<&str>, n: usize) -> Vec<String> {
        use std::ops::Bound;
        let g = self.inner.lock();
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        g.set
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|k| k.starts_with(prefix))
            .take(n)
            .cloned()
            .collect()
    }

    /// Rewrites the file with one add frame per name when removes and repeats have made it more
    /// than twice that (plus 1024 frames): temporary file, sync, rename, directory sync.
    pub(crate) fn compact_if_needed(&self) -> Result<()> {
        let mut g = self.inner.lock();
        if g.frames <= 2 * g.set.len() as u64 + 1024 {
            return Ok(());
        }
        write_compact(&self.path, &g.set)?;
        g.file = OpenOptions::new().append(true).open(&self.path)?;
        g.frames = g.set.len() as u64;
        Ok(())
    }
}

/// One frame: `len`, `crc32(payload)`, payload (`op` then the name).
fn frame(op: u8, name: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(1 + name.len());
    payload.push(op);
    payload.extend_from_slice(name.as_bytes());
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The names a file holds, its frame count and the length of its valid prefix; `None` when the
/// header is not a version-1 names header. Frames end at the first that is cut short, fails its
/// CRC or does not decode (a torn tail).
fn parse(buf: &[u8]) -> Option<(BTreeSet<String>, u64, usize)> {
    let header = buf.get(..HEADER_LEN)?;
    if &header[..4] != MAGIC || header[4..8] != VERSION.to_le_bytes() {
        return None;
    }
    let mut set = BTreeSet::new();
    let (mut at, mut frames) = (HEADER_LEN, 0u64);
    while let Some(head) = buf.get(at..at + 8) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let Some(payload) = buf.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let (Some(op), Ok(name)) = (payload.first(), std::str::from_utf8(&payload[1.min(len)..]))
        else {
            break;
        };
        match *op {
            ADD => {
                set.insert(name.to_owned());
            }
            REMOVE => {
                set.remove(name);
            }
            _ => break,
        }
        frames += 1;
        at += 8 + len;
    }
    Some((set, frames, at))
}

/// Every name with a sidecar under `root/streams` (soft-deleted ones included: their streams
/// exist; listing filters them).
fn scan_sidecars(root: &Path) -> Result<BTreeSet<String>> {
    let mut set = BTreeSet::new();
    let streams = root.join("streams");
    let Ok(tops) = std::fs::read_dir(&streams) else {
        return Ok(set);
    };
    for top in tops.flatten() {
        for dir in std::fs::read_dir(top.path())?.flatten() {
            if let Some(sc) = sidecar::load(&dir.path())? {
                set.insert(sc.state.config.name);
            }
        }
    }
    Ok(set)
}

/// Writes `set` as a fresh names file at `path`, durably: a temporary file, `fsync`, rename,
/// directory sync.
fn write_compact(path: &Path, set: &BTreeSet<String>) -> Result<()> {
    let mut buf = Vec::with_capacity(HEADER_LEN + set.len() * 40);
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&VERSION.to_le_bytes());
    buf.extend_from_slice(&[0; 8]);
    for name in set {
        buf.extend_from_slice(&frame(ADD, name));
    }
    let tmp = path.with_extension("tmp");
    let mut f = fs::create(&tmp)?;
    f.write_all(&buf)?;
    fs::sync_all(&f, &tmp)?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        fs::sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_removes_survive_a_reload_and_a_torn_tail_is_cut() -> Result<()> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(&dir.path().join("streams"))?;
        let names = Names::open(dir.path())?;
        for n in ["a/1", "a/2", "b/1", "a/3"] {
            names.add(n)?;
        }
        names.remove("a/2")?;
        drop(names);
        let path = dir.path().join("NAMES");
        let len = std::fs::metadata(&path)?.len();
        // A torn frame at the end: cut off on the next open.
        OpenOptions::new()
            .append(true)
            .open(&path)?
            .write_all(&[9, 0, 0, 0, 1, 2])?;
        let names = Names::open(dir.path())?;
        assert_eq!(std::fs::metadata(&path)?.len(), len);
        assert_eq!(names.page("a/", None, 10), vec!["a/1", "a/3"]);
        assert_eq!(names.page("a/", Some("a/1"), 10), vec!["a/3"]);
        assert_eq!(names.page("", None, 2), vec!["a/1", "a/3"]);
        assert_eq!(names.page("c", None, 2), Vec::<String>::new());
        Ok(())
    }

    #[test]
    fn a_damaged_header_is_rebuilt_from_the_sidecars() -> Result<()> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(&dir.path().join("streams"))?;
        std::fs::write(dir.path().join("NAMES"), b"garbage garbage!")?;
        let names = Names::open(dir.path())?;
        assert!(names.page("", None, 10).is_empty());
        names.add("x")?;
        drop(names);
        assert_eq!(Names::open(dir.path())?.page("", None, 10), vec!["x"]);
        Ok(())
    }
}
