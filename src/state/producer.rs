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

/// A stream's producers by id, in id order: a sorted vector sized to what it holds. Most
/// streams have one producer or a few, and a stream's state is held up to three times over
/// (staged, applied, and the copy a checkpoint records), where a `BTreeMap`'s first node, with
/// room for eleven, took about 1.4 KiB each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Producers(Vec<(String, ProducerState)>);

impl Producers {
    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(id))
    }

    /// The producer `id`'s state, if it wrote.
    pub(crate) fn get(&self, id: &str) -> Option<&ProducerState> {
        self.find(id).ok().map(|i| &self.0[i].1)
    }

    /// The producer `id`'s state, to change in place.
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut ProducerState> {
        self.find(id).ok().map(|i| &mut self.0[i].1)
    }

    /// Sets the producer `id`'s state (its id copied only when it is new).
    pub(crate) fn set(&mut self, id: &str, state: ProducerState) {
        match self.find(id) {
            Ok(i) => self.0[i].1 = state,
            Err(i) => {
                // A few producers take exactly their room; more grow as a vector does.
                if self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (id.to_owned(), state));
            }
        }
    }

    /// How many producers wrote.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The producers in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ProducerState)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl std::ops::Index<&str> for Producers {
    type Output = ProducerState;

    fn index(&self, id: &str) -> &ProducerState {
        self.get(id).expect("no producer of that id")
    }
}

/// Whether any producer keeps a digest (so the state's encoding carries the table).
pub(super) fn any_digest(producers: &Producers) -> bool {
    producers
        .iter()
        .any(|(_, p)| p.claim_digest.is_some() || p.newest_digest.is_some())
}

/// Encodes the digest table (see the module docs).
pub(super) fn encode_digests(e: &mut Enc, producers: &Producers) {
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
pub(super) fn decode_digests(d: &mut Dec<'_>, producers: &mut Producers) -> Option<()> {
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
