//! Fork-chain reads: positions, boundaries and data of a stream, following its fork chain.
//!
//! A fork's own segments start at its base (the divergence point); every position below the
//! base is its source's, and so on up the chain. Each helper here answers from the stream's own
//! segments at or past its base and recurses into the source (via [`Engine::source_of`]) below
//! it. The recursion ends because a chain is finite and acyclic: a fork is created after its
//! source and names it, and a stream with no fork has base zero, so no position is below it. A
//! soft-deleted source is still found (it is kept for its forks); a missing one is `Corrupt`.
//!
//! Each helper takes one stream's `data` lock at a time, never two at once.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::name::Offset;
use crate::segment::Piece;

use super::Engine;
use super::stream::Stream;

impl Engine {
    /// The source a fork reads its inherited range from (`Corrupt` if `s` is not a fork or its
    /// source is missing: a source with forks is only soft-deleted).
    pub(super) fn source_of(&self, s: &Stream) -> Result<Arc<Stream>> {
        let (src, _) = s
            .config
            .fork
            .as_ref()
            .ok_or_else(|| Error::corrupt(&s.dir, "fork without source"))?;
        self.lookup_source(src)?
            .ok_or_else(|| Error::corrupt(&s.dir, "fork source is missing"))
    }

    /// The offset (messages and bytes) of byte position `pos`, which must be a message boundary.
    ///
    /// Recursion: below the base the source answers. A fork's base itself is answered with its
    /// stored base offset (the source's offset of the fork point), without recursing.
    pub(super) fn offset_at(&self, s: &Arc<Stream>, pos: u64) -> Result<Offset> {
        let base = s.base();
        if pos < base.bytes || (pos == base.bytes && s.config.fork.is_some()) {
            if pos == base.bytes {
                return Ok(base);
            }
            return self.offset_at(&self.source_of(s)?, pos);
        }
        let mut d = s.data.lock();
        Ok(match d.segs.as_mut() {
            Some(g) => g.mapped()?.offset_at(pos),
            None => Offset::new(0, pos),
        })
    }

    /// `o` itself when its message count agrees with its byte position in `s` (as in every
    /// offset `s` issued), else `InvalidOffset`: an offset is one position, not two.
    pub(super) fn check_halves(&self, s: &Arc<Stream>, o: Offset) -> Result<Offset> {
        let canonical = self.offset_at(s, o.bytes)?;
        if canonical != o {
            return Err(Error::InvalidOffset(format!(
                "offset {o} names message {} but byte {}, where {canonical} is",
                o.messages, o.bytes
            )));
        }
        Ok(o)
    }

    /// Whether byte position `pos` is a message boundary (a position brook returned).
    ///
    /// Recursion: the base is a boundary; below it the source decides.
    pub(super) fn is_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<bool> {
        let base = s.base();
        if pos == base.bytes {
            return Ok(true);
        }
        if pos < base.bytes {
            return self.is_boundary(&self.source_of(s)?, pos);
        }
        let mut d = s.data.lock();
        Ok(match d.segs.as_mut() {
            Some(g) => g.mapped()?.is_boundary(pos),
            None => false,
        })
    }

    /// The first message boundary after byte position `pos`, or `None` past the last message.
    ///
    /// Recursion: below the base the source answers, capped at the base (which is always a
    /// boundary of the fork, whatever the source holds past it).
    pub(super) fn next_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<Option<u64>> {
        let base = s.base();
        if pos < base.bytes {
            let b = self.next_boundary(&self.source_of(s)?, pos)?;
            return Ok(Some(b.map_or(base.bytes, |b| b.min(base.bytes))));
        }
        let mut d = s.data.lock();
        Ok(match d.segs.as_mut() {
            Some(g) => g.mapped()?.next_boundary_after(pos),
            None => None,
        })
    }

    /// Where a JSON read from `from` that may return bytes up to `limit` ends: the last message
    /// boundary at or before `limit`, or the end of the first message if that alone is longer
    /// (a read returns at least one whole message); never past `tail`.
    ///
    /// Recursion: a read starting below the base is first bounded in the source, up to the base.
    /// If it ends before the base (or may not pass it), that is the answer; if the whole
    /// inherited range fits, it continues into the fork's own data, where the second call (from
    /// the base, so it does not recurse again) may add whole messages within `limit`.
    pub(super) fn read_boundary(
        &self,
        s: &Arc<Stream>,
        from: u64,
        limit: u64,
        tail: u64,
    ) -> Result<u64> {
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            let b = self.read_boundary(&src, from, limit.min(base.bytes), base.bytes)?;
            if b < base.bytes || limit <= base.bytes {
                return Ok(b.min(base.bytes));
            }
            // The whole inherited range fits: continue into the fork's own data.
            if limit > base.bytes && tail > base.bytes {
                let own = self.read_boundary(s, base.bytes, limit, tail)?;
                return Ok(if own > limit { base.bytes } else { own });
            }
            return Ok(base.bytes);
        }
        let mut d = s.data.lock();
        Ok(match d.segs.as_mut() {
            Some(g) => g.mapped()?.boundary_for_read(from, limit),
            None => tail,
        }
        .min(tail))
    }

    /// Appends views of bytes `from..to` to `out`, in order, without copying. A range reaching
    /// below the retained start is `OffsetGone`.
    ///
    /// Recursion: the part below the base is read from the source (up to the base), then the
    /// rest from the stream's own segments (that call starts at the base and does not recurse).
    pub(super) fn read_range(
        &self,
        s: &Arc<Stream>,
        from: u64,
        to: u64,
        out: &mut Vec<Bytes>,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            self.read_range(&src, from, to.min(base.bytes), out)?;
            return self.read_range(s, base.bytes, to, out);
        }
        let pieces = {
            let mut d = s.data.lock();
            let segs = d.segs.as_mut().ok_or(Error::NotFound)?;
            segs.read(from, to)?
        };
        let Some(pieces) = pieces else {
            return Err(Error::OffsetGone {
                earliest: s.visible().earliest,
            });
        };
        for p in pieces {
            match p {
                Piece::Local(b) => out.push(b),
                // Fetched without the stream's lock: the shard thread never waits on the tier.
                #[cfg(feature = "tier")]
                Piece::Cold(c) => out.push(self.read_cold(s, &c)?),
                #[cfg(not(feature = "tier"))]
                Piece::Cold(c) => {
                    return Err(Error::corrupt(
                        &s.dir,
                        format!(
                            "bytes {}..{} are in a cold tier (build with the `tier` feature)",
                            c.want.0, c.want.1
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Appends the byte range of every message in `from..to` to `out`, in order.
    ///
    /// Recursion: the part below the base comes from the source (up to the base), then the
    /// stream's own messages from the base on.
    pub(super) fn message_ranges(
        &self,
        s: &Arc<Stream>,
        from: u64,
        to: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        let base = s.base();
        if from < base.bytes {
            let src = self.source_of(s)?;
            self.message_ranges(&src, from, to.min(base.bytes), out)?;
        }
        let mut d = s.data.lock();
        if let Some(g) = d.segs.as_mut() {
            out.extend(g.mapped()?.message_ranges(from.max(base.bytes), to));
        }
        Ok(())
    }
}
