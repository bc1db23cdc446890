//! Snapshots and retention.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::fs;
use crate::journal::Record;
use crate::name::{Incarnation, Offset, StreamName, normalize_content_type};
use crate::types::{Snapshot, SnapshotInfo, StreamInfo};

use super::Engine;
use super::apply::snapshot_file;

impl Engine {
    pub(crate) fn publish_snapshot(
        &self,
        name: &StreamName,
        offset: Offset,
        content_type: Option<&str>,
        blob: &mut dyn Read,
        expect_digest: Option<&str>,
        expect: Option<&Incarnation>,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        use sha2::Digest;
        let s = self.live(name)?;
        s.check_expect(expect)?;
        let ct = normalize_content_type(content_type.unwrap_or("application/octet-stream"))?;
        // Refuse what can be refused before streaming a blob of up to `max_snapshot_bytes` to
        // disk; everything is checked again under the lock below.
        {
            let core = s.core.lock();
            let st = &core.state;
            let latest = st.latest_snapshot();
            let republish = st.snapshots.iter().any(|x| x.offset.bytes == offset.bytes);
            if offset.bytes > st.tail.bytes {
                return Err(Error::OffsetBeyondTail { tail: st.tail });
            }
            if offset.bytes < st.earliest.bytes {
                return Err(Error::OffsetGone {
                    earliest: st.earliest,
                });
            }
            if expect_digest.is_some_and(|want| latest.map(|l| l.digest.as_str()) != Some(want)) {
                return Err(Error::SnapshotMatchFailed {
                    current: latest.map(|l| l.digest.clone()),
                });
            }
            if let Some(l) = latest.filter(|l| l.offset.bytes > offset.bytes && !republish) {
                return Err(Error::SnapshotStale { latest: l.offset });
            }
        }
        // Stream the blob to a temporary file, hashing as it goes.
        let tmp = s.dir.join(format!(
            "snap-tmp-{}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        ));
        let cleanup = TempFile(tmp.clone());
        let mut f = File::create(&tmp)?;
        let mut hasher = sha2::Sha256::new();
        hasher.update(ct.as_bytes());
        hasher.update([0u8]);
        let mut buf = vec![0u8; 256 << 10];
        let mut len = 0u64;
        loop {
            let n = blob.read(&mut buf)?;
            if n == 0 {
                break;
            }
            len += n as u64;
            if len > self.options.max_snapshot_bytes {
                return Err(Error::TooLarge(format!(
                    "snapshot is larger than {} bytes",
                    self.options.max_snapshot_bytes
                )));
            }
            hasher.update(&buf[..n]);
            f.write_all(&buf[..n])?;
        }
        f.sync_all()?;
        drop(f);
        let digest = format!(
            "sha256:{}",
            hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        let tail = core.state.tail;
        if offset.bytes > tail.bytes {
            return Err(Error::OffsetBeyondTail { tail });
        }
        if offset.bytes < core.state.earliest.bytes {
            return Err(Error::OffsetGone {
                earliest: core.state.earliest,
            });
        }
        let latest = core.state.latest_snapshot().cloned();
        if let Some(want) = expect_digest
            && latest.as_ref().map(|l| l.digest.as_str()) != Some(want)
        {
            return Err(Error::SnapshotMatchFailed {
                current: latest.map(|l| l.digest),
            });
        }
        if let Some(existing) = core
            .state
            .snapshots
            .iter()
            .find(|x| x.offset.bytes == offset.bytes)
        {
            if existing.digest == digest && existing.content_type == ct {
                let info = existing.clone();
                let t = self.shards[s.shard].ticket(core.last_lsn);
                let sinfo = s.staged_info(&core.state);
                drop(core);
                t.wait()?;
                return Ok((info, sinfo));
            }
            return Err(Error::SnapshotConflict);
        }
        if let Some(l) = &latest
            && l.offset.bytes > offset.bytes
        {
            return Err(Error::SnapshotStale { latest: l.offset });
        }
        drop(core);
        let canonical = self.offset_at(&s, offset.bytes)?;
        if !self.is_boundary(&s, offset.bytes)? && offset.bytes != tail.bytes {
            return Err(Error::NotOnBoundary(offset));
        }
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        if core
            .state
            .snapshots
            .iter()
            .any(|x| x.offset.bytes >= offset.bytes)
        {
            return Err(Error::SnapshotConflict);
        }
        let info = SnapshotInfo {
            offset: canonical,
            digest,
            content_type: ct,
            len,
        };
        std::fs::rename(&tmp, s.dir.join(snapshot_file(canonical)))?;
        std::mem::forget(cleanup);
        fs::sync_dir(&s.dir)?;
        core.state.apply_snapshot(&info);
        let record = Record::Snapshot {
            name: name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            info: info.clone(),
        };
        let t = self.shards[s.shard].push(&s, record)?;
        core.last_lsn = t.lsn;
        let sinfo = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok((info, sinfo))
    }

    pub(crate) fn snapshot(
        &self,
        name: &StreamName,
        offset: Option<Offset>,
        expect: Option<&Incarnation>,
    ) -> Result<Snapshot> {
        let s = self.live(name)?;
        let vis = s.visible();
        let info = match offset {
            None => vis.snapshots.last().cloned(),
            Some(o) => vis
                .snapshots
                .iter()
                .find(|x| x.offset.bytes == o.bytes)
                .cloned(),
        }
        .ok_or(Error::SnapshotNotFound)?;
        // A request that would answer 404 without Stream-Incarnation still does (the seed).
        s.check_expect(expect)?;
        let data = match crate::segment::blob_view(&s.dir.join(snapshot_file(info.offset))) {
            // Retention removed it since `visible()`.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::SnapshotNotFound);
            }
            other => other?,
        };
        // The blob is served only if it is still the one published (its length and digest).
        let path = s.dir.join(snapshot_file(info.offset));
        if data.len() as u64 != info.len
            || snapshot_digest(&info.content_type, &data) != info.digest
        {
            return Err(Error::corrupt(
                path,
                "snapshot blob does not match its digest",
            ));
        }
        Ok(Snapshot {
            info,
            data,
            tail: vis.tail,
            closed: vis.closed,
            incarnation: s.incarnation.clone(),
        })
    }

    pub(crate) fn delete_snapshot(
        &self,
        name: &StreamName,
        offset: Offset,
        expect: Option<&Incarnation>,
    ) -> Result<()> {
        let s = self.live(name)?;
        let vis = s.visible();
        match vis.snapshots.last() {
            Some(l) if l.offset.bytes == offset.bytes => {
                s.check_expect(expect)?;
                Err(Error::SnapshotDeleteRefused)
            }
            // 404 with or without Stream-Incarnation (the seed).
            _ => Err(Error::SnapshotNotFound),
        }
    }

    pub(crate) fn set_retention(
        &self,
        name: &StreamName,
        offset: Offset,
        expect: Option<&Incarnation>,
    ) -> Result<StreamInfo> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        if !self.is_boundary(&s, offset.bytes)? {
            return Err(Error::NotOnBoundary(offset));
        }
        let canonical = self.offset_at(&s, offset.bytes)?;
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        match core.state.latest_snapshot() {
            Some(l) if l.offset.bytes >= offset.bytes => {}
            _ => return Err(Error::RetentionBeyondSnapshot),
        }
        if canonical.bytes <= core.state.earliest.bytes {
            let t = self.shards[s.shard].ticket(core.last_lsn);
            let info = s.staged_info(&core.state);
            drop(core);
            t.wait()?;
            return Ok(info);
        }
        core.state.apply_retention(canonical);
        let record = Record::Retention {
            name: name.as_str().to_owned(),
            incarnation: s.incarnation.as_str().to_owned(),
            to: canonical,
        };
        let t = self.shards[s.shard].push(&s, record)?;
        core.last_lsn = t.lsn;
        let info = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok(info)
    }
}
/// A snapshot's digest: `sha256:` and the hex SHA-256 of its content type, a NUL, and the blob.
pub(super) fn snapshot_digest(content_type: &str, blob: &[u8]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(content_type.as_bytes());
    h.update([0u8]);
    h.update(blob);
    format!(
        "sha256:{}",
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Removes a temporary file when dropped (unless forgotten).
pub(super) struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
