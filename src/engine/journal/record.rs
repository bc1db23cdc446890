//! Journal records: what each kind carries and how it is encoded in a frame's payload.

use std::sync::Arc;

use super::FRAME_HEADER;
use crate::codec::{Dec, Enc};
use crate::name::Offset;
use crate::state::{AppendRecord, Body, StreamState, decode_snapshot, encode_snapshot};
use crate::types::{Producer, SnapshotInfo};

/// The smallest one-message body whose CRC the journal computes apart and folds into its
/// frame's (see `Record::encode_frame`); below it, hashing the frame in one pass is cheaper.
pub(super) const COMBINE_MIN: usize = 2048;

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
