//! The only module that maps files. Every map is created over files brook owns and never
//! shrinks while mapped: segment logs and indexes only grow (`set_len` upward), snapshot blobs are
//! never written after they are renamed into place, and a file is removed only by unlinking,
//! which keeps existing maps valid.
//!
//! Every read-only map (segment logs, snapshot blobs) is a [`ReadMap`], listed for as long as it
//! lives in a process-wide registry of address ranges together with the file it maps. Given a
//! slice of such a map, [`file_range`] answers which file and offset hold the same bytes, so the
//! HTTP server can have the kernel send the file's pages to a socket (`sendfile(2)`) instead of
//! copying them out of the map. Because the files never change under a map (above), the file
//! bytes at that offset are exactly the slice's bytes.
#![expect(
    unsafe_code,
    reason = "the one module that maps files, under the invariants above"
)]

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};
use parking_lot::RwLock;

use crate::error::Result;

/// A live read-only map in the registry: where it ends and the file it maps from offset 0.
struct Listed {
    end: usize,
    file: Arc<File>,
}

/// The live read-only maps, by start address. Two live maps never overlap, so the only map
/// that can hold an address is the one with the greatest start at or below it.
static MAPS: RwLock<BTreeMap<usize, Listed>> = RwLock::new(BTreeMap::new());

/// A read-only map of a whole file (from offset 0), listed in the registry from its creation
/// until it is dropped. It is taken off the list before it is unmapped, so an address is never
/// looked up to a map that is gone (or to a later map at the same address under an old entry).
pub(crate) struct ReadMap {
    map: Mmap,
}

impl ReadMap {
    fn listed(map: Mmap, file: Arc<File>) -> ReadMap {
        if !map.is_empty() {
            let start = map.as_ptr() as usize;
            let previous = MAPS.write().insert(
                start,
                Listed {
                    end: start + map.len(),
                    file,
                },
            );
            debug_assert!(previous.is_none(), "two live maps at one address");
        }
        ReadMap { map }
    }
}

impl Drop for ReadMap {
    fn drop(&mut self) {
        if !self.map.is_empty() {
            MAPS.write().remove(&(self.map.as_ptr() as usize));
        }
        // `self.map` is unmapped after this body returns.
    }
}

impl Deref for ReadMap {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl AsRef<[u8]> for ReadMap {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

/// Where the bytes of a read's body live on disk: the segment file behind a piece of a
/// [`ReadChunk`](crate::ReadChunk)'s body and the offset in it of the piece's first byte, so a
/// server can send the piece with `sendfile(2)` (or `copy_file_range`) instead of copying it
/// through user space. The file stays open as long as this value does, even if the segment is
/// closed or reclaimed meanwhile; the bytes at the range never change (a segment is append-only
/// and only ever unlinked whole).
#[derive(Clone, Debug)]
pub struct FileRange {
    /// Kept open by the registry while the map lives, and by this value after: a segment closed
    /// (evicted, or reclaimed by retention and unlinked) meanwhile does not close it.
    file: Arc<File>,
    /// Where the piece starts in the file.
    offset: u64,
}

impl FileRange {
    /// The file range behind `piece`, when all of it lies inside one mapped segment log (a
    /// piece of a `ReadChunk`'s body that is not yet dropped); `None` for an empty slice or any
    /// other memory.
    pub fn of(piece: &[u8]) -> Option<FileRange> {
        lookup(piece.as_ptr() as usize, piece.len())
    }

    /// The segment file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the piece starts in [`FileRange::file`].
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// [`file_range`] by address: the map holding all of `[start, start + len)`, if any.
fn lookup(start: usize, len: usize) -> Option<FileRange> {
    if len == 0 {
        return None;
    }
    let end = start.checked_add(len)?;
    let maps = MAPS.read();
    let (&base, listed) = maps.range(..=start).next_back()?;
    (end <= listed.end).then(|| FileRange {
        file: listed.file.clone(),
        offset: (start - base) as u64,
    })
}

/// Maps the first `len` bytes of a segment log read-only.
pub(crate) fn map_read(file: &Arc<File>, len: usize) -> Result<ReadMap> {
    // SAFETY: brook never truncates a segment log below a mapped length while the store is open
    // (logs grow by set_len, and are deleted by unlink), so the mapped range stays backed by the
    // file; bytes another thread writes beyond the durable tail are never read through this map.
    let map = unsafe { MmapOptions::new().len(len).map(&**file)? };
    Ok(ReadMap::listed(map, file.clone()))
}

/// Maps the first `len` bytes of an index file read-only (entries reach the file by `pwrite`,
/// which a shared map sees at once).
pub(crate) fn map_index(file: &File, len: usize) -> Result<Mmap> {
    // SAFETY: the index file is owned by one segment; the map is only read under the stream's
    // data lock, and the file only grows while mapped (a grown file is mapped again).
    let map = unsafe { MmapOptions::new().len(len).map(file)? };
    Ok(map)
}

/// Maps a whole snapshot blob read-only; the map keeps `file` open.
pub(crate) fn map_blob(file: File, len: usize) -> Result<ReadMap> {
    // SAFETY: a snapshot blob is written to a temporary file, synced and renamed into place, and
    // never opened for writing again; it is removed only by unlinking, so the mapped range stays
    // backed by unchanging bytes for as long as the map lives.
    let map = unsafe { MmapOptions::new().len(len).map(&file)? };
    Ok(ReadMap::listed(map, Arc::new(file)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    type R = std::result::Result<(), Box<dyn std::error::Error>>;

    fn file_of(bytes: &[u8]) -> std::io::Result<Arc<File>> {
        let mut f = tempfile::tempfile()?;
        f.write_all(bytes)?;
        Ok(Arc::new(f))
    }

    #[test]
    fn slices_inside_a_map_name_their_file_and_offset() -> R {
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let file = file_of(&data)?;
        let map = map_read(&file, data.len())?;
        for (range, offset) in [
            (0..data.len(), 0),
            (5000..9000, 5000),
            (data.len() - 1..data.len(), data.len() - 1),
        ] {
            let r = FileRange::of(&map[range.clone()]).ok_or(format!("{range:?} not found"))?;
            assert!(Arc::ptr_eq(&r.file, &file));
            assert_eq!(r.offset, offset as u64);
        }
        assert!(
            FileRange::of(&map[10..10]).is_none(),
            "an empty slice names no file"
        );
        Ok(())
    }

    #[test]
    fn other_memory_and_ranges_past_a_map_are_not_found() -> R {
        let a = map_read(&file_of(&[1; 8192])?, 8192)?;
        let mut f = tempfile::tempfile()?;
        f.write_all(&[2; 4096])?;
        let b = map_blob(f, 4096)?;
        let heap = vec![0u8; 1 << 20];
        assert!(FileRange::of(&heap).is_none());
        assert!(FileRange::of(&heap[100..200]).is_none());
        assert_eq!(FileRange::of(&b[100..]).map(|r| r.offset), Some(100));
        // A range that starts inside a map but runs past its end (into whatever follows it,
        // another map included) is not one map's bytes.
        let start = a.as_ptr() as usize;
        assert_eq!(lookup(start + 4096, 4096).map(|r| r.offset), Some(4096));
        assert!(lookup(start + 4096, 4097).is_none());
        assert!(lookup(start + 8191, 2).is_none());
        assert!(lookup(start, usize::MAX).is_none());
        Ok(())
    }

    #[test]
    fn a_dropped_map_is_no_longer_listed() -> R {
        let file = file_of(&[9; 4096])?;
        let map = map_read(&file, 4096)?;
        assert!(FileRange::of(&map).is_some());
        assert_eq!(
            Arc::strong_count(&file),
            2,
            "the registry holds the file while the map lives"
        );
        let start = map.as_ptr() as usize;
        drop(map);
        // The registry let go of the file: only the test holds it. (The address itself may
        // already belong to a map another test made meanwhile.)
        assert_eq!(Arc::strong_count(&file), 1);
        assert!(lookup(start, 4096).is_none_or(|r| !Arc::ptr_eq(&r.file, &file)));
        Ok(())
    }
}
