//! Allocating ahead without taking a nearly full disk's last space: a file grows in steps
//! (more than the write at hand needs, so that few writes allocate), but a step is taken only
//! while the disk keeps a margin free after it; otherwise, and when the step does not fit,
//! exactly what is needed.

use std::fs::File;
use std::io;
use std::path::Path;

/// The free space one batch's allocations may take: looked at once (`fstatvfs`, through the
/// seam), at the first step that needs the answer, then counted down by what was allocated.
pub(crate) struct Headroom {
    /// Bytes that stay free after a step.
    keep: u64,
    /// The free space after this batch's allocations so far.
    free: Free,
}

/// What a [`Headroom`] knows of the free space.
#[derive(Clone, Copy)]
enum Free {
    /// Not looked at yet.
    Unlooked,
    /// The file system cannot say.
    Unknown,
    /// This many bytes.
    Bytes(u64),
}

impl Headroom {
    /// A batch's headroom that keeps `keep` bytes free after any step.
    pub(crate) fn new(keep: u64) -> Headroom {
        Headroom {
            keep,
            free: Free::Unlooked,
        }
    }

    /// Whether `bytes` more may be allocated with `keep` bytes free after them (yes when the
    /// file system cannot say); `file` at `path` is on the file system to look at.
    fn fits(&mut self, bytes: u64, file: &File, path: &Path) -> bool {
        if let Free::Unlooked = self.free {
            self.free = super::available_bytes(file, path).map_or(Free::Unknown, Free::Bytes);
        }
        match self.free {
            Free::Bytes(f) => f >= bytes.saturating_add(self.keep),
            Free::Unlooked | Free::Unknown => true,
        }
    }

    /// The free space on the file system holding `file` (open at `path`) after this batch's
    /// allocations so far: the look taken for them less what they took, or a look now if none
    /// was taken; `None` if the file system cannot say.
    pub(crate) fn available(&self, file: &File, path: &Path) -> Option<u64> {
        match self.free {
            Free::Unlooked => super::available_bytes(file, path),
            Free::Unknown => None,
            Free::Bytes(f) => Some(f),
        }
    }

    /// Counts `bytes` allocated.
    fn took(&mut self, bytes: u64) {
        if let Free::Bytes(f) = &mut self.free {
            *f = f.saturating_sub(bytes);
        }
    }
}

/// Allocates the blocks of `file` (open at `path`) from `from` up to `step` (growing it), or
/// only up to `need` when the step would leave less than the headroom's margin free or does
/// not fit (`ENOSPC`); returns the end allocated. `ENOSPC` when not even `need` fits.
pub(crate) fn allocate_ahead(
    file: &File,
    path: &Path,
    (from, need, step): (u64, u64, u64),
    room: &mut Headroom,
) -> io::Result<u64> {
    let step = step.max(need);
    let to = if step > need && !room.fits(step - from, file, path) {
        need
    } else {
        step
    };
    let to = match super::allocate(file, path, from, to - from) {
        Ok(()) => to,
        Err(e) if e.kind() == io::ErrorKind::StorageFull && need < to => {
            super::allocate(file, path, from, need - from).map(|()| need)?
        }
        Err(e) => return Err(e),
    };
    room.took(to - from);
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_taken_only_while_the_margin_stays_free() -> io::Result<()> {
        let file = tempfile::tempfile()?;
        let path = Path::new("/no-hook-watches-this");
        // No disk has this much free: exactly what is needed.
        let mut tight = Headroom::new(u64::MAX / 2);
        assert_eq!(
            allocate_ahead(&file, path, (0, 100, 1 << 20), &mut tight)?,
            100
        );
        assert_eq!(file.metadata()?.len(), 100);
        // With no margin to keep, the whole step.
        let mut roomy = Headroom::new(0);
        assert_eq!(
            allocate_ahead(&file, path, (100, 200, 8192), &mut roomy)?,
            8192
        );
        assert_eq!(file.metadata()?.len(), 8192);
        Ok(())
    }
}
