//! A stream's state (configuration, tail, closure, Stream-Seq, producer table, snapshots, forks)
//! and the pure functions that check a request against it and apply a journal record to it.
//!
//! The whole order of checks for an append (DESIGN.md, "Order of checks") is
//! [`StreamState::order_of_checks`]; the engine runs it on the *staged* state under the stream's
//! `core` lock, after the request's syntax checks (row 0: [`filter_stream_seq`],
//! [`validate_producer`], the body size) and with the body already converted by
//! [`prepare_body`] outside the lock (its failure is reported only at row 9).
//!
//! The same `apply` runs when the journal thread commits a record and when recovery replays it,
//! so the state a checkpoint stores is exactly the state replay would rebuild.
//!
//! An append body's stored form ([`Body`]) and the conversion to it ([`prepare_body`]) are in
//! `body`; the unit tests in `tests`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::codec::{Dec, Enc};
use crate::digest::{BodyDigest, TailMatch};
use crate::error::{Error, Result};
use crate::name::{Incarnation, Offset};
use crate::retention::RetentionPolicy;
use crate::types::{AppendStatus, Expiry, Producer, SnapshotInfo};

mod body;
mod producer;
#[cfg(test)]
mod tests;

pub(crate) use body::{Body, prepare_body};
pub(crate) use producer::Producers;

/// Bit 0 of the state's flags byte: soft-deleted (the byte was that bool before it had flags).
const FLAG_SOFT_DELETED: u8 = 1;
/// Bit 1 of the state's flags byte: a retention policy follows the byte.
const FLAG_RETENTION: u8 = 2;

/// Longest Stream-Seq value (the seed: at most 256 bytes).
pub(crate) const MAX_STREAM_SEQ: usize = 256;
/// Longest producer id.
pub(crate) const MAX_PRODUCER_ID: usize = 256;
/// Largest producer epoch or sequence number (2^53 - 1, for JavaScript clients).
pub(crate) const MAX_PRODUCER_NUM: u64 = (1 << 53) - 1;

/// A stream incarnation's fixed configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) incarnation: String,
    pub(crate) content_type: String,
    pub(crate) expiry: Expiry,
    /// Source stream name and the divergence point, for a fork.
    pub(crate) fork: Option<(String, Offset)>,
    /// The stream's own retention policy (the store's default fills what it leaves unset).
    pub(crate) retention: RetentionPolicy,
}

/// One producer's position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProducerState {
    pub(crate) epoch: u64,
    pub(crate) seq: u64,
    /// The tail right after this producer's newest accepted write.
    pub(crate) tail: Offset,
    /// The digest the claim of this epoch (its seq 0) carried, if any (`producer`).
    pub(crate) claim_digest: Option<BodyDigest>,
    /// The digest the newest accepted write carried, if any.
    pub(crate) newest_digest: Option<BodyDigest>,
}

/// Everything a stream is, besides its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamState {
    /// Fixed per incarnation, so one copy is shared by the stream's states (staged, applied)
    /// and the stream itself.
    pub(crate) config: Arc<Config>,
    /// First offset held by the stream's own segments (the fork point, or zero).
    pub(crate) base: Offset,
    pub(crate) tail: Offset,
    pub(crate) closed: bool,
    pub(crate) stream_seq: Option<String>,
    pub(crate) producers: Producers,
    /// Earliest readable offset (retention).
    pub(crate) earliest: Offset,
    /// Published snapshots, ascending by offset.
    pub(crate) snapshots: Vec<SnapshotInfo>,
    /// Names of forks that read from this stream (may list forks already deleted; checked lazily).
    pub(crate) forks: BTreeSet<String>,
    /// Deleted by a client but kept for its forks.
    pub(crate) soft_deleted: bool,
}

/// Keeps a Stream-Seq value only if every byte is printable ASCII (the seed: other values are
/// ignored, as if absent); refuses values longer than [`MAX_STREAM_SEQ`].
pub(crate) fn filter_stream_seq(v: Option<String>) -> Result<Option<String>> {
    match v {
        Some(s) if !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) => Ok(None),
        Some(s) if s.len() > MAX_STREAM_SEQ => Err(Error::TooLarge(format!(
            "Stream-Seq is longer than {MAX_STREAM_SEQ} bytes"
        ))),
        other => Ok(other),
    }
}

/// Validates a producer tuple's bounds.
pub(crate) fn validate_producer(p: &Producer) -> Result<()> {
    if p.id.is_empty() || p.id.len() > MAX_PRODUCER_ID {
        return Err(Error::InvalidArgument(format!(
            "Producer-Id must be 1 to {MAX_PRODUCER_ID} bytes"
        )));
    }
    if p.epoch > MAX_PRODUCER_NUM || p.seq > MAX_PRODUCER_NUM {
        return Err(Error::InvalidArgument(
            "Producer-Epoch and Producer-Seq must be at most 2^53-1".into(),
        ));
    }
    Ok(())
}

/// An append as the checks see it.
pub(crate) struct AppendCheck<'a> {
    /// The body converted by [`prepare_body`], or why it could not be (reported at row 9).
    pub(crate) body: &'a Result<Body>,
    /// The request carries data (a non-empty body).
    pub(crate) has_data: bool,
    /// The request's normalized content type, if it named one.
    pub(crate) content_type: Option<&'a str>,
    /// The request closes the stream.
    pub(crate) close: bool,
    /// The request's Stream-Seq, already filtered by [`filter_stream_seq`].
    pub(crate) stream_seq: Option<&'a str>,
    /// The request's producer, already bounds-checked by [`validate_producer`].
    pub(crate) producer: Option<&'a Producer>,
    /// The producer write's digest (`Producer-Digest`), and whether the body hashes to it
    /// (computed outside the lock; reported at row 9).
    pub(crate) digest: Option<(&'a BodyDigest, bool)>,
    /// The tail precondition, if any (row 4b).
    pub(crate) expect_tail: Option<&'a TailMatch>,
}

/// Checks a caller's `expect`ed incarnation against the stream's `current` one (row 3 of the
/// order of checks, and the same check on every other request that names an incarnation).
pub(crate) fn check_incarnation(current: &str, expect: Option<&Incarnation>) -> Result<()> {
    match expect {
        Some(e) if e.as_str() != current => Err(Error::IncarnationMismatch {
            current: Incarnation::from_raw(current.to_owned()),
        }),
        _ => Ok(()),
    }
}

/// What the checks decided for an append that is not refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing to write; answer with this status.
    Answer(AppendStatus),
    /// Write it.
    Accept,
}

impl StreamState {
    /// The state of a new, empty incarnation whose own data starts at `base` (a fork's
    /// divergence point, or zero).
    pub(crate) fn new(config: Config, base: Offset) -> Self {
        StreamState {
            config: Arc::new(config),
            base,
            tail: base,
            closed: false,
            stream_seq: None,
            producers: Producers::default(),
            earliest: Offset::ZERO,
            snapshots: Vec::new(),
            forks: BTreeSet::new(),
            soft_deleted: false,
        }
    }

    /// Runs the whole order of checks for an append (DESIGN.md, "Order of checks") on this
    /// staged state, first failure wins:
    ///
    /// 1. the stream still exists (`gone`: deleted or expired since it was looked up) — `NotFound`;
    /// 2. it is not soft-deleted — `Gone`;
    /// 3. `expect`, if given, is its incarnation — `IncarnationMismatch`;
    /// 4. to 9. the guards of [`StreamState::check_append`].
    ///
    /// Row 0 (header syntax and body size) runs before the stream is looked up. The expiry half
    /// of row 1 is decided by the engine when it looks the stream up, before this, because
    /// expiring a stream deletes it (under the registry lock, which ranks above `core`); so a
    /// soft-deleted stream answers `Gone` even once it is past its expiry.
    ///
    /// Pure: a refusal changes nothing, and the caller applies an accepted append itself.
    pub(crate) fn order_of_checks(
        &self,
        gone: bool,
        expect: Option<&Incarnation>,
        req: &AppendCheck<'_>,
    ) -> Result<Decision> {
        if gone {
            return Err(Error::NotFound);
        }
        if self.soft_deleted {
            return Err(Error::Gone);
        }
        check_incarnation(&self.config.incarnation, expect)?;
        self.check_append(req)
    }

    /// Rows 4 to 9 of the order of checks, for a stream that exists in the expected incarnation:
    /// producer duplicate (and its identity), the tail precondition, closed, content type,
    /// producer validity, Stream-Seq, body validation.
    pub(crate) fn check_append(&self, req: &AppendCheck<'_>) -> Result<Decision> {
        let known = req
            .producer
            .and_then(|p| self.producers.get(&p.id).map(|s| (p, s)));
        if let Some((p, s)) = known
            && p.epoch == s.epoch
            && p.seq <= s.seq
        {
            producer::check_identity(p, req.digest.map(|(d, _)| d), s)?;
            let original_tail = (p.seq == s.seq).then_some(s.tail);
            return Ok(Decision::Answer(AppendStatus::Duplicate { original_tail }));
        }
        if let Some(t) = req.expect_tail
            && (t.incarnation.as_str() != self.config.incarnation
                || t.tail != self.tail
                || t.closed != self.closed)
        {
            return Err(Error::TailMoved {
                incarnation: Incarnation::from_raw(self.config.incarnation.clone()),
                tail: self.tail,
                closed: self.closed,
            });
        }
        if self.closed {
            if !req.has_data && req.close {
                return Ok(Decision::Answer(AppendStatus::AlreadyClosed));
            }
            return Err(Error::StreamClosed { tail: self.tail });
        }
        if req.has_data
            && let Some(ct) = req.content_type
            && ct != self.config.content_type
        {
            return Err(Error::ContentTypeMismatch {
                expected: self.config.content_type.clone(),
            });
        }
        if let Some(p) = req.producer {
            match self.producers.get(&p.id) {
                None if p.seq != 0 => {
                    return Err(Error::ProducerSeqGap {
                        expected: 0,
                        received: p.seq,
                    });
                }
                None => {}
                Some(s) if p.epoch < s.epoch => {
                    return Err(Error::ProducerEpochStale { current: s.epoch });
                }
                Some(s) if p.epoch > s.epoch && p.seq != 0 => {
                    return Err(Error::ProducerEpochSeqNotZero);
                }
                Some(s) if p.epoch == s.epoch && p.seq != s.seq + 1 => {
                    return Err(Error::ProducerSeqGap {
                        expected: s.seq + 1,
                        received: p.seq,
                    });
                }
                Some(_) => {}
            }
        }
        if let (Some(new), Some(last)) = (req.stream_seq, self.stream_seq.as_deref())
            && new.as_bytes() <= last.as_bytes()
        {
            return Err(Error::StreamSeqConflict {
                tail: self.tail,
                last_seq: last.to_owned(),
            });
        }
        if let Some((_, false)) = req.digest {
            return Err(Error::ProducerDigestMismatch);
        }
        match req.body {
            Err(e) => Err(clone_body_error(e)),
            Ok(_) if !req.has_data && !req.close => Err(Error::EmptyAppend),
            Ok(_) => Ok(Decision::Accept),
        }
    }

    /// Applies an accepted append: data, closure, Stream-Seq and producer position together.
    pub(crate) fn apply_append(&mut self, rec: &AppendRecord) {
        self.tail = Offset::new(
            self.tail.messages + rec.body.messages(),
            self.tail.bytes + rec.body.data.len() as u64,
        );
        if rec.close {
            self.closed = true;
        }
        if let Some(s) = &rec.stream_seq {
            self.stream_seq = Some(s.clone());
        }
        if let Some(p) = &rec.producer {
            let claim_digest = producer::claim_after(p, rec.digest, self.producers.get(&p.id));
            self.producers.set(
                &p.id,
                ProducerState {
                    epoch: p.epoch,
                    seq: p.seq,
                    tail: self.tail,
                    claim_digest,
                    newest_digest: rec.digest,
                },
            );
        }
    }

    /// The newest published snapshot, if any.
    pub(crate) fn latest_snapshot(&self) -> Option<&SnapshotInfo> {
        self.snapshots.last()
    }

    /// Checks a snapshot publication at `offset` against this state, as far as it can be
    /// checked without the blob: `offset` within the retained data (`OffsetBeyondTail`,
    /// `OffsetGone`), `expect_digest` is the latest snapshot's (`SnapshotMatchFailed`), and not
    /// older than the latest snapshot unless it republishes one at the same offset
    /// (`SnapshotStale`). Whether a republication matches is up to the caller, which has the
    /// blob's digest.
    pub(crate) fn check_snapshot(&self, offset: Offset, expect_digest: Option<&str>) -> Result<()> {
        let latest = self.latest_snapshot();
        let republish = self
            .snapshots
            .iter()
            .any(|x| x.offset.bytes == offset.bytes);
        if offset.bytes > self.tail.bytes {
            return Err(Error::OffsetBeyondTail { tail: self.tail });
        }
        if offset.bytes < self.earliest.bytes {
            return Err(Error::OffsetGone {
                earliest: self.earliest,
            });
        }
        if expect_digest.is_some_and(|want| latest.map(|l| l.digest.as_str()) != Some(want)) {
            return Err(Error::SnapshotMatchFailed {
                current: latest.map(|l| l.digest.clone()),
            });
        }
        if let Some(l) = latest.filter(|l| l.offset.bytes > offset.bytes && !republish) {
            return Err(Error::SnapshotStale { latest: l.offset });
        }
        Ok(())
    }

    /// Adds a published snapshot (a replayed one already present is left as it is), keeping
    /// the list sorted by offset.
    pub(crate) fn apply_snapshot(&mut self, info: &SnapshotInfo) {
        if !self.snapshots.iter().any(|s| s.offset == info.offset) {
            self.snapshots.push(info.clone());
            self.snapshots.sort_by_key(|s| s.offset);
        }
    }

    /// Moves the earliest readable offset forward to `to` (never back) and forgets snapshots
    /// older than it, except the newest.
    pub(crate) fn apply_retention(&mut self, to: Offset) {
        if to > self.earliest {
            self.earliest = to;
        }
        let earliest = self.earliest;
        // Snapshots older than the retained start can no longer be bootstrapped from; keep the newest.
        let latest = self.snapshots.last().map(|s| s.offset);
        self.snapshots
            .retain(|s| s.offset >= earliest || Some(s.offset) == latest);
    }

    /// Encodes the state as a sidecar payload (layout in DESIGN.md, "Sidecar").
    pub(crate) fn encode(&self, e: &mut Enc) {
        let c = &self.config;
        e.str(&c.name);
        e.str(&c.incarnation);
        e.str(&c.content_type);
        encode_expiry(e, &c.expiry);
        match &c.fork {
            None => e.u8(0),
            Some((src, at)) => {
                e.u8(1);
                e.str(src);
                e.offset(*at);
            }
        }
        e.offset(self.base);
        e.offset(self.tail);
        e.u8(u8::from(self.closed));
        e.opt_str(self.stream_seq.as_deref());
        e.u32(self.producers.len() as u32);
        for (id, p) in self.producers.iter() {
            e.str(id);
            e.u64(p.epoch);
            e.u64(p.seq);
            e.offset(p.tail);
        }
        e.offset(self.earliest);
        e.u32(self.snapshots.len() as u32);
        for s in &self.snapshots {
            encode_snapshot(e, s);
        }
        e.u32(self.forks.len() as u32);
        for f in &self.forks {
            e.str(f);
        }
        // The flags byte: old states wrote only the soft-deleted bool here, so a state without a
        // policy or digests encodes exactly as before and every stored state still decodes.
        let policy = !c.retention.is_empty();
        let digests = producer::any_digest(&self.producers);
        let mut flags = 0;
        if self.soft_deleted {
            flags |= FLAG_SOFT_DELETED;
        }
        if policy {
            flags |= FLAG_RETENTION;
        }
        if digests {
            flags |= producer::HAS_DIGESTS;
        }
        e.u8(flags);
        if policy {
            c.retention.encode(e);
        }
        if digests {
            producer::encode_digests(e, &self.producers);
        }
    }

    /// Decodes a sidecar payload written by [`StreamState::encode`]; `None` if it is malformed.
    pub(crate) fn decode(d: &mut Dec<'_>) -> Option<StreamState> {
        let mut config = Config {
            name: d.string()?,
            incarnation: d.string()?,
            content_type: d.string()?,
            expiry: decode_expiry(d)?,
            fork: match d.u8()? {
                0 => None,
                1 => Some((d.string()?, d.offset()?)),
                _ => return None,
            },
            retention: RetentionPolicy::default(),
        };
        let base = d.offset()?;
        let tail = d.offset()?;
        let closed = d.u8()? != 0;
        let stream_seq = d.opt_string()?;
        let n = d.u32()?;
        let mut producers = Producers::default();
        for _ in 0..n {
            let id = d.string()?;
            producers.set(
                &id,
                ProducerState {
                    epoch: d.u64()?,
                    seq: d.u64()?,
                    tail: d.offset()?,
                    claim_digest: None,
                    newest_digest: None,
                },
            );
        }
        let earliest = d.offset()?;
        let n = d.u32()?;
        let mut snapshots = Vec::new();
        for _ in 0..n {
            snapshots.push(decode_snapshot(d)?);
        }
        let n = d.u32()?;
        let mut forks = BTreeSet::new();
        for _ in 0..n {
            forks.insert(d.string()?);
        }
        let flags = d.u8()?;
        if flags & !(FLAG_SOFT_DELETED | FLAG_RETENTION | producer::HAS_DIGESTS) != 0 {
            return None;
        }
        let soft_deleted = flags & FLAG_SOFT_DELETED != 0;
        if flags & FLAG_RETENTION != 0 {
            config.retention = RetentionPolicy::decode(d)?;
        }
        if flags & producer::HAS_DIGESTS != 0 {
            producer::decode_digests(d, &mut producers)?;
        }
        Some(StreamState {
            config: Arc::new(config),
            base,
            tail,
            closed,
            stream_seq,
            producers,
            earliest,
            snapshots,
            forks,
            soft_deleted,
        })
    }
}

/// The state change an append carries, as journaled.
#[derive(Clone, Debug)]
pub(crate) struct AppendRecord {
    pub(crate) start: Offset,
    pub(crate) body: Body,
    pub(crate) close: bool,
    pub(crate) stream_seq: Option<String>,
    pub(crate) producer: Option<Producer>,
    /// The producer write's digest (`Producer-Digest`); only with `producer`.
    pub(crate) digest: Option<BodyDigest>,
}

/// A copy of a [`prepare_body`] failure (which only ever fails with the variants kept here).
fn clone_body_error(e: &Error) -> Error {
    match e {
        Error::InvalidJson(s) => Error::InvalidJson(s.clone()),
        Error::EmptyJsonArray => Error::EmptyJsonArray,
        Error::TooLarge(s) => Error::TooLarge(s.clone()),
        other => Error::InvalidArgument(other.to_string()),
    }
}

/// Encodes an expiry: `u8` 0 never, 1 then TTL seconds `u64`, 2 then ms since the epoch `u64`.
pub(crate) fn encode_expiry(e: &mut Enc, x: &Expiry) {
    match x {
        Expiry::Never => e.u8(0),
        Expiry::Ttl(s) => {
            e.u8(1);
            e.u64(*s);
        }
        Expiry::At(t) => {
            e.u8(2);
            e.u64(
                t.duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            );
        }
    }
}

/// Decodes an expiry written by [`encode_expiry`]; `None` if it is malformed.
pub(crate) fn decode_expiry(d: &mut Dec<'_>) -> Option<Expiry> {
    Some(match d.u8()? {
        0 => Expiry::Never,
        1 => Expiry::Ttl(d.u64()?),
        2 => Expiry::At(UNIX_EPOCH + Duration::from_millis(d.u64()?)),
        _ => return None,
    })
}

/// Encodes a snapshot's description: offset, digest, content type, length.
pub(crate) fn encode_snapshot(e: &mut Enc, s: &SnapshotInfo) {
    e.offset(s.offset);
    e.str(&s.digest);
    e.str(&s.content_type);
    e.u64(s.len);
}

/// Decodes a snapshot's description written by [`encode_snapshot`]; `None` if malformed.
pub(crate) fn decode_snapshot(d: &mut Dec<'_>) -> Option<SnapshotInfo> {
    Some(SnapshotInfo {
        offset: d.offset()?,
        digest: d.string()?,
        content_type: d.string()?,
        len: d.u64()?,
    })
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Truncates an instant to whole milliseconds (the precision brook stores).
pub(crate) fn to_ms(t: SystemTime) -> SystemTime {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    UNIX_EPOCH + Duration::from_millis(ms)
}
