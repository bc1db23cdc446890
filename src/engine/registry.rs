//! The stream registry: lookup, cache, eviction, listing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use crate::error::{Error, Result};
use crate::fs;
use crate::name::StreamName;
use crate::segment::SegmentSet;
use crate::sidecar;
use crate::state::now_ms;
use crate::types::Expiry;

use super::Engine;
use super::stream::Stream;

impl Engine {
    /// Looks a stream up, loading it from disk if needed. Includes soft-deleted streams.
    pub(super) fn lookup(&self, name: &str) -> Result<Option<Arc<Stream>>> {
        let mut reg = self.registry.lock();
        if let Some(s) = reg.get(name) {
            if s.core.lock().gone {
                // A tombstone: deleted, and until the delete is applied its files must not be
                // loaded again. Once applied, the directory is gone and the entry can go too.
                if s.data.lock().deleted {
                    reg.remove(name);
                }
                return Ok(None);
            }
            s.last_used.store(now_ms(), Ordering::Relaxed);
            return Ok(Some(s.clone()));
        }
        let dir = fs::stream_dir(&self.root, name);
        let Some(sc) = sidecar::load(&dir)? else {
            return Ok(None);
        };
        if sc.state.config.name != name {
            return Err(Error::corrupt(
                &dir,
                "stream directory belongs to another name (hash collision)",
            ));
        }
        let segs = SegmentSet::open(
            &dir,
            sc.state.base,
            sc.state.tail,
            self.options.segment_bytes,
        )?;
        let s = Stream::new(
            sc.state,
            dir,
            self.shard_of(name),
            Some(segs),
            sc.applied_lsn,
            sc.generation,
            true,
        );
        s.data.lock().checkpointed_lsn = sc.applied_lsn;
        reg.insert(name.to_owned(), s.clone());
        if reg.len() > self.options.max_open_streams {
            evict(&mut reg, self.options.max_open_streams);
        }
        Ok(Some(s))
    }

    /// A stream clients may address: not soft-deleted, not expired.
    pub(super) fn live(&self, name: &StreamName) -> Result<Arc<Stream>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired_at(now_ms()) {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<StreamName>> {
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        let now = now_ms();
        let mut names: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let loaded: HashMap<String, Arc<Stream>> = self.registry.lock().clone();
        for (n, s) in &loaded {
            let core = s.core.lock();
            if n.starts_with(prefix) && !core.gone && !core.state.soft_deleted && !s.expired_at(now)
            {
                names.insert(n.clone());
            }
        }
        for top in std::fs::read_dir(self.root.join("streams"))?.flatten() {
            for dir in std::fs::read_dir(top.path())?.flatten() {
                if let Some(sc) = sidecar::load(&dir.path())? {
                    let n = &sc.state.config.name;
                    if loaded.contains_key(n) || !n.starts_with(prefix) || sc.state.soft_deleted {
                        continue;
                    }
                    let expired = match sc.state.config.expiry {
                        Expiry::At(t) => {
                            t.duration_since(UNIX_EPOCH)
                                .map_or(0, |d| d.as_millis() as u64)
                                <= now
                        }
                        _ => false,
                    };
                    if !expired {
                        names.insert(n.clone());
                    }
                }
            }
        }
        Ok(names
            .into_iter()
            .filter_map(|n| StreamName::new(&n).ok())
            .collect())
    }
}
/// Closes idle, clean streams beyond `cap`, least recently used first.
pub(super) fn evict(reg: &mut HashMap<String, Arc<Stream>>, cap: usize) {
    let target = cap - cap / 8;
    let mut candidates: Vec<(u64, String)> = reg
        .iter()
        .filter(|(_, s)| Arc::strong_count(s) == 1)
        .filter(|(_, s)| {
            let Some(d) = s.data.try_lock() else {
                return false;
            };
            let Some(c) = s.core.try_lock() else {
                return false;
            };
            d.deleted
                || (d.applied_lsn == d.checkpointed_lsn
                    && c.last_lsn <= d.applied_lsn
                    && !c.state.soft_deleted)
        })
        .map(|(n, s)| (s.last_used.load(Ordering::Relaxed), n.clone()))
        .collect();
    candidates.sort_unstable();
    let excess = reg.len().saturating_sub(target);
    for (_, n) in candidates.into_iter().take(excess) {
        reg.remove(&n);
    }
}
