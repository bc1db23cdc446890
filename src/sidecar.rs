//! The per-stream sidecar: a checkpoint of the stream's state, written in two alternating slots.
//!
//! Files `meta.0` and `meta.1` in the stream's directory; generation `g` goes to slot `g % 2`, so a
//! write torn by a crash leaves the other slot, one checkpoint older, intact. Recovery picks the
//! valid slot with the highest generation and replays journal records with a higher LSN.
//! ```text
//!  0..4   magic "BRKM"
//!  4..8   format version (u32 LE) = 2 (1 is read too)
//!  8..16  generation (u64 LE)
//! 16..24  applied LSN (u64 LE): every journal record up to this LSN is reflected
//! 24..28  payload length (u32 LE)
//! 28..32  crc32 of bytes 0..28 followed by the payload
//! 32..    payload: the stream state (layout in DESIGN.md, "Sidecar")
//! ```

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::codec::{Dec, Enc};
use crate::error::Result;
use crate::state::StreamState;

const MAGIC: &[u8; 4] = b"BRKM";
/// The sidecar format this build writes: 2 may carry producer digests in the stream state,
/// which a version 1 reader would take for a damaged slot.
const VERSION: u32 = 2;
/// The oldest sidecar format this build reads (version 1 has no producer digests).
const OLDEST_VERSION: u32 = 1;
const HEADER: usize = 32;

/// A decoded sidecar.
#[derive(Debug)]
pub(crate) struct Sidecar {
    pub(crate) generation: u64,
    pub(crate) applied_lsn: u64,
    pub(crate) state: StreamState,
}

/// The slots' file names, by slot.
const SLOTS: [&str; 2] = ["meta.0", "meta.1"];

/// Room reserved for a slot image before encoding: most states fit, so encoding grows the
/// buffer at most once.
const TYPICAL_IMAGE: usize = 512;

fn slot_path(dir: &Path, slot: u64) -> std::path::PathBuf {
    dir.join(SLOTS[(slot % 2) as usize])
}

/// Encodes a sidecar slot image.
#[cfg(feature = "fuzzing")]
pub(crate) fn encode(generation: u64, applied_lsn: u64, state: &StreamState) -> Vec<u8> {
    encode_into(
        Vec::with_capacity(TYPICAL_IMAGE),
        generation,
        applied_lsn,
        state,
    )
}

/// Encodes a slot image into `buf` (cleared first; its allocation is reused).
fn encode_into(
    mut buf: Vec<u8>,
    generation: u64,
    applied_lsn: u64,
    state: &StreamState,
) -> Vec<u8> {
    buf.clear();
    append_image(&mut buf, generation, applied_lsn, state);
    buf
}

/// Appends a slot image to `buf`: the form a checkpoint file holds its entries in (one image
/// after another, each as long as its header says: [`image_len`]). Returns its length.
pub(crate) fn append_image(
    buf: &mut Vec<u8>,
    generation: u64,
    applied_lsn: u64,
    state: &StreamState,
) -> usize {
    let start = buf.len();
    let mut e = Enc::with(std::mem::take(buf));
    e.buf.extend_from_slice(MAGIC);
    e.u32(VERSION);
    e.u64(generation);
    e.u64(applied_lsn);
    e.u32(0);
    e.u32(0);
    state.encode(&mut e);
    *buf = e.buf;
    let image = &mut buf[start..];
    let len = (image.len() - HEADER) as u32;
    image[24..28].copy_from_slice(&len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&image[..28]);
    h.update(&image[HEADER..]);
    let crc = h.finalize();
    image[28..32].copy_from_slice(&crc.to_le_bytes());
    buf.len() - start
}

/// The length of the image that starts `buf`, from its header (`None` when `buf` is shorter
/// than a header or than the image it announces). Not checked: [`decode`] checks.
pub(crate) fn image_len(buf: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(buf.get(24..28)?.try_into().ok()?) as usize;
    let total = HEADER.checked_add(len)?;
    (buf.len() >= total).then_some(total)
}

/// Decodes a slot image; `None` if it is torn, corrupt or of another version.
pub(crate) fn decode(buf: &[u8]) -> Option<Sidecar> {
    let head = buf.get(..HEADER)?;
    let mut d = Dec::new(head);
    if d.take(4)? != MAGIC || !(OLDEST_VERSION..=VERSION).contains(&d.u32()?) {
        return None;
    }
    let generation = d.u64()?;
    let applied_lsn = d.u64()?;
    let len = d.u32()? as usize;
    let crc = d.u32()?;
    let payload = buf.get(HEADER..HEADER + len)?;
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..28]);
    h.update(payload);
    if h.finalize() != crc {
        return None;
    }
    let mut d = Dec::new(payload);
    let state = StreamState::decode(&mut d)?;
    d.buf.is_empty().then_some(Sidecar {
        generation,
        applied_lsn,
        state,
    })
}

/// Loads the newest valid slot of the stream in `dir`; `None` when neither slot is valid (a stream
/// whose creation never reached a checkpoint).
pub(crate) fn load(dir: &Path) -> Result<Option<Sidecar>> {
    let mut best: Option<Sidecar> = None;
    for slot in 0..2 {
        let buf = match std::fs::read(slot_path(dir, slot)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        if let Some(s) = decode(&buf)
            && best.as_ref().is_none_or(|b| s.generation > b.generation)
        {
            best = Some(s);
        }
    }
    Ok(best)
}

/// Writes generation `generation` into its slot. Not synced here: the checkpoint syncs the file
/// system once for every sidecar it wrote (see `engine::Shard::checkpoint`).
pub(crate) fn write(
    dir: &Path,
    generation: u64,
    applied_lsn: u64,
    state: &StreamState,
) -> Result<()> {
    write_with(&mut Vec::new(), dir, generation, applied_lsn, state)
}

/// [`write`], encoding into `scratch`, whose allocation a checkpoint reuses for every sidecar
/// it writes.
pub(crate) fn write_with(
    scratch: &mut Vec<u8>,
    dir: &Path,
    generation: u64,
    applied_lsn: u64,
    state: &StreamState,
) -> Result<()> {
    if scratch.capacity() == 0 {
        scratch.reserve(TYPICAL_IMAGE);
    }
    let buf = encode_into(std::mem::take(scratch), generation, applied_lsn, state);
    let f: File = crate::fs::open_create(
        OpenOptions::new().create(true).write(true).truncate(false),
        &slot_path(dir, generation % 2),
    )?;
    // The slot is not cut to the new image's length: its header gives the length, so bytes of a
    // longer earlier image past it are never read, and a `set_len` per checkpoint per stream
    // costs a metadata change each time.
    let written = f.write_all_at(&buf, 0);
    *scratch = buf;
    Ok(written?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::Offset;
    use crate::state::Config;
    use crate::types::Expiry;

    fn state(tail: u64) -> StreamState {
        let mut s = StreamState::new(
            Config {
                name: "n".into(),
                incarnation: "i".into(),
                content_type: "t/p".into(),
                expiry: Expiry::Never,
                fork: None,
                retention: crate::RetentionPolicy::new().max_age(60).max_bytes(4096),
            },
            Offset::ZERO,
        );
        s.tail = Offset::new(tail, tail);
        s
    }

    #[test]
    fn newest_valid_slot_wins_and_damage_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 1, 10, &state(1)).unwrap();
        write(dir.path(), 2, 20, &state(2)).unwrap();
        let s = load(dir.path()).unwrap().unwrap();
        assert_eq!(
            (s.generation, s.applied_lsn, s.state.tail.bytes),
            (2, 20, 2)
        );
        assert_eq!(s.state.config.retention, state(2).config.retention);
        // Every single-bit flip in the newest slot falls back to the older one, never to garbage.
        let good = std::fs::read(dir.path().join("meta.0")).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 1;
            std::fs::write(dir.path().join("meta.0"), &bad).unwrap();
            let s = load(dir.path()).unwrap().unwrap();
            assert_eq!(s.generation, 1, "flip at {i}");
        }
        // Truncations too.
        for cut in 0..good.len() {
            std::fs::write(dir.path().join("meta.0"), &good[..cut]).unwrap();
            assert_eq!(load(dir.path()).unwrap().unwrap().generation, 1);
        }
    }

    #[test]
    fn a_reused_buffer_holds_only_the_newest_image() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        let mut long = state(1);
        std::sync::Arc::make_mut(&mut long.config).content_type = "x".repeat(2000);
        write_with(&mut scratch, dir.path(), 1, 10, &long).unwrap();
        // A shorter state next, to another stream's slot: nothing of the longer image leaks in.
        let other = tempfile::tempdir().unwrap();
        write_with(&mut scratch, other.path(), 1, 20, &state(2)).unwrap();
        let s = load(other.path()).unwrap().unwrap();
        assert_eq!((s.applied_lsn, s.state.tail.bytes), (20, 2));
        assert_eq!(s.state.config.content_type, "t/p");
        assert_eq!(
            std::fs::read(other.path().join("meta.1")).unwrap().len(),
            encode_into(Vec::new(), 1, 20, &state(2)).len()
        );
        assert_eq!(
            load(dir.path())
                .unwrap()
                .unwrap()
                .state
                .config
                .content_type
                .len(),
            2000
        );
    }
}
