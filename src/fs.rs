//! File-system helpers: the store lock, directory syncs and whole-file-system syncs.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// Makes a directory's entries (creations, renames, removals) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Makes everything written to the file system that holds `file` durable (`syncfs(2)`), and
/// reports any write-back error since the file was opened.
pub(crate) fn sync_fs(file: &File) -> Result<()> {
    use std::os::fd::AsRawFd;
    #[expect(unsafe_code, reason = "syncfs(2) on an open descriptor we own; no memory is shared")]
    // SAFETY: `file` is an open descriptor for the duration of the call; syncfs only reads it.
    let rc = unsafe { libc::syncfs(file.as_raw_fd()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Takes the store's exclusive lock (`LOCK` in the data directory), held until the file is dropped.
pub(crate) fn lock(dir: &Path) -> Result<File> {
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("LOCK"))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

/// The 16-byte key of a stream name: the first half of its SHA-256. Stream directories are named
/// by it, so no catalog has to be read at startup.
pub(crate) fn key(name: &str) -> [u8; 16] {
    use sha2::Digest;
    let d = sha2::Sha256::digest(name.as_bytes());
    let mut k = [0u8; 16];
    k.copy_from_slice(&d[..16]);
    k
}

/// The directory of a stream: `streams/{k[0]:02x}/{key as 32 hex digits}`.
pub(crate) fn stream_dir(root: &Path, name: &str) -> std::path::PathBuf {
    let k = key(name);
    let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
    root.join("streams").join(&hex[..2]).join(hex)
}
