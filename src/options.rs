//! `Options`: every tunable of a store, with its default and bounds, validated once at open.

use crate::error::{Error, Result};

/// What an acknowledged write survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// An acknowledged write is on stable storage (its journal record was `fdatasync`ed): it
    /// survives a process crash and a power loss. Concurrent writes share syncs (group commit).
    #[default]
    Sync,
    /// An acknowledged write has reached the operating system (written to the journal file, not
    /// synced): it survives a crash of the process, not a crash of the machine. The journal is
    /// synced at every checkpoint and on a clean shutdown.
    Buffered,
}

/// Options for [`Store::open`](crate::Store::open). Build with `Options::default()` and the setters.
#[derive(Clone, Debug)]
pub struct Options {
    pub(crate) durability: Durability,
    pub(crate) journal_shards: usize,
    pub(crate) segment_bytes: u64,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) max_open_streams: usize,
    pub(crate) max_append_bytes: usize,
    pub(crate) max_read_bytes: u64,
    pub(crate) max_snapshot_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            journal_shards: 2,
            segment_bytes: 64 << 20,
            checkpoint_bytes: 64 << 20,
            max_open_streams: 4096,
            max_append_bytes: 64 << 20,
            max_read_bytes: 8 << 20,
            max_snapshot_bytes: 128 << 20,
        }
    }
}

impl Options {
    /// What an acknowledged write survives. Default [`Durability::Sync`].
    #[must_use]
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Number of journal shards, each with its own file and sync thread, so several syncs are in
    /// flight at once. Default 2, 1 to 64. Fixed when a store is created: reopening with another
    /// value keeps the stored one.
    #[must_use]
    pub fn journal_shards(mut self, n: usize) -> Self {
        self.journal_shards = n;
        self
    }

    /// Size at which a stream's segment file is rolled. Default 64 MiB, 4 KiB to 1 GiB. Retention
    /// reclaims disk space a whole segment at a time.
    #[must_use]
    pub fn segment_bytes(mut self, n: u64) -> Self {
        self.segment_bytes = n;
        self
    }

    /// Journal size that triggers a checkpoint (stream files synced, sidecars written, journal
    /// truncated). Bounds recovery work after a crash. Default 64 MiB, 64 KiB to 16 GiB.
    #[must_use]
    pub fn checkpoint_bytes(mut self, n: u64) -> Self {
        self.checkpoint_bytes = n;
        self
    }

    /// Streams kept open (file handles and maps) at once; idle clean streams beyond it are closed,
    /// least recently used first. Default 4096, at least 16. Each open stream holds about two file
    /// descriptors per segment it has touched.
    #[must_use]
    pub fn max_open_streams(mut self, n: usize) -> Self {
        self.max_open_streams = n;
        self
    }

    /// Largest append (or create) body. Default 64 MiB, 1 byte to 1 GiB.
    #[must_use]
    pub fn max_append_bytes(mut self, n: usize) -> Self {
        self.max_append_bytes = n;
        self
    }

    /// Largest body one read returns when the caller sets no smaller bound. Default 8 MiB, at
    /// least 1 KiB. A JSON read always returns at least one whole message.
    #[must_use]
    pub fn max_read_bytes(mut self, n: u64) -> Self {
        self.max_read_bytes = n;
        self
    }

    /// Largest snapshot blob. Default 128 MiB, at most 4 GiB.
    #[must_use]
    pub fn max_snapshot_bytes(mut self, n: u64) -> Self {
        self.max_snapshot_bytes = n;
        self
    }

    /// The configured durability mode.
    pub fn durability_mode(&self) -> Durability {
        self.durability
    }

    /// The configured largest append body.
    pub fn append_limit(&self) -> usize {
        self.max_append_bytes
    }

    /// The configured largest snapshot blob.
    pub fn snapshot_limit(&self) -> u64 {
        self.max_snapshot_bytes
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |what: &str| {
            Err(Error::InvalidArgument(format!(
                "option {what} is out of bounds"
            )))
        };
        if !(1..=64).contains(&self.journal_shards) {
            return bad("journal_shards");
        }
        if !(4096..=1 << 30).contains(&self.segment_bytes) {
            return bad("segment_bytes");
        }
        if !(64 << 10..=16 << 30).contains(&self.checkpoint_bytes) {
            return bad("checkpoint_bytes");
        }
        if self.max_open_streams < 16 {
            return bad("max_open_streams");
        }
        if !(1..=1 << 30).contains(&self.max_append_bytes) {
            return bad("max_append_bytes");
        }
        if self.max_read_bytes < 1024 {
            return bad("max_read_bytes");
        }
        if self.max_snapshot_bytes > 4 << 30 {
            return bad("max_snapshot_bytes");
        }
        Ok(())
    }
}
