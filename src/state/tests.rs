//! The order of checks, Stream-Seq and producer rules, body conversion and the sidecar
//! encoding, against hand-built states.

use bytes::Bytes;

use super::*;

fn state() -> StreamState {
    StreamState::new(
        Config {
            name: "s".into(),
            incarnation: "i".into(),
            content_type: "text/plain".into(),
            expiry: Expiry::Never,
            fork: None,
            retention: crate::RetentionPolicy::default(),
        },
        Offset::ZERO,
    )
}

fn check(s: &StreamState, seq: Option<&str>, p: Option<&Producer>) -> Result<Decision> {
    let body = prepare_body(false, Bytes::from_static(b"x"), false);
    s.check_append(&AppendCheck {
        body: &body,
        has_data: true,
        content_type: Some("text/plain"),
        close: false,
        stream_seq: seq,
        producer: p,
    })
}

fn apply(s: &mut StreamState, seq: Option<&str>, p: Option<Producer>) {
    let body = prepare_body(false, Bytes::from_static(b"x"), false).unwrap();
    let rec = AppendRecord {
        start: s.tail,
        body,
        close: false,
        stream_seq: seq.map(Into::into),
        producer: p,
    };
    s.apply_append(&rec);
}

#[test]
fn stream_seq_is_bytewise_strictly_greater() {
    let mut s = state();
    assert_eq!(check(&s, Some("9"), None).unwrap(), Decision::Accept);
    apply(&mut s, Some("9"), None);
    assert!(
        matches!(check(&s, Some("10"), None), Err(Error::StreamSeqConflict { ref last_seq, .. }) if last_seq == "9")
    );
    assert!(matches!(
        check(&s, Some("9"), None),
        Err(Error::StreamSeqConflict { .. })
    ));
    assert_eq!(check(&s, Some("90"), None).unwrap(), Decision::Accept);
    assert_eq!(check(&s, None, None).unwrap(), Decision::Accept);
}

#[test]
fn producer_dedup_runs_before_stream_seq() {
    let mut s = state();
    let p0 = Producer {
        id: "a".into(),
        epoch: 0,
        seq: 0,
    };
    apply(&mut s, Some("5"), Some(p0.clone()));
    let tail = s.tail;
    assert_eq!(
        check(&s, Some("5"), Some(&p0)).unwrap(),
        Decision::Answer(AppendStatus::Duplicate {
            original_tail: Some(tail)
        })
    );
    let p1 = Producer {
        id: "a".into(),
        epoch: 0,
        seq: 1,
    };
    apply(&mut s, Some("6"), Some(p1.clone()));
    assert_eq!(
        check(&s, Some("1"), Some(&p0)).unwrap(),
        Decision::Answer(AppendStatus::Duplicate {
            original_tail: None
        })
    );
    let p3 = Producer {
        id: "a".into(),
        epoch: 0,
        seq: 3,
    };
    assert!(matches!(
        check(&s, Some("7"), Some(&p3)),
        Err(Error::ProducerSeqGap {
            expected: 2,
            received: 3
        })
    ));
    let stale = Producer {
        id: "a".into(),
        epoch: 0,
        seq: 2,
    };
    assert!(matches!(
        check(&s, Some("6"), Some(&stale)),
        Err(Error::StreamSeqConflict { .. })
    ));
    let e1 = Producer {
        id: "a".into(),
        epoch: 1,
        seq: 1,
    };
    assert!(matches!(
        check(&s, None, Some(&e1)),
        Err(Error::ProducerEpochSeqNotZero)
    ));
    let mut s2 = s.clone();
    apply(
        &mut s2,
        None,
        Some(Producer {
            id: "a".into(),
            epoch: 2,
            seq: 0,
        }),
    );
    assert!(matches!(
        check(&s2, None, Some(&p1)),
        Err(Error::ProducerEpochStale { current: 2 })
    ));
}

#[test]
fn stream_seq_filter() {
    assert_eq!(filter_stream_seq(Some("a\u{7f}".into())).unwrap(), None);
    assert_eq!(filter_stream_seq(Some("é".into())).unwrap(), None);
    assert!(matches!(
        filter_stream_seq(Some("a".repeat(257))),
        Err(crate::Error::TooLarge(_))
    ));
    assert_eq!(
        filter_stream_seq(Some("a".repeat(256)))
            .unwrap()
            .map(|s| s.len()),
        Some(256)
    );
}

#[test]
fn json_bodies_flatten_one_level() {
    let b = prepare_body(true, Bytes::from_static(br#" [ {"a":1}, [1,2] ] "#), false).unwrap();
    assert_eq!(&b.data[..], br#"{"a":1},[1,2],"#);
    assert_eq!(*b.ends, [8, 14]);
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"[]"), false),
        Err(Error::EmptyJsonArray)
    ));
    assert_eq!(
        prepare_body(true, Bytes::from_static(b"[]"), true)
            .unwrap()
            .messages(),
        0
    );
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"{"), false),
        Err(Error::InvalidJson(_))
    ));
    assert_eq!(
        prepare_body(true, Bytes::from_static(b"[[[1]]]"), false)
            .unwrap()
            .data,
        Bytes::from_static(b"[[1]],")
    );
}

#[test]
fn sidecar_state_round_trips() {
    let mut s = state();
    apply(
        &mut s,
        Some("x"),
        Some(Producer {
            id: "p".into(),
            epoch: 3,
            seq: 0,
        }),
    );
    s.forks.insert("f".into());
    s.snapshots.push(SnapshotInfo {
        offset: Offset::new(1, 1),
        digest: "d".into(),
        content_type: "c".into(),
        len: 3,
    });
    let mut e = Enc::default();
    s.encode(&mut e);
    assert_eq!(StreamState::decode(&mut Dec::new(&e.buf)), Some(s));
    assert_eq!(
        StreamState::decode(&mut Dec::new(&e.buf[..e.buf.len() - 1])),
        None
    );
}
