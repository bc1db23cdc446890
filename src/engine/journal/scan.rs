//! Reading a journal file back: its header, then frames until the first that does not check.

use std::path::Path;

use super::{FLAG_PREV_UNSYNCED, FRAME_HEADER, HEADER_LEN, MAGIC, OLDEST_VERSION, Record, VERSION};
use crate::codec::Dec;
use crate::error::{Error, Result};

/// The payload of a whole frame, with a good CRC, at `pos` in `bytes`.
fn frame_at(bytes: &[u8], pos: usize) -> Option<&[u8]> {
    let head = bytes.get(pos..pos + FRAME_HEADER)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let payload = bytes.get(pos + FRAME_HEADER..pos + FRAME_HEADER + len)?;
    (len != 0 && crc32fast::hash(payload) == crc).then_some(payload)
}

/// What reading one journal file found.
pub(crate) struct Scanned {
    pub(crate) base_lsn: u64,
    /// Each record with its LSN.
    pub(crate) records: Vec<(u64, Record)>,
    /// LSN just past the last valid frame.
    pub(crate) end_lsn: u64,
    /// Whether bytes after the last valid frame were found (a torn or corrupt tail).
    pub(crate) torn: bool,
    /// The header's flags ([`FLAG_PREV_UNSYNCED`]); a file too short for a header holds no
    /// record, and counts as following an unsynced file.
    pub(crate) flags: u32,
    /// The file has no durable header: too short for one, or a prepared file (see
    /// [`PREPARED`]) whose header, written when it became the journal, was lost with the power
    /// before the first sync of the file. Either way no record in it was ever acknowledged.
    pub(crate) headerless: bool,
}

/// Reads every valid frame of a journal file, stopping at the first torn or corrupt one.
pub(crate) fn scan(path: &Path, shard: u32) -> Result<Scanned> {
    let bytes = std::fs::read(path)?;
    let header_lost = bytes
        .get(..HEADER_LEN as usize)
        .is_none_or(|h| h.iter().all(|&b| b == 0));
    if header_lost && frame_at(&bytes, HEADER_LEN as usize).is_some() {
        // A header lost while a record after it was kept: not a header that never became
        // durable (the first sync of a file makes its header durable with its first record).
        return Err(Error::corrupt(path, "journal file lost its header"));
    }
    if header_lost {
        // A file whose header never became durable: it holds no records.
        let base = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::corrupt(path, "journal file name is not an LSN"))?;
        return Ok(Scanned {
            base_lsn: base,
            records: Vec::new(),
            end_lsn: base,
            torn: !bytes.is_empty(),
            flags: FLAG_PREV_UNSYNCED,
            headerless: true,
        });
    }
    let mut d = Dec::new(&bytes[..HEADER_LEN as usize]);
    let bad = |why: &str| Error::corrupt(path, why.to_owned());
    if d.take(4) != Some(MAGIC) {
        return Err(bad("bad journal magic"));
    }
    if !d
        .u32()
        .is_some_and(|v| (OLDEST_VERSION..=VERSION).contains(&v))
    {
        return Err(bad("unsupported journal version"));
    }
    if d.u32() != Some(shard) {
        return Err(bad("journal file belongs to another shard"));
    }
    let flags = d.u32().ok_or_else(|| bad("short journal header"))?;
    let base_lsn = d.u64().ok_or_else(|| bad("short journal header"))?;
    // The file is named by its base LSN: a header that disagrees is damaged, and trusting it
    // would give records LSNs that checkpoints already cover (or skip ones they do not).
    let named = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse::<u64>().ok());
    if named.is_some_and(|n| n != base_lsn) {
        return Err(bad(
            "journal header's base LSN disagrees with its file name",
        ));
    }
    let mut pos = HEADER_LEN as usize;
    let mut records = Vec::new();
    let mut torn = false;
    while pos < bytes.len() {
        let Some(payload) = frame_at(&bytes, pos) else {
            torn = true;
            break;
        };
        let Some(rec) = Record::decode(payload) else {
            torn = true;
            break;
        };
        pos += FRAME_HEADER + payload.len();
        records.push((base_lsn + pos as u64 - HEADER_LEN, rec));
    }
    if torn && bytes[pos..].iter().all(|&b| b == 0) {
        // Space the writer set aside and never wrote (see `JOURNAL_STEP`): a clean end.
        torn = false;
    }
    Ok(Scanned {
        base_lsn,
        records,
        end_lsn: base_lsn + pos as u64 - HEADER_LEN,
        torn,
        flags,
        headerless: false,
    })
}
