//! The order of checks, Stream-Seq and producer rules, body conversion and the sidecar
//! encoding, against hand-built states.

use bytes::Bytes;
use proptest::strategy::Strategy as _;

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
    let body = prepare_body(false, Bytes::from_static(b"x"), false, 1000);
    s.check_append(&AppendCheck {
        body: &body,
        has_data: true,
        content_type: Some("text/plain"),
        close: false,
        stream_seq: seq,
        producer: p,
        digest: None,
        expect_tail: None,
    })
}

fn apply(s: &mut StreamState, seq: Option<&str>, p: Option<Producer>) {
    let body = prepare_body(false, Bytes::from_static(b"x"), false, 1000).unwrap();
    let rec = AppendRecord {
        start: s.tail,
        body,
        close: false,
        stream_seq: seq.map(Into::into),
        producer: p,
        digest: None,
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
    let b = prepare_body(
        true,
        Bytes::from_static(br#" [ {"a":1}, [1,2] ] "#),
        false,
        1000,
    )
    .unwrap();
    assert_eq!(&b.data[..], br#"{"a":1},[1,2],"#);
    assert_eq!(*b.ends, [8, 14]);
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"[]"), false, 1000),
        Err(Error::EmptyJsonArray)
    ));
    assert_eq!(
        prepare_body(true, Bytes::from_static(b"[]"), true, 1000)
            .unwrap()
            .messages(),
        0
    );
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"{"), false, 1000),
        Err(Error::InvalidJson(_))
    ));
    assert_eq!(
        prepare_body(true, Bytes::from_static(b"[[[1]]]"), false, 1000)
            .unwrap()
            .data,
        Bytes::from_static(b"[[1]],")
    );
}

#[test]
fn a_json_array_is_split_up_to_the_message_cap_and_refused_past_it() {
    let at_cap = prepare_body(true, Bytes::from_static(b"[1, 2,\n3]"), false, 3).unwrap();
    assert_eq!(&at_cap.data[..], b"1,2,3,");
    assert_eq!(*at_cap.ends, [2, 4, 6]);
    match prepare_body(true, Bytes::from_static(b"[1,2,3,4]"), false, 3) {
        Err(Error::TooLarge(why)) => assert!(why.contains("more than 3 messages"), "{why}"),
        other => panic!("four messages past a cap of three: {other:?}"),
    }
    // A single value is one message, whatever the cap. A body that breaks the cap before it
    // turns invalid is refused by the cap: the parse stops there.
    assert_eq!(
        prepare_body(true, Bytes::from_static(b"{\"a\":[1,2,3,4]}"), false, 1)
            .unwrap()
            .messages(),
        1
    );
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"[1,2,3,4,"), false, 3),
        Err(Error::TooLarge(_))
    ));
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"[1,2,"), false, 3),
        Err(Error::InvalidJson(_))
    ));
    // Trailing garbage after the array is invalid, as before.
    assert!(matches!(
        prepare_body(true, Bytes::from_static(b"[1] x"), false, 3),
        Err(Error::InvalidJson(_))
    ));
}

proptest::proptest! {
    /// The split keeps every element's text and order, and stores no more bytes than the body
    /// plus one, for arrays of any shape.
    #[test]
    fn a_json_split_keeps_each_element(values in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::num::i64::ANY.prop_map(|n| n.to_string()),
            "[a-z ]{0,8}".prop_map(|s| format!("{s:?}")),
            proptest::strategy::Just("{\"k\": [1, {}]}".to_owned()),
        ],
        1..40,
    ), pad in 0usize..3) {
        let ws = " ".repeat(pad);
        let body = format!("[{ws}{}{ws}]", values.join(&format!("{ws},{ws}")));
        let b = prepare_body(true, Bytes::from(body.clone()), false, 1000).unwrap();
        proptest::prop_assert!(b.data.len() <= body.len() + 1);
        let mut start = 0usize;
        for (v, end) in values.iter().zip(b.ends.iter()) {
            let got = &b.data[start..*end as usize - 1];
            proptest::prop_assert_eq!(got, v.as_bytes());
            start = *end as usize;
        }
        proptest::prop_assert_eq!(b.ends.len(), values.len());
    }
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

/// Appends `body` as producer `p` with `digest`, checked first: the decision, applied when
/// accepted.
fn keyed(
    s: &mut StreamState,
    p: &Producer,
    body: &[u8],
    digest: Option<BodyDigest>,
) -> Result<Decision> {
    let prepared = prepare_body(false, Bytes::copy_from_slice(body), false, 1000);
    let hashed = digest.map(|d| (d, BodyDigest::of(body) == d));
    let decision = s.check_append(&AppendCheck {
        body: &prepared,
        has_data: true,
        content_type: Some("text/plain"),
        close: false,
        stream_seq: None,
        producer: Some(p),
        digest: hashed.as_ref().map(|(d, ok)| (d, *ok)),
        expect_tail: None,
    })?;
    if decision == Decision::Accept {
        s.apply_append(&AppendRecord {
            start: s.tail,
            body: prepared.expect("a valid body"),
            close: false,
            stream_seq: None,
            producer: Some(p.clone()),
            digest,
        });
    }
    Ok(decision)
}

/// Ursula 0.11's row 8: the claim and the newest write keep their digests; a repeat of either
/// with another identity (another digest, or a digest where none was kept, or none where one
/// was) is a key conflict; a repeat of a write in between is not checked; a write that would
/// apply with a body that does not hash to its digest is refused and uses no seq.
#[test]
fn producer_digests_are_the_write_identity() {
    let mut s = state();
    let d = |b: &[u8]| Some(BodyDigest::of(b));
    let p = |seq| Producer::new("p", 1, seq);
    let conflict = Err::<Decision, _>(Error::ProducerKeyConflict { epoch: 1 });
    assert_eq!(
        keyed(&mut s, &p(0), b"a", d(b"a")).ok(),
        Some(Decision::Accept)
    );
    assert_eq!(
        keyed(&mut s, &p(1), b"b", None).ok(),
        Some(Decision::Accept)
    );
    assert_eq!(
        keyed(&mut s, &p(2), b"c", d(b"c")).ok(),
        Some(Decision::Accept)
    );
    let dup = |tail| {
        Ok::<Decision, Error>(Decision::Answer(AppendStatus::Duplicate {
            original_tail: tail,
        }))
    };
    let newest = Some(s.tail);
    // The newest write: its own digest is a duplicate (whatever the body), any other identity
    // a conflict.
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(2), b"c", d(b"c"))),
        format!("{:?}", dup(newest))
    );
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(2), b"x", d(b"c"))),
        format!("{:?}", dup(newest))
    );
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(2), b"x", d(b"x"))),
        format!("{conflict:?}")
    );
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(2), b"c", None)),
        format!("{conflict:?}")
    );
    // The claim keeps its digest too; the write in between is not checked.
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(0), b"a", d(b"a"))),
        format!("{:?}", dup(None))
    );
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(0), b"a", None)),
        format!("{conflict:?}")
    );
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(1), b"z", d(b"z"))),
        format!("{:?}", dup(None))
    );
    // A body that does not hash to its digest applies nothing, and seq 3 is still next.
    let tail = s.tail;
    assert_eq!(
        format!("{:?}", keyed(&mut s, &p(3), b"d", d(b"other"))),
        format!("{:?}", Err::<Decision, _>(Error::ProducerDigestMismatch))
    );
    assert_eq!(s.tail, tail);
    assert_eq!(
        keyed(&mut s, &p(3), b"d", d(b"d")).ok(),
        Some(Decision::Accept)
    );
    // A new epoch's claim replaces the kept claim digest.
    let q = Producer::new("p", 2, 0);
    assert_eq!(keyed(&mut s, &q, b"e", None).ok(), Some(Decision::Accept));
    assert_eq!(s.producers["p"].claim_digest, None);
    // The digests survive the sidecar encoding; a state without any encodes as before.
    s.producers
        .get_mut("p")
        .expect("the producer")
        .newest_digest = d(b"e");
    let mut e = Enc::default();
    s.encode(&mut e);
    assert_eq!(StreamState::decode(&mut Dec::new(&e.buf)), Some(s.clone()));
    // With a retention policy too, both follow the flags byte (the policy first) and both
    // survive.
    let mut both = s.clone();
    std::sync::Arc::make_mut(&mut both.config).retention =
        crate::RetentionPolicy::new().max_age(60).max_bytes(1 << 20);
    let mut e2 = Enc::default();
    both.encode(&mut e2);
    assert_eq!(StreamState::decode(&mut Dec::new(&e2.buf)), Some(both));
    s.producers
        .get_mut("p")
        .expect("the producer")
        .newest_digest = None;
    let mut plain = Enc::default();
    s.encode(&mut plain);
    assert_eq!(plain.buf.last(), Some(&0));
    assert!(plain.buf.len() < e.buf.len());
}

/// The tail precondition (brook's extension) runs after producer deduplication: a retry of an
/// accepted write is a duplicate even though its own write moved the tail.
#[test]
fn the_tail_precondition_follows_deduplication() {
    let mut s = state();
    let at_start = TailMatch {
        incarnation: Incarnation::new("i").expect("a token"),
        tail: Offset::ZERO,
        closed: false,
    };
    let body = prepare_body(false, Bytes::from_static(b"x"), false, 1000);
    let p = Producer::new("p", 0, 0);
    let check = |s: &StreamState| {
        s.check_append(&AppendCheck {
            body: &body,
            has_data: true,
            content_type: Some("text/plain"),
            close: false,
            stream_seq: None,
            producer: Some(&p),
            digest: None,
            expect_tail: Some(&at_start),
        })
    };
    assert_eq!(check(&s).ok(), Some(Decision::Accept));
    apply(&mut s, None, Some(p.clone()));
    assert!(matches!(
        check(&s),
        Ok(Decision::Answer(AppendStatus::Duplicate { .. }))
    ));
    let q = Producer::new("q", 0, 0);
    let moved = s.check_append(&AppendCheck {
        body: &body,
        has_data: true,
        content_type: Some("text/plain"),
        close: false,
        stream_seq: None,
        producer: Some(&q),
        digest: None,
        expect_tail: Some(&at_start),
    });
    assert!(matches!(moved, Err(Error::TailMoved { tail, closed: false, .. }) if tail == s.tail));
}
