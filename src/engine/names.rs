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
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

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
///
/// Opening does not wait for the set: the file is read and its frames checked (so a torn tail
/// is cut before anything is appended), and a thread builds the sorted set from those frames
/// while the store opens and serves. Adds and removes made meanwhile are written to the file
/// at once and applied to the set when it is built; only [`Names::page`] waits for it. So
/// startup does not grow with the number of streams (about 1 us per stream, off the path).
pub(crate) struct Names {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Signalled when the set is built.
    built: Condvar,
}

/// The index's state under its lock.
struct Inner {
    /// Every indexed name; `None` while the set is being built.
    set: Option<BTreeSet<String>>,
    /// Adds (`true`) and removes made while the set is being built, in order.
    pending: Vec<(bool, String)>,
    /// `NAMES`, open for appending.
    file: File,
    /// Frames in the file (for compaction).
    frames: u64,
}

impl Names {
    /// Loads `NAMES` in `root`, cutting a torn tail off, or rebuilds it from every sidecar when
    /// it is missing or not a names file. Runs at open, before the journal replay; a loaded
    /// file's set is built on a thread of its own (see the type's docs).
    pub(crate) fn open(root: &Path) -> Result<Arc<Names>> {
        let path = root.join("NAMES");
        let buf = match std::fs::read(&path) {
            Ok(buf) => Some(buf),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let checked = buf.as_deref().and_then(check);
        let (set, frames) = if let Some((frames, valid)) = checked {
            let f = OpenOptions::new().write(true).open(&path)?;
            if f.metadata()?.len() != valid as u64 {
                fs::set_len(&f, &path, valid as u64)?;
            }
            (None, frames)
        } else {
            let set = scan_sidecars(root)?;
            write_compact(&path, &set)?;
            tracing::info!(
                streams = set.len(),
                "rebuilt the name index from the sidecars"
            );
            let frames = set.len() as u64;
            (Some(set), frames)
        };
        let file = OpenOptions::new().append(true).open(&path)?;
        let names = Arc::new(Names {
            path,
            inner: Mutex::new(Inner {
                set,
                pending: Vec::new(),
                file,
                frames,
            }),
            built: Condvar::new(),
        });
        if let (Some(mut buf), Some((_, valid))) = (buf, checked) {
            buf.truncate(valid);
            let building = names.clone();
            std::thread::Builder::new()
                .name("brook-names".into())
                .spawn(move || building.build(&buf))?;
        }
        Ok(names)
    }

    /// Builds the set from a checked file's frames, applies what was added and removed
    /// meanwhile, and wakes whoever waits for it.
    fn build(&self, buf: &[u8]) {
        let mut set = BTreeSet::new();
        for (add, name) in frames(buf) {
            change(&mut set, add, name);
        }
        let mut g = self.inner.lock();
        for (add, name) in std::mem::take(&mut g.pending) {
            change(&mut set, add, &name);
        }
        g.set = Some(set);
        drop(g);
        self.built.notify_all();
    }

    /// Indexes `name` (nothing is written if it already is).
    pub(crate) fn add(&self, name: &str) -> Result<()> {
        let mut g = self.inner.lock();
        if g.set.as_ref().is_some_and(|set| set.contains(name)) {
            return Ok(());
        }
        g.file.write_all(&frame(ADD, name))?;
        g.frames += 1;
        match g.set.as_mut() {
            Some(set) => {
                set.insert(name.to_owned());
            }
            None => g.pending.push((true, name.to_owned())),
        }
        Ok(())
    }

    /// Drops `name` from the index (nothing is written if it is known not to be there).
    pub(crate) fn remove(&self, name: &str) -> Result<()> {
        let mut g = self.inner.lock();
        match g.set.as_mut() {
            Some(set) => {
                if !set.remove(name) {
                    return Ok(());
                }
            }
            None => g.pending.push((false, name.to_owned())),
        }
        g.file.write_all(&frame(REMOVE, name))?;
        g.frames += 1;
        Ok(())
    }

    /// Up to `n` indexed names starting with `prefix`, after `after` (exclusive), in order.
    /// Waits for the set if it is still being built.
    pub(crate) fn page(&self, prefix: &str, after: Option<&str>, n: usize) -> Vec<String> {
        use std::ops::Bound;
        let mut g = self.inner.lock();
        let set = loop {
            if let Some(set) = g.set.as_ref() {
                break set;
            }
            self.built.wait(&mut g);
        };
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        set.range::<str, _>((start, Bound::Unbounded))
            .take_while(|k| k.starts_with(prefix))
            .take(n)
            .cloned()
            .collect()
    }

    /// Rewrites the file with one add frame per name when removes and repeats have made it more
    /// than twice that (plus 1024 frames): temporary file, sync, rename, directory sync. While
    /// the set is being built this waits for the next call.
    pub(crate) fn compact_if_needed(&self) -> Result<()> {
        let mut g = self.inner.lock();
        let Some(set) = g.set.as_ref() else {
            return Ok(());
        };
        if g.frames <= 2 * set.len() as u64 + 1024 {
            return Ok(());
        }
        write_compact(&self.path, set)?;
        let len = set.len() as u64;
        g.file = OpenOptions::new().append(true).open(&self.path)?;
        g.frames = len;
        Ok(())
    }
}

/// Adds `name` to `set` (`add`) or removes it.
fn change(set: &mut BTreeSet<String>, add: bool, name: &str) {
    if add {
        set.insert(name.to_owned());
    } else {
        set.remove(name);
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

/// A names file's frame count and the length of its valid prefix; `None` when the header is
/// not a version-1 names header. Frames end at the first that is cut short, fails its CRC or
/// does not decode (a torn tail).
fn check(buf: &[u8]) -> Option<(u64, usize)> {
    let header = buf.get(..HEADER_LEN)?;
    if &header[..4] != MAGIC || header[4..8] != VERSION.to_le_bytes() {
        return None;
    }
    let (mut at, mut count) = (HEADER_LEN, 0u64);
    while let Some(head) = buf.get(at..at + 8) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let Some(payload) = buf.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc || decode(payload).is_none() {
            break;
        }
        count += 1;
        at += 8 + len;
    }
    Some((count, at))
}

/// The frames of a file [`check`] accepted, cut to its valid prefix: (add, name) in order.
fn frames(buf: &[u8]) -> impl Iterator<Item = (bool, &str)> {
    let mut at = HEADER_LEN;
    std::iter::from_fn(move || {
        let head = buf.get(at..at + 8)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let payload = buf.get(at + 8..at + 8 + len)?;
        at += 8 + len;
        decode(payload)
    })
}

/// A frame's payload: whether it adds, and the name; `None` if it does not decode.
fn decode(payload: &[u8]) -> Option<(bool, &str)> {
    let (&op, name) = payload.split_first()?;
    let name = std::str::from_utf8(name).ok()?;
    match op {
        ADD => Some((true, name)),
        REMOVE => Some((false, name)),
        _ => None,
    }
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
                set.insert(sc.state.config.name.clone());
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
    fn changes_made_while_the_set_is_built_are_kept() -> Result<()> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(&dir.path().join("streams"))?;
        let names = Names::open(dir.path())?;
        for i in 0..20_000 {
            names.add(&format!("n/{i:05}"))?;
        }
        drop(names);
        // Right after the open the set is most likely still being built: these go to
        // `pending` then, to the set otherwise, and must agree either way.
        let names = Names::open(dir.path())?;
        names.remove("n/00000")?;
        names.add("m/1")?;
        names.remove("m/1")?;
        names.add("m/2")?;
        names.add("n/00001")?;
        assert_eq!(names.page("m/", None, 10), vec!["m/2"]);
        assert_eq!(names.page("n/", None, 2), vec!["n/00001", "n/00002"]);
        drop(names);
        let names = Names::open(dir.path())?;
        assert_eq!(names.page("", None, 3), vec!["m/2", "n/00001", "n/00002"]);
        assert_eq!(names.page("n/", None, usize::MAX).len(), 19_999);
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
