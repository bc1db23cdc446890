//! A stream's own data: a run of segment logs with an mmap'd index each.
//!
//! `{base:020}.log` holds raw message bytes, contiguous, so a catch-up read is a view of the map
//! with no copy. `{base:020}.idx` holds one entry per message:
//! ```text
//! header  0..4   magic "BRKI"
//!         4..8   format version (u32 LE) = 1
//!         8..16  messages before the segment (u64 LE)
//!        16..24  bytes before the segment (u64 LE) (= the number in the file name)
//!        24..32  reserved, 0
//! entry   0..8   end of the message, absolute byte position (u64 LE)
//!         8..12  crc32 of the message's bytes (u32 LE)
//!        12..16  reserved, 0
//! ```
//! The index is derived: the stream's sidecar and journal say how many messages are valid, and
//! an index that disagrees with the log is reported as corruption.
//!
//! | module | what |
//! |---|---|
//! | `log` | one segment: its log and index files, the write buffer, index entries, CRC checks |
//! | `set` | a stream's run of segments (`SegmentSet`): open, replay, append, roll, read, retain |
//! | `mmap` | the only module that maps files: read maps and the file ranges behind them |
//! | `room` | room made in the files for a batch before it reaches the journal (full disk) |

mod log;
mod mmap;
mod room;
mod set;
#[cfg(test)]
mod tests;

pub use mmap::FileRange;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use mmap::ReadMap;
pub(crate) use set::{SegmentRecord, SegmentSet, SegmentUse};

const IDX_MAGIC: &[u8; 4] = b"BRKI";
const IDX_VERSION: u32 = 1;
const IDX_HEADER: u64 = 32;
const ENTRY: u64 = 16;
const MIN_LOG_CAP: u64 = 64 << 10;
const MIN_IDX_ENTRIES: u64 = 1024;

/// A snapshot blob's bytes as a view of its file (mapped, not read into memory), so serving a
/// large snapshot does not hold a copy of it.
pub(crate) fn blob_view(path: &Path) -> Result<Bytes> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    let len = usize::try_from(len)
        .map_err(|_| Error::corrupt(path, "snapshot blob larger than the address space"))?;
    Ok(Bytes::from_owner(mmap::map_blob(file, len)?))
}

fn log_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

fn idx_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

/// Whether `path` names a segment log (whose removal must be durable before its index's: see
/// `discard_all` in the engine).
pub(crate) fn is_log(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_log_name)
        .is_some()
}

/// The base byte position of the segment log named `name`, or `None` if it names none.
pub(crate) fn parse_log_name(name: &str) -> Option<u64> {
    name.strip_suffix(".log")?.parse().ok()
}

/// The base of an index file's name (`{base:020}.idx`).
pub(crate) fn parse_idx_name(name: &str) -> Option<u64> {
    name.strip_suffix(".idx")?.parse().ok()
}

/// A segment's write buffer is written to its log once it holds this much: the bound on the
/// memory a stream's unwritten appends take.
const FLUSH_AT: usize = 16 << 10;

/// What a segment's buffer of index entries may hold whatever its stream's share of the
/// store's write-buffer budget (32 entries): a stream that got no share (the budget taken by
/// others) writes its entries once per this many appends, not at each one (an index write
/// opens the file). Beyond the budget by at most this much per stream with buffers.
const IDX_FLOOR: usize = 512;

/// Once this many bytes were written to a log since its write-back was last asked for, the
/// range is handed to the engine, whose checkpoint thread has the kernel start writing it
/// (`fs::start_writeback`), so a checkpoint's `syncfs` does not find a whole checkpoint's
/// segment bytes dirty at once.
const WRITEBACK_AT: u64 = 1 << 20;

/// Bodies at least this long are written to the log at once (after what is buffered), not
/// copied into the segment's write buffer.
const WRITE_THROUGH: usize = 64 << 10;

/// The cold tier's unit of fetching and caching, in bytes of a segment: whole messages whose
/// starts fall in one aligned `COLD_BLOCK` of the segment (so a block is at most this plus its
/// last message).
pub(crate) const COLD_BLOCK: u64 = 1 << 20;

/// One part of a read, in order: bytes at hand, or a range of a cold block to fetch.
pub(crate) enum Piece {
    /// A view of a local segment's map.
    Local(Bytes),
    /// Bytes `want` (absolute positions) of the cold block `block` of the segment at
    /// `seg_base` (a log of `seg_len` bytes in the tier).
    Cold(ColdPiece),
}

/// A range of a cold block: see [`Piece::Cold`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColdPiece {
    /// The segment's base byte position (its name).
    pub(crate) seg_base: u64,
    /// The segment's log length.
    pub(crate) seg_len: u64,
    /// The block, absolute byte positions: whole messages.
    pub(crate) block: (u64, u64),
    /// The bytes of the read inside the block, absolute.
    pub(crate) want: (u64, u64),
}

/// An owner for a slice of a map, so `Bytes` can point into it without copying.
struct MapSlice {
    map: Arc<ReadMap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MapSlice {
    fn as_ref(&self) -> &[u8] {
        // Ranges are checked against the map's length when the slice is made.
        self.map.get(self.start..self.end).unwrap_or(&[])
    }
}
