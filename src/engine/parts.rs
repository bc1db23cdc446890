//! Snapshots uploaded in parts (Ursula 0.11's snapshot parts): staging a part, committing the
//! parts as one snapshot, discarding them.
//!
//! A part is a file under `{root}/snapshot-parts/`, written as its body arrives (through a
//! fixed buffer, so a part of any size costs the same memory) and never synced: parts are
//! scratch, not state. They belong to one incarnation of one stream; only a commit on that
//! incarnation finds them, and a commit spends them. What is kept about them lives in memory
//! only, so opening the store removes every part a previous process left, and a client whose
//! upload a restart interrupted stages its parts again.
//!
//! Bounds (DESIGN.md, "Snapshot parts"): a part is at most `max_snapshot_bytes`; a stream holds
//! at most [`MAX_STAGED_PARTS`] unused parts and `2 × max_snapshot_bytes` of them; a tenant (the
//! prefix its parts are staged under: the stream name's first segment unless the caller names
//! one, as the HTTP server does from the token's grant) holds at most
//! `max_staged_bytes_per_tenant` (default `2 × max_snapshot_bytes`, a quarter of the store's),
//! so one tenant cannot fill the store's pool and have every other refused for a day; the
//! store holds at most `8 × max_snapshot_bytes` of them in all. A part older than
//! [`PART_GRACE`] is removed by the next stage on any stream. The bounds are checked before a
//! part's body is read (no room at all is refused then), and its bytes are reserved as they
//! arrive, so concurrent parts never pass them together and none holds room it has not used.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result, StagedLimit};
use crate::fs;
use crate::name::{Incarnation, Offset, StreamName};
use crate::types::{SnapshotInfo, StreamInfo};

use super::Engine;
use super::snapshot::copy_bounded;

/// The most parts one commit may list (Ursula's bound).
pub(crate) const MAX_COMMIT_PARTS: usize = 4096;

/// The most unused parts a stream holds: two commits' worth, so an abandoned upload and a full
/// retry fit.
pub(crate) const MAX_STAGED_PARTS: u64 = 2 * MAX_COMMIT_PARTS as u64;

/// How long an unused part is kept.
pub(crate) const PART_GRACE: Duration = Duration::from_hours(24);

/// The directory of the staged parts, under the store's root.
const PARTS_DIR: &str = "snapshot-parts";

/// One staged part.
struct Part {
    /// Its file.
    path: PathBuf,
    /// Its length.
    len: u64,
    /// The tenant its bytes are counted to.
    tenant: String,
    /// When it was staged.
    staged: Instant,
}

/// The unused parts of one incarnation of one stream.
#[derive(Default)]
struct StreamParts {
    /// The incarnation they belong to.
    incarnation: Option<Incarnation>,
    /// By id.
    parts: HashMap<String, Part>,
    /// Bytes of `parts` plus bytes reserved by parts being written.
    bytes: u64,
    /// Parts being written.
    writing: u64,
    /// A commit or discard holds these parts.
    busy: bool,
}

/// The store's staged parts.
#[derive(Default)]
struct Staged {
    streams: HashMap<StreamName, StreamParts>,
    /// Bytes of every stream's parts, reserved ones included.
    bytes: u64,
    /// Bytes of each tenant's parts, reserved ones included (tenants at zero are forgotten).
    tenants: HashMap<String, u64>,
}

/// Takes `n` bytes from `tenant`'s count in `tenants`, forgetting it at zero.
fn give_back(tenants: &mut HashMap<String, u64>, tenant: &str, n: u64) {
    if let Some(held) = tenants.get_mut(tenant) {
        *held = held.saturating_sub(n);
        if *held == 0 {
            tenants.remove(tenant);
        }
    }
}

/// The tenant a stream's parts count to when the caller names none: the stream name's first
/// segment (`alice` for `alice/chat/1`), the layout docs/http.md recommends for tenants.
pub(crate) fn default_tenant(name: &StreamName) -> &str {
    name.as_str().split('/').next().unwrap_or("")
}

/// The staged snapshot parts of a store (see the module doc).
pub(crate) struct StagedParts {
    dir: PathBuf,
    state: Mutex<Staged>,
}

impl StagedParts {
    /// The parts of the store at `root`: none, after removing whatever an earlier process left.
    pub(crate) fn open(root: &Path) -> Result<StagedParts> {
        let dir = root.join(PARTS_DIR);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        Ok(StagedParts {
            dir,
            state: Mutex::new(Staged::default()),
        })
    }
}

/// A stream's parts taken by a commit or a discard; handed back when dropped.
struct Held<'a> {
    staged: &'a StagedParts,
    name: StreamName,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(sp) = self.staged.state.lock().streams.get_mut(&self.name) {
            sp.busy = false;
        }
    }
}

/// Removes the files of `parts`, giving their bytes back to the store's count (`staged_bytes`),
/// their tenants' (`tenants`) and `sp`.
fn remove_parts(
    staged_bytes: &mut u64,
    tenants: &mut HashMap<String, u64>,
    sp: &mut StreamParts,
    ids: &[String],
) {
    for id in ids {
        if let Some(p) = sp.parts.remove(id) {
            sp.bytes = sp.bytes.saturating_sub(p.len);
            *staged_bytes = staged_bytes.saturating_sub(p.len);
            give_back(tenants, &p.tenant, p.len);
            let _ = fs::remove_file(&p.path);
        }
    }
}

/// Reads `files` one after the other, as one blob.
struct Chain {
    files: std::vec::IntoIter<File>,
    current: Option<File>,
}

impl Read for Chain {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(f) = self.current.as_mut() else {
                return Ok(0);
            };
            let n = f.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            self.current = self.files.next();
        }
    }
}

/// Whether a commit that failed with `e` may be repeated with the same parts: the server's own
/// failures. After any other answer the commit is final, and its parts are spent.
fn retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Io(_)
            | Error::Poisoned { .. }
            | Error::OutcomeUnknown { .. }
            | Error::ShutDown
            | Error::Locked(_)
            | Error::TooManyOpenStreams { .. }
            | Error::TooManyOpenFiles
            | Error::TierUnavailable { .. }
    )
}

impl Engine {
    /// The bound on every stream's unused parts together.
    fn store_parts_bytes(&self) -> u64 {
        self.options.max_snapshot_bytes.saturating_mul(8)
    }

    /// The bound on one stream's unused parts.
    fn stream_parts_bytes(&self) -> u64 {
        self.options.max_snapshot_bytes.saturating_mul(2)
    }

    /// The bound on one tenant's unused parts.
    fn tenant_parts_bytes(&self) -> u64 {
        self.options.max_staged_bytes_per_tenant()
    }

    /// Stages one part of a snapshot of `name` (in the `expect`ed incarnation) read from
    /// `blob`, counted to `tenant`, and returns its id, its length and the stream's
    /// incarnation. The part is not durable.
    pub(crate) fn stage_snapshot_part(
        &self,
        name: &StreamName,
        tenant: &str,
        blob: &mut dyn Read,
        expect: Option<&Incarnation>,
    ) -> Result<(String, u64, Incarnation)> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        let incarnation = s.incarnation.clone();
        let id = format!(
            "{:x}-{:x}",
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        );
        let path = self.parts.dir.join(format!("{id}.part"));
        // The count and the room are checked before the body is read; its bytes are reserved
        // as they arrive.
        {
            let mut st = self.parts.state.lock();
            Self::sweep_parts(&mut st);
            let st = &mut *st;
            let sp = st.streams.entry(name.clone()).or_default();
            if sp.incarnation.as_ref() != Some(&incarnation) && !sp.busy {
                // A deleted incarnation's parts can never be committed.
                let ids: Vec<String> = sp.parts.keys().cloned().collect();
                remove_parts(&mut st.bytes, &mut st.tenants, sp, &ids);
                sp.incarnation = Some(incarnation.clone());
            }
            if sp.parts.len() as u64 + sp.writing >= MAX_STAGED_PARTS {
                return Err(Error::StagedPartsLimit {
                    limit: StagedLimit::Parts(MAX_STAGED_PARTS),
                });
            }
            let of_tenant = st.tenants.get(tenant).copied().unwrap_or(0);
            self.room_for(st.bytes, of_tenant, sp.bytes, 1)?;
            sp.writing += 1;
        }
        let mut reserved = 0u64;
        let written = self.write_part(&path, blob, &mut |n| {
            let mut st = self.parts.state.lock();
            let st = &mut *st;
            let sp = st.streams.entry(name.clone()).or_default();
            let of_tenant = st.tenants.entry(tenant.to_owned()).or_insert(0);
            self.room_for(st.bytes, *of_tenant, sp.bytes, n)?;
            sp.bytes += n;
            st.bytes += n;
            *of_tenant += n;
            reserved += n;
            Ok(())
        });
        let mut st = self.parts.state.lock();
        let st = &mut *st;
        let sp = st.streams.entry(name.clone()).or_default();
        sp.writing = sp.writing.saturating_sub(1);
        let keep = match written {
            Ok(len) if sp.incarnation.as_ref() == Some(&incarnation) => Ok(len),
            // The stream was recreated (and parts staged for it) while this one was written.
            Ok(_) => Err(Error::IncarnationMismatch {
                current: sp.incarnation.clone().unwrap_or(incarnation.clone()),
            }),
            Err(e) => Err(e),
        };
        let len = match keep {
            Ok(len) => len,
            Err(e) => {
                sp.bytes = sp.bytes.saturating_sub(reserved);
                st.bytes = st.bytes.saturating_sub(reserved);
                give_back(&mut st.tenants, tenant, reserved);
                let _ = fs::remove_file(&path);
                return Err(e);
            }
        };
        sp.parts.insert(
            id.clone(),
            Part {
                path,
                len,
                tenant: tenant.to_owned(),
                staged: Instant::now(),
            },
        );
        Ok((id, len, incarnation))
    }

    /// Whether `n` more bytes fit beside the store's `store`, the tenant's `tenant` and the
    /// stream's `stream` bytes of unused parts (`StagedPartsLimit` naming the bound otherwise).
    fn room_for(&self, store: u64, tenant: u64, stream: u64, n: u64) -> Result<()> {
        if stream.saturating_add(n) > self.stream_parts_bytes() {
            return Err(Error::StagedPartsLimit {
                limit: StagedLimit::Bytes(self.stream_parts_bytes()),
            });
        }
        if tenant.saturating_add(n) > self.tenant_parts_bytes() {
            return Err(Error::StagedPartsLimit {
                limit: StagedLimit::TenantBytes(self.tenant_parts_bytes()),
            });
        }
        if store.saturating_add(n) > self.store_parts_bytes() {
            return Err(Error::StagedPartsLimit {
                limit: StagedLimit::StoreBytes(self.store_parts_bytes()),
            });
        }
        Ok(())
    }

    /// Streams `blob` into a new part file at `path`, at most `max_snapshot_bytes`
    /// (`TooLarge` past it), calling `reserve` with each piece's length before writing it;
    /// returns the part's length. Not synced: parts do not outlive the process.
    fn write_part(
        &self,
        path: &Path,
        blob: &mut dyn Read,
        reserve: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        let limit = self.options.max_snapshot_bytes;
        fs::create_dir_all(&self.parts.dir)?;
        let mut f = fs::create(path)?;
        copy_bounded(blob, &mut f, limit, "a snapshot part", &mut |piece| {
            reserve(piece.len() as u64)
        })
    }

    /// Removes the parts older than [`PART_GRACE`] that no commit holds.
    fn sweep_parts(st: &mut Staged) {
        let now = Instant::now();
        let Staged {
            streams,
            bytes,
            tenants,
        } = st;
        streams.retain(|_, sp| {
            if !sp.busy {
                let old: Vec<String> = sp
                    .parts
                    .iter()
                    .filter(|(_, p)| now.duration_since(p.staged) > PART_GRACE)
                    .map(|(id, _)| id.clone())
                    .collect();
                remove_parts(bytes, tenants, sp, &old);
            }
            sp.busy || sp.writing > 0 || !sp.parts.is_empty()
        });
    }

    /// Takes `name`'s parts for a commit or a discard (`SnapshotCommitInProgress` while another
    /// holds them).
    fn hold_parts(&self, name: &StreamName) -> Result<Held<'_>> {
        let mut st = self.parts.state.lock();
        let sp = st.streams.entry(name.clone()).or_default();
        if sp.busy {
            return Err(Error::SnapshotCommitInProgress);
        }
        sp.busy = true;
        Ok(Held {
            staged: &self.parts,
            name: name.clone(),
        })
    }

    /// Publishes the staged `parts` of `name`, in order, as the snapshot at `offset` whose
    /// digest must be `digest` (see [`Engine::publish_snapshot`]); durable when it returns.
    ///
    /// The stream's latest snapshot decides first: the same snapshot already published answers
    /// as the publish did, without the parts; an offset a snapshot already covers is
    /// `SnapshotConflict`. Then every part must be staged for the stream's current incarnation
    /// (`UnknownPart`) and together at most `max_snapshot_bytes` (`TooLarge`). The parts are
    /// spent by any answer except the server's own failures, after which the commit can be
    /// repeated.
    pub(crate) fn publish_snapshot_parts(
        &self,
        name: &StreamName,
        offset: Offset,
        content_type: Option<&str>,
        parts: &[String],
        digest: &str,
        expect: Option<&Incarnation>,
    ) -> Result<(SnapshotInfo, StreamInfo)> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        {
            let core = s.core.lock();
            if let Some(existing) = core
                .state
                .snapshots
                .iter()
                .find(|x| x.offset.bytes == offset.bytes && x.digest == digest)
            {
                let info = existing.clone();
                return self.republished(&s, core, info);
            }
            core.state.check_snapshot(offset, None)?;
            // Another snapshot at this offset: refused before any part is read.
            if core
                .state
                .snapshots
                .iter()
                .any(|x| x.offset.bytes == offset.bytes)
            {
                return Err(Error::SnapshotConflict);
            }
        }
        if parts.is_empty() || parts.len() > MAX_COMMIT_PARTS {
            return Err(Error::InvalidArgument(format!(
                "a commit lists 1 to {MAX_COMMIT_PARTS} parts, not {}",
                parts.len()
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(parts.len());
        if let Some(twice) = parts.iter().find(|id| !seen.insert(id.as_str())) {
            return Err(Error::InvalidArgument(format!(
                "part {twice:?} is listed twice"
            )));
        }
        let incarnation = s.incarnation.clone();
        let held = self.hold_parts(name)?;
        let (files, total) = {
            let st = self.parts.state.lock();
            let sp = st.streams.get(name);
            let mut files = Vec::with_capacity(parts.len());
            let mut total = 0u64;
            for id in parts {
                let part = sp
                    .filter(|sp| sp.incarnation.as_ref() == Some(&incarnation))
                    .and_then(|sp| sp.parts.get(id))
                    .ok_or_else(|| Error::UnknownPart { part: id.clone() })?;
                total = total.saturating_add(part.len);
                files.push(part.path.clone());
            }
            (files, total)
        };
        if total > self.options.max_snapshot_bytes {
            return Err(Error::TooLarge(format!(
                "the parts assemble a snapshot larger than {} bytes",
                self.options.max_snapshot_bytes
            )));
        }
        let mut opened = Vec::with_capacity(files.len());
        for f in &files {
            opened.push(File::open(f)?);
        }
        let mut files = opened.into_iter();
        let mut chain = Chain {
            current: files.next(),
            files,
        };
        let published = self.publish_snapshot_checked(
            name,
            offset,
            content_type,
            &mut chain,
            None,
            Some(&incarnation),
            Some(digest),
        );
        let published = match published {
            // Recreated while the parts were read: for a caller that named no incarnation,
            // the parts are simply not this stream's.
            Err(Error::IncarnationMismatch { .. }) if expect.is_none() => Err(Error::UnknownPart {
                part: parts.first().cloned().unwrap_or_default(),
            }),
            other => other,
        };
        if !matches!(&published, Err(e) if retryable(e)) {
            let mut st = self.parts.state.lock();
            let st = &mut *st;
            if let Some(sp) = st.streams.get_mut(name) {
                remove_parts(&mut st.bytes, &mut st.tenants, sp, parts);
            }
        }
        drop(held);
        published
    }

    /// Discards every unused part of `name` (in the `expect`ed incarnation), and of its earlier
    /// incarnations; returns the stream's incarnation.
    pub(crate) fn discard_snapshot_parts(
        &self,
        name: &StreamName,
        expect: Option<&Incarnation>,
    ) -> Result<Incarnation> {
        let s = self.live(name)?;
        s.check_expect(expect)?;
        let held = self.hold_parts(name)?;
        {
            let mut st = self.parts.state.lock();
            let st = &mut *st;
            if let Some(sp) = st.streams.get_mut(name) {
                let ids: Vec<String> = sp.parts.keys().cloned().collect();
                remove_parts(&mut st.bytes, &mut st.tenants, sp, &ids);
            }
        }
        drop(held);
        Ok(s.incarnation.clone())
    }
}
