//! Snapshots and retention: publishing a snapshot blob at an offset, serving one, refusing to
//! delete the latest, and moving a stream's retained start forward to a snapshot.
//!
//! A snapshot's blob is streamed to a temporary file, synced, renamed into place and its
//! directory synced before its record is enqueued (so a durable record never names a missing
//! blob). Snapshots are immutable per offset; their digest is `sha256:` and the hex SHA-256 of
//! the content type, a NUL and the blob.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fs;
use crate::name::{Incarnation, Offset, StreamName, normalize_content_type};
use crate::types::{Snapshot, SnapshotInfo, StreamInfo};

use super::apply::snapshot_file;
use super::stream::{Core, Stream};
use super::{Engine, hex};

impl Engine {
    /// Publishes a snapshot of `name` at `offset` (a message boundary or the tail) whose
    /// content is read from `blob`, and waits until its record is durable. Returns the
    /// snapshot (at the canonical offset) and the stream's description.
    ///
    /// What can be refused without the blob is refused before it is read (see
    /// `StreamState::check_snapshot`); everything is checked again under `core` once it is
    /// written. Republishing the same content at the same offset succeeds without writing; other
    /// content there is `SnapshotConflict`.
    pub(crate) fn publish_snapshot(
        &self,
        name: &StreamName,
        offset: Offset,
        content_type: Option<&str>,
        blob: &mut dyn Read,
        expect_digest: Option<&str>,
        expect: Option<&Incarnation>,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        self.publish_snapshot_checked(
            name,
            offset,
            content_type,
            blob,
            expect_digest,
            expect,
            None,
        )
    }

    /// [`Engine::publish_snapshot`], refusing with `SnapshotDigestMismatch` (once the blob is
    /// written, before anything is published) a blob whose digest is not `blob_digest`.
    #[expect(
        clippy::too_many_arguments,
        reason = "the publish's arguments, each a separate precondition"
    )]
    pub(crate) fn publish_snapshot_checked(
        &self,
        name: &StreamName,
        offset: Offset,
        content_type: Option<&str>,
        blob: &mut dyn Read,
        expect_digest: Option<&str>,
        expect: Option<&Incarnation>,
        blob_digest: Option<&str>,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        let ct = normalize_content_type(content_type.unwrap_or("application/octet-stream"))?;
        // Refuse what can be refused before streaming a blob of up to `max_snapshot_bytes`.
        s.core.lock().state.check_snapshot(offset, expect_digest)?;
        let (tmp, digest, len) = self.write_blob(&s, &ct, blob)?;
        if blob_digest.is_some_and(|want| want != digest) {
            return Err(Error::SnapshotDigestMismatch { assembled: digest });
        }
        let core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        core.state.check_snapshot(offset, expect_digest)?;
        let tail = core.state.tail;
        if let Some(existing) = core
            .state
            .snapshots
            .iter()
            .find(|x| x.offset.bytes == offset.bytes)
        {
            if existing.digest == digest && existing.content_type == ct {
                let info = existing.clone();
                // The same content again puts back a blob the stream lists but lost (a
                // published snapshot must stay readable), before answering as the first did.
                let path = s.dir.join(snapshot_file(info.offset));
                if !path.exists() {
                    tmp.persist(&path)?;
                    sync_blob_dirs(&s.dir)?;
                    tracing::warn!(stream = %name, offset = %info.offset, "a missing snapshot blob was restored by its republication");
                }
                return self.republished(&s, core, info);
            }
            return Err(Error::SnapshotConflict);
        }
        drop(core);
        if !self.is_boundary(&s, offset.bytes)? && offset.bytes != tail.bytes {
            return Err(Error::NotOnBoundary(offset));
        }
        let canonical = self.check_halves(&s, offset)?;
        let mut core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        // Another publication got in while the lock was released for the boundary lookups.
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
        tmp.persist(&s.dir.join(snapshot_file(canonical)))?;
        sync_blob_dirs(&s.dir)?;
        core.state.apply_snapshot(&info);
        let t = self.shards[s.shard].push(&s, s.snapshot_record(info.clone()))?;
        core.last_lsn = t.lsn;
        let sinfo = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok((info, sinfo))
    }

    /// `info`, a snapshot of `s` already published as asked, answered as its publish was: once
    /// its record is durable (it may still be in flight from the publish that wrote it).
    pub(super) fn republished(
        &self,
        s: &Stream,
        core: MutexGuard<'_, Core>,
        info: SnapshotInfo,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        let t = self.shards[s.shard].ticket(core.last_lsn);
        let sinfo = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok((info, sinfo))
    }

    /// Streams `blob` into a synced temporary file in `s`'s directory, hashing it as it goes;
    /// returns the file, the digest (of `ct` and the blob) and the length. A blob over
    /// `max_snapshot_bytes` is `TooLarge`. The file is removed unless it is persisted.
    fn write_blob(
        &self,
        s: &Stream,
        ct: &str,
        blob: &mut dyn Read,
    ) -> Result<(TempFile, String, u64)> {
        let tmp = TempFile::new(s.dir.join(format!(
            "snap-tmp-{}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        )));
        let mut f = fs::create(&tmp.path)?;
        let mut hasher = digest_hasher(ct);
        let limit = self.options.max_snapshot_bytes;
        let len = copy_bounded(blob, &mut f, limit, "snapshot", &mut |piece| {
            hasher.update(piece);
            Ok(())
        })?;
        fs::sync_all(&f, &tmp.path)?;
        Ok((tmp, digest_string(hasher), len))
    }

    /// The snapshot at `offset` (the latest if `None`) of a live stream, as a mapped view of
    /// its blob, checked against its length and digest before it is served.
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
            Some(o) => vis.snapshots.iter().find(|x| x.offset == o).cloned(),
        }
        .ok_or(Error::SnapshotNotFound)?;
        // A request that would answer 404 without Stream-Incarnation still does (the seed).
        s.check_expect(expect)?;
        let path = s.dir.join(snapshot_file(info.offset));
        let data = match crate::segment::blob_view(&path) {
            // Retention removed it since `visible()` (its files go only after the stream's
            // state stopped listing it), or it is missing: a published snapshot the state
            // still lists is never answered as absent, which would let a bootstrap serve the
            // messages after it without it.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                let listed = s
                    .visible()
                    .snapshots
                    .iter()
                    .any(|x| x.offset == info.offset);
                return Err(if listed {
                    Error::corrupt(&path, "a published snapshot's blob is missing")
                } else {
                    Error::SnapshotNotFound
                });
            }
            other => other?,
        };
        // The blob is served only if it is still the one published (its length and digest).
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

    /// Refuses to delete a snapshot: snapshots are immutable, so deleting the latest is
    /// `SnapshotDeleteRefused` and any other offset `SnapshotNotFound` (older ones go only
    /// with retention).
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

    /// Moves the stream's retained start forward to `offset` (a message boundary at or before
    /// the latest snapshot) and waits until its record is durable; the segments and snapshots
    /// behind it are removed once it is (none while the stream has forks). Retention never
    /// moves back: an offset at or before the current start succeeds without writing.
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
        let canonical = self.check_halves(&s, offset)?;
        let core = s.core.lock();
        if core.gone {
            return Err(Error::NotFound);
        }
        match core.state.latest_snapshot() {
            Some(l) if l.offset.bytes >= offset.bytes => {}
            _ => return Err(Error::RetentionBeyondSnapshot),
        }
        self.move_earliest(&s, core, canonical)
    }

    /// Moves `s`'s earliest offset forward to `canonical` (a message boundary the caller
    /// checked, with `core` held since) and waits until its record is durable; an offset at or
    /// before the current start succeeds without writing. The files behind it are reclaimed
    /// once a checkpoint records the move (`Shard::reclaim`), so a crash at any point leaves
    /// either the old start with every file, or the new one (recovery removes what is left).
    pub(super) fn move_earliest(
        &self,
        s: &Arc<Stream>,
        mut core: parking_lot::MutexGuard<'_, super::stream::Core>,
        canonical: Offset,
    ) -> Result<StreamInfo> {
        if canonical.bytes <= core.state.earliest.bytes {
            let t = self.shards[s.shard].ticket(core.last_lsn);
            let info = s.staged_info(&core.state);
            drop(core);
            t.wait()?;
            return Ok(info);
        }
        core.state.apply_retention(canonical);
        let t = self.shards[s.shard].push(s, s.retention_record(canonical))?;
        core.last_lsn = t.lsn;
        let info = s.staged_info(&core.state);
        drop(core);
        t.wait()?;
        Ok(info)
    }
}

/// Makes a blob just renamed into stream directory `dir` durable: the directory, and the two
/// above it (`streams/{k0}` and `streams`). A stream's directory is otherwise made durable by
/// the next checkpoint's `syncfs` (its create record rebuilds it after a crash), so a power
/// loss before then could take a new stream's directory, and the blob in it, along, while the
/// snapshot's record survives in the journal.
fn sync_blob_dirs(dir: &Path) -> Result<()> {
    fs::sync_dir(dir)?;
    let mut up = dir.parent();
    for _ in 0..2 {
        let Some(d) = up else { break };
        fs::sync_dir(d)?;
        up = d.parent();
    }
    Ok(())
}

/// Copies `blob` into `out` and returns its length, refusing (`TooLarge`, naming it `what`)
/// one over `limit` bytes before writing the piece that crosses it; `each` sees every piece
/// before it is written (and may refuse it).
pub(super) fn copy_bounded(
    blob: &mut dyn Read,
    out: &mut dyn Write,
    limit: u64,
    what: &str,
    each: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut len = 0u64;
    loop {
        let n = blob.read(&mut buf)?;
        if n == 0 {
            return Ok(len);
        }
        len += n as u64;
        if len > limit {
            return Err(Error::TooLarge(format!(
                "{what} is larger than {limit} bytes"
            )));
        }
        each(&buf[..n])?;
        out.write_all(&buf[..n])?;
    }
}

/// A hasher for a snapshot digest, fed the content type and its NUL separator.
fn digest_hasher(content_type: &str) -> Sha256 {
    let mut h = Sha256::new();
    h.update(content_type.as_bytes());
    h.update([0u8]);
    h
}

/// The digest string (`sha256:` and lowercase hex) of a fed hasher.
fn digest_string(h: Sha256) -> String {
    format!("sha256:{}", hex(&h.finalize()))
}

/// A snapshot's digest: `sha256:` and the hex SHA-256 of its content type, a NUL, and the blob.
fn snapshot_digest(content_type: &str, blob: &[u8]) -> String {
    let mut h = digest_hasher(content_type);
    h.update(blob);
    digest_string(h)
}

/// A temporary file, removed when dropped unless it was persisted.
struct TempFile {
    path: PathBuf,
    /// Persisted: the path is no longer ours to remove.
    kept: bool,
}

impl TempFile {
    /// Takes charge of the (not yet created) file at `path`.
    fn new(path: PathBuf) -> TempFile {
        TempFile { path, kept: false }
    }

    /// Renames the file to `to` (not synced: the caller syncs the directory) and keeps it.
    fn persist(mut self, to: &Path) -> Result<()> {
        fs::rename(&self.path, to)?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for TempFile {
    /// Removes the file unless it was persisted (a failed or refused publication).
    fn drop(&mut self) {
        if !self.kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}
