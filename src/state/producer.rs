//! The identity of a producer's writes (Ursula 0.11's `Producer-Digest`) and its place in the
//! stream state's encoding.
//!
//! A producer's record keeps the digest of its epoch's claim (seq 0) and of its newest write,
//! each `None` when that write carried none. A repeat of either is answered as a duplicate only
//! when its digest is the kept one, an absent digest matching only an absent one; a repeat of a
//! write in between is not checked (its digest is not kept), as Ursula's evaluation table has it.
//!
//! The digests ride in the stream state's encoding after its last field, behind bit 1 of the
//! soft-deletion byte, which is written only when some producer kept a digest: a state without
//! digests encodes exactly as before (layout in DESIGN.md, "Sidecar").
//! ```text
//! count u32, then per producer with a digest: id str, mask u8 (bit 0 claim, bit 1 newest),
//!   the claim's 32 bytes if bit 0, the newest write's 32 bytes if bit 1
//! ```

use std::collections::BTreeMap;

use crate::codec::{Dec, Enc};
use crate::digest::BodyDigest;
use crate::error::{Error, Result};
use crate::types::Producer;

use super::ProducerState;

/// Bit 2 of the state's flags byte: a digest table follows the byte (after the retention
/// policy, when bit 1 says one is there).
pub(super) const HAS_DIGESTS: u8 = 4;

/// Refuses a repeat of a kept write (the claim, or the newest write) whose identity is not the
/// kept one: `ProducerKeyConflict` with the producer's epoch. `p` has `s`'s epoch and a seq at
/// or below `s.seq` (a duplicate by key).
pub(super) fn check_identity(
    p: &Producer,
    digest: Option<&BodyDigest>,
    s: &ProducerState,
) -> Result<()> {
    let kept = if p.seq == 0 {
        Some(s.claim_digest)
    } else if p.seq == s.seq {
        Some(s.newest_digest)
    } else {
        None
    };
    match kept {
        Some(kept) if kept.as_ref() != digest => Err(Error::ProducerKeyConflict { epoch: s.epoch }),
        _ => Ok(()),
    }
}

/// The claim digest a producer's record keeps after `p` applied with `digest`: its own when it
/// claims (seq 0), else the record's.
pub(super) fn claim_after(
    p: &Producer,
    digest: Option<BodyDigest>,
    before: Option<&ProducerState>,
) -> Option<BodyDigest> {
    if p.seq == 0 {
        digest
    } else {
        before.and_then(|s| s.claim_digest)
    }
}

/// Whether any producer keeps a digest (so the state's encoding carries the table).
pub(super) fn any_digest(producers: &BTreeMap<String, ProducerState>) -> bool {
    producers
        .values()
        .any(|p| p.claim_digest.is_some() || p.newest_digest.is_some())
}

/// Encodes the digest table (see the module docs).
pub(super) fn encode_digests(e: &mut Enc, producers: &BTreeMap<String, ProducerState>) {
    let with: Vec<_> = producers
        .iter()
        .filter(|(_, p)| p.claim_digest.is_some() || p.newest_digest.is_some())
        .collect();
    e.u32(with.len() as u32);
    for (id, p) in with {
        e.str(id);
        e.u8(u8::from(p.claim_digest.is_some()) | u8::from(p.newest_digest.is_some()) << 1);
        for d in [p.claim_digest, p.newest_digest].iter().flatten() {
            e.buf.extend_from_slice(d.as_bytes());
        }
    }
}

/// Decodes the digest table into `producers`; `None` if it is malformed or names a producer the
/// state does not have.
pub(super) fn decode_digests(
    d: &mut Dec<'_>,
    producers: &mut BTreeMap<String, ProducerState>,
) -> Option<()> {
    let n = d.u32()?;
    for _ in 0..n {
        let id = d.string()?;
        let mask = d.u8()?;
        if mask == 0 || mask > 3 {
            return None;
        }
        let mut digest = || -> Option<BodyDigest> {
            let bytes: [u8; 32] = d.take(32)?.try_into().ok()?;
            Some(BodyDigest::from_bytes(bytes))
        };
        let claim = if mask & 1 != 0 { Some(digest()?) } else { None };
        let newest = if mask & 2 != 0 { Some(digest()?) } else { None };
        let p = producers.get_mut(&id)?;
        p.claim_digest = claim;
        p.newest_digest = newest;
    }
    Some(())
}
