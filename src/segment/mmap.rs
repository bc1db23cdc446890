//! The only module that maps files. Every map is created over files brook owns and never
//! shrinks while mapped: segment logs and indexes only grow (`set_len` upward), snapshot blobs are
//! never written after they are renamed into place, and a file is removed only by unlinking,
//! which keeps existing maps valid.
#![allow(unsafe_code)]

use std::fs::File;

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::error::Result;

/// Maps the first `len` bytes of a segment log read-only.
pub(crate) fn map_read(file: &File, len: usize) -> Result<Mmap> {
    // SAFETY: brook never truncates a segment log below a mapped length while the store is open
    // (logs grow by set_len, and are deleted by unlink), so the mapped range stays backed by the
    // file; bytes another thread writes beyond the durable tail are never read through this map.
    let map = unsafe { MmapOptions::new().len(len).map(file)? };
    Ok(map)
}

/// Maps a whole index file read-write.
pub(crate) fn map_write(file: &File, len: usize) -> Result<MmapMut> {
    // SAFETY: the index file is owned by one segment; the map is only accessed under the stream's
    // data lock, and the file only grows while mapped (a grown file is mapped again).
    let map = unsafe { MmapOptions::new().len(len).map_mut(file)? };
    Ok(map)
}

/// Maps a whole snapshot blob read-only.
pub(crate) fn map_blob(file: &File, len: usize) -> Result<Mmap> {
    // SAFETY: a snapshot blob is written to a temporary file, synced and renamed into place, and
    // never opened for writing again; it is removed only by unlinking, so the mapped range stays
    // backed by unchanging bytes for as long as the map lives.
    let map = unsafe { MmapOptions::new().len(len).map(file)? };
    Ok(map)
}
