//! Prepared journal files (Sync mode): the next journal file is written full of zeros and
//! synced by the shard's checkpoint thread before the writer needs it, so that each batch's
//! `fdatasync` overwrites blocks that already exist and writes only them. Appending to a new or
//! sparse file instead allocates blocks, and each sync must then make that allocation durable
//! with the data: on this machine's ext4, 3200 bytes written and synced took 205 us at the
//! median into new space and 142 us over written zeros (docs/benchmarks/history.md).
//!
//! The writer asks for a prepared file once the current one has taken [`prepare_after`] bytes
//! in syncs of less than [`SMALL_SYNCS`] on average (a store that writes little never makes
//! one, and one whose syncs are large gains little from one). At the start of a batch, if the
//! current file was not prepared, it switches to a ready one: the file gets its header and is
//! renamed to its journal name (the LSN it starts at). A checkpoint's rotation takes a ready
//! one too. Recovery reads a file whose header was lost with the power before its first sync
//! as an empty one (`journal::scan`); nothing in it had been acknowledged.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::journal;
use crate::error::Result;
use crate::fs;
use crate::options::{Durability, Options};

use super::shard::{Shard, Writer, open_journal_file};

/// The smallest and largest prepared file.
const PREPARED_MIN: u64 = 64 << 10;
const PREPARED_MAX: u64 = 256 << 20;

/// A file is prepared only on a file system with this many times its length free.
const ROOM: u64 = 4;

/// After each piece, the preparation pauses this many times as long as the piece took (so it
/// takes at most a quarter of the disk's time), up to [`MAX_PAUSE`].
const PACE: u32 = 3;
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// Zeros are written, and written back, this many bytes at a time.
const ZERO_CHUNK: usize = 256 << 10;

/// The length of a prepared file: room for a checkpoint's worth of journal and a quarter more
/// (a checkpoint that finds another running is put off), within [`PREPARED_MIN`] and
/// [`PREPARED_MAX`]. Past it, the file grows in sparse steps, as an unprepared one does.
pub(super) fn prepared_len(options: &Options) -> u64 {
    let c = options.checkpoint_bytes;
    c.saturating_add(c / 4)
        .clamp(PREPARED_MIN, PREPARED_MAX)
        .next_multiple_of(4096)
}

/// A shard asks for a prepared file only while its syncs cover less than this many bytes on
/// average. For a sync of 3 KiB the allocation it saves is a third of the sync's time; for one
/// of a MiB (256 connections appending 4 KiB each) it is little, and the prepared file's zeros
/// would double what the disk writes: on this machine the one-stream 4 KiB row's p99 went from
/// 13 to 25 ms with them.
const SMALL_SYNCS: u64 = 64 << 10;

/// Bytes a journal file takes before its shard asks for a prepared one to follow it.
pub(super) fn prepare_after(options: &Options) -> u64 {
    (options.checkpoint_bytes / 2).min(1 << 20)
}

/// Removes a prepared file left in `dir` by an earlier run (at open, before the shard starts).
pub(in crate::engine) fn remove_leftover(dir: &Path) -> Result<()> {
    let path = dir.join(journal::PREPARED);
    if path.exists() {
        fs::remove_file(&path)?;
    }
    Ok(())
}

impl Shard {
    /// Whether this shard prepares its journal files (Sync mode: Buffered mode does not sync
    /// each batch).
    pub(in crate::engine) fn prepares(&self) -> bool {
        self.options.durability == Durability::Sync
    }

    /// Under `writer`, at the start of a batch: asks for a prepared file to follow the current
    /// one once that has taken [`prepare_after`] bytes in small syncs, and switches to a ready
    /// one if the current file was not prepared.
    pub(super) fn maybe_switch(&self, w: &mut Writer) {
        if !self.prepares() {
            return;
        }
        if !w.asked {
            let bytes = w.end_lsn - w.file_base;
            if bytes >= prepare_after(&self.options) && bytes / w.syncs.max(1) < SMALL_SYNCS {
                w.asked = true;
                self.ask_prepare();
            }
        }
        if w.prewritten {
            return;
        }
        if let Some(f) = self.take_prepared() {
            let lsn = w.end_lsn;
            match self.install_prepared(f, lsn, 0) {
                Ok((file, len)) => self.continue_in(w, file, lsn, len, true),
                Err(e) => tracing::warn!(
                    shard = self.id,
                    error = %e,
                    "could not switch to the prepared journal file; the current one goes on"
                ),
            }
        }
    }

    /// Starts the journal file of a rotation at `w.end_lsn` (step 6a): the prepared file if
    /// one is ready, else a new empty one.
    pub(super) fn start_journal_file(&self, w: &mut Writer, flags: u32) -> Result<()> {
        let lsn = w.end_lsn;
        if let Some(f) = self.take_prepared() {
            match self.install_prepared(f, lsn, flags) {
                Ok((file, len)) => {
                    self.continue_in(w, file, lsn, len, true);
                    return Ok(());
                }
                Err(e) => tracing::warn!(
                    shard = self.id,
                    error = %e,
                    "could not use the prepared journal file; starting an empty one"
                ),
            }
        }
        let file = open_journal_file(&self.dir, self.id, lsn, flags)?;
        self.continue_in(w, file, lsn, journal::HEADER_LEN, false);
        Ok(())
    }

    /// Has the checkpoint thread prepare a file, unless one is ready.
    fn ask_prepare(&self) {
        let mut c = self.checkpoints.lock();
        if c.prepared.is_none() {
            c.prepare = true;
            self.checkpoints_cv.notify_all();
        }
    }

    /// Makes `file` the journal from `lsn` on.
    fn continue_in(&self, w: &mut Writer, file: File, lsn: u64, len: u64, prewritten: bool) {
        w.file = file;
        w.path = journal::file_path(&self.dir, lsn);
        w.file_base = lsn;
        w.alloc = len;
        w.unstarted = 0;
        w.shared_file = None;
        w.fresh = true;
        w.prewritten = prewritten;
        w.asked = false;
        w.syncs = 0;
        // The file's space was taken since the last look (a prepared file's by the
        // checkpoint thread): the next batch looks again.
        w.unlooked = 0;
    }

    /// The prepared file, if one is ready.
    fn take_prepared(&self) -> Option<File> {
        if !self.prepared_ready.load(Ordering::Acquire) {
            return None;
        }
        self.prepared_ready.store(false, Ordering::Release);
        self.checkpoints.lock().prepared.take()
    }

    /// Writes the header of a journal file starting at `lsn` into the prepared `file` and
    /// renames it to that file's name; returns it, positioned after its header, with its
    /// length. On failure the prepared file is removed.
    fn install_prepared(&self, file: File, lsn: u64, flags: u32) -> Result<(File, u64)> {
        let from = self.dir.join(journal::PREPARED);
        let installed = (|| -> Result<(File, u64)> {
            file.write_all_at(&journal::file_header(self.id as u32, lsn, flags), 0)?;
            let len = file.metadata()?.len();
            let mut file = file;
            file.seek(SeekFrom::Start(journal::HEADER_LEN))?;
            // Last: once renamed, the file is the journal.
            fs::rename(&from, &journal::file_path(&self.dir, lsn))?;
            Ok((file, len))
        })();
        if installed.is_err() && from.exists() {
            let _ = fs::remove_file(&from);
        }
        installed
    }

    /// On the checkpoint thread: writes a prepared file and syncs it, then offers it to the
    /// writer; not on a file system with less than [`ROOM`] times its length free. A failure
    /// is logged and costs nothing but the speed-up: the writer goes on growing its file, and
    /// asks again after its next switch or rotation.
    pub(super) fn prepare(&self) {
        let path = self.dir.join(journal::PREPARED);
        let made = (|| -> Result<Option<File>> {
            let file = fs::open_create(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true),
                &path,
            )?;
            let len = prepared_len(&self.options);
            // Never the space the journal itself may need: on a file system with less than
            // [`ROOM`] times the file free, the writer goes on without.
            if fs::available_bytes(&file, &path).is_none_or(|free| free < len.saturating_mul(ROOM))
            {
                tracing::debug!(
                    shard = self.id,
                    "too little free space to prepare a journal file"
                );
                return Ok(None);
            }
            let zeros = vec![0u8; ZERO_CHUNK.min(len as usize)];
            let mut at = 0;
            while at < len {
                if self.checkpoints.lock().stop {
                    // Shutdown does not wait for the rest.
                    return Ok(None);
                }
                let n = (len - at).min(zeros.len() as u64);
                let started = Instant::now();
                file.write_all_at(&zeros[..n as usize], at)?;
                // A piece at a time: a journal sync queues behind one piece, not the file.
                fs::write_back_and_wait(&file, at, n);
                at += n;
                // And at most a quarter of the disk's time: at a moderate load a preparation
                // that ran flat out doubled the p99 of the syncs beside it
                // (docs/benchmarks/history.md, "The twelfth pass"); a file takes a checkpoint's
                // worth of journal to fill.
                std::thread::sleep((started.elapsed() * PACE).min(MAX_PAUSE));
            }
            fs::sync_data(&file, &path)?;
            Ok(Some(file))
        })();
        let mut c = self.checkpoints.lock();
        c.prepare = false;
        match made {
            Ok(Some(file)) if !c.stop => {
                c.prepared = Some(file);
                self.prepared_ready.store(true, Ordering::Release);
            }
            Ok(_) => {
                drop(c);
                let _ = fs::remove_file(&path);
            }
            Err(e) => {
                drop(c);
                tracing::warn!(
                    shard = self.id,
                    error = %e,
                    "could not prepare the next journal file; the journal grows as it goes"
                );
                if path.exists() {
                    let _ = fs::remove_file(&path);
                }
            }
        }
    }
}
