//! Fork-chain reads.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::name::Offset;

use super::Engine;
use super::stream::Stream;

impl Engine {
    pub(super) fn source_of(&self, s: &Stream) -> Result<Arc<Stream>> {
        let (src, _) = s
            .config
            .fork
            .as_ref()
            .ok_or_else(|| Error::corrupt(&s.dir, "fork without source"))?;
        self.lookup(src)?
            .ok_or_else(|| Error::corrupt(&s.dir, "fork source is missing"))
    }

    pub(super) fn offset_at(&self, s: &Arc<Stream>, pos: u64) -> Result<Offset> {
        let base = s.base();
        if pos < base.bytes || (pos == base.bytes && s.config.fork.is_some()) {
            if pos == base.bytes {
                return Ok(base);
            }
            return self.offset_at(&self.source_of(s)?, pos);
        }
        let d = s.data.lock();
        Ok(d.segs
            .as_ref()
            .map_or(Offset::new(0, pos), |g| g.offset_at(pos)))
    }

    pub(super) fn is_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<bool> {
        let base = s.base();
        if pos == base.bytes {
            return Ok(true);
        }
        if pos < base.bytes {
            return self.is_boundary(&self.source_of(s)?, pos);
        }
        let d = s.data.lock();
        Ok(d.segs.as_ref().is_some_and(|g| g.is_boundary(pos)))
    }

    pub(super) fn next_boundary(&self, s: &Arc<Stream>, pos: u64) -> Result<Option<u64>> {
        let base = s.base();
        if pos < base.bytes {
            let b = self.next_boundary(&self.source_of(s)?, pos)?;
            return Ok(Some(b.map_or(base.bytes, |b| b.min(base.bytes))));
        }
        let d = s.data.lock();
        Ok(d.segs.as_ref().and_then(|g| g.next_boundary_after(pos)))
    }

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
        let d = s.data.lock();
        Ok(d.segs
            .as_ref()
            .map_or(tail, |g| g.boundary_for_read(from, limit))
            .min(tail))
    }

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
        let mut d = s.data.lock();
        let segs = d.segs.as_mut().ok_or(Error::NotFound)?;
        match segs.read(from, to)? {
            Some(v) => {
                out.extend(v);
                Ok(())
            }
            None => Err(Error::OffsetGone {
                earliest: s.visible().earliest,
            }),
        }
    }

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
        let d = s.data.lock();
        if let Some(g) = d.segs.as_ref() {
            out.extend(g.message_ranges(from.max(base.bytes), to));
        }
        Ok(())
    }
}
