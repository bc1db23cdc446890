//! `Store::check`: reads every stream of the open store end to end, so every message is checked
//! against its index CRC and every index against its log, and reports what is damaged. Opening
//! the store already checked the manifest, every journal frame's CRC (replaying those after the
//! last checkpoint over the sidecars) and the last message of each stream it replayed.

use std::time::UNIX_EPOCH;

use crate::error::Result;
use crate::fs;
use crate::name::{ReadFrom, StreamName};
use crate::sidecar;
use crate::state::now_ms;
use crate::types::{Expiry, ReadRequest};
use crate::{CheckReport, Error};

use super::Engine;

impl Engine {
    /// Checks every stream directory (see the module docs); `progress` is called after each
    /// stream with the number checked so far. Damage is reported, never repaired.
    pub(crate) fn check(&self, progress: &mut dyn FnMut(u64)) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let streams = self.root.join("streams");
        let mut dirs = Vec::new();
        for top in std::fs::read_dir(&streams)? {
            for dir in std::fs::read_dir(top?.path())? {
                dirs.push(dir?.path());
            }
        }
        dirs.sort();
        for dir in dirs {
            let sc = match sidecar::load(&dir) {
                Ok(Some(sc)) => sc,
                Ok(None) => {
                    report.damaged.push(format!(
                        "{}: no valid sidecar (meta.0, meta.1)",
                        dir.display()
                    ));
                    report.damaged_dirs.push(dir);
                    continue;
                }
                Err(e) => {
                    report.damaged.push(format!("{}: {e}", dir.display()));
                    report.damaged_dirs.push(dir);
                    continue;
                }
            };
            let name = sc.state.config.name.clone();
            if fs::stream_dir(&self.root, &name) != dir {
                report.damaged.push(format!(
                    "{}: holds the sidecar of {name:?}, which belongs elsewhere",
                    dir.display()
                ));
                continue;
            }
            report.streams += 1;
            if self.names.page(&name, None, 1).first() != Some(&name) {
                report
                    .damaged
                    .push(format!("{name}: missing from the name index (NAMES)"));
            }
            let expired = match sc.state.config.expiry {
                Expiry::At(t) => {
                    t.duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64)
                        <= now_ms()
                }
                _ => false,
            };
            if sc.state.soft_deleted || expired {
                // Not readable through the store (gone, or deleted on first touch); its files
                // were checked when it was written.
                report.skipped += 1;
                progress(report.streams);
                continue;
            }
            match self.check_stream(&name) {
                Ok((messages, bytes)) => {
                    report.messages += messages;
                    report.bytes += bytes;
                }
                Err(e) => {
                    report.damaged.push(format!("{name}: {e}"));
                    report.damaged_dirs.push(dir);
                }
            }
            progress(report.streams);
        }
        Ok(report)
    }

    /// Reads `name` from its earliest offset to its tail; returns the messages and bytes read.
    fn check_stream(&self, name: &str) -> Result<(u64, u64)> {
        // The name comes from a sidecar: a system stream's (`__ds/...`) is valid here too.
        let name = StreamName(name.into());
        let mut req = ReadRequest::from(ReadFrom::Start);
        let first = self.read(&name, &req)?;
        let start = first.start;
        let mut chunk = first;
        loop {
            if chunk.up_to_date {
                return Ok((
                    chunk.next.messages - start.messages,
                    chunk.next.bytes - start.bytes,
                ));
            }
            if chunk.next == chunk.start {
                return Err(Error::corrupt(
                    fs::stream_dir(&self.root, name.as_str()),
                    "a read made no progress before the tail",
                ));
            }
            req.from = ReadFrom::At(chunk.next);
            chunk = self.read(&name, &req)?;
        }
    }
}

impl Engine {
    /// Moves the stream directory `dir` (one of [`CheckReport::damaged_dirs`]) into
    /// `quarantine/{key}-{ms since the epoch}` and forgets the stream it held (registry, name
    /// index): its name answers as no stream afterwards and may be created again. Everything
    /// acknowledged is checkpointed first, so nothing else is lost. Returns where it went.
    pub(crate) fn quarantine(&self, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        if dir.parent().and_then(std::path::Path::parent) != Some(&self.root.join("streams")) {
            return Err(Error::InvalidArgument(format!(
                "{} is not a stream directory of this store",
                dir.display()
            )));
        }
        self.checkpoint()?;
        let name = sidecar::load(dir)
            .ok()
            .flatten()
            .map(|sc| sc.state.config.name.clone());
        if let Some(n) = &name {
            self.registry.lock().remove(n.as_str());
            self.resident.forget(n);
            // Its image in a checkpoint file, if any, names a directory that is gone.
            self.shards[self.shard_of(n)].images.deleted(n, u64::MAX);
            self.names.remove(n)?;
        }
        let qdir = self.root.join("quarantine");
        fs::create_dir_all(&qdir)?;
        let key = dir
            .file_name()
            .and_then(|k| k.to_str())
            .unwrap_or("unknown");
        let to = qdir.join(format!("{key}-{}", now_ms()));
        fs::rename(dir, &to)?;
        if let Some(parent) = dir.parent() {
            fs::sync_dir(parent)?;
        }
        fs::sync_dir(&qdir)?;
        tracing::warn!(
            stream = name.as_deref(),
            from = %dir.display(),
            to = %to.display(),
            "stream directory quarantined"
        );
        Ok(to)
    }
}
