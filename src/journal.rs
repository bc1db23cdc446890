//! Journal records and journal files.
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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::name::Offset;
use crate::state::{AppendRecord, Body, StreamState, decode_snapshot, encode_snapshot};
use crate::types::{Producer, SnapshotInfo};

pub(crate) const MAGIC: &[u8; 4] = b"BRKJ";
/// The journal format this build writes: 2 added the placed append (kind 7); 3 added the
/// retention policy to the stream state of a Create record (flag bit 1 of its last byte,
/// DESIGN.md 2.3) and the producer digest (producer tag 2, and digests in a stream state, flag
/// bit 2), which older readers would misread or take for a damaged frame and end the journal at.
pub(crate) const VERSION: u32 = 3;
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

/// The smallest one-message body whose CRC the journal computes apart and folds into its
/// frame's (see `Record::encode_frame`); below it, hashing the frame in one pass is cheaper.
const COMBINE_MIN: usize = 2048;

/// The smallest body that Buffered mode writes once, to its segment, rather than into its journal
/// frame as well (see [`Placed`]).
pub(crate) const PLACE_MIN: usize = 2048;

/// An append whose body is written only to its stream's segment log, not into its journal
/// frame (Buffered mode, bodies of [`PLACE_MIN`] bytes or more: DESIGN.md 2.2 and 3). The frame
/// keeps what recovery needs to find and check the bytes: their length and CRC-32 (the body's
/// start and message ends are in the record, as for any append). The writer puts the bytes in
/// the segment log before the batch is acknowledged.
///
/// A decoded placed record's body holds its message ends but no bytes (`data` is empty):
/// replay reads them from the segment ([`crate::segment::SegmentSet::adopt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) len: u32,
    pub(crate) crc: u32,
}

/// One journaled change.
#[derive(Clone, Debug)]
pub(crate) enum Record {
    /// A stream came to be: its whole initial state, and its initial data.
    Create {
        state: Box<StreamState>,
        initial: AppendRecord,
    },
    /// Data and/or closure, with the state change it guards; `placed` when the body's bytes are
    /// in the segment log only.
    Append {
        name: Arc<str>,
        incarnation: Arc<str>,
        rec: AppendRecord,
        placed: Option<Placed>,
    },
    /// The stream was deleted (`soft`: kept for its forks).
    Delete {
        name: Arc<str>,
        incarnation: Arc<str>,
        soft: bool,
    },
    /// A snapshot was published (its blob file is already durable).
    Snapshot {
        name: Arc<str>,
        incarnation: Arc<str>,
        info: SnapshotInfo,
    },
    /// Retention advanced.
    Retention {
        name: Arc<str>,
        incarnation: Arc<str>,
        to: Offset,
    },
    /// A fork of this stream was added or removed.
    ForkRef {
        name: Arc<str>,
        incarnation: Arc<str>,
        fork: String,
        add: bool,
    },
}

impl Record {
    /// The stream the record is about.
    pub(crate) fn name(&self) -> &str {
        match self {
            Record::Create { state, .. } => &state.config.name,
            Record::Append { name, .. }
            | Record::Delete { name, .. }
            | Record::Snapshot { name, .. }
            | Record::Retention { name, .. }
            | Record::ForkRef { name, .. } => name,
        }
    }

    /// The incarnation the record applies to.
    pub(crate) fn incarnation(&self) -> &str {
        match self {
            Record::Create { state, .. } => &state.config.incarnation,
            Record::Append { incarnation, .. }
            | Record::Delete { incarnation, .. }
            | Record::Snapshot { incarnation, .. }
            | Record::Retention { incarnation, .. }
            | Record::ForkRef { incarnation, .. } => incarnation,
        }
    }

    /// Appends the record's frame to `out`; returns the frame length.
    pub(crate) fn encode_frame(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER]);
        let mut e = Enc::with(std::mem::take(out));
        // Where an append's body bytes landed in `out`, for the CRC below.
        let mut body_at = None;
        match self {
            Record::Create { state, initial } => {
                e.u8(1);
                state.encode(&mut e);
                body_at = Some((encode_append(&mut e, initial), &initial.body));
            }
            Record::Append {
                name,
                incarnation,
                rec,
                placed: None,
            } => {
                e.u8(2);
                e.str(name);
                e.str(incarnation);
                body_at = Some((encode_append(&mut e, rec), &rec.body));
            }
            Record::Append {
                name,
                incarnation,
                rec,
                placed: Some(p),
            } => {
                e.u8(7);
                e.str(name);
                e.str(incarnation);
                encode_placed(&mut e, rec, *p);
            }
            Record::Delete {
                name,
                incarnation,
                soft,
            } => {
                e.u8(3);
                e.str(name);
                e.str(incarnation);
                e.u8(u8::from(*soft));
            }
            Record::Snapshot {
                name,
                incarnation,
                info,
            } => {
                e.u8(4);
                e.str(name);
                e.str(incarnation);
                encode_snapshot(&mut e, info);
            }
            Record::Retention {
                name,
                incarnation,
                to,
            } => {
                e.u8(5);
                e.str(name);
                e.str(incarnation);
                e.offset(*to);
            }
            Record::ForkRef {
                name,
                incarnation,
                fork,
                add,
            } => {
                e.u8(6);
                e.str(name);
                e.str(incarnation);
                e.str(fork);
                e.u8(u8::from(*add));
            }
        }
        *out = e.buf;
        let payload_len = out.len() - start - FRAME_HEADER;
        let crc = match body_at {
            // A large one-message body is hashed once: its CRC is folded into the frame's
            // (`combine` costs one carry-less multiply per set bit of the length) and kept for
            // the segment index, which would hash the same bytes again.
            Some((at, body)) if body.ends.len() == 1 && body.data.len() >= COMBINE_MIN => {
                let end = at + body.data.len();
                let mut data = crc32fast::Hasher::new();
                data.update(&out[at..end]);
                let _ = body.crc.set(data.clone().finalize());
                let mut frame = crc32fast::Hasher::new();
                frame.update(&out[start + FRAME_HEADER..at]);
                frame.combine(&data);
                frame.update(&out[end..]);
                frame.finalize()
            }
            _ => crc32fast::hash(&out[start + FRAME_HEADER..]),
        };
        out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        out.len() - start
    }

    /// Decodes one payload (already CRC-checked).
    pub(crate) fn decode(payload: &[u8]) -> Option<Record> {
        let mut d = Dec::new(payload);
        let rec = match d.u8()? {
            1 => {
                let state = StreamState::decode(&mut d)?;
                Record::Create {
                    state: Box::new(state),
                    initial: decode_append(&mut d)?,
                }
            }
            2 => Record::Append {
                name: d.string()?.into(),
                incarnation: d.string()?.into(),
                rec: decode_append(&mut d)?,
                placed: None,
            },
            7 => {
                let name = d.string()?.into();
                let incarnation = d.string()?.into();
                let (rec, placed) = decode_placed(&mut d)?;
                Record::Append {
                    name,
                    incarnation,
                    rec,
                    placed: Some(placed),
                }
            }
            3 => Record::Delete {
                name: d.string()?.into(),
                incarnation: d.string()?.into(),
                soft: d.u8()? != 0,
            },
            4 => Record::Snapshot {
                name: d.string()?.into(),
                incarnation: d.string()?.into(),
                info: decode_snapshot(&mut d)?,
            },
            5 => Record::Retention {
                name: d.string()?.into(),
                incarnation: d.string()?.into(),
                to: d.offset()?,
            },
            6 => Record::ForkRef {
                name: d.string()?.into(),
                incarnation: d.string()?.into(),
                fork: d.string()?,
                add: d.u8()? != 0,
            },
            _ => return None,
        };
        d.buf.is_empty().then_some(rec)
    }
}

/// Encodes an append; returns where its body's bytes start in the encoder's buffer.
fn encode_append(e: &mut Enc, r: &AppendRecord) -> usize {
    e.offset(r.start);
    e.u32(r.body.data.len() as u32);
    let at = e.buf.len();
    e.buf.extend_from_slice(&r.body.data);
    encode_ends_and_guards(e, r);
    at
}

/// Encodes a placed append: as [`encode_append`], with the body's length and CRC in place of
/// its bytes.
fn encode_placed(e: &mut Enc, r: &AppendRecord, p: Placed) {
    e.offset(r.start);
    e.u32(p.len);
    e.u32(p.crc);
    encode_ends_and_guards(e, r);
}

/// The part of an append after its data: message ends, closure, Stream-Seq, producer.
fn encode_ends_and_guards(e: &mut Enc, r: &AppendRecord) {
    e.u32(r.body.ends.len() as u32);
    for end in r.body.ends.iter() {
        e.u32(*end);
    }
    e.u8(u8::from(r.close));
    e.opt_str(r.stream_seq.as_deref());
    match &r.producer {
        None => e.u8(0),
        Some(p) => {
            e.u8(if r.digest.is_some() { 2 } else { 1 });
            e.str(&p.id);
            e.u64(p.epoch);
            e.u64(p.seq);
            if let Some(d) = &r.digest {
                e.buf.extend_from_slice(d.as_bytes());
            }
        }
    }
}

fn decode_append(d: &mut Dec<'_>) -> Option<AppendRecord> {
    let start = d.offset()?;
    let data = bytes::Bytes::copy_from_slice(d.bytes()?);
    let len = data.len();
    decode_ends_and_guards(d, start, data, len)
}

/// Decodes a placed append: its record, whose body has message ends but no bytes, and where
/// its bytes are.
fn decode_placed(d: &mut Dec<'_>) -> Option<(AppendRecord, Placed)> {
    let start = d.offset()?;
    let placed = Placed {
        len: d.u32()?,
        crc: d.u32()?,
    };
    if placed.len == 0 {
        return None;
    }
    let rec = decode_ends_and_guards(d, start, bytes::Bytes::new(), placed.len as usize)?;
    Some((rec, placed))
}

/// Decodes what follows an append's data (see [`encode_ends_and_guards`]) for a body of `len`
/// bytes, of which `data` holds all or (a placed body) none.
fn decode_ends_and_guards(
    d: &mut Dec<'_>,
    start: Offset,
    data: bytes::Bytes,
    len: usize,
) -> Option<AppendRecord> {
    let n = d.u32()? as usize;
    let mut ends = Vec::with_capacity(n.min(1 << 20));
    let mut prev = 0;
    for _ in 0..n {
        let end = d.u32()?;
        if end <= prev || end as usize > len {
            return None;
        }
        prev = end;
        ends.push(end);
    }
    if (prev as usize) != len {
        return None;
    }
    let close = d.u8()? != 0;
    let stream_seq = d.opt_string()?;
    let tag = d.u8()?;
    let producer = match tag {
        0 => None,
        1 | 2 => Some(Producer {
            id: d.string()?,
            epoch: d.u64()?,
            seq: d.u64()?,
        }),
        _ => return None,
    };
    let digest = if tag == 2 {
        let bytes: [u8; 32] = d.take(32)?.try_into().ok()?;
        Some(crate::digest::BodyDigest::from_bytes(bytes))
    } else {
        None
    };
    Some(AppendRecord {
        start,
        body: Body::new(data, ends),
        close,
        stream_seq,
        producer,
        digest,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Config;
    use crate::types::Expiry;

    fn append(n: u8) -> Record {
        Record::Append {
            name: "s".into(),
            incarnation: "i".into(),
            rec: AppendRecord {
                start: Offset::new(u64::from(n), u64::from(n)),
                body: Body::new(vec![n; 3].into(), vec![1, 3]),
                close: n.is_multiple_of(2),
                stream_seq: Some(format!("{n:04}")),
                producer: Some(Producer {
                    id: "p".into(),
                    epoch: 1,
                    seq: u64::from(n),
                }),
                digest: n
                    .is_multiple_of(3)
                    .then(|| crate::digest::BodyDigest::of(&[n])),
            },
            placed: None,
        }
    }

    #[test]
    fn frames_round_trip_and_torn_tails_stop_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_path(dir.path(), 100);
        let mut buf = file_header(0, 100, 0);
        let state = StreamState::new(
            Config {
                name: "s".into(),
                incarnation: "i".into(),
                content_type: "a/b".into(),
                expiry: Expiry::Ttl(5),
                fork: None,
                retention: crate::RetentionPolicy::new().max_bytes(1 << 20),
            },
            Offset::ZERO,
        );
        let create = Record::Create {
            state: Box::new(state),
            initial: AppendRecord {
                start: Offset::ZERO,
                body: Body::default(),
                close: false,
                stream_seq: None,
                producer: None,
                digest: None,
            },
        };
        create.encode_frame(&mut buf);
        for n in 0..3 {
            append(n).encode_frame(&mut buf);
        }
        std::fs::write(&path, &buf).unwrap();
        let s = scan(&path, 0).unwrap();
        assert_eq!(s.records.len(), 4);
        assert!(!s.torn);
        assert_eq!(s.end_lsn, 100 + buf.len() as u64 - HEADER_LEN);
        // Every truncation point yields a clean prefix of records.
        for cut in HEADER_LEN as usize..buf.len() {
            std::fs::write(&path, &buf[..cut]).unwrap();
            let s = scan(&path, 0).unwrap();
            assert!(s.records.len() <= 4);
            assert_eq!(
                s.torn,
                !s.records
                    .iter()
                    .any(|(lsn, _)| *lsn == 100 + cut as u64 - HEADER_LEN)
                    && cut > HEADER_LEN as usize
                    && s.end_lsn != 100 + cut as u64 - HEADER_LEN
            );
        }
        // A flipped bit in the last frame drops exactly that record.
        let mut flipped = buf.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x10;
        std::fs::write(&path, &flipped).unwrap();
        let s = scan(&path, 0).unwrap();
        assert_eq!(s.records.len(), 3);
        assert!(s.torn);
        // Space set aside and never written (zeros) is a clean end; a torn frame before
        // zeros is still torn.
        let mut spare = buf.clone();
        spare.resize(buf.len() + 4096, 0);
        std::fs::write(&path, &spare).unwrap();
        let s = scan(&path, 0).unwrap();
        assert_eq!((s.records.len(), s.torn), (4, false));
        assert_eq!(s.end_lsn, 100 + buf.len() as u64 - HEADER_LEN);
        let mut torn = flipped.clone();
        torn.resize(buf.len() + 4096, 0);
        std::fs::write(&path, &torn).unwrap();
        let s = scan(&path, 0).unwrap();
        assert_eq!((s.records.len(), s.torn), (3, true));
    }

    /// A prepared file whose header was lost with the power (all zeros, like the rest of it)
    /// holds nothing; a zero header before a whole, good frame is a damaged file, not that.
    #[test]
    fn a_lost_header_is_an_empty_file_unless_a_record_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_path(dir.path(), 100);
        std::fs::write(&path, vec![0u8; 64 << 10]).unwrap();
        let s = scan(&path, 0).unwrap();
        assert!(s.headerless && s.torn && s.records.is_empty());
        assert_eq!((s.base_lsn, s.end_lsn), (100, 100));
        let mut buf = vec![0u8; HEADER_LEN as usize];
        append(1).encode_frame(&mut buf);
        buf.resize(64 << 10, 0);
        std::fs::write(&path, &buf).unwrap();
        let e = scan(&path, 0).err().expect("a record after a zero header");
        assert!(e.to_string().contains("lost its header"), "{e}");
        // With its header, the same file is one record and a clean end.
        buf[..HEADER_LEN as usize].copy_from_slice(&file_header(0, 100, 0));
        std::fs::write(&path, &buf).unwrap();
        let s = scan(&path, 0).unwrap();
        assert!(!s.headerless && !s.torn);
        assert_eq!(s.records.len(), 1);
    }

    /// A large one-message body's frame CRC, folded from the body's own CRC, is the frame's
    /// CRC computed in one pass, and the body keeps its CRC for the segment index; the frame
    /// scans back intact.
    #[test]
    fn a_large_body_is_hashed_once_and_its_frame_checks() {
        for len in [COMBINE_MIN - 1, COMBINE_MIN, 4096, 4097, 70_001] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let rec = Record::Append {
                name: "s".into(),
                incarnation: "i".into(),
                rec: AppendRecord {
                    start: Offset::new(7, 1),
                    body: Body::new(data.clone().into(), vec![len as u32]),
                    close: false,
                    stream_seq: Some("0001".into()),
                    producer: None,
                    digest: None,
                },
                placed: None,
            };
            let mut out = vec![9u8; 5];
            let n = rec.encode_frame(&mut out);
            let frame = &out[5..5 + n];
            let crc = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
            assert_eq!(crc, crc32fast::hash(&frame[FRAME_HEADER..]), "len {len}");
            let Record::Append { rec: r, .. } = &rec else {
                unreachable!()
            };
            if len >= COMBINE_MIN {
                assert_eq!(r.body.crc.get().copied(), Some(crc32fast::hash(&data)));
            } else {
                assert_eq!(r.body.crc.get(), None);
            }
            assert_eq!(r.body.single_crc(), crc32fast::hash(&data));
            let decoded = Record::decode(&frame[FRAME_HEADER..]).expect("the frame decodes");
            assert!(matches!(decoded, Record::Append { .. }));
        }
    }

    /// A placed append's frame carries its body's length and CRC, not its bytes, and decodes
    /// to the same record with an empty body that keeps its message ends; a placed length that
    /// disagrees with the ends does not decode.
    #[test]
    fn a_placed_append_keeps_its_bytes_out_of_the_frame() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let placed = Placed {
            len: 5000,
            crc: crc32fast::hash(&data),
        };
        let rec = Record::Append {
            name: "s".into(),
            incarnation: "i".into(),
            rec: AppendRecord {
                start: Offset::new(3, 700),
                body: Body::new(data.into(), vec![1000, 5000]),
                close: true,
                stream_seq: Some("0009".into()),
                producer: Some(Producer {
                    id: "p".into(),
                    epoch: 2,
                    seq: 4,
                }),
                digest: Some(crate::digest::BodyDigest::from_bytes([7; 32])),
            },
            placed: Some(placed),
        };
        let mut out = Vec::new();
        let n = rec.encode_frame(&mut out);
        // Without its 32-byte producer digest, under 100 bytes: the body is not in it.
        assert!(n < 132, "a placed frame of {n} bytes");
        let crc = u32::from_le_bytes([out[4], out[5], out[6], out[7]]);
        assert_eq!(crc, crc32fast::hash(&out[FRAME_HEADER..]));
        let Some(Record::Append {
            name,
            incarnation,
            rec: r,
            placed: p,
        }) = Record::decode(&out[FRAME_HEADER..])
        else {
            panic!("the placed frame decodes to an append");
        };
        assert_eq!((&*name, &*incarnation, p), ("s", "i", Some(placed)));
        assert_eq!(r.start, Offset::new(3, 700));
        assert!(r.body.data.is_empty());
        assert_eq!(&*r.body.ends, &[1000, 5000]);
        assert!(r.close);
        assert_eq!(r.stream_seq.as_deref(), Some("0009"));
        assert_eq!(r.producer.map(|p| (p.epoch, p.seq)), Some((2, 4)));
        assert_eq!(
            r.digest,
            Some(crate::digest::BodyDigest::from_bytes([7; 32]))
        );
        // The last end must be the placed length.
        let Record::Append { rec: full, .. } = &rec else {
            unreachable!()
        };
        let wrong = Record::Append {
            name: "s".into(),
            incarnation: "i".into(),
            rec: full.clone(),
            placed: Some(Placed {
                len: 4999,
                ..placed
            }),
        };
        let mut out = Vec::new();
        wrong.encode_frame(&mut out);
        assert!(Record::decode(&out[FRAME_HEADER..]).is_none());
    }
}
