//! The per-stream tier manifest: which of a stream's files the cold tier holds, verified.
//!
//! File `tier` in the stream's directory, replaced whole (written to `tier.tmp`, synced, renamed,
//! directory synced), so a crash leaves the old manifest or the new one, never a mix. An object
//! is listed only after its upload was read back and checked, so whatever the manifest lists is
//! in the tier; an object the tier holds that the manifest does not list (an upload cut short)
//! is uploaded again under the same name.
//! ```text
//!  0..4   magic "BRKT"
//!  4..8   format version (u32 LE) = 1
//!  8..    incarnation str, entry count (u32 LE), entries, crc32 of every byte before it (u32 LE)
//! entry   kind u8: 1 segment, 2 snapshot
//!   segment   base offset, end offset (each messages u64 + bytes u64), log crc32 u32,
//!             index length u64, index crc32 u32
//!   snapshot  offset, blob length u64, blob crc32 u32
//! ```
//! Strings are a `u32` length and UTF-8 bytes (as everywhere in brook's files).

use std::io::Write;
use std::path::Path;

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::name::Offset;

const MAGIC: &[u8; 4] = b"BRKT";
const VERSION: u32 = 1;

/// The manifest's file name in a stream directory.
pub(crate) const FILE: &str = "tier";

/// A sealed segment the tier holds: its log (`end - base` bytes) and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentEntry {
    /// The segment's first position (its file name is `base.bytes`).
    pub(crate) base: Offset,
    /// The position after its last message (the next segment's base).
    pub(crate) end: Offset,
    /// crc32 of the log's bytes.
    pub(crate) log_crc: u32,
    /// The index's length uploaded (header and one entry per message).
    pub(crate) idx_len: u64,
    /// crc32 of those index bytes.
    pub(crate) idx_crc: u32,
}

/// A snapshot blob the tier holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotEntry {
    /// The snapshot's offset (its file name).
    pub(crate) offset: Offset,
    /// The blob's length.
    pub(crate) len: u64,
    /// crc32 of the blob.
    pub(crate) crc: u32,
}

/// A stream's tier manifest: its objects in the tier, for one incarnation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// The incarnation the objects belong to (a manifest of another one lists nothing of this).
    pub(crate) incarnation: String,
    /// Segments, in position order.
    pub(crate) segments: Vec<SegmentEntry>,
    /// Snapshot blobs.
    pub(crate) snapshots: Vec<SnapshotEntry>,
}

impl Manifest {
    /// An empty manifest of `incarnation`.
    pub(crate) fn new(incarnation: &str) -> Manifest {
        Manifest {
            incarnation: incarnation.to_owned(),
            ..Manifest::default()
        }
    }

    /// The manifest's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.buf.extend_from_slice(MAGIC);
        e.u32(VERSION);
        e.str(&self.incarnation);
        e.u32((self.segments.len() + self.snapshots.len()) as u32);
        for s in &self.segments {
            e.u8(1);
            e.offset(s.base);
            e.offset(s.end);
            e.u32(s.log_crc);
            e.u64(s.idx_len);
            e.u32(s.idx_crc);
        }
        for s in &self.snapshots {
            e.u8(2);
            e.offset(s.offset);
            e.u64(s.len);
            e.u32(s.crc);
        }
        let crc = crc32fast::hash(&e.buf);
        e.u32(crc);
        e.buf
    }

    /// Decodes a manifest; `None` if it is torn, corrupt or of another version.
    pub(crate) fn decode(buf: &[u8]) -> Option<Manifest> {
        let body = buf.get(..buf.len().checked_sub(4)?)?;
        let crc = u32::from_le_bytes(buf.get(body.len()..)?.try_into().ok()?);
        if crc32fast::hash(body) != crc {
            return None;
        }
        let mut d = Dec::new(body);
        if d.take(4)? != MAGIC || d.u32()? != VERSION {
            return None;
        }
        let mut m = Manifest::new(&d.string()?);
        for _ in 0..d.u32()? {
            match d.u8()? {
                1 => m.segments.push(SegmentEntry {
                    base: d.offset()?,
                    end: d.offset()?,
                    log_crc: d.u32()?,
                    idx_len: d.u64()?,
                    idx_crc: d.u32()?,
                }),
                2 => m.snapshots.push(SnapshotEntry {
                    offset: d.offset()?,
                    len: d.u64()?,
                    crc: d.u32()?,
                }),
                _ => return None,
            }
        }
        d.take(1).is_none().then_some(m)
    }
}

/// The manifest in stream directory `dir`: `None` if there is none; `Corrupt` if it does not
/// decode (it is written whole, so damage is not a torn write).
pub(crate) fn load(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(buf) => Manifest::decode(&buf)
            .map(Some)
            .ok_or_else(|| Error::corrupt(path, "tier manifest does not decode")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Replaces the manifest in `dir` durably: `tier.tmp` written and synced, renamed over `tier`,
/// the directory synced.
#[cfg_attr(
    not(any(feature = "tier", test)),
    expect(dead_code, reason = "only the tier writes manifests")
)]
pub(crate) fn store(dir: &Path, m: &Manifest) -> Result<()> {
    let tmp = dir.join("tier.tmp");
    let mut f = crate::fs::create(&tmp)?;
    f.write_all(&m.encode())?;
    crate::fs::sync_all(&f, &tmp)?;
    drop(f);
    crate::fs::rename(&tmp, &dir.join(FILE))?;
    crate::fs::sync_dir(dir)?;
    Ok(())
}

/// The cold segments of stream directory `dir` that a [`SegmentSet`](crate::segment::SegmentSet)
/// opens: every segment the manifest of `incarnation` lists, as (base byte position, log
/// length), whose index is here. Empty without a manifest (or with another incarnation's).
pub(crate) fn cold_segments(dir: &Path, incarnation: &str) -> Result<Vec<(u64, u64)>> {
    let Some(m) = load(dir)? else {
        return Ok(Vec::new());
    };
    if m.incarnation != incarnation {
        return Ok(Vec::new());
    }
    Ok(m.segments
        .iter()
        .filter(|s| dir.join(format!("{:020}.idx", s.base.bytes)).exists())
        .map(|s| (s.base.bytes, s.end.bytes - s.base.bytes))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let mut m = Manifest::new("18c-abc");
        m.segments.push(SegmentEntry {
            base: Offset::new(0, 0),
            end: Offset::new(10, 4096),
            log_crc: 7,
            idx_len: 32 + 160,
            idx_crc: 9,
        });
        m.snapshots.push(SnapshotEntry {
            offset: Offset::new(10, 4096),
            len: 12,
            crc: 3,
        });
        let buf = m.encode();
        assert_eq!(Manifest::decode(&buf), Some(m.clone()));
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert_eq!(Manifest::decode(&bad), None, "byte {i}");
        }
        assert_eq!(Manifest::decode(&buf[..buf.len() - 1]), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        store(dir.path(), &m).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(m));
        std::fs::write(dir.path().join("00000000000000000000.idx"), b"").unwrap();
        assert_eq!(
            cold_segments(dir.path(), "18c-abc").unwrap(),
            vec![(0, 4096)]
        );
        assert!(cold_segments(dir.path(), "other").unwrap().is_empty());
    }
}
