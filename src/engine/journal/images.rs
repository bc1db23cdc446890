//! Checkpoint files (DESIGN.md 2.8): a checkpoint records the streams whose configuration did
//! not change in one file per shard, `{lsn:020}.ckpt` beside the journal, instead of a sidecar
//! per stream. [`Images`] knows, for every stream whose newest durable image is in such a file,
//! where it is, and which files still hold a newest image (the others are removed).
//!
//! An image is a sidecar's slot image (2.3), so it carries the stream's whole state and the
//! applied LSN it reflects. A stream's sidecar and its newest checkpoint-file image are compared
//! by that LSN: the higher one wins (a shard's LSNs only grow, and a stream lives in one shard),
//! and an image of another incarnation than the sidecar's never applies. The sidecar keeps its
//! generation either way, so its two slots alternate as before.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::codec::Dec;
use crate::error::{Error, Result};
use crate::fs;
use crate::sidecar::{self, Sidecar};

/// The first bytes of a checkpoint file.
const MAGIC: &[u8; 4] = b"BRKC";
/// The checkpoint file format version.
const VERSION: u32 = 1;
/// Magic, version, shard (`u32`), reserved (`u32`), the rotation LSN (`u64`).
pub(in crate::engine) const FILE_HEADER: usize = 24;
/// The name's suffix.
const SUFFIX: &str = ".ckpt";

/// Where a stream's newest image is.
#[derive(Clone, Copy, Debug)]
struct Loc {
    /// The applied LSN the image records.
    lsn: u64,
    /// The file (its rotation LSN).
    file: u64,
    offset: u64,
    len: u32,
}

/// A checkpoint file that still holds some stream's newest image.
struct CkptFile {
    file: Arc<File>,
    path: PathBuf,
    bytes: u64,
    /// How many of its images are the newest of their stream, and their bytes.
    live: u64,
    live_bytes: u64,
}

impl CkptFile {
    /// Bytes of images that are no stream's newest.
    fn dead(&self) -> u64 {
        self.bytes
            .saturating_sub(FILE_HEADER as u64)
            .saturating_sub(self.live_bytes)
    }

    fn lose(&mut self, l: &Loc) {
        self.live = self.live.saturating_sub(1);
        self.live_bytes = self.live_bytes.saturating_sub(u64::from(l.len));
    }

    fn gain(&mut self, l: &Loc) {
        self.live += 1;
        self.live_bytes += u64::from(l.len);
    }
}

#[derive(Default)]
struct Inner {
    files: BTreeMap<u64, CkptFile>,
    newest: HashMap<Box<str>, Loc>,
}

/// A shard's checkpoint files and the newest image of each stream in them.
pub(crate) struct Images {
    dir: PathBuf,
    shard: u32,
    /// Checkpoints write their streams' images here (`false`: sidecars only, as with a cold
    /// tier, whose thread reads a stream's state from its sidecar).
    pub(in crate::engine) enabled: bool,
    inner: Mutex<Inner>,
}

/// The images one checkpoint wrote to its file, for [`Images::commit`].
#[derive(Default)]
pub(in crate::engine) struct Written {
    /// The file's bytes (header and images), empty when it holds no image.
    pub(in crate::engine) buf: Vec<u8>,
    /// Each image's stream, applied LSN, offset and length.
    locs: Vec<(Box<str>, u64, u64, u32)>,
    /// The file folded into this one, whose newest images were copied here.
    folded: Option<u64>,
}

impl Written {
    /// Appends the image of `state` at `lsn` (of a stream whose sidecar is at `generation`).
    pub(in crate::engine) fn push(
        &mut self,
        shard: u32,
        rotation: u64,
        generation: u64,
        lsn: u64,
        state: &crate::state::StreamState,
    ) {
        if self.buf.is_empty() {
            self.buf = header(shard, rotation);
        }
        let offset = self.buf.len() as u64;
        let len = sidecar::append_image(&mut self.buf, generation, lsn, state);
        self.locs
            .push((state.config.name.as_str().into(), lsn, offset, len as u32));
    }

    /// How many images it holds.
    pub(in crate::engine) fn len(&self) -> usize {
        self.locs.len()
    }
}

fn header(shard: u32, rotation: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 * 1024);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&shard.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&rotation.to_le_bytes());
    b
}

/// The path of the checkpoint file of rotation `lsn` in `dir`.
fn file_path(dir: &Path, lsn: u64) -> PathBuf {
    dir.join(format!("{lsn:020}{SUFFIX}"))
}

/// The images of a checkpoint file's bytes, in order, each with its offset; stops at the first
/// that does not decode (a file a power cut tore before the checkpoint's `syncfs`: that
/// checkpoint's journal is still there).
fn images(buf: &[u8]) -> impl Iterator<Item = (u64, usize, Sidecar)> + '_ {
    let mut at = FILE_HEADER;
    std::iter::from_fn(move || {
        let rest = buf.get(at..)?;
        let len = sidecar::image_len(rest)?;
        let sc = sidecar::decode(&rest[..len])?;
        let offset = at as u64;
        at += len;
        Some((offset, len, sc))
    })
}

impl Images {
    /// Reads the checkpoint files of the shard journal directory `dir`, oldest first, and
    /// removes those that hold no stream's newest image. A file whose header is not a
    /// checkpoint file's of this shard is removed when its checkpoint did not finish (a journal
    /// file older than its rotation is left), and an error (`Corrupt`) otherwise.
    pub(in crate::engine) fn open(dir: &Path, shard: usize, enabled: bool) -> Result<Images> {
        let mut found: Vec<(u64, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let Some(lsn) = name
                .to_str()
                .and_then(|n| n.strip_suffix(SUFFIX))
                .filter(|n| n.len() == 20)
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            found.push((lsn, e.path()));
        }
        found.sort();
        // A checkpoint drops the journal before its rotation only after its file is durable
        // (step 6d): while a journal file older than the rotation is left, the checkpoint may
        // not have finished, and its file may be torn anywhere, the header included.
        let oldest_journal = super::list_files(dir)?.first().map(|(base, _)| *base);
        let mut inner = Inner::default();
        for (lsn, path) in found {
            let buf = std::fs::read(&path)?;
            let ok = buf.len() >= FILE_HEADER && {
                let mut d = Dec::new(&buf[..FILE_HEADER]);
                let ok = d.take(4) == Some(MAGIC.as_slice())
                    && d.u32() == Some(VERSION)
                    && d.u32() == Some(shard as u32);
                let _reserved = d.u32();
                ok && d.u64() == Some(lsn)
            };
            if !ok {
                if oldest_journal.is_some_and(|base| base < lsn) {
                    // Its checkpoint did not finish; the journal it would replace is here.
                    fs::remove_file(&path)?;
                    continue;
                }
                return Err(Error::corrupt(&path, "not a checkpoint file of this shard"));
            }
            for (offset, len, sc) in images(&buf) {
                let name = sc.state.config.name.as_str();
                let newer = inner
                    .newest
                    .get(name)
                    .is_none_or(|l| sc.applied_lsn >= l.lsn);
                if newer {
                    inner.newest.insert(
                        name.into(),
                        Loc {
                            lsn: sc.applied_lsn,
                            file: lsn,
                            offset,
                            len: len as u32,
                        },
                    );
                }
            }
            let file = Arc::new(File::open(&path)?);
            inner.files.insert(
                lsn,
                CkptFile {
                    file,
                    path,
                    bytes: buf.len() as u64,
                    live: 0,
                    live_bytes: 0,
                },
            );
        }
        for l in inner.newest.values() {
            if let Some(f) = inner.files.get_mut(&l.file) {
                f.gain(l);
            }
        }
        let empty: Vec<u64> = inner
            .files
            .iter()
            .filter(|(_, f)| f.live == 0)
            .map(|(l, _)| *l)
            .collect();
        for lsn in empty {
            if let Some(f) = inner.files.remove(&lsn) {
                fs::remove_file(&f.path)?;
            }
        }
        Ok(Images {
            dir: dir.to_owned(),
            shard: shard as u32,
            enabled,
            inner: Mutex::new(inner),
        })
    }

    /// The shard.
    pub(in crate::engine) fn shard(&self) -> u32 {
        self.shard
    }

    /// The newest durable image of the stream in `dir`: its sidecar, or a checkpoint file's
    /// image of the same name and incarnation at a higher applied LSN (with the sidecar's
    /// generation). `None` when the directory holds no valid sidecar.
    pub(crate) fn load(&self, dir: &Path) -> Result<Option<Sidecar>> {
        let Some(sc) = sidecar::load(dir)? else {
            return Ok(None);
        };
        self.newer(sc)
    }

    /// `sc`, or the newer image of its stream that a checkpoint file holds.
    fn newer(&self, sc: Sidecar) -> Result<Option<Sidecar>> {
        let (loc, file) = {
            let inner = self.inner.lock();
            let Some(loc) = inner.newest.get(sc.state.config.name.as_str()).copied() else {
                return Ok(Some(sc));
            };
            if loc.lsn <= sc.applied_lsn {
                return Ok(Some(sc));
            }
            let Some(f) = inner.files.get(&loc.file) else {
                return Ok(Some(sc));
            };
            (loc, f.file.clone())
        };
        let mut buf = vec![0; loc.len as usize];
        file.read_exact_at(&mut buf, loc.offset)?;
        let image = sidecar::decode(&buf).ok_or_else(|| {
            Error::corrupt(
                file_path(&self.dir, loc.file),
                "a checkpoint file's image changed after it was read",
            )
        })?;
        if image.state.config.name != sc.state.config.name
            || image.state.config.incarnation != sc.state.config.incarnation
        {
            return Ok(Some(sc));
        }
        Ok(Some(Sidecar {
            generation: sc.generation,
            applied_lsn: image.applied_lsn,
            state: image.state,
        }))
    }

    /// The file the next checkpoint should fold into its own, if any: once the bytes of images
    /// that are no stream's newest pass `bound`, the file holding most of them.
    pub(in crate::engine) fn fold_due(&self, bound: u64) -> Option<u64> {
        let inner = self.inner.lock();
        let dead: u64 = inner.files.values().map(CkptFile::dead).sum();
        if dead <= bound {
            return None;
        }
        inner
            .files
            .iter()
            .max_by_key(|(_, f)| f.dead())
            .map(|(lsn, _)| *lsn)
    }

    /// Copies the images of file `from` that are still their stream's newest into `w`, except
    /// those of `skip` (streams the checkpoint writes a newer image or sidecar of).
    pub(in crate::engine) fn fold(
        &self,
        from: u64,
        rotation: u64,
        w: &mut Written,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        let Some(file) = self.inner.lock().files.get(&from).map(|f| f.file.clone()) else {
            return Ok(());
        };
        let len = file.metadata()?.len();
        let mut buf = vec![0; len as usize];
        file.read_exact_at(&mut buf, 0)?;
        let inner = self.inner.lock();
        for (offset, len, sc) in images(&buf) {
            let name = sc.state.config.name.as_str();
            let current = inner
                .newest
                .get(name)
                .is_some_and(|l| l.file == from && l.offset == offset);
            if !current || skip(name) {
                continue;
            }
            if w.buf.is_empty() {
                w.buf = header(self.shard, rotation);
            }
            let at = w.buf.len() as u64;
            w.buf
                .extend_from_slice(&buf[offset as usize..offset as usize + len]);
            w.locs.push((name.into(), sc.applied_lsn, at, len as u32));
        }
        w.folded = Some(from);
        Ok(())
    }

    /// Writes `w`'s file for rotation `rotation` (not synced: the checkpoint's `syncfs` makes it
    /// durable). Nothing when it holds no image.
    pub(in crate::engine) fn write(&self, rotation: u64, w: &Written) -> Result<Option<Arc<File>>> {
        if w.locs.is_empty() {
            return Ok(None);
        }
        let path = file_path(&self.dir, rotation);
        let f = fs::open_create(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
            &path,
        )?;
        f.write_all_at(&w.buf, 0)?;
        Ok(Some(Arc::new(f)))
    }

    /// After the checkpoint's second `syncfs`: `w`'s images (in `file`) are the newest of their
    /// streams; `sidecars` were written and `gone` deleted, so their older images are not; files
    /// left with no newest image are removed (a power cut may bring one back: its images are
    /// older than what replaced them, so it changes nothing).
    pub(in crate::engine) fn commit(
        &self,
        rotation: u64,
        w: Written,
        file: Option<Arc<File>>,
        sidecars: &[(Box<str>, u64)],
        gone: &[Box<str>],
    ) -> Result<()> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let drop_loc = |inner_files: &mut BTreeMap<u64, CkptFile>, old: Option<Loc>| {
            if let Some(old) = old
                && let Some(f) = inner_files.get_mut(&old.file)
            {
                f.lose(&old);
            }
        };
        // Deletes first: a name deleted and created again since has a sidecar or image below.
        for name in gone {
            let old = inner.newest.remove(&**name);
            drop_loc(&mut inner.files, old);
        }
        if let Some(file) = file {
            inner.files.insert(
                rotation,
                CkptFile {
                    file,
                    path: file_path(&self.dir, rotation),
                    bytes: w.buf.len() as u64,
                    live: 0,
                    live_bytes: 0,
                },
            );
            for (name, lsn, offset, len) in w.locs {
                let new = Loc {
                    lsn,
                    file: rotation,
                    offset,
                    len,
                };
                let old = inner.newest.insert(name, new);
                drop_loc(&mut inner.files, old);
                if let Some(f) = inner.files.get_mut(&rotation) {
                    f.gain(&new);
                }
            }
        }
        for (name, lsn) in sidecars {
            if inner.newest.get(&**name).is_some_and(|l| l.lsn <= *lsn) {
                let old = inner.newest.remove(&**name);
                drop_loc(&mut inner.files, old);
            }
        }
        if let Some(folded) = w.folded
            && let Some(f) = inner.files.get_mut(&folded)
        {
            // Every newest image it held was copied or superseded.
            f.live = 0;
            f.live_bytes = 0;
        }
        let empty: Vec<u64> = inner
            .files
            .iter()
            .filter(|(_, f)| f.live == 0)
            .map(|(l, _)| *l)
            .collect();
        for lsn in empty {
            if let Some(f) = inner.files.remove(&lsn) {
                fs::remove_file(&f.path)?;
            }
        }
        Ok(())
    }

    /// A sidecar of `name` at `lsn` was written and made durable outside a checkpoint (replay's
    /// spill): an older image in a file is no longer the newest.
    pub(in crate::engine) fn superseded(&self, name: &str, lsn: u64) {
        let mut inner = self.inner.lock();
        if inner.newest.get(name).is_some_and(|l| l.lsn <= lsn)
            && let Some(old) = inner.newest.remove(name)
            && let Some(f) = inner.files.get_mut(&old.file)
        {
            f.lose(&old);
        }
    }

    /// Replay applied a hard delete of `name` at `lsn`: its older image is no longer anyone's.
    /// The file that holds it goes at the next checkpoint (after which the delete's journal
    /// goes too).
    pub(in crate::engine) fn deleted(&self, name: &str, lsn: u64) {
        let mut inner = self.inner.lock();
        if inner.newest.get(name).is_some_and(|l| l.lsn < lsn)
            && let Some(old) = inner.newest.remove(name)
            && let Some(f) = inner.files.get_mut(&old.file)
        {
            f.lose(&old);
        }
    }

    /// Writes every stream's newest image into its sidecar (the slot after the current one),
    /// makes them durable, and removes the checkpoint files: for a store opened with a cold tier,
    /// whose thread reads a stream's state from its sidecar (2.8). An image whose stream has no
    /// sidecar of its incarnation any more, or a newer one, is dropped. Returns the sidecars
    /// written.
    pub(in crate::engine) fn write_into_sidecars(&self, root: &Path) -> Result<usize> {
        let mut inner = self.inner.lock();
        if inner.files.is_empty() {
            return Ok(0);
        }
        let mut written = 0;
        let mut scratch = Vec::new();
        for (name, loc) in &inner.newest {
            let Some(f) = inner.files.get(&loc.file) else {
                continue;
            };
            let mut buf = vec![0; loc.len as usize];
            f.file.read_exact_at(&mut buf, loc.offset)?;
            let Some(image) = sidecar::decode(&buf) else {
                return Err(Error::corrupt(&f.path, "a checkpoint file's image changed"));
            };
            let dir = fs::stream_dir(root, name);
            let Some(current) = sidecar::load(&dir)? else {
                continue;
            };
            if current.state.config.name != image.state.config.name
                || current.state.config.incarnation != image.state.config.incarnation
                || current.applied_lsn >= image.applied_lsn
            {
                continue;
            }
            sidecar::write_with(
                &mut scratch,
                &dir,
                current.generation + 1,
                image.applied_lsn,
                &image.state,
            )?;
            written += 1;
        }
        fs::sync_fs(&File::open(root)?, root)?;
        for f in std::mem::take(&mut inner.files).into_values() {
            fs::remove_file(&f.path)?;
        }
        inner.newest.clear();
        Ok(written)
    }

    /// The number of checkpoint files and their bytes.
    pub(in crate::engine) fn files(&self) -> (usize, u64) {
        let inner = self.inner.lock();
        (
            inner.files.len(),
            inner.files.values().map(|f| f.bytes).sum(),
        )
    }
}
