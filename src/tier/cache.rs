//! The cold tier's read cache: cold blocks fetched from the tier, in memory, least recently used
//! first out, bounded in bytes.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// A block's name: the object and the block's first byte in it.
pub(super) type BlockKey = (String, u64);

/// Blocks by key, with the tick of their last use; evicts the least recently used block while
/// the cached bytes exceed `capacity`. A block larger than the capacity is never kept.
pub(super) struct Cache {
    capacity: u64,
    bytes: u64,
    tick: u64,
    blocks: HashMap<BlockKey, (Bytes, u64)>,
    by_use: BTreeMap<u64, BlockKey>,
}

impl Cache {
    /// An empty cache holding at most `capacity` bytes of blocks.
    pub(super) fn new(capacity: u64) -> Cache {
        Cache {
            capacity,
            bytes: 0,
            tick: 0,
            blocks: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// The block, if cached (and marks it used).
    pub(super) fn get(&mut self, key: &BlockKey) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let (b, used) = self.blocks.get_mut(key)?;
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, key.clone());
        Some(b.clone())
    }

    /// Caches a block, evicting the least recently used ones to stay within the capacity.
    pub(super) fn insert(&mut self, key: BlockKey, block: Bytes) {
        let len = block.len() as u64;
        if len > self.capacity || self.blocks.contains_key(&key) {
            return;
        }
        while self.bytes + len > self.capacity {
            let Some((_, old)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.blocks.remove(&old) {
                self.bytes -= b.len() as u64;
            }
        }
        self.tick += 1;
        self.by_use.insert(self.tick, key.clone());
        self.blocks.insert(key, (block, self.tick));
        self.bytes += len;
    }

    /// Drops every block of objects whose name starts with `prefix` (a stream deleted).
    pub(super) fn forget(&mut self, prefix: &str) {
        let gone: Vec<BlockKey> = self
            .blocks
            .keys()
            .filter(|k| k.0.starts_with(prefix))
            .cloned()
            .collect();
        for k in gone {
            if let Some((b, used)) = self.blocks.remove(&k) {
                self.bytes -= b.len() as u64;
                self.by_use.remove(&used);
            }
        }
    }

    /// The bytes cached now.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_its_bound() {
        let mut c = Cache::new(10);
        let k = |n: u64| ("o".to_owned(), n);
        c.insert(k(0), Bytes::from_static(b"aaaa"));
        c.insert(k(1), Bytes::from_static(b"bbbb"));
        assert!(c.get(&k(0)).is_some()); // 1 is now the least recently used
        c.insert(k(2), Bytes::from_static(b"cccc"));
        assert_eq!(c.bytes(), 8);
        assert!(c.get(&k(1)).is_none());
        assert_eq!(c.get(&k(0)).as_deref(), Some(&b"aaaa"[..]));
        c.insert(k(3), Bytes::from(vec![0; 11]));
        assert!(c.get(&k(3)).is_none(), "larger than the whole cache");
        c.forget("o");
        assert_eq!(c.bytes(), 0);
        assert!(c.get(&k(2)).is_none());
    }
}
