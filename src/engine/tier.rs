//! The engine's side of the cold tier (feature `tier`): reads of cold blocks, eviction of
//! uploaded segments, and the indexes restored from the tier at open.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::segment::ColdPiece;
use crate::tier::{Tier, manifest};

use super::Engine;
use super::stream::Stream;

impl Engine {
    /// The bytes of cold piece `c` of stream `s`, through the tier's cache; a block fetched is
    /// checked against the stream's index (under its `data` lock, briefly) before it is cached.
    /// Called without any lock held: the fetch may take as long as the object store does.
    pub(super) fn read_cold(&self, s: &Arc<Stream>, c: &ColdPiece) -> Result<Bytes> {
        let tier = self.tier.as_ref().ok_or_else(|| {
            Error::corrupt(
                &s.dir,
                "part of the stream is in a cold tier, which is not configured",
            )
        })?;
        tier.read_cold(&s.dir, s.incarnation.as_str(), c, |bytes| {
            let mut d = s.data.lock();
            let segs = d.segs.as_mut().ok_or(Error::NotFound)?;
            segs.mapped()?.check_block(c.seg_base, c.block, bytes)
        })
    }

    /// Turns the uploaded segment at `base` of stream `name` (incarnation `incarnation`, in
    /// `dir`) cold and removes its local log. Under the registry lock, so a stream being
    /// loaded finds either the log or the manifest entry that replaces it. False (and nothing
    /// done) if the stream is not that incarnation any more or the segment is not sealed.
    pub(crate) fn evict_segment(
        &self,
        dir: &Path,
        name: &str,
        incarnation: &str,
        base: u64,
    ) -> Result<bool> {
        let reg = self.registry.lock();
        let listed = manifest::load(dir)?.is_some_and(|m| {
            m.incarnation == incarnation && m.segments.iter().any(|e| e.base.bytes == base)
        });
        if !listed {
            return Ok(false);
        }
        if let Some(s) = reg.get(name) {
            if s.incarnation.as_str() != incarnation {
                return Ok(false);
            }
            let mut d = s.data.lock();
            if d.deleted {
                return Ok(false);
            }
            if let Some(segs) = d.segs.as_mut()
                && !segs.make_cold(base)
            {
                return Ok(false);
            }
        }
        match crate::fs::remove_file(&dir.join(format!("{base:020}.log"))) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Asks the tier for a pass over every stream after a checkpoint, and waits for it (see
    /// `Store::sync_tier`).
    pub(crate) fn sync_tier(&self) -> Result<()> {
        let tier = self
            .tier
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the store has no cold tier".into()))?;
        self.checkpoint()?;
        tier.sync()
    }
}

/// The tier of a store being opened: stopped (its thread joined) if the open fails before the
/// engine takes it with [`TierGuard::keep`].
pub(super) struct TierGuard(pub(super) Option<Arc<Tier>>);

impl TierGuard {
    /// The tier, for the open engine.
    pub(super) fn keep(mut self) -> Option<Arc<Tier>> {
        self.0.take()
    }
}

impl Drop for TierGuard {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.stop();
        }
    }
}

/// Fetches from the tier every index that a stream's manifest lists (a segment past the
/// stream's retained start) and the local disk lost or holds otherwise than the tier, before
/// recovery opens any stream: a stream whose local files of tiered segments are gone opens
/// with them cold. A sealed segment's index never changes once uploaded, so a local copy whose
/// first `idx_len` bytes fail the manifest's crc lost entries a power cut took (written, not
/// yet durable, when the tier read them): the tier's verified copy replaces it, and the local
/// log, if any, goes too (it may have lost bytes alike; the tier holds it, checked), so the
/// segment opens cold.
pub(super) fn restore_indexes(root: &Path, tier: &Tier) -> Result<()> {
    let Ok(shards) = std::fs::read_dir(root.join("streams")) else {
        return Ok(());
    };
    for shard in shards.flatten() {
        let Ok(dirs) = std::fs::read_dir(shard.path()) else {
            continue;
        };
        for dir in dirs.flatten().map(|e| e.path()) {
            let Some(m) = manifest::load(&dir)? else {
                continue;
            };
            let Some(sc) = crate::sidecar::load(&dir)? else {
                continue;
            };
            if sc.state.config.incarnation != m.incarnation {
                continue;
            }
            for e in &m.segments {
                let file = format!("{:020}.idx", e.base.bytes);
                let path = dir.join(&file);
                let retained = sc.state.forks.is_empty() && e.end.bytes <= sc.state.earliest.bytes;
                if retained || local_index_matches(&path, e.idx_len, e.idx_crc)? {
                    continue;
                }
                if path.exists() {
                    tracing::warn!(dir = %dir.display(), base = e.base.bytes, "a tiered segment's local index differs from the tier's: replaced, and its local log dropped");
                    let log = dir.join(format!("{:020}.log", e.base.bytes));
                    match crate::fs::remove_file(&log) {
                        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                            return Err(err.into());
                        }
                        _ => crate::fs::sync_dir(&dir)?,
                    }
                }
                tier.restore_file(
                    tier.object(&dir, &m.incarnation, &file),
                    &path,
                    e.idx_len,
                    e.idx_crc,
                )?;
                tracing::info!(dir = %dir.display(), base = e.base.bytes, "index restored from the cold tier");
            }
        }
    }
    Ok(())
}

/// Whether the index file at `path` exists and its first `len` bytes have crc32 `crc` (a
/// missing file, or a shorter one, does not match).
fn local_index_matches(path: &Path, len: u64, crc: u32) -> Result<bool> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if f.metadata()?.len() < len {
        return Ok(false);
    }
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0)?;
    Ok(crc32fast::hash(&buf) == crc)
}
