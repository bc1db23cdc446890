//! The stream registry: a bounded cache of open streams by name. Lookup (loading a stream from
//! its sidecar on first use), the live-stream check every client request starts with, eviction
//! of idle streams, and listing.
//!
//! The registry lock is the first in the lock order (registry → `core` → ...). A deleted stream
//! stays in the registry as a tombstone (`Core::gone`) until its delete is applied, so its files
//! are never loaded again in between.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use crate::error::{Error, Result};
use crate::fs;
use crate::name::StreamName;
use crate::sidecar;
use crate::state::now_ms;
use crate::types::Expiry;

use super::Engine;
use super::stream::Stream;

impl Engine {
    /// Looks a stream up, loading it from disk if needed. Includes soft-deleted and expired
    /// streams; `None` for a name with no stream or a tombstone. A stream directory holding
    /// another name's sidecar (a hash collision) is `Corrupt`.
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
            s.mark_used();
            return Ok(Some(s.clone()));
        }
        let dir = fs::stream_dir(&self.root, name);
        let loaded = Stream::load(
            dir.clone(),
            self.shard_of(name),
            self.options.segment_bytes,
            |sc| {
                if sc.state.config.name == name {
                    Ok(true)
                } else {
                    Err(Error::corrupt(
                        &dir,
                        "stream directory belongs to another name (hash collision)",
                    ))
                }
            },
        )?;
        let Some(s) = loaded else {
            if dir.exists() {
                // Segments without a sidecar: a create that never became durable (its files
                // outran its record before a power loss), or a sidecar lost to damage. Either
                // way no stream is known here; a create of the name clears the directory.
                tracing::warn!(
                    stream = name,
                    dir = %dir.display(),
                    "stream directory has no sidecar: answering as if the stream did not exist"
                );
            }
            return Ok(None);
        };
        self.register(&mut reg, name, s.clone());
        Ok(Some(s))
    }

    /// Adds `s` to the registry (held as `reg`) under `name`, evicting idle streams when the
    /// registry is over `max_open_streams`.
    pub(super) fn register(
        &self,
        reg: &mut HashMap<String, Arc<Stream>>,
        name: &str,
        s: Arc<Stream>,
    ) {
        reg.insert(name.to_owned(), s);
        if reg.len() > self.options.max_open_streams {
            evict(reg, self.options.max_open_streams);
        }
    }

    /// A stream clients may address: it exists (`NotFound`), is not soft-deleted (`Gone`) and
    /// has not expired (`NotFound`, and the expired stream is deleted now). Soft-deletion is
    /// checked first, so a soft-deleted stream past its expiry answers `Gone`.
    pub(super) fn live(&self, name: &StreamName) -> Result<Arc<Stream>> {
        let s = self.lookup(name.as_str())?.ok_or(Error::NotFound)?;
        if s.core.lock().state.soft_deleted {
            return Err(Error::Gone);
        }
        if s.expired() {
            self.expire(&s);
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    /// The names of the live streams starting with `prefix` (a leading `/` ignored), sorted:
    /// the open ones from the registry, the others from their sidecars on disk (without opening
    /// them; a sliding TTL is not checked for those, as their last access is not recorded).
    pub(crate) fn list(&self, prefix: &str) -> Result<Vec<StreamName>> {
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        let now = now_ms();
        let mut names = BTreeSet::new();
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

/// Closes idle, clean streams beyond `cap`, least recently used first, down to 7/8 of `cap`.
///
/// A stream qualifies only if nobody else holds it (no reader, writer or waiter), and it is
/// either deleted or has nothing unsynced or uncheckpointed (so closing it loses nothing and
/// reloading it from its sidecar gives the same state). Called under the registry lock; its
/// stream locks are only tried, never waited for, so the order `data` before `core` here cannot
/// deadlock.
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
