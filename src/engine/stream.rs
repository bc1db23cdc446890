//! The in-memory stream: one incarnation's staged, applied and visible state.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use event_listener::Event;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::name::{Incarnation, Offset, StreamName, is_json};
use crate::segment::SegmentSet;
use crate::state::{Config, StreamState, now_ms};
use crate::types::{Expiry, SnapshotInfo, StreamInfo};

/// One incarnation of a stream. A stream deleted and created again is a new `Stream`.
pub(crate) struct Stream {
    pub(super) name: StreamName,
    pub(super) dir: PathBuf,
    pub(super) shard: usize,
    pub(super) config: Config,
    pub(super) incarnation: Incarnation,
    pub(super) json: bool,
    /// Staged state: what the checks see, including changes not yet durable.
    pub(super) core: Mutex<Core>,
    /// Applied state and the files: owned by the shard thread (and by readers briefly).
    pub(super) data: Mutex<Data>,
    /// The durable view readers and waiters see.
    pub(super) visible: Mutex<Visible>,
    pub(super) event: Event,
    pub(super) last_access_ms: AtomicU64,
    pub(super) last_used: AtomicU64,
}

pub(super) struct Core {
    pub(super) state: StreamState,
    /// LSN of this stream's newest enqueued record.
    pub(super) last_lsn: u64,
    /// Hard-deleted (or expired); the registry no longer holds it.
    pub(super) gone: bool,
}

pub(super) struct Data {
    pub(super) state: StreamState,
    pub(super) segs: Option<SegmentSet>,
    pub(super) applied_lsn: u64,
    pub(super) checkpointed_lsn: u64,
    pub(super) generation: u64,
    pub(super) deleted: bool,
}

#[derive(Clone)]
pub(super) struct Visible {
    pub(super) tail: Offset,
    pub(super) closed: bool,
    pub(super) earliest: Offset,
    pub(super) snapshots: Arc<Vec<SnapshotInfo>>,
    pub(super) stream_seq: Option<String>,
    pub(super) soft_deleted: bool,
    pub(super) deleted: bool,
}

impl Visible {
    pub(super) fn of(s: &StreamState, deleted: bool) -> Visible {
        Visible {
            tail: s.tail,
            closed: s.closed,
            earliest: s.earliest,
            snapshots: Arc::new(s.snapshots.clone()),
            stream_seq: s.stream_seq.clone(),
            soft_deleted: s.soft_deleted,
            deleted,
        }
    }
}

impl Stream {
    pub(super) fn new(
        state: StreamState,
        dir: PathBuf,
        shard: usize,
        segs: Option<SegmentSet>,
        lsn: u64,
        generation: u64,
        visible: bool,
    ) -> Arc<Stream> {
        let name = StreamName::new(&state.config.name)
            .unwrap_or_else(|_| StreamName(state.config.name.clone()));
        let vis = if visible {
            Visible::of(&state, false)
        } else {
            // A stream being created: nothing is readable until its create record is durable.
            let mut v = Visible::of(&state, false);
            v.tail = state.base;
            v.closed = false;
            v
        };
        let now = now_ms();
        Arc::new(Stream {
            name,
            dir,
            shard,
            incarnation: Incarnation::from_raw(state.config.incarnation.clone()),
            json: is_json(&state.config.content_type),
            config: state.config.clone(),
            core: Mutex::new(Core {
                state: state.clone(),
                last_lsn: lsn,
                gone: false,
            }),
            data: Mutex::new(Data {
                state,
                segs,
                applied_lsn: lsn,
                checkpointed_lsn: lsn,
                generation,
                deleted: false,
            }),
            visible: Mutex::new(vis),
            event: Event::new(),
            last_access_ms: AtomicU64::new(now),
            last_used: AtomicU64::new(now),
        })
    }

    pub(super) fn visible(&self) -> Visible {
        self.visible.lock().clone()
    }

    pub(super) fn expired_at(&self, now: u64) -> bool {
        match self.config.expiry {
            Expiry::Never => false,
            Expiry::Ttl(s) => {
                self.last_access_ms
                    .load(Ordering::Relaxed)
                    .saturating_add(s.saturating_mul(1000))
                    <= now
            }
            Expiry::At(t) => {
                t.duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
                    <= now
            }
        }
    }

    pub(super) fn touch(&self) {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(super) fn check_expect(&self, expect: Option<&Incarnation>) -> Result<()> {
        match expect {
            Some(e) if *e != self.incarnation => Err(Error::IncarnationMismatch {
                current: self.incarnation.clone(),
            }),
            _ => Ok(()),
        }
    }

    pub(super) fn info(&self, v: &Visible) -> StreamInfo {
        let last = self.last_access_ms.load(Ordering::Relaxed);
        let expires_at = match self.config.expiry {
            Expiry::Never => None,
            Expiry::Ttl(s) => Some(UNIX_EPOCH + Duration::from_millis(last + s * 1000)),
            Expiry::At(t) => Some(t),
        };
        StreamInfo {
            name: self.name.clone(),
            content_type: self.config.content_type.clone(),
            tail: v.tail,
            closed: v.closed,
            expiry: self.config.expiry,
            expires_at,
            incarnation: self.incarnation.clone(),
            earliest: v.earliest,
            snapshot: v.snapshots.last().cloned(),
            fork: self
                .config
                .fork
                .as_ref()
                .map(|(s, o)| (StreamName(s.clone()), *o)),
            stream_seq: v.stream_seq.clone(),
        }
    }

    pub(super) fn staged_info(&self, s: &StreamState) -> StreamInfo {
        self.info(&Visible::of(s, false))
    }

    pub(super) fn base(&self) -> Offset {
        self.core.lock().state.base
    }
}
