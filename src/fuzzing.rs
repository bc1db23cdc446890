//! Entry points for the `fuzz/` crate and its tests (feature `fuzzing`): the on-disk decoders,
//! which are otherwise crate-private, and (with `http`) the differential check of brook's
//! HTTP/1.1 loop against hyper's ([`Http1Check`]). Not part of brook's API and not covered by
//! semver.

use std::path::Path;

use crate::error::Result;

#[cfg(feature = "http")]
pub use crate::http::differential::{Http1Check, Outcome, Seen};

/// Decodes one journal record payload (the bytes after a frame's length and CRC). On success,
/// returns the payload the decoded record encodes to.
pub fn journal_record(payload: &[u8]) -> Option<Vec<u8>> {
    let record = crate::engine::journal::Record::decode(payload)?;
    let mut frame = Vec::new();
    record.encode_frame(&mut frame);
    Some(frame.split_off(8))
}

/// A journal frame (length, CRC, payload) around `payload`, as the journal writes it.
pub fn journal_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 8);
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// The header of a journal file of shard `shard` starting at `base_lsn`.
pub fn journal_header(shard: u32, base_lsn: u64) -> Vec<u8> {
    crate::engine::journal::file_header(shard, base_lsn, 0)
}

/// Scans a journal file as recovery does: (records, LSN after the last valid one, torn tail).
pub fn journal_scan(path: &Path, shard: u32) -> Result<(usize, u64, bool)> {
    let s = crate::engine::journal::scan(path, shard)?;
    Ok((s.records.len(), s.end_lsn, s.torn))
}

/// Decodes a sidecar slot image. On success, returns the image the decoded sidecar encodes to.
pub fn sidecar(image: &[u8]) -> Option<Vec<u8>> {
    let s = crate::sidecar::decode(image)?;
    Some(crate::sidecar::encode(
        s.generation,
        s.applied_lsn,
        &s.state,
    ))
}
