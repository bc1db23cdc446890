use super::record::COMBINE_MIN;
use super::*;
use crate::name::Offset;
use crate::state::{AppendRecord, Body, Config, StreamState};
use crate::types::{Expiry, Producer};

fn append(n: u8) -> Record {
    Record::Append {
        name: "s".into(),
        incarnation: "i".into(),
        rec: AppendRecord {
            start: Offset::new(u64::from(n), u64::from(n)),
            body: Body::new(vec![n; 3].into(), vec![1, 3]),
            close: n.is_multiple_of(2),
            stream_seq: Some(format!("{n:04}")),
            producer: Some(Producer {
                id: "p".into(),
                epoch: 1,
                seq: u64::from(n),
            }),
            digest: n
                .is_multiple_of(3)
                .then(|| crate::digest::BodyDigest::of(&[n])),
        },
        placed: None,
    }
}

#[test]
fn frames_round_trip_and_torn_tails_stop_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_path(dir.path(), 100);
    let mut buf = file_header(0, 100, 0);
    let state = StreamState::new(
        Config {
            name: "s".into(),
            incarnation: "i".into(),
            content_type: "a/b".into(),
            expiry: Expiry::Ttl(5),
            fork: None,
            retention: crate::RetentionPolicy::new().max_bytes(1 << 20),
        },
        Offset::ZERO,
    );
    let create = Record::Create {
        state: Box::new(state),
        initial: AppendRecord {
            start: Offset::ZERO,
            body: Body::default(),
            close: false,
            stream_seq: None,
            producer: None,
            digest: None,
        },
    };
    create.encode_frame(&mut buf);
    for n in 0..3 {
        append(n).encode_frame(&mut buf);
    }
    std::fs::write(&path, &buf).unwrap();
    let s = scan(&path, 0).unwrap();
    assert_eq!(s.records.len(), 4);
    assert!(!s.torn);
    assert_eq!(s.end_lsn, 100 + buf.len() as u64 - HEADER_LEN);
    // Every truncation point yields a clean prefix of records.
    for cut in HEADER_LEN as usize..buf.len() {
        std::fs::write(&path, &buf[..cut]).unwrap();
        let s = scan(&path, 0).unwrap();
        assert!(s.records.len() <= 4);
        assert_eq!(
            s.torn,
            !s.records
                .iter()
                .any(|(lsn, _)| *lsn == 100 + cut as u64 - HEADER_LEN)
                && cut > HEADER_LEN as usize
                && s.end_lsn != 100 + cut as u64 - HEADER_LEN
        );
    }
    // A flipped bit in the last frame drops exactly that record.
    let mut flipped = buf.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    let s = scan(&path, 0).unwrap();
    assert_eq!(s.records.len(), 3);
    assert!(s.torn);
    // Space set aside and never written (zeros) is a clean end; a torn frame before
    // zeros is still torn.
    let mut spare = buf.clone();
    spare.resize(buf.len() + 4096, 0);
    std::fs::write(&path, &spare).unwrap();
    let s = scan(&path, 0).unwrap();
    assert_eq!((s.records.len(), s.torn), (4, false));
    assert_eq!(s.end_lsn, 100 + buf.len() as u64 - HEADER_LEN);
    let mut torn = flipped.clone();
    torn.resize(buf.len() + 4096, 0);
    std::fs::write(&path, &torn).unwrap();
    let s = scan(&path, 0).unwrap();
    assert_eq!((s.records.len(), s.torn), (3, true));
}

/// A prepared file whose header was lost with the power (all zeros, like the rest of it)
/// holds nothing; a zero header before a whole, good frame is a damaged file, not that.
#[test]
fn a_lost_header_is_an_empty_file_unless_a_record_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_path(dir.path(), 100);
    std::fs::write(&path, vec![0u8; 64 << 10]).unwrap();
    let s = scan(&path, 0).unwrap();
    assert!(s.headerless && s.torn && s.records.is_empty());
    assert_eq!((s.base_lsn, s.end_lsn), (100, 100));
    let mut buf = vec![0u8; HEADER_LEN as usize];
    append(1).encode_frame(&mut buf);
    buf.resize(64 << 10, 0);
    std::fs::write(&path, &buf).unwrap();
    let e = scan(&path, 0).err().expect("a record after a zero header");
    assert!(e.to_string().contains("lost its header"), "{e}");
    // With its header, the same file is one record and a clean end.
    buf[..HEADER_LEN as usize].copy_from_slice(&file_header(0, 100, 0));
    std::fs::write(&path, &buf).unwrap();
    let s = scan(&path, 0).unwrap();
    assert!(!s.headerless && !s.torn);
    assert_eq!(s.records.len(), 1);
}

/// A large one-message body's frame CRC, folded from the body's own CRC, is the frame's
/// CRC computed in one pass, and the body keeps its CRC for the segment index; the frame
/// scans back intact.
#[test]
fn a_large_body_is_hashed_once_and_its_frame_checks() {
    for len in [COMBINE_MIN - 1, COMBINE_MIN, 4096, 4097, 70_001] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let rec = Record::Append {
            name: "s".into(),
            incarnation: "i".into(),
            rec: AppendRecord {
                start: Offset::new(7, 1),
                body: Body::new(data.clone().into(), vec![len as u32]),
                close: false,
                stream_seq: Some("0001".into()),
                producer: None,
                digest: None,
            },
            placed: None,
        };
        let mut out = vec![9u8; 5];
        let n = rec.encode_frame(&mut out);
        let frame = &out[5..5 + n];
        let crc = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
        assert_eq!(crc, crc32fast::hash(&frame[FRAME_HEADER..]), "len {len}");
        let Record::Append { rec: r, .. } = &rec else {
            unreachable!()
        };
        if len >= COMBINE_MIN {
            assert_eq!(r.body.crc.get().copied(), Some(crc32fast::hash(&data)));
        } else {
            assert_eq!(r.body.crc.get(), None);
        }
        assert_eq!(r.body.single_crc(), crc32fast::hash(&data));
        let decoded = Record::decode(&frame[FRAME_HEADER..]).expect("the frame decodes");
        assert!(matches!(decoded, Record::Append { .. }));
    }
}

/// A placed append's frame carries its body's length and CRC, not its bytes, and decodes
/// to the same record with an empty body that keeps its message ends; a placed length that
/// disagrees with the ends does not decode.
#[test]
fn a_placed_append_keeps_its_bytes_out_of_the_frame() {
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let placed = Placed {
        len: 5000,
        crc: crc32fast::hash(&data),
    };
    let rec = Record::Append {
        name: "s".into(),
        incarnation: "i".into(),
        rec: AppendRecord {
            start: Offset::new(3, 700),
            body: Body::new(data.into(), vec![1000, 5000]),
            close: true,
            stream_seq: Some("0009".into()),
            producer: Some(Producer {
                id: "p".into(),
                epoch: 2,
                seq: 4,
            }),
            digest: Some(crate::digest::BodyDigest::from_bytes([7; 32])),
        },
        placed: Some(placed),
    };
    let mut out = Vec::new();
    let n = rec.encode_frame(&mut out);
    // Without its 32-byte producer digest, under 100 bytes: the body is not in it.
    assert!(n < 132, "a placed frame of {n} bytes");
    let crc = u32::from_le_bytes([out[4], out[5], out[6], out[7]]);
    assert_eq!(crc, crc32fast::hash(&out[FRAME_HEADER..]));
    let Some(Record::Append {
        name,
        incarnation,
        rec: r,
        placed: p,
    }) = Record::decode(&out[FRAME_HEADER..])
    else {
        panic!("the placed frame decodes to an append");
    };
    assert_eq!((&*name, &*incarnation, p), ("s", "i", Some(placed)));
    assert_eq!(r.start, Offset::new(3, 700));
    assert!(r.body.data.is_empty());
    assert_eq!(&*r.body.ends, &[1000, 5000]);
    assert!(r.close);
    assert_eq!(r.stream_seq.as_deref(), Some("0009"));
    assert_eq!(r.producer.map(|p| (p.epoch, p.seq)), Some((2, 4)));
    assert_eq!(
        r.digest,
        Some(crate::digest::BodyDigest::from_bytes([7; 32]))
    );
    // The last end must be the placed length.
    let Record::Append { rec: full, .. } = &rec else {
        unreachable!()
    };
    let wrong = Record::Append {
        name: "s".into(),
        incarnation: "i".into(),
        rec: full.clone(),
        placed: Some(Placed {
            len: 4999,
            ..placed
        }),
    };
    let mut out = Vec::new();
    wrong.encode_frame(&mut out);
    assert!(Record::decode(&out[FRAME_HEADER..]).is_none());
}
