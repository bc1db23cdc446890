//! The in-memory stream: one incarnation's staged state (`core`), applied state and files
//! (`data`) and durable view (`visible`), each under its own lock.
//!
//! Lock order within a stream: `core` → `data` → `visible` (`core` only on the writer side:
//! committers take `data` then `visible` and never `core`). See the module map in `engine`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use event_listener::Event;
use parking_lot::Mutex;

use crate::engine::journal::{Placed, Record};
use crate::error::Result;
use crate::name::{Incarnation, Offset, StreamName, is_json};
use crate::segment::SegmentSet;
use crate::sidecar::Sidecar;

use super::journal::images::Images;
use crate::state::{AppendRecord, Config, StreamState, check_incarnation, now_ms};
use crate::types::{Expiry, SnapshotInfo, StreamInfo};

/// One incarnation of a stream. A stream deleted and created again is a new `Stream`.
pub(crate) struct Stream {
    pub(super) name: StreamName,
    /// The stream's directory (`streams/{k0}/{key}`), fixed by its name.
    pub(super) dir: PathBuf,
    /// The journal shard all of this stream's records go to.
    pub(super) shard: usize,
    /// The incarnation's fixed configuration (the same in every state below, shared).
    pub(super) config: Arc<Config>,
    pub(super) incarnation: Incarnation,
    /// The content type is JSON: reads and positions work on whole messages.
    pub(super) json: bool,
    /// Staged state: what the checks see, including changes not yet durable.
    pub(super) core: Mutex<Core>,
    /// Applied state and the files: owned by the shard thread (and by readers briefly).
    pub(super) data: Mutex<Data>,
    /// The durable view readers and waiters see.
    pub(super) visible: Mutex<Visible>,
    /// Notified when `visible` changes, and on delete: wakes the stream's waiters.
    pub(super) event: Event,
    /// The last read or write, for a sliding TTL (ms since the epoch; not journaled).
    pub(super) last_access_ms: AtomicU64,
    /// The last lookup, for least-recently-used eviction (ms since the epoch).
    pub(super) last_used: AtomicU64,
}

/// The writer side of a stream: the state every check runs against.
pub(super) struct Core {
    /// The staged state: every accepted change is in it before its record is enqueued.
    pub(super) state: StreamState,
    /// LSN of this stream's newest enqueued record.
    pub(super) last_lsn: u64,
    /// Hard-deleted (or expired); the registry no longer holds it.
    pub(super) gone: bool,
}

/// The committer side of a stream: its files and the state applied to them.
pub(super) struct Data {
    /// The applied state: every record up to `applied_lsn`, as recovery would rebuild it.
    pub(super) state: StreamState,
    /// The segment logs and indexes; `None` before the create is applied and after a delete.
    pub(super) segs: Option<SegmentSet>,
    /// The LSN of the newest record applied.
    pub(super) applied_lsn: u64,
    /// The applied LSN the newest sidecar records (the stream is clean when they are equal).
    pub(super) checkpointed_lsn: u64,
    /// The newest sidecar's generation (the next one goes to the other slot).
    pub(super) generation: u64,
    /// A record that changed more than data was applied since the last checkpoint took the
    /// stream: the next one writes its sidecar (2.8).
    pub(super) sidecar_due: bool,
    /// The delete was applied: the directory is in the trash.
    pub(super) deleted: bool,
    /// The stream is in its shard's dirty set (`Shard::dirty`): set only after it was put
    /// there, cleared when the set lets it go (a rotation takes it, a delete is applied);
    /// `false` says nothing (the set is then looked at under its lock). Spares a committed
    /// record a lookup by name in the set when its stream is already there.
    pub(super) in_dirty: bool,
}

/// The reader side of a stream: the public parts of the applied state as of the last sync.
#[derive(Clone)]
pub(super) struct Visible {
    /// The durable tail.
    pub(super) tail: Offset,
    pub(super) closed: bool,
    pub(super) earliest: Offset,
    pub(super) snapshots: Arc<Vec<SnapshotInfo>>,
    pub(super) stream_seq: Option<String>,
    pub(super) soft_deleted: bool,
    pub(super) deleted: bool,
}

impl Visible {
    /// Makes this view that of state `s`, keeping its snapshot list (shared with readers) when
    /// it has not changed and reusing its Stream-Seq's buffer: what each commit publishes.
    pub(super) fn refresh(&mut self, s: &StreamState, deleted: bool) {
        self.tail = s.tail;
        self.closed = s.closed;
        self.earliest = s.earliest;
        if *self.snapshots != s.snapshots {
            self.snapshots = Arc::new(s.snapshots.clone());
        }
        self.stream_seq.clone_from(&s.stream_seq);
        self.soft_deleted = s.soft_deleted;
        self.deleted = deleted;
    }

    /// The view of state `s` (the applied state once durable, or a staged one for a reply).
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
    /// A stream of `state` whose records up to `lsn` are applied (and checkpointed, as sidecar
    /// `generation`). `readable`: the view shows the state's data; otherwise (a stream being
    /// created) nothing is readable until its create record is durable.
    pub(super) fn new(
        state: StreamState,
        dir: PathBuf,
        shard: usize,
        segs: Option<SegmentSet>,
        lsn: u64,
        generation: u64,
        readable: bool,
    ) -> Arc<Stream> {
        let name = StreamName::new(&state.config.name)
            .unwrap_or_else(|_| StreamName(state.config.name.as_str().into()));
        let vis = if readable {
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
                sidecar_due: false,
                deleted: false,
                in_dirty: false,
            }),
            visible: Mutex::new(vis),
            event: Event::new(),
            last_access_ms: AtomicU64::new(now),
            last_used: AtomicU64::new(now),
        })
    }

    /// Opens the stream stored in `dir` as its newest durable image records it (its sidecar, or
    /// its shard's checkpoint file: `images`): segments opened (and checked
    /// against the state: see `SegmentSet::open`), applied and checkpointed at the sidecar's
    /// LSN. `None` if `dir` holds no valid sidecar or `accept` declines the one it holds (before
    /// any segment is opened); `accept`'s error is returned as it is. `replaying`: loaded by
    /// recovery's replay (see `SegmentSet::open`).
    pub(super) fn load(
        dir: PathBuf,
        images: &Images,
        segment_bytes: u64,
        replaying: bool,
        accept: impl FnOnce(&Sidecar) -> Result<bool>,
    ) -> Result<Option<Arc<Stream>>> {
        crate::fs::no_symlinks(&dir)?;
        let shard = images.shard() as usize;
        let Some(sc) = images.load(&dir)? else {
            return Ok(None);
        };
        if !accept(&sc)? {
            return Ok(None);
        }
        // Retention reclaims segments only while the stream has no forks (they read them).
        let start = if sc.state.forks.is_empty() {
            sc.state.earliest
        } else {
            sc.state.base
        };
        let cold = crate::tier::manifest::cold_segments(&dir, &sc.state.config.incarnation)?;
        let segs = SegmentSet::open(
            &dir,
            start,
            sc.state.earliest,
            sc.state.tail,
            segment_bytes,
            &cold,
            replaying,
        )?;
        Ok(Some(Stream::new(
            sc.state,
            dir,
            shard,
            Some(segs),
            sc.applied_lsn,
            sc.generation,
            true,
        )))
    }

    /// A copy of the durable view.
    pub(super) fn visible(&self) -> Visible {
        self.visible.lock().clone()
    }

    /// Whether the stream has expired as of now (a stream that never expires reads no clock).
    pub(super) fn expired(&self) -> bool {
        !matches!(self.config.expiry, Expiry::Never) && self.expired_at(now_ms())
    }

    /// Whether the stream has expired at `now` (ms since the epoch): its sliding TTL ran out
    /// since the last access, or its absolute expiry passed.
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

    /// Records an access (a read or write): restarts a sliding TTL.
    pub(super) fn touch(&self) {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Records an access at the time of the lookup that found the stream for it (every lookup
    /// stamps `last_used`, and a stream loaded for it starts with the time of its load), so one
    /// clock read per append serves both.
    pub(super) fn touch_as_used(&self) {
        self.last_access_ms
            .store(self.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Records a lookup, for least-recently-used eviction.
    pub(super) fn mark_used(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// Checks a caller's `expect`ed incarnation against this one (`IncarnationMismatch`).
    pub(super) fn check_expect(&self, expect: Option<&Incarnation>) -> Result<()> {
        check_incarnation(self.incarnation.as_str(), expect)
    }

    /// The stream's description as of view `v` (expiry computed from the last access).
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
            retention: self.config.retention,
            snapshot: v.snapshots.last().cloned(),
            fork: self
                .config
                .fork
                .as_ref()
                .map(|(s, o)| (StreamName(s.as_str().into()), *o)),
            stream_seq: v.stream_seq.clone(),
        }
    }

    /// The stream's description as of staged state `s` (for the reply to a write, which the
    /// caller sends only once the write is durable).
    pub(super) fn staged_info(&self, s: &StreamState) -> StreamInfo {
        self.info(&Visible::of(s, false))
    }

    /// The first position of the stream's own data (a fork's divergence point, or zero);
    /// positions below it are read from the fork's source.
    pub(super) fn base(&self) -> Offset {
        self.core.lock().state.base
    }

    /// The journal record of an append to this incarnation (`placed`: its body is written to
    /// the segment only).
    pub(super) fn append_record(&self, rec: AppendRecord, placed: Option<Placed>) -> Record {
        Record::Append {
            name: self.name.0.clone(),
            incarnation: self.incarnation.shared(),
            rec,
            placed,
        }
    }

    /// The journal record of this incarnation's delete: `soft` keeps it for its forks.
    pub(super) fn delete_record(&self, soft: bool) -> Record {
        Record::Delete {
            name: self.name.0.clone(),
            incarnation: self.incarnation.shared(),
            soft,
        }
    }

    /// The journal record of a snapshot published on this incarnation.
    pub(super) fn snapshot_record(&self, info: SnapshotInfo) -> Record {
        Record::Snapshot {
            name: self.name.0.clone(),
            incarnation: self.incarnation.shared(),
            info,
        }
    }

    /// The journal record of this incarnation's retention moving to `to`.
    pub(super) fn retention_record(&self, to: Offset) -> Record {
        Record::Retention {
            name: self.name.0.clone(),
            incarnation: self.incarnation.shared(),
            to,
        }
    }

    /// The journal record adding `fork` to (or, `add` false, removing it from) this
    /// incarnation's fork list.
    pub(super) fn fork_ref_record(&self, fork: &StreamName, add: bool) -> Record {
        Record::ForkRef {
            name: self.name.0.clone(),
            incarnation: self.incarnation.shared(),
            fork: fork.as_str().to_owned(),
            add,
        }
    }
}
