//! The resident records of closed streams (docs/resident-streams.md, step 1): what the
//! registry's eviction closes, kept so that opening the stream again reads neither its sidecar
//! nor its directory listing.
//!
//! A stream is closed only when its state is all in its sidecar and segments (checkpointed, no
//! record enqueued, no one holding it), so a record is a cache of what its files say, and
//! losing one costs only the slower open from the files. A record is taken out (removed) by the
//! open that uses it, so a stream is open or has a record, never both: nothing changes a
//! stream's files while it is closed (every change goes through the open stream), and the
//! record stays true. Not kept with a cold tier, which moves the segments of closed streams.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::error::Result;
use crate::segment::{SegmentRecord, SegmentSet};
use crate::state::StreamState;

use super::stream::Stream;

/// A closed stream as its last open knew it.
pub(super) struct Resident {
    /// The applied (and checkpointed) state, as the sidecar holds it.
    state: StreamState,
    /// The LSN of that state, and the generation of the sidecar that holds it.
    lsn: u64,
    generation: u64,
    /// Its segments, ascending: where each starts, its files' lengths and room (see
    /// `SegmentRecord`), so its next open opens, lists and maps nothing.
    segs: Box<[SegmentRecord]>,
    /// The last access, for a sliding TTL.
    last_access_ms: u64,
}

/// The resident records by name.
#[derive(Default)]
pub(super) struct Residents {
    records: Mutex<HashMap<Box<str>, Resident>>,
}

impl Residents {
    /// Keeps the record of `s`, which the registry just closed: it is idle and clean (see
    /// `registry::close_idle`). A deleted stream keeps none.
    pub(super) fn keep(&self, s: &Stream) {
        let d = s.data.lock();
        if d.deleted || d.applied_lsn != d.checkpointed_lsn {
            return;
        }
        let Some(segs) = d.segs.as_ref().and_then(SegmentSet::record) else {
            return;
        };
        let record = Resident {
            state: d.state.clone(),
            lsn: d.applied_lsn,
            generation: d.generation,
            segs,
            last_access_ms: s.last_access_ms.load(Ordering::Relaxed),
        };
        drop(d);
        self.records.lock().insert(s.name.as_str().into(), record);
    }

    /// Opens the stream `name` of the store in `root` from its record, taking the record out;
    /// `None` without one. Its directory is computed again from the name (a hash: cheaper
    /// than the hundred-odd bytes of a path kept per record).
    /// Its segments are resumed from the record (`SegmentSet::resume`): the last one's log is
    /// opened (`SegmentSet::open_last`), nothing else until a read maps an index or wakes the
    /// set. A failure drops the record and is returned: the caller opens from the files
    /// instead, which finds the cause again and reports it as an open would.
    pub(super) fn open(
        &self,
        root: &Path,
        name: &str,
        shard: usize,
        segment_bytes: u64,
    ) -> Option<Result<Arc<Stream>>> {
        let r = self.records.lock().remove(name)?;
        let dir = crate::fs::stream_dir(root, name);
        let resumed = SegmentSet::resume(&dir, &r.segs, r.state.tail, segment_bytes)
            .and_then(|mut segs| segs.open_last().map(|()| segs));
        let segs = match resumed {
            Ok(segs) => segs,
            Err(e) => return Some(Err(e)),
        };
        let s = Stream::new(r.state, dir, shard, Some(segs), r.lsn, r.generation, true);
        s.last_access_ms.store(r.last_access_ms, Ordering::Relaxed);
        Some(Ok(s))
    }

    /// Drops the record of `name`, if any: its files are about to change behind the registry.
    pub(super) fn forget(&self, name: &str) {
        self.records.lock().remove(name);
    }

    /// How many records are kept.
    pub(super) fn len(&self) -> usize {
        self.records.lock().len()
    }
}
