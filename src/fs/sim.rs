//! A simulated disk for tests, watching a data directory through the file-system seam
//! (`fs/seam.rs`): it keeps, per file, the bytes that are durable and, per directory change,
//! whether it is durable yet; it can fail chosen calls (`EIO`, `ENOSPC`) and cut the power.
//!
//! The model (DESIGN.md section 10 states it as a guarantee list):
//!
//! * A file's bytes become durable when the file is synced (`fdatasync`/`fsync`: a copy of the
//!   file is taken just before the real call) or the file system is (`syncfs`). Its name does
//!   not: a create, rename or removal becomes durable only when every directory it changes is
//!   synced afterwards (or the file system is).
//! * After a power cut, each file holds its durable bytes, overwritten sector by sector (512
//!   bytes) by what was written since, each changed sector independently, followed by a random
//!   prefix of what was appended since (whose last sector may be zeros: a torn tail). A length
//!   cut back since the last sync may or may not be.
//! * Each directory change not yet durable is independently kept or undone, newest first; a
//!   rename is undone whole (it is atomic), a removed file or directory comes back with its own
//!   torn contents, an undone directory creation takes what was created inside it.
//!
//! Data written without the seam (journal writes, segment writes, the mapped index) is read from
//! the files themselves.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::seam::{self, Hook, Op};

/// A sector: the unit a torn write keeps or loses.
const SECTOR: usize = 512;

/// The kind of a seam call, to choose which calls an injected fault fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `fdatasync`/`fsync` of a file.
    SyncFile,
    /// `fsync` of a directory.
    SyncDir,
    /// `syncfs`.
    SyncFs,
    /// A file created.
    Create,
    /// A directory created.
    Mkdir,
    /// A rename.
    Rename,
    /// A file removed.
    Remove,
    /// A directory tree removed.
    RemoveDir,
    /// A length set.
    SetLen,
    /// Blocks allocated ahead of the journal's writes (`fallocate`).
    Allocate,
    /// A journal write.
    Write,
}

fn kind(op: &Op<'_>) -> Kind {
    match op {
        Op::SyncFile(_) => Kind::SyncFile,
        Op::SyncDir(_) => Kind::SyncDir,
        Op::SyncFs(_) => Kind::SyncFs,
        Op::Create(_) => Kind::Create,
        Op::Mkdir(_) => Kind::Mkdir,
        Op::Rename { .. } => Kind::Rename,
        Op::Remove(_) => Kind::Remove,
        Op::RemoveDir(_) => Kind::RemoveDir,
        Op::SetLen(_) => Kind::SetLen,
        Op::Allocate(_) => Kind::Allocate,
        Op::Write(_) => Kind::Write,
    }
}

/// A removed or replaced file, as it may come back after a power cut.
#[derive(Clone)]
struct Saved {
    ino: u64,
    durable: Option<Vec<u8>>,
    lengths: Vec<u64>,
    current: Vec<u8>,
}

/// A directory change that is not durable yet.
enum Change {
    Create {
        path: PathBuf,
        ino: u64,
    },
    Mkdir {
        path: PathBuf,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
        displaced: Option<Saved>,
    },
    Remove {
        path: PathBuf,
        saved: Saved,
    },
    /// A tree removed: each entry relative to `path`, `None` for a directory.
    RemoveTree {
        path: PathBuf,
        saved: Vec<(PathBuf, Option<Saved>)>,
    },
}

/// What `before` found, for `after`.
enum Staged {
    Existed(Option<u64>),
    File(Option<Saved>),
    Tree(Vec<(PathBuf, Option<Saved>)>),
}

/// An injected failure: the next `times` calls of `kind` (on a path containing `path`) fail
/// with `errno`, or panic (`errno` 0: a bug in the engine's code at that point, simulated).
struct Fault {
    kind: Kind,
    path: String,
    errno: i32,
    times: u32,
}

#[derive(Default)]
struct Inner {
    /// Each file's durable bytes, by inode (a rename keeps them, a removal takes them along).
    durable: HashMap<u64, Vec<u8>>,
    /// Lengths each file had since it was last synced (set by `set_len`, or before a journal
    /// write): with the durable and the current length, the lengths a power cut may leave.
    lengths: HashMap<u64, Vec<u64>>,
    /// Directory changes not yet durable, oldest first, each with the directories it changes
    /// that have not been synced since.
    pending: Vec<(Change, Vec<PathBuf>)>,
    staged: HashMap<PathBuf, Staged>,
    calls: u64,
    cut_after: Option<u64>,
    cut: bool,
    faults: Vec<Fault>,
    /// Faults that fired, for the test's report.
    fired: Vec<String>,
    /// A disk of limited size ([`Disk::limit_space`]): the bytes the files under the root
    /// took when it was set, and the free space reported then.
    space: Option<(u64, u64)>,
}

impl Inner {
    /// Forgets the durable bytes of a file removed (or replaced) since `before` saved it. Only
    /// if they are still the ones saved: between the two the inode may have been freed and
    /// taken by a file another thread created and synced meanwhile.
    fn forget(&mut self, s: &Saved) {
        if self.durable.get(&s.ino) == s.durable.as_ref() {
            self.durable.remove(&s.ino);
        }
    }
}

/// A simulated disk under one data directory; see the module docs. Install it with
/// [`Disk::install`] before opening the store.
pub struct Disk {
    root: PathBuf,
    inner: Mutex<Inner>,
}

/// What a power cut did to the directory, for a failing test's message.
#[derive(Debug, Default, Clone)]
pub struct PowerLoss {
    /// Files whose contents differ from what was written.
    pub torn: Vec<PathBuf>,
    /// Directory changes undone.
    pub undone: Vec<String>,
    /// Directory changes kept although not durable.
    pub kept: usize,
}

impl Disk {
    /// A disk whose durable state is everything under `root` now, watching every seam call
    /// under it.
    pub fn install(root: &Path) -> io::Result<Arc<Disk>> {
        let disk = Arc::new(Disk {
            root: root.to_path_buf(),
            inner: Mutex::new(Inner::default()),
        });
        {
            let mut g = disk.inner.lock();
            for (_, ino, bytes) in files(root)? {
                g.durable.insert(ino, bytes);
            }
        }
        seam::install(root, disk.clone());
        Ok(disk)
    }

    /// Stops watching (the directory is left as it is).
    pub fn uninstall(&self) {
        seam::uninstall(&self.root);
    }

    /// The seam calls seen so far.
    pub fn calls(&self) -> u64 {
        self.inner.lock().calls
    }

    /// Cuts the power at the `n`th seam call from now: it and every later call fail with `EIO`.
    pub fn cut_after(&self, n: u64) {
        let mut g = self.inner.lock();
        g.cut_after = Some(g.calls + n.max(1));
    }

    /// Cuts the power now: every later seam call fails with `EIO`.
    pub fn cut(&self) {
        self.inner.lock().cut = true;
    }

    /// The process died (with the power on) and starts again: seam calls work again, and what
    /// was not durable when it died is still not durable (the page cache kept it), for a power
    /// cut later to take.
    pub fn restart(&self) {
        let mut g = self.inner.lock();
        g.cut = false;
        g.cut_after = None;
    }

    /// Whether the power is cut.
    pub fn is_cut(&self) -> bool {
        self.inner.lock().cut
    }

    /// Fails the next `times` seam calls of `kind` whose path contains `path` with `errno`
    /// (doing nothing).
    pub fn fail(&self, kind: Kind, path: &str, errno: i32, times: u32) {
        self.inner.lock().faults.push(Fault {
            kind,
            path: path.to_owned(),
            errno,
            times,
        });
    }

    /// Panics in the next seam call of `kind` whose path contains `path`, on whatever engine
    /// thread makes it (doing nothing): stands for a bug in the engine's code at that point.
    pub fn panic_at(&self, kind: Kind, path: &str) {
        self.fail(kind, path, 0, 1);
    }

    /// From now on, reports `free` bytes free on the disk (to the engine's free-space looks),
    /// less what the files under the root take beyond what they take now (their allocated
    /// blocks: writes and `fallocate` count, holes do not). Nothing is refused for it: a full
    /// disk's `ENOSPC` is injected with [`Disk::fail`].
    pub fn limit_space(&self, free: u64) -> io::Result<()> {
        let used = used_bytes(&self.root)?;
        self.inner.lock().space = Some((used, free));
        Ok(())
    }

    /// The free space reported now (see [`Disk::limit_space`]); `None` while unlimited.
    pub fn free(&self) -> Option<u64> {
        let (at, free) = self.inner.lock().space?;
        let used = used_bytes(&self.root).ok()?;
        Some(free.saturating_sub(used.saturating_sub(at)))
    }

    /// Drops the faults not yet fired.
    pub fn clear_faults(&self) {
        self.inner.lock().faults.clear();
    }

    /// The faults fired so far, as `kind path`.
    pub fn fired(&self) -> Vec<String> {
        self.inner.lock().fired.clone()
    }

    /// Rewrites the directory to one state a real disk could be in after the power cut (cutting
    /// it first if it was not), chosen by `seed`. The store must be gone (dropped, or its
    /// process killed): nothing may write the directory meanwhile.
    pub fn power_loss(&self, seed: u64) -> io::Result<PowerLoss> {
        let mut g = self.inner.lock();
        g.cut = true;
        let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
        let mut out = PowerLoss::default();
        for (path, ino, current) in files(&self.root)? {
            let lengths = g.lengths.get(&ino).map_or(&[][..], Vec::as_slice);
            let torn = mix(
                g.durable.get(&ino).map(Vec::as_slice),
                lengths,
                &current,
                &mut rng,
            );
            if torn != current {
                std::fs::write(&path, &torn)?;
                out.torn.push(path);
            }
        }
        // Files put back, by path, with the inode they had: an undone create matches them.
        let mut restored: HashMap<PathBuf, u64> = HashMap::new();
        let same = |p: &Path, ino: u64, restored: &HashMap<PathBuf, u64>| {
            restored.get(p) == Some(&ino)
                || std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.ino() == ino)
        };
        let pending = std::mem::take(&mut g.pending);
        for (change, _) in pending.into_iter().rev() {
            if rng.below(2) == 0 {
                out.kept += 1;
                continue;
            }
            match change {
                Change::Create { path, ino } => {
                    if same(&path, ino, &restored) {
                        std::fs::remove_file(&path)?;
                        restored.remove(&path);
                        out.undone.push(format!("create {}", path.display()));
                    }
                }
                Change::Mkdir { path } => {
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path)?;
                        // What was put back in it went with it: an older create of the same
                        // name must not find it there.
                        restored.retain(|p, _| !p.starts_with(&path));
                        out.undone.push(format!("mkdir {}", path.display()));
                    }
                }
                Change::Rename {
                    from,
                    to,
                    displaced,
                } => {
                    let back = to.symlink_metadata().is_ok()
                        && from.symlink_metadata().is_err()
                        && from.parent().is_some_and(Path::is_dir);
                    if back {
                        std::fs::rename(&to, &from)?;
                        // The file, or everything put back in the directory, moves with it.
                        let moved: Vec<PathBuf> = restored
                            .keys()
                            .filter(|p| p.starts_with(&to))
                            .cloned()
                            .collect();
                        for p in moved {
                            if let (Some(ino), Ok(rel)) = (restored.remove(&p), p.strip_prefix(&to))
                            {
                                restored.insert(from.join(rel), ino);
                            }
                        }
                        if let Some(s) = displaced {
                            put_back(&to, &s, &mut rng, &mut restored)?;
                        }
                        out.undone
                            .push(format!("rename {} {}", from.display(), to.display()));
                    }
                }
                Change::Remove { path, saved } => {
                    if path.symlink_metadata().is_err() && path.parent().is_some_and(Path::is_dir) {
                        put_back(&path, &saved, &mut rng, &mut restored)?;
                        out.undone.push(format!("remove {}", path.display()));
                    }
                }
                Change::RemoveTree { path, saved } => {
                    if path.symlink_metadata().is_err() && path.parent().is_some_and(Path::is_dir) {
                        std::fs::create_dir(&path)?;
                        for (rel, file) in &saved {
                            let p = path.join(rel);
                            match file {
                                None => std::fs::create_dir_all(&p)?,
                                Some(s) => put_back(&p, s, &mut rng, &mut restored)?,
                            }
                        }
                        out.undone.push(format!("remove tree {}", path.display()));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Takes the file at `path` as it stands: its inode and a copy of its bytes, with the
    /// durable bytes of that inode.
    fn save(g: &Inner, path: &Path) -> Option<Saved> {
        let m = std::fs::symlink_metadata(path).ok()?;
        if !m.is_file() {
            return None;
        }
        let current = std::fs::read(path).ok()?;
        Some(Saved {
            ino: m.ino(),
            durable: g.durable.get(&m.ino()).cloned(),
            lengths: g.lengths.get(&m.ino()).cloned().unwrap_or_default(),
            current,
        })
    }
}

impl Hook for Disk {
    fn before(&self, op: &Op<'_>) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.cut {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        g.calls += 1;
        if g.cut_after == Some(g.calls) {
            g.cut = true;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let k = kind(op);
        let path = op_path(op);
        let hit = g
            .faults
            .iter()
            .position(|f| f.kind == k && path.to_string_lossy().contains(f.path.as_str()));
        if let Some(i) = hit {
            let errno = g.faults[i].errno;
            g.faults[i].times -= 1;
            if g.faults[i].times == 0 {
                g.faults.remove(i);
            }
            g.fired.push(format!("{k:?} {}", path.display()));
            if errno == 0 {
                drop(g);
                panic!("injected panic at {k:?} {}", path.display());
            }
            return Err(io::Error::from_raw_os_error(errno));
        }
        match *op {
            Op::SyncFile(p) => {
                if let Ok(m) = std::fs::metadata(p)
                    && let Ok(bytes) = std::fs::read(p)
                {
                    g.durable.insert(m.ino(), bytes);
                    g.lengths.remove(&m.ino());
                }
            }
            Op::SyncDir(d) => g.pending.retain_mut(|(_, dirs)| {
                dirs.retain(|x| x != d);
                !dirs.is_empty()
            }),
            Op::SyncFs(_) => {
                for (_, ino, bytes) in files(&self.root)? {
                    g.durable.insert(ino, bytes);
                }
                g.lengths.clear();
                g.pending.clear();
            }
            Op::Create(p) => {
                let ino = std::fs::symlink_metadata(p).ok().map(|m| m.ino());
                g.staged.insert(p.to_path_buf(), Staged::Existed(ino));
            }
            Op::Rename { to, .. } => {
                let s = Disk::save(&g, to);
                g.staged.insert(to.to_path_buf(), Staged::File(s));
            }
            Op::Remove(p) => {
                let s = Disk::save(&g, p);
                g.staged.insert(p.to_path_buf(), Staged::File(s));
            }
            Op::RemoveDir(p) => {
                let mut tree = Vec::new();
                let mut stack = vec![p.to_path_buf()];
                while let Some(d) = stack.pop() {
                    let Ok(rd) = std::fs::read_dir(&d) else {
                        continue;
                    };
                    for e in rd.flatten() {
                        let ep = e.path();
                        let rel = ep.strip_prefix(p).unwrap_or(&ep).to_path_buf();
                        if ep.is_dir() {
                            tree.push((rel, None));
                            stack.push(ep);
                        } else if let Some(s) = Disk::save(&g, &ep) {
                            tree.push((rel, Some(s)));
                        }
                    }
                }
                // Parents before children, so restoring in order makes each directory first.
                tree.sort_by(|a, b| a.0.cmp(&b.0));
                g.staged.insert(p.to_path_buf(), Staged::Tree(tree));
            }
            Op::Write(p) => {
                if let Ok(m) = std::fs::metadata(p) {
                    g.lengths.entry(m.ino()).or_default().push(m.len());
                }
            }
            Op::Mkdir(_) | Op::SetLen(_) | Op::Allocate(_) => {}
        }
        Ok(())
    }

    fn free_space(&self, _path: &Path) -> Option<u64> {
        self.free()
    }

    fn after(&self, op: &Op<'_>, ok: bool) {
        let mut g = self.inner.lock();
        let staged = g.staged.remove(match *op {
            Op::Rename { to, .. } => to,
            _ => op_path(op),
        });
        if !ok || g.cut {
            return;
        }
        let parent = |p: &Path| p.parent().map(Path::to_path_buf).into_iter().collect();
        match *op {
            Op::Create(p) => {
                let Ok(m) = std::fs::symlink_metadata(p) else {
                    return;
                };
                if let Some(Staged::Existed(Some(ino))) = staged
                    && ino == m.ino()
                {
                    return; // an existing file opened: no directory change
                }
                // A new file: whatever an earlier file of this inode left is not its own.
                g.durable.remove(&m.ino());
                g.lengths.remove(&m.ino());
                let change = Change::Create {
                    path: p.to_path_buf(),
                    ino: m.ino(),
                };
                g.pending.push((change, parent(p)));
            }
            Op::Mkdir(p) => {
                let change = Change::Mkdir {
                    path: p.to_path_buf(),
                };
                g.pending.push((change, parent(p)));
            }
            Op::Rename { from, to } => {
                let displaced = match staged {
                    Some(Staged::File(s)) => s,
                    _ => None,
                };
                if let Some(s) = &displaced {
                    g.forget(s);
                }
                let mut dirs: Vec<PathBuf> = parent(from);
                for d in parent(to) {
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
                let change = Change::Rename {
                    from: from.to_path_buf(),
                    to: to.to_path_buf(),
                    displaced,
                };
                g.pending.push((change, dirs));
            }
            Op::Remove(p) => {
                if let Some(Staged::File(Some(saved))) = staged {
                    g.forget(&saved);
                    let change = Change::Remove {
                        path: p.to_path_buf(),
                        saved,
                    };
                    g.pending.push((change, parent(p)));
                }
            }
            Op::RemoveDir(p) => {
                if let Some(Staged::Tree(saved)) = staged {
                    for (_, s) in &saved {
                        if let Some(s) = s {
                            g.forget(s);
                        }
                    }
                    let change = Change::RemoveTree {
                        path: p.to_path_buf(),
                        saved,
                    };
                    g.pending.push((change, parent(p)));
                }
            }
            Op::SetLen(p) | Op::Allocate(p) => {
                if let Ok(m) = std::fs::metadata(p) {
                    g.lengths.entry(m.ino()).or_default().push(m.len());
                }
            }
            Op::SyncFile(_) | Op::SyncDir(_) | Op::SyncFs(_) | Op::Write(_) => {}
        }
    }
}

/// The path an observer files a call under (a rename's: its source).
fn op_path<'a>(op: &Op<'a>) -> &'a Path {
    match *op {
        Op::SyncFile(p)
        | Op::SyncDir(p)
        | Op::SyncFs(p)
        | Op::Create(p)
        | Op::Mkdir(p)
        | Op::Remove(p)
        | Op::RemoveDir(p)
        | Op::SetLen(p)
        | Op::Allocate(p)
        | Op::Write(p) => p,
        Op::Rename { from, .. } => from,
    }
}

/// Writes a removed file back at `path` with torn contents.
fn put_back(
    path: &Path,
    s: &Saved,
    rng: &mut Rng,
    restored: &mut HashMap<PathBuf, u64>,
) -> io::Result<()> {
    let bytes = mix(s.durable.as_deref(), &s.lengths, &s.current, rng);
    std::fs::write(path, bytes)?;
    restored.insert(path.to_path_buf(), s.ino);
    Ok(())
}

/// The bytes the regular files under `root` take on the disk (their allocated blocks).
fn used_bytes(root: &Path) -> io::Result<u64> {
    std::fs::metadata(root)?;
    let mut used = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        // The store runs meanwhile: what is removed while the walk passes is skipped.
        let Ok(dir) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in dir.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                used = used.saturating_add(m.blocks().saturating_mul(512));
            }
        }
    }
    Ok(used)
}

/// Every regular file under `root` but the lock, with its inode and bytes.
fn files(root: &Path) -> io::Result<Vec<(PathBuf, u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = std::fs::symlink_metadata(e.path())?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && e.path() != root.join("LOCK") {
                out.push((e.path(), m.ino(), std::fs::read(e.path())?));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A file as a power cut may leave it: one of the lengths it had since its last sync (`durable`,
/// empty if never synced; each of `lengths`; its current length), its durable bytes with each
/// sector changed since independently new or old, then the bytes appended since up to that
/// length, whose last sector may be zeros (a torn tail).
fn mix(durable: Option<&[u8]>, lengths: &[u64], current: &[u8], rng: &mut Rng) -> Vec<u8> {
    let d = durable.unwrap_or(&[]);
    let pick = rng.below(lengths.len() as u64 + 2) as usize;
    let len = match pick {
        0 => d.len(),
        1 => current.len(),
        i => lengths[i - 2] as usize,
    };
    let sector = |b: &[u8], at: usize, end: usize| -> Vec<u8> {
        let mut v = b.get(at..end.min(b.len())).unwrap_or(&[]).to_vec();
        v.resize(end - at, 0);
        v
    };
    let mut out = Vec::with_capacity(len);
    for at in (0..len).step_by(SECTOR) {
        let end = (at + SECTOR).min(len);
        let new = sector(current, at, end);
        if at >= d.len() {
            out.extend_from_slice(&new);
            continue;
        }
        let old = sector(d, at, end);
        if new == old || rng.below(2) == 0 {
            out.extend_from_slice(&new);
        } else {
            out.extend_from_slice(&old);
        }
    }
    if len > d.len() && rng.below(4) == 0 {
        let last = ((len - 1) / SECTOR * SECTOR).max(d.len());
        for b in &mut out[last..] {
            *b = 0;
        }
    }
    out
}

/// splitmix64: the seeded choices of a power cut.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// `len` bytes that do not repeat at any short period (xorshift from `seed`), for tests that
/// send or store data in slices: a slice taken from a wrong offset (or a wrong segment) cannot
/// compare equal.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_file_keeps_its_durable_prefix_and_a_prefix_of_the_rest() {
        let durable = vec![1u8; 1000];
        let mut current = durable.clone();
        current.extend(std::iter::repeat_n(2u8, 3000));
        for seed in 0..200 {
            let out = mix(Some(&durable), &[2500, 3000], &current, &mut Rng(seed));
            assert!(
                [1000, 2500, 3000, 4000].contains(&out.len()),
                "len {}",
                out.len()
            );
            assert_eq!(&out[..1000], &durable[..], "seed {seed}");
            // The sector holding the durable end is old (zeros past it) or new, whole.
            let edge = &out[1000..out.len().min(1024)];
            assert!(
                edge.iter().all(|&b| b == 0) || edge.iter().all(|&b| b == 2),
                "seed {seed}: {edge:?}"
            );
            // Past it, the appended bytes in order, but for a last sector that may be zeros.
            let last =
                (out.len().saturating_sub(1) / SECTOR * SECTOR).clamp(1024, out.len().max(1024));
            assert!(
                out.get(1024..last).unwrap_or(&[]).iter().all(|&b| b == 2),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn unsynced_changes_may_be_undone_and_synced_ones_stay() -> io::Result<()> {
        let mut undone = false;
        for seed in 0..16 {
            let dir = tempfile::tempdir()?;
            let root = dir.path();
            let disk = Disk::install(root)?;
            let a = root.join("a");
            super::super::create(&a)?;
            super::super::sync_dir(root)?;
            std::fs::write(&a, b"synced")?;
            super::super::sync_all(&std::fs::File::open(&a)?, &a)?;
            let b = root.join("b");
            super::super::create(&b)?;
            std::fs::write(&b, b"never synced")?;
            disk.uninstall();
            let loss = disk.power_loss(seed)?;
            assert_eq!(std::fs::read(&a)?, b"synced", "seed {seed}: {loss:?}");
            undone |= !b.exists();
        }
        assert!(undone, "no seed undid the unsynced create");
        Ok(())
    }
}
