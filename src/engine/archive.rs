//! `Store::export` and `Store::import`: every live stream of a store, with its state, data and
//! snapshot blobs, as one streamed archive (DESIGN.md 2.7), and back into another store with the
//! same offsets, incarnation, guard state (Stream-Seq, producers, closure), expiry, retention
//! and snapshots.
//!
//! Layout (little-endian):
//!
//! ```text
//! header   magic "BRKX" | version u32 = 1 | reserved u64
//! records  kind u8 | len u64 | crc32(payload) u32 | payload
//!   1 stream    the stream state (as in a sidecar, 2.3), fork link and soft deletion cleared,
//!               base = earliest offset
//!   2 chunk     start offset | message count u32 | each message's end u32 (relative) | data
//!               (stored representation: a JSON message's text and its `,`)
//!   3 snapshot  offset | blob bytes (its description is in the stream state)
//!   4 end       (of the stream)
//!   0 archive end: stream count u64
//! ```
//!
//! Import writes each stream's files directly (segments, index, snapshot blobs, sidecar at
//! generation 1 and LSN 0: nothing in the journal refers to them), adds it to the name index,
//! and makes everything durable with one `syncfs` at the end. An import that fails midway leaves
//! the streams imported so far (and possibly one partial stream directory): import into a new
//! directory and start over on failure.

use std::fs::File;
use std::io::{Read, Write};

use bytes::Bytes;

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::fs;
use crate::name::{Offset, ReadFrom, is_json};
use crate::segment::SegmentSet;
use crate::sidecar;
use crate::state::{Body, StreamState};
use crate::types::ReadRequest;

use super::Engine;
use super::apply::snapshot_file;

/// The first bytes of an archive.
const MAGIC: &[u8; 4] = b"BRKX";
/// The archive format this build writes: 2 may carry producer digests in a stream's state.
const VERSION: u32 = 2;
/// The oldest archive format this build reads (version 1 has no producer digests).
const OLDEST_VERSION: u32 = 1;
/// Record kinds.
const END_ARCHIVE: u8 = 0;
const STREAM: u8 = 1;
const CHUNK: u8 = 2;
const SNAPSHOT: u8 = 3;
const END_STREAM: u8 = 4;
/// The largest record an import accepts (a snapshot blob or a chunk is far smaller).
const MAX_RECORD: u64 = 4 << 30;

/// Writes one record.
fn record(out: &mut dyn Write, kind: u8, payload: &[u8]) -> Result<()> {
    let mut head = [0u8; 13];
    head[0] = kind;
    head[1..9].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    head[9..13].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.write_all(&head)?;
    out.write_all(payload)?;
    Ok(())
}

/// Reads one record: its kind and payload.
fn read_record(input: &mut dyn Read) -> Result<(u8, Vec<u8>)> {
    let bad = |why: &str| Error::InvalidArgument(format!("not a valid brook archive: {why}"));
    let mut head = [0u8; 13];
    input
        .read_exact(&mut head)
        .map_err(|_| bad("it ends before its end record"))?;
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&head[1..9]);
    let len = u64::from_le_bytes(len8);
    if len > MAX_RECORD {
        return Err(bad("a record is too long"));
    }
    let mut payload = vec![0u8; len as usize];
    input
        .read_exact(&mut payload)
        .map_err(|_| bad("a record is cut short"))?;
    let crc = u32::from_le_bytes([head[9], head[10], head[11], head[12]]);
    if crc32fast::hash(&payload) != crc {
        return Err(bad("a record fails its checksum"));
    }
    Ok((head[0], payload))
}

impl Engine {
    /// Writes every live stream to `out` (see the module docs); `progress` gets the number of
    /// streams written so far. Returns that number.
    pub(crate) fn export(&self, out: &mut dyn Write, progress: &mut dyn FnMut(u64)) -> Result<u64> {
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&[0; 8]);
        out.write_all(&header)?;
        let mut count = 0u64;
        for name in self.list("")? {
            let s = self.live(&name)?;
            let mut state = s.data.lock().state.clone();
            std::sync::Arc::make_mut(&mut state.config).fork = None;
            state.forks.clear();
            state.soft_deleted = false;
            state.base = state.earliest;
            let mut e = Enc::default();
            state.encode(&mut e);
            record(out, STREAM, &e.buf)?;
            let json = is_json(&state.config.content_type);
            let mut req = ReadRequest::from(if state.earliest == Offset::ZERO {
                ReadFrom::Start
            } else {
                ReadFrom::At(state.earliest)
            });
            loop {
                let (messages, chunk) = self.read_messages(&name, &req)?;
                if let Some(first) = messages.first() {
                    let mut e = Enc::default();
                    e.offset(first.start);
                    e.u32(messages.len() as u32);
                    let mut end = 0u32;
                    for m in &messages {
                        end += m.data.len() as u32 + u32::from(json);
                        e.u32(end);
                    }
                    for m in &messages {
                        e.buf.extend_from_slice(&m.data);
                        if json {
                            e.buf.push(b',');
                        }
                    }
                    record(out, CHUNK, &e.buf)?;
                }
                if chunk.up_to_date || chunk.next == chunk.start {
                    break;
                }
                req.from = ReadFrom::At(chunk.next);
            }
            for snap in &state.snapshots {
                let blob = std::fs::read(s.dir.join(snapshot_file(snap.offset)))?;
                let mut e = Enc::default();
                e.offset(snap.offset);
                e.buf.extend_from_slice(&blob);
                record(out, SNAPSHOT, &e.buf)?;
            }
            record(out, END_STREAM, &[])?;
            count += 1;
            progress(count);
        }
        record(out, END_ARCHIVE, &count.to_le_bytes())?;
        out.flush()?;
        Ok(count)
    }

    /// Reads an archive from `input` into this store (see the module docs); a stream whose name
    /// exists here is refused. `progress` gets the number of streams imported so far.
    pub(crate) fn import(
        &self,
        input: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64> {
        let bad = |why: String| Error::InvalidArgument(format!("not a valid brook archive: {why}"));
        let mut header = [0u8; 16];
        input
            .read_exact(&mut header)
            .map_err(|_| bad("no header".into()))?;
        if &header[..4] != MAGIC {
            return Err(bad("no BRKX magic".into()));
        }
        let version = header
            .get(4..8)
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_le_bytes);
        if !version.is_some_and(|v| (OLDEST_VERSION..=VERSION).contains(&v)) {
            return Err(bad("a format version this brook does not know".into()));
        }
        let mut count = 0u64;
        let mut open: Option<(StreamState, std::path::PathBuf, SegmentSet)> = None;
        loop {
            let (kind, payload) = read_record(input)?;
            let mut d = Dec::new(&payload);
            match kind {
                STREAM => {
                    if open.is_some() {
                        return Err(bad("a stream starts inside another".into()));
                    }
                    let state = StreamState::decode(&mut d)
                        .ok_or_else(|| bad("a bad stream state".into()))?;
                    let name = state.config.name.clone();
                    let dir = fs::stream_dir(&self.root, &name);
                    if self.lookup(&name)?.is_some() || dir.exists() {
                        return Err(Error::InvalidArgument(format!(
                            "the stream {name:?} already exists in this store"
                        )));
                    }
                    fs::create_dir_all(&dir)?;
                    let segs = SegmentSet::create(&dir, state.base, self.options.segment_bytes)?;
                    open = Some((state, dir, segs));
                }
                CHUNK => {
                    let (_, _, segs) = open
                        .as_mut()
                        .ok_or_else(|| bad("data outside a stream".into()))?;
                    let start = d.offset().ok_or_else(|| bad("a bad chunk".into()))?;
                    let n = d.u32().ok_or_else(|| bad("a bad chunk".into()))?;
                    let mut ends = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        ends.push(d.u32().ok_or_else(|| bad("a bad chunk".into()))?);
                    }
                    let data = Bytes::copy_from_slice(d.buf);
                    if ends.last().copied() != Some(data.len() as u32)
                        || ends.windows(2).any(|w| w[0] >= w[1])
                    {
                        return Err(bad("a chunk's message ends do not match its data".into()));
                    }
                    segs.append(start, &Body::new(data, ends))?;
                    segs.flush()?;
                }
                SNAPSHOT => {
                    let (_, dir, _) = open
                        .as_ref()
                        .ok_or_else(|| bad("a snapshot outside a stream".into()))?;
                    let at = d.offset().ok_or_else(|| bad("a bad snapshot".into()))?;
                    let mut f = fs::create(&dir.join(snapshot_file(at)))?;
                    f.write_all(d.buf)?;
                }
                END_STREAM => {
                    let (state, dir, mut segs) = open
                        .take()
                        .ok_or_else(|| bad("an end outside a stream".into()))?;
                    segs.flush()?;
                    if segs.end() != state.tail {
                        return Err(bad(format!(
                            "the data of {:?} ends at {} but its tail is {}",
                            state.config.name,
                            segs.end(),
                            state.tail
                        )));
                    }
                    drop(segs);
                    // At the shard's newest LSN: replay then skips every older record of the
                    // name (of streams deleted before), and no older image in a checkpoint
                    // file can win over this sidecar (2.8).
                    let lsn = self.shards[self.shard_of(&state.config.name)].last_lsn();
                    sidecar::write(&dir, 1, lsn, &state)?;
                    self.resident.forget(&state.config.name);
                    self.names.add(&state.config.name)?;
                    count += 1;
                    progress(count);
                }
                END_ARCHIVE => {
                    if open.is_some() || d.u64() != Some(count) {
                        return Err(bad("the end record does not match the streams read".into()));
                    }
                    // Everything written above (segments, indexes, blobs, sidecars, directories
                    // and the name index's frames) becomes durable at once.
                    fs::sync_fs(&File::open(&self.root)?, &self.root)?;
                    return Ok(count);
                }
                k => return Err(bad(format!("an unknown record kind {k}"))),
            }
        }
    }
}
