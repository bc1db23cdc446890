//! The file-system seam: every durability point and namespace change the engine makes goes
//! through one of these functions, so a test can watch them (a simulated disk that keeps each
//! file's durable bytes apart from its written ones) or fail them (an injected `EIO` or
//! `ENOSPC`, a power cut).
//!
//! Data writes themselves (journal `write`s, segment `pwrite`s, the mapped index) do not go
//! through the seam: an observer reads what they wrote from the files. The journal write has a
//! seam point of its own ([`check_write`]) only so that it can be failed.
//!
//! Observers are installed per data directory ([`install`]) and found by path prefix. With none
//! installed (every store but a test's) each function costs one relaxed atomic load before the
//! plain `std` call.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

/// One call through the seam, as an observer sees it (before and after the real call).
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// `fdatasync`/`fsync` of the file at the path: its data becomes durable (not its name).
    SyncFile(&'a Path),
    /// `fsync` of a directory: its entries (creations, renames, removals) become durable.
    SyncDir(&'a Path),
    /// `syncfs` of the file system holding the path: everything becomes durable.
    SyncFs(&'a Path),
    /// A file is created (or opened with `O_CREAT`).
    Create(&'a Path),
    /// One directory is created.
    Mkdir(&'a Path),
    /// `rename(from, to)`, replacing `to` if it exists.
    Rename {
        /// The old name.
        from: &'a Path,
        /// The new name.
        to: &'a Path,
    },
    /// A file is unlinked.
    Remove(&'a Path),
    /// A directory is removed with everything in it.
    RemoveDir(&'a Path),
    /// A file's length is set (grown or cut back).
    SetLen(&'a Path),
    /// Blocks are allocated for a range of the (journal) file at the path, growing it
    /// (`fallocate(2)`): later writes into the range need no space the disk may not have.
    Allocate(&'a Path),
    /// Bytes are about to be written to the (journal) file at the path.
    Write(&'a Path),
}

impl Op<'_> {
    /// A path the call touches, used to find its observer.
    fn path(&self) -> &Path {
        match *self {
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
}

/// An observer of the seam calls under one data directory (a simulated disk, a fault injector).
pub trait Hook: Send + Sync {
    /// Called before the real call; an error is returned in its place (the call is not made).
    fn before(&self, op: &Op<'_>) -> io::Result<()>;
    /// Called after the real call, with whether it succeeded.
    fn after(&self, op: &Op<'_>, ok: bool);
    /// The free space to report for the file system holding `path` in place of the real one
    /// (a simulated disk's size); `None` (the default) reports the real one.
    fn free_space(&self, path: &Path) -> Option<u64> {
        let _ = path;
        None
    }
}

/// Whether any hook is installed (the fast path's one load).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The installed hooks, each with the directory it watches.
static HOOKS: RwLock<Vec<(PathBuf, Arc<dyn Hook>)>> = RwLock::new(Vec::new());

/// Installs `hook` for every seam call on a path under `root` (replacing an earlier hook for
/// the same directory). For tests: a store normally runs with none.
pub fn install(root: &Path, hook: Arc<dyn Hook>) {
    let mut hooks = HOOKS.write();
    hooks.retain(|(r, _)| r != root);
    hooks.push((root.to_path_buf(), hook));
    ACTIVE.store(true, Ordering::Release);
}

/// Removes the hook installed for `root`, if any.
pub fn uninstall(root: &Path) {
    let mut hooks = HOOKS.write();
    hooks.retain(|(r, _)| r != root);
    ACTIVE.store(!hooks.is_empty(), Ordering::Release);
}

/// The hook watching `op`'s path, if any.
fn hook_for(op: &Op<'_>) -> Option<Arc<dyn Hook>> {
    hook_at(op.path())
}

/// The hook watching `p`, if any.
fn hook_at(p: &Path) -> Option<Arc<dyn Hook>> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    HOOKS
        .read()
        .iter()
        .find(|(r, _)| p.starts_with(r))
        .map(|(_, h)| h.clone())
}

/// Runs `real` as the seam call `op`: through its hook when one watches the path.
fn call<T>(op: &Op<'_>, real: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let Some(h) = hook_for(op) else {
        return real();
    };
    h.before(op)?;
    let r = real();
    h.after(op, r.is_ok());
    r
}

/// `fdatasync(2)` of `file`, which is open at `path`: its data is durable when this returns.
pub(crate) fn sync_data(file: &File, path: &Path) -> io::Result<()> {
    call(&Op::SyncFile(path), || file.sync_data())
}

/// `fsync(2)` of `file`, which is open at `path`: its data and metadata are durable (its name
/// is not: that takes a sync of its directory).
pub(crate) fn sync_all(file: &File, path: &Path) -> io::Result<()> {
    call(&Op::SyncFile(path), || file.sync_all())
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    call(&Op::SyncDir(dir), || File::open(dir)?.sync_all())
}

/// `syncfs(2)` through `file`, open at `path`: see [`super::sync_fs`].
pub(crate) fn sync_fs(file: &File, path: &Path) -> io::Result<()> {
    call(&Op::SyncFs(path), || super::syncfs(file))
}

/// `File::create`: creates or truncates the file at `path`.
pub(crate) fn create(path: &Path) -> io::Result<File> {
    call(&Op::Create(path), || File::create(path))
}

/// Opens `path` with `options`, which create it if missing (`create(true)`).
pub(crate) fn open_create(options: &OpenOptions, path: &Path) -> io::Result<File> {
    call(&Op::Create(path), || options.open(path))
}

/// `rename(2)`: atomic, durable once both directories are synced.
pub(crate) fn rename(from: &Path, to: &Path) -> io::Result<()> {
    call(&Op::Rename { from, to }, || std::fs::rename(from, to))
}

/// Unlinks a file.
pub(crate) fn remove_file(path: &Path) -> io::Result<()> {
    call(&Op::Remove(path), || std::fs::remove_file(path))
}

/// Removes a directory and everything in it.
pub(crate) fn remove_dir_all(path: &Path) -> io::Result<()> {
    call(&Op::RemoveDir(path), || std::fs::remove_dir_all(path))
}

/// Creates a directory and any missing parents; a hook sees one [`Op::Mkdir`] per directory
/// made.
pub(crate) fn create_dir_all(path: &Path) -> io::Result<()> {
    if hook_for(&Op::Mkdir(path)).is_none() {
        return std::fs::create_dir_all(path);
    }
    let missing: Vec<&Path> = path.ancestors().take_while(|p| !p.exists()).collect();
    for p in missing.into_iter().rev() {
        match call(&Op::Mkdir(p), || std::fs::create_dir(p)) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            other => other?,
        }
    }
    Ok(())
}

/// Sets the length of `file`, open at `path`.
pub(crate) fn set_len(file: &File, path: &Path, len: u64) -> io::Result<()> {
    call(&Op::SetLen(path), || file.set_len(len))
}

/// Grows `file`, open at `path`, to at least `offset + len` bytes with blocks allocated for
/// `[offset, offset + len)` (see [`super::fallocate`]).
pub(crate) fn allocate(file: &File, path: &Path, offset: u64, len: u64) -> io::Result<()> {
    call(&Op::Allocate(path), || super::fallocate(file, offset, len))
}

/// The bytes an unprivileged writer may still take on the file system holding `file`, open at
/// `path` (`fstatvfs(3)`), or what a hook reports for it; `None` if neither can say.
pub(crate) fn available_bytes(file: &File, path: &Path) -> Option<u64> {
    hook_at(path)
        .and_then(|h| h.free_space(path))
        .or_else(|| super::statvfs_available(file))
}

/// The seam point before a journal write to `path` (the write itself is the caller's): only a
/// hook can fail it.
pub(crate) fn check_write(path: &Path) -> io::Result<()> {
    call(&Op::Write(path), || Ok(()))
}
