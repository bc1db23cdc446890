//! Runs the logic of every fuzz target (`fuzz/src/lib.rs`) on a few thousand inputs, so the
//! decoders and the operation model are exercised on every test run, not only under cargo-fuzz.
//! Inputs are random bytes and mutations of real files written by a store. Needs the `fuzzing`
//! feature (on with `--all-features`). Replay with `BROOK_TEST_SEED`.

use brook::*;

use crate::util::{R, Rng, crash_image, files_under, name};

#[path = "../../fuzz/src/lib.rs"]
mod targets;

/// Real journal files and sidecars, from a store that did a bit of everything.
type Files = Vec<Vec<u8>>;

fn seed_files() -> std::result::Result<(Files, Files), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(
        dir.path(),
        Options::default().with_durability(Durability::Buffered),
    )?;
    let j = name("seed/json");
    store.create(
        &j,
        CreateOptions::json().data("[1,{\"a\":2}]").stream_seq("s"),
    )?;
    for i in 0..5u64 {
        store.append(
            &j,
            AppendRequest::new(format!("{{\"i\":{i}}}"))
                .stream_seq(format!("t{i}"))
                .producer(Producer::new("p", 2, i)),
        )?;
    }
    let f = name("seed/fork");
    store.create(
        &f,
        CreateOptions::new()
            .fork(ForkFrom::tail(j.clone()))
            .ttl(3600),
    )?;
    store.append(&f, AppendRequest::new("7").closing())?;
    let tail = store.head(&j, &Guard::NONE)?.tail;
    store.publish_snapshot(
        &j,
        PublishSnapshot::new(tail, &b"{}"[..]).content_type("application/json"),
    )?;
    store.set_retention(&j, &RetentionRequest::to(tail))?;
    let b = name("seed/bytes");
    store.create(&b, CreateOptions::new().data("raw").closed())?;
    store.delete(&b, &Guard::NONE)?;
    store.append(&f, AppendRequest::close())?;
    // The journal as a crash leaves it; then the sidecars the recovery checkpoint writes.
    let image = crash_image(store, dir.path())?;
    let mut wal = Vec::new();
    let mut meta = Vec::new();
    for p in files_under(image.path())? {
        if p.extension().is_some_and(|e| e == "wal") {
            let mut bytes = std::fs::read(&p)?;
            // Without the zeros the writer set aside past its last record (its 4 MiB steps):
            // the seeds stay small, and a zero tail has its own case in the scan's tests.
            let used = 24 + payloads(&bytes).iter().map(|p| 8 + p.len()).sum::<usize>();
            bytes.truncate(used);
            wal.push(bytes);
        }
    }
    drop(Store::open(image.path(), Options::default())?);
    for p in files_under(image.path())? {
        if p.file_name()
            .and_then(|s| s.to_str())
            .is_some_and(|n| n.starts_with("meta."))
        {
            meta.push(std::fs::read(&p)?);
        }
    }
    Ok((wal, meta))
}

/// The payloads of the frames in a journal file.
fn payloads(wal: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = 24;
    while let Some(h) = wal.get(pos..pos + 8) {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let Some(p) = wal.get(pos + 8..pos + 8 + len).filter(|_| len > 0) else {
            break;
        };
        out.push(p.to_vec());
        pos += 8 + len;
    }
    out
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len() as u64) as usize;
                v[i] = rng.next() as u8;
            }
            2 => v.truncate(rng.below(v.len() as u64 + 1) as usize),
            3 => {
                let i = rng.below(v.len() as u64 + 1) as usize;
                let k = 1 + rng.below(8) as usize;
                let extra = rng.bytes(k);
                v.splice(i..i, extra);
            }
            _ if v.len() >= 4 => {
                // Lengths are little-endian u32s: make one huge or zero.
                let i = rng.below(v.len() as u64 - 3) as usize;
                let val: u32 = if rng.one_in(2) {
                    u32::MAX - rng.below(16) as u32
                } else {
                    rng.below(4) as u32
                };
                v[i..i + 4].copy_from_slice(&val.to_le_bytes());
            }
            _ => {}
        }
    }
    v
}

#[test]
fn fuzz_journal_record_decoder() -> R {
    let mut rng = Rng::from_env("fuzz_journal_record");
    let (wal, _) = seed_files()?;
    let seeds: Vec<Vec<u8>> = wal.iter().flat_map(|w| payloads(w)).collect();
    assert!(
        seeds.len() >= 5,
        "the seed store wrote {} records",
        seeds.len()
    );
    for s in &seeds {
        assert!(
            brook::fuzzing::journal_record(s).is_some(),
            "a record the store wrote does not decode"
        );
        targets::journal_record(s);
    }
    for i in 0..4000 {
        let input = if i % 4 == 0 {
            {
                let k = rng.below(80) as usize;
                rng.bytes(k)
            }
        } else {
            {
                let k = rng.below(seeds.len() as u64) as usize;
                mutate(&mut rng, &seeds[k])
            }
        };
        targets::journal_record(&input);
    }
    Ok(())
}

#[test]
fn fuzz_sidecar_decoder() -> R {
    let mut rng = Rng::from_env("fuzz_sidecar");
    let (_, meta) = seed_files()?;
    let seeds: Vec<Vec<u8>> = meta
        .into_iter()
        .filter(|m| brook::fuzzing::sidecar(m).is_some())
        .collect();
    assert!(
        seeds.len() >= 2,
        "the seed store left {} valid sidecars",
        seeds.len()
    );
    for i in 0..4000 {
        let mut input = if i % 4 == 0 {
            {
                let k = rng.below(120) as usize;
                rng.bytes(k)
            }
        } else {
            {
                let k = rng.below(seeds.len() as u64) as usize;
                mutate(&mut rng, &seeds[k])
            }
        };
        // A CRC-correct header most of the time, so the payload decoder is reached.
        if i % 3 != 0 && input.len() >= 32 {
            let len = (input.len() - 32) as u32;
            input[24..28].copy_from_slice(&len.to_le_bytes());
            let mut h = crc32_with(&input[..28]);
            h.update(&input[32..]);
            let crc = h.finalize();
            input[28..32].copy_from_slice(&crc.to_le_bytes());
        }
        targets::sidecar(&input);
    }
    Ok(())
}

/// A CRC-32 hasher primed with `prefix` (crc32fast is a dependency of brook, not of the tests,
/// so this is a plain bitwise CRC-32).
fn crc32_with(prefix: &[u8]) -> Crc {
    let mut c = Crc(!0);
    c.update(prefix);
    c
}

struct Crc(u32);

impl Crc {
    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u32::from(b);
            for _ in 0..8 {
                self.0 = if self.0 & 1 == 1 {
                    (self.0 >> 1) ^ 0xEDB8_8320
                } else {
                    self.0 >> 1
                };
            }
        }
    }
    fn finalize(&self) -> u32 {
        !self.0
    }
}

#[test]
fn fuzz_journal_scan() -> R {
    let mut rng = Rng::from_env("fuzz_journal_scan");
    let (wal, _) = seed_files()?;
    let payload_seeds: Vec<Vec<u8>> = wal.iter().flat_map(|w| payloads(w)).collect();
    for i in 0..2000 {
        let input = match i % 3 {
            // Framed mode: CRC-correct frames around (mutated) real payloads.
            0 => {
                let mut v = vec![1 | (rng.next() as u8 & 0xfe)];
                for _ in 0..=rng.below(4) {
                    let p = {
                        let k = rng.below(payload_seeds.len() as u64) as usize;
                        mutate(&mut rng, &payload_seeds[k])
                    };
                    v.extend(p.into_iter().map(|b| if b == 0xff { 0xfe } else { b }));
                    v.push(0xff);
                }
                v
            }
            1 => {
                let mut v = {
                    let k = rng.below(wal.len() as u64) as usize;
                    mutate(&mut rng, &wal[k])
                };
                if let Some(b) = v.first_mut() {
                    *b &= 0xfe;
                }
                v
            }
            _ => {
                let k = rng.below(100) as usize;
                rng.bytes(k)
            }
        };
        targets::journal_scan(&input);
    }
    Ok(())
}

#[test]
fn fuzz_operation_sequences() -> R {
    let mut rng = Rng::from_env("fuzz_ops");
    let dir = tempfile::tempdir()?;
    let mut ops = targets::Ops::open(dir.path())?;
    for i in 0..2000 {
        let len = rng.below(120) as usize;
        let mut input = rng.bytes(len);
        // Reopens and checkpoints are opcodes 255 and 254; keep them rare but present.
        for b in &mut input {
            if *b >= 254 && !rng.one_in(40) {
                *b = rng.below(254) as u8;
            }
        }
        ops.run(&format!("ops/{i}"), &input);
    }
    Ok(())
}
