//! The journal, in one place: its records (`record.rs`), its files (their header, names and
//! listing, here) and the scan that reads a file back (`scan.rs`); and the side that writes it:
//! group commit, the write barrier (`commit.rs`), the shard's writer and its thread
//! (`shard.rs`), the free-space reservation before a batch (`space.rs`), poisoning and healing
//! (`poison.rs`), rotation and checkpoints (`checkpoint.rs`) and Sync mode's prepared files
//! (`prepared.rs`). Recovery, which replays it, is the engine's (`recovery.rs`).
//!
//! Every change to a stream is first a record in its shard's journal. A record carries the data
//! *and* the state change it guards (Stream-Seq, producer position, closure) under one CRC, so
//! recovery can never find one without the other.
//!
//! File layout (`journal/{shard:02}/{base_lsn:020}.wal`):
//! ```text
//! header  0..4   magic "BRKJ"
//!         4..8   format version (u32 LE) = 3 (1 and 2 are read too)
//!         8..12  shard (u32 LE)
//!        12..16  flags (u32 LE): bit 0 = FLAG_PREV_UNSYNCED, other bits 0
//!        16..24  base LSN (u64 LE): the LSN of the first record byte
//! frames  [len u32 LE][crc32 u32 LE of payload][payload: len bytes] ...
//! ```
//! An LSN is a position in the shard's endless journal; a record's LSN is the position just past
//! its frame. Payload layouts are in DESIGN.md ("Journal records").

pub(in crate::engine) mod checkpoint;
pub(in crate::engine) mod commit;
pub(crate) mod images;
pub(in crate::engine) mod poison;
pub(in crate::engine) mod prepared;
mod record;
mod scan;
pub(in crate::engine) mod shard;
pub(in crate::engine) mod space;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::codec::Enc;
use crate::error::Result;

pub(crate) use record::{PLACE_MIN, Placed, Record};
pub(crate) use scan::scan;

pub(crate) const MAGIC: &[u8; 4] = b"BRKJ";
/// The journal format this build writes: 2 added the placed append (kind 7); 3 added the
/// retention policy to the stream state of a Create record (flag bit 1 of its last byte,
/// DESIGN.md 2.3) and the producer digest (producer tag 2, and digests in a stream state, flag
/// bit 2), which older readers would misread or take for a damaged frame and end the journal at.
pub(crate) const VERSION: u32 = 4;
/// The oldest journal format this build reads (version 1 has no placed appends).
const OLDEST_VERSION: u32 = 1;
pub(crate) const HEADER_LEN: u64 = 24;
const FRAME_HEADER: usize = 8;

/// The journal's writer grows its file in steps of this many bytes (`set_len`, zeros) ahead of
/// its writes, so a batch's `fdatasync` does not also have to make a new file size durable:
/// about a third less time per sync on this machine's ext4. Recovery reads a zero tail as a
/// clean end, so at most this much is read past a file's last record.
pub(crate) const JOURNAL_STEP: u64 = 4 << 20;

/// The name, in a shard's journal directory, of the next journal file while it is prepared and
/// waits for its turn: zeros written and synced ahead of time (Sync mode), so that a batch's
/// `fdatasync` writes only data blocks, with no block allocation to make durable along with
/// them. A file of this name is never read as a journal; open removes one that is left over.
pub(crate) const PREPARED: &str = "prepared.tmp";

/// Header flag: the file before this one was not synced when this one was started (a Buffered
/// rotation), so it may end torn after a power loss even though it is not the newest. Recovery
/// then ends the journal at that tear and drops this file and every later one, which were never
/// synced either (DESIGN.md 2.2 and 6).
pub(crate) const FLAG_PREV_UNSYNCED: u32 = 1;

/// The header of a new journal file.
pub(crate) fn file_header(shard: u32, base_lsn: u64, flags: u32) -> Vec<u8> {
    let mut e = Enc::default();
    e.buf.extend_from_slice(MAGIC);
    e.u32(VERSION);
    e.u32(shard);
    e.u32(flags);
    e.u64(base_lsn);
    e.buf
}

/// The path of the journal file that starts at `base_lsn`.
pub(crate) fn file_path(dir: &Path, base_lsn: u64) -> PathBuf {
    dir.join(format!("{base_lsn:020}.wal"))
}

/// Journal files in `dir`, ascending by base LSN.
pub(crate) fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".wal")
            && let Ok(base) = stem.parse::<u64>()
        {
            out.push((base, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}
