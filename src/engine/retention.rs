//! The retention enforcer: a thread that, every `Options::retention_interval`, applies each
//! stream's retention policy (its own limits, the store's default for the rest) by moving the
//! stream's earliest offset to the start of a segment, with the same Retention record as
//! `PUT {s}/retention/{offset}`. So the files behind the new start go the same way (once a
//! checkpoint records the move: `Shard::reclaim`), and a crash anywhere leaves either the old
//! start with all its files or the new one.
//!
//! A pass looks at every open stream, then at up to [`SWEEP`] streams that are not open (their
//! sidecars: only one with a policy and more than one segment is opened), going on through the
//! name index from pass to pass, so every stream is reached without opening all of them at
//! once. [`Engine::enforce_retention`] runs one pass over every stream.
//!
//! What a policy may drop: whole sealed segments, oldest first (never the segment being
//! written). By age, a segment whose index file was last written more than `max_age` ago (the
//! time of its newest message; a crash recovery that replays it restarts its clock, which only
//! keeps data longer). By size, the oldest segment while the stream retains more than
//! `max_bytes` from its earliest offset to its tail. Either limit drops a segment. Never past
//! the latest durable snapshot (when the stream has one: the data after it is what a reader of
//! the snapshot needs), nor past the lowest offset a subscription linking the stream has
//! acknowledged; each time one of those holds a policy back it is counted
//! (`RetentionStats::held_by_*`) and logged at debug level.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::{Condvar, Mutex};

use crate::error::Result;
use crate::fs;
use crate::name::{Offset, StreamName};
use crate::retention::RetentionPolicy;
use crate::sidecar;

use super::Engine;
use super::stream::Stream;
use super::subscription::SYSTEM_STREAM;

/// Streams that are not open a background pass looks at (their sidecars), at most.
const SWEEP: usize = 64;

/// What one enforcement pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Streams whose earliest offset moved.
    pub(crate) streams: u64,
    /// Whole segments dropped.
    pub(crate) segments: u64,
    /// Bytes the earliest offsets advanced over.
    pub(crate) bytes: u64,
}

/// One stream's decision.
struct Trim {
    from: Offset,
    to: Offset,
    segments: u64,
    by_age: bool,
    by_bytes: bool,
}

impl Engine {
    /// Runs one enforcement pass over every stream of the store (open or not) now, and
    /// checkpoints if it moved any stream, so the files behind the new starts are reclaimed
    /// before it returns.
    pub(crate) fn enforce_retention(&self) -> Result<Pass> {
        let mut cursor = None;
        self.retention_pass(&mut cursor, usize::MAX)
    }

    /// One pass: the open streams, then up to `sweep` streams that are not open, from the name
    /// after `cursor` (which it moves on; back to `None` at the end of the index).
    fn retention_pass(&self, cursor: &mut Option<String>, sweep: usize) -> Result<Pass> {
        self.counters
            .retention
            .passes
            .fetch_add(1, Ordering::Relaxed);
        // Asked per stream that would be trimmed, not gathered for every link up front: one
        // lookup per subscription, none while no subscription exists.
        let subscriptions = self.has_subscriptions();
        let floors = |name: &StreamName| {
            if subscriptions {
                self.acked_floor(name)
            } else {
                None
            }
        };
        let default = self.options.retention_default;
        let open: Vec<Arc<Stream>> = self
            .registry
            .lock()
            .values()
            .filter(|s| !s.config.retention.or(default).is_empty())
            .cloned()
            .collect();
        let mut pass = Pass::default();
        let mut first_error = None;
        let mut note = |r: Result<Option<Trim>>, pass: &mut Pass| match r {
            Ok(Some(t)) => {
                pass.streams += 1;
                pass.segments += t.segments;
                pass.bytes += t.to.bytes - t.from.bytes;
            }
            Ok(None) => {}
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some(e);
                }
            }
        };
        let now = SystemTime::now();
        for s in &open {
            note(self.enforce_stream(s, &floors, now), &mut pass);
        }
        let mut left = sweep;
        while left > 0 {
            let page = self.names.page("", cursor.as_deref(), left.min(1024));
            if page.is_empty() {
                *cursor = None;
                break;
            }
            left -= page.len();
            *cursor = page.last().cloned();
            for name in page {
                if self.registry.lock().contains_key(&name) || !self.worth_opening(&name) {
                    continue;
                }
                match self.lookup(&name) {
                    Ok(Some(s)) => note(self.enforce_stream(&s, &floors, now), &mut pass),
                    Ok(None) => {}
                    Err(e) => note(Err(e), &mut pass),
                }
            }
        }
        if pass.streams > 0 {
            self.checkpoint()?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(pass),
        }
    }

    /// Whether a stream that is not open may have something to trim, from its sidecar and its
    /// directory alone: a policy (its own or the default) and more than one segment.
    fn worth_opening(&self, name: &str) -> bool {
        let dir = fs::stream_dir(&self.root, name);
        let Ok(Some(sc)) = sidecar::load(&dir) else {
            return false;
        };
        if sc.state.config.name != name
            || sc.state.soft_deleted
            || sc
                .state
                .config
                .retention
                .or(self.options.retention_default)
                .is_empty()
        {
            return false;
        }
        let logs = std::fs::read_dir(&dir).map_or(0, |rd| {
            rd.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
                .count()
        });
        logs > 1
    }

    /// Applies `s`'s policy as of `now`, with `floors` a stream's lowest acknowledged offset:
    /// the trim it made, if any.
    fn enforce_stream(
        &self,
        s: &Arc<Stream>,
        floors: &dyn Fn(&StreamName) -> Option<Offset>,
        now: SystemTime,
    ) -> Result<Option<Trim>> {
        let policy = s.config.retention.or(self.options.retention_default);
        if policy.is_empty() || s.name.as_str() == SYSTEM_STREAM {
            return Ok(None);
        }
        let starts = {
            let d = s.data.lock();
            match d.segs.as_ref() {
                Some(segs) if !d.deleted && !d.state.soft_deleted => segs.segment_starts(),
                _ => return Ok(None),
            }
        };
        if starts.len() < 2 {
            return Ok(None);
        }
        let vis = s.visible();
        let (by_age, by_bytes) = droppable(&policy, &starts, vis.earliest, vis.tail, now);
        let want = by_age.max(by_bytes);
        if want == 0 {
            return Ok(None);
        }
        // The largest cut at or before `limit`: segment `i` may start the stream only if its
        // start is at or before it.
        let clamp = |limit: Option<Offset>| {
            let mut i = want;
            while i > 0 && limit.is_some_and(|l| starts[i].0.bytes > l.bytes) {
                i -= 1;
            }
            i
        };
        let by_snapshot = clamp(vis.snapshots.last().map(|x| x.offset));
        let by_subscription = clamp(floors(&s.name));
        let i = by_snapshot.min(by_subscription);
        let r = &self.counters.retention;
        if by_snapshot < want {
            r.held_by_snapshot.fetch_add(1, Ordering::Relaxed);
        }
        if by_subscription < want {
            r.held_by_subscription.fetch_add(1, Ordering::Relaxed);
        }
        if i < want {
            tracing::debug!(
                stream = s.name.as_str(),
                wanted = %starts[want].0,
                allowed = %starts[i].0,
                snapshot = by_snapshot < want,
                subscription = by_subscription < want,
                "retention held back"
            );
        }
        let to = starts[i].0;
        if to.bytes <= vis.earliest.bytes {
            return Ok(None);
        }
        let core = s.core.lock();
        if core.gone || core.state.soft_deleted {
            return Ok(None);
        }
        let from = core.state.earliest;
        if to.bytes <= from.bytes {
            return Ok(None);
        }
        self.move_earliest(s, core, to)?;
        let trim = Trim {
            from,
            to,
            segments: starts[1..=i]
                .iter()
                .filter(|(next, _)| next.bytes > from.bytes)
                .count() as u64,
            by_age: starts[by_age.min(i)].0.bytes > from.bytes,
            by_bytes: starts[by_bytes.min(i)].0.bytes > from.bytes,
        };
        r.trimmed_segments
            .fetch_add(trim.segments, Ordering::Relaxed);
        r.trimmed_bytes
            .fetch_add(to.bytes - from.bytes, Ordering::Relaxed);
        if trim.by_age {
            r.age_runs.fetch_add(1, Ordering::Relaxed);
        }
        if trim.by_bytes {
            r.bytes_runs.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(
            stream = s.name.as_str(),
            from = %from,
            to = %to,
            segments = trim.segments,
            by_age = trim.by_age,
            by_bytes = trim.by_bytes,
            "retention trimmed the start of a stream"
        );
        Ok(Some(trim))
    }
}

/// How many leading segments of `starts` (first offsets and index files, the last one being
/// written) each limit of `policy` lets go, as (by age, by size); never the last segment.
fn droppable(
    policy: &RetentionPolicy,
    starts: &[(Offset, PathBuf)],
    earliest: Offset,
    tail: Offset,
    now: SystemTime,
) -> (usize, usize) {
    let sealed = starts.len() - 1;
    let mut by_bytes = 0;
    if let Some(max) = policy.max_bytes {
        while by_bytes < sealed
            && tail
                .bytes
                .saturating_sub(starts[by_bytes].0.bytes.max(earliest.bytes))
                > max
        {
            by_bytes += 1;
        }
    }
    let mut by_age = 0;
    if let Some(age) = policy.max_age_duration() {
        while by_age < sealed && older_than(&starts[by_age].1, age, now) {
            by_age += 1;
        }
    }
    (by_age, by_bytes)
}

/// Whether the file at `path` was last written more than `age` before `now` (false when it
/// cannot be told: the data is kept).
fn older_than(path: &std::path::Path, age: Duration, now: SystemTime) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| now.duration_since(t).ok())
        .is_some_and(|d| d > age)
}

/// The enforcer thread: a pass every `every`, until `stop` is set or the engine is dropped. It
/// holds the engine only while it works; a failed pass is logged and the next one tries again.
pub(super) fn enforcer(engine: &Weak<Engine>, stop: &(Mutex<bool>, Condvar), every: Duration) {
    let mut cursor = None;
    loop {
        {
            let (m, cv) = stop;
            let mut stopped = m.lock();
            if *stopped {
                return;
            }
            cv.wait_for(&mut stopped, every);
            if *stopped {
                return;
            }
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if let Err(e) = engine.retention_pass(&mut cursor, SWEEP) {
            tracing::warn!(error = %e, "retention pass failed");
        }
    }
}
