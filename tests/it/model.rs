//! Model-based property test: random operation sequences run against a `Store` and against a
//! plain in-memory model (the stream's bytes as a list of pieces, plus its conditional state),
//! comparing every outcome, every error and full reads, with `Reopen` and `Crash` operations
//! between them.
//!
//! The model is written from the seed's rules and the API's documentation, not from the engine:
//! a difference is either an engine bug or a rule the model states wrongly, and is looked at.
//! `PROPTEST_CASES` sets the number of cases (default 64).

use std::collections::BTreeMap;

use brook::*;
use proptest::prelude::*;

use crate::util::{crash_image, name};

const NAMES: [&str; 4] = ["m/a", "m/b", "m/c", "m/d"];
const MAX_READ: u64 = 8 << 20;

// ---------------------------------------------------------------------------------------------
// Operations, as generated. Values that depend on the state (producer numbers, offsets) are
// chosen when the operation runs, from the model, so that shrinking keeps them meaningful.

#[derive(Clone, Debug)]
struct BodySel {
    /// Messages (JSON) or 0 for an empty body.
    n: u8,
    big: bool,
    array: bool,
    bad: bool,
}

#[derive(Clone, Debug)]
enum SeqSel {
    Num(u8),
    /// The prefix count: the stream's message count plus a delta (-1, 0, 1).
    Count(i8),
    Lit(&'static str),
    TooLong,
}

#[derive(Clone, Debug)]
struct ProdSel {
    id: u8,
    mode: u8,
    /// `Producer-Digest`: 0 none, 1 and 2 the body's, 3 another body's.
    digest: u8,
}

#[derive(Clone, Copy, Debug)]
enum ExpectSel {
    None,
    Right,
    Wrong,
    /// A former incarnation of the same name, if there is one.
    Stale,
}

#[derive(Clone, Copy, Debug)]
enum PosSel {
    /// The k-th boundary at or after the earliest offset (wrapping).
    Boundary(u16),
    /// Any byte position at or after the earliest offset.
    Byte(u16),
    Tail,
    BeyondTail,
    /// A boundary before the earliest offset (or zero).
    BeforeEarliest(u16),
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        s: usize,
        kind: u8,
        body: BodySel,
        closed: bool,
        seq: Option<SeqSel>,
        expect: ExpectSel,
    },
    Append {
        s: usize,
        body: BodySel,
        ct: u8,
        close: bool,
        seq: Option<SeqSel>,
        producer: Option<ProdSel>,
        expect: ExpectSel,
    },
    Close {
        s: usize,
        expect: ExpectSel,
    },
    Read {
        s: usize,
        from: Option<PosSel>,
        tail: bool,
        max: Option<u64>,
        messages: bool,
        expect: ExpectSel,
    },
    Head {
        s: usize,
        expect: ExpectSel,
    },
    Delete {
        s: usize,
        expect: ExpectSel,
    },
    Fork {
        s: usize,
        src: usize,
        at: Option<PosSel>,
        sub: u8,
    },
    Publish {
        s: usize,
        at: PosSel,
        blob: u8,
        json_ct: bool,
        matching: Option<bool>,
    },
    ReadSnapshot {
        s: usize,
        at: Option<PosSel>,
    },
    Retention {
        s: usize,
        at: PosSel,
    },
    Checkpoint,
    Reopen,
    Crash,
}

fn body_sel() -> impl Strategy<Value = BodySel> {
    (
        0u8..4,
        prop::bool::weighted(0.15),
        any::<bool>(),
        prop::bool::weighted(0.05),
    )
        .prop_map(|(n, big, array, bad)| BodySel {
            n: if n == 0 && !big { 0 } else { n.max(1) },
            big,
            array,
            bad,
        })
}

fn nonempty_body() -> impl Strategy<Value = BodySel> {
    body_sel().prop_map(|mut b| {
        b.n = b.n.max(1);
        b
    })
}

fn seq_sel() -> impl Strategy<Value = Option<SeqSel>> {
    prop_oneof![
        4 => Just(None),
        2 => (0u8..12).prop_map(|n| Some(SeqSel::Num(n))),
        2 => (-1i8..=1).prop_map(|d| Some(SeqSel::Count(d))),
        1 => prop::sample::select(vec!["9", "10", "\u{1}5", "é", "~", " "]).prop_map(|s| Some(SeqSel::Lit(s))),
        1 => Just(Some(SeqSel::TooLong)),
    ]
}

fn expect_sel() -> impl Strategy<Value = ExpectSel> {
    prop_oneof![
        6 => Just(ExpectSel::None),
        2 => Just(ExpectSel::Right),
        1 => Just(ExpectSel::Wrong),
        1 => Just(ExpectSel::Stale),
    ]
}

fn pos_sel() -> impl Strategy<Value = PosSel> {
    prop_oneof![
        6 => any::<u16>().prop_map(PosSel::Boundary),
        2 => any::<u16>().prop_map(PosSel::Byte),
        2 => Just(PosSel::Tail),
        1 => Just(PosSel::BeyondTail),
        1 => any::<u16>().prop_map(PosSel::BeforeEarliest),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..NAMES.len();
    prop_oneof![
        4 => (s.clone(), 0u8..5, body_sel(), prop::bool::weighted(0.1), seq_sel(), expect_sel())
            .prop_map(|(s, kind, body, closed, seq, expect)| Op::Create { s, kind, body, closed, seq, expect }),
        12 => (
            s.clone(),
            nonempty_body(),
            prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8)],
            prop::bool::weighted(0.06),
            seq_sel(),
            prop::option::weighted(0.5, (0u8..2, 0u8..10, 0u8..4).prop_map(|(id, mode, digest)| ProdSel { id, mode, digest })),
            expect_sel()
        )
            .prop_map(|(s, body, ct, close, seq, producer, expect)| Op::Append { s, body, ct, close, seq, producer, expect }),
        1 => (s.clone(), expect_sel()).prop_map(|(s, expect)| Op::Close { s, expect }),
        5 => (
            s.clone(),
            prop::option::of(pos_sel()),
            prop::bool::weighted(0.1),
            prop::option::of(prop_oneof![1u64..40, 40u64..3000]),
            any::<bool>(),
            expect_sel()
        )
            .prop_map(|(s, from, tail, max, messages, expect)| Op::Read { s, from, tail, max, messages, expect }),
        1 => (s.clone(), expect_sel()).prop_map(|(s, expect)| Op::Head { s, expect }),
        2 => (s.clone(), expect_sel()).prop_map(|(s, expect)| Op::Delete { s, expect }),
        2 => (s.clone(), s.clone(), prop::option::weighted(0.8, pos_sel()), prop_oneof![3 => Just(0u8), 1 => 1u8..4])
            .prop_map(|(s, src, at, sub)| Op::Fork { s, src, at, sub }),
        2 => (s.clone(), pos_sel(), 0u8..3, any::<bool>(), prop::option::weighted(0.2, any::<bool>()))
            .prop_map(|(s, at, blob, json_ct, matching)| Op::Publish { s, at, blob, json_ct, matching }),
        1 => (s.clone(), prop::option::of(pos_sel())).prop_map(|(s, at)| Op::ReadSnapshot { s, at }),
        1 => (s.clone(), pos_sel()).prop_map(|(s, at)| Op::Retention { s, at }),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

// ---------------------------------------------------------------------------------------------
// The model

#[derive(Clone, Debug)]
struct Piece {
    data: Vec<u8>,
    /// Whether the piece is a whole message (a fork's sub-offset can inherit part of one).
    counted: bool,
}

#[derive(Clone, Debug)]
struct MSnap {
    offset: Offset,
    ct: String,
    blob: Vec<u8>,
    digest: String,
}

#[derive(Clone, Debug)]
struct MStream {
    json: bool,
    ct: String,
    incarnation: Incarnation,
    pieces: Vec<Piece>,
    closed: bool,
    seq: Option<String>,
    /// id -> (epoch, seq, tail after its newest write)
    producers: BTreeMap<String, (u64, u64, Offset)>,
    /// id -> the digests its epoch's claim and its newest write carried (`Producer-Digest`)
    digests: BTreeMap<String, (Option<BodyDigest>, Option<BodyDigest>)>,
    earliest: Offset,
    snapshots: Vec<MSnap>,
    /// Source name index and divergence point, for a fork.
    fork: Option<(usize, Offset)>,
    soft_deleted: bool,
}

impl MStream {
    fn len(&self) -> u64 {
        self.pieces.iter().map(|p| p.data.len() as u64).sum()
    }

    fn data(&self) -> Vec<u8> {
        self.pieces
            .iter()
            .flat_map(|p| p.data.iter().copied())
            .collect()
    }

    /// (start, end, counted) of every piece.
    fn spans(&self) -> Vec<(u64, u64, bool)> {
        let mut pos = 0;
        self.pieces
            .iter()
            .map(|p| {
                let a = pos;
                pos += p.data.len() as u64;
                (a, pos, p.counted)
            })
            .collect()
    }

    fn offset_at(&self, pos: u64) -> Offset {
        let n = self
            .spans()
            .iter()
            .filter(|(_, e, c)| *c && *e <= pos)
            .count() as u64;
        Offset::new(n, pos)
    }

    fn tail(&self) -> Offset {
        self.offset_at(self.len())
    }

    fn boundaries(&self) -> Vec<u64> {
        let mut b = vec![0];
        b.extend(self.spans().iter().map(|(_, e, _)| *e));
        b.dedup();
        b
    }

    fn is_boundary(&self, pos: u64) -> bool {
        self.boundaries().contains(&pos)
    }

    fn next_boundary(&self, pos: u64) -> Option<u64> {
        self.boundaries().into_iter().find(|&b| b > pos)
    }

    fn latest(&self) -> Option<&MSnap> {
        self.snapshots.last()
    }

    fn pos(&self, sel: PosSel) -> Offset {
        let tail = self.len();
        let e = self.earliest.bytes;
        match sel {
            PosSel::Boundary(k) => {
                let b: Vec<u64> = self.boundaries().into_iter().filter(|&b| b >= e).collect();
                self.offset_at(b[k as usize % b.len()])
            }
            PosSel::Byte(k) => self.offset_at(e + u64::from(k) % (tail - e + 1)),
            PosSel::Tail => self.tail(),
            PosSel::BeyondTail => Offset::new(self.tail().messages + 1, tail + 1),
            PosSel::BeforeEarliest(k) => {
                let b: Vec<u64> = self.boundaries().into_iter().filter(|&b| b < e).collect();
                if b.is_empty() {
                    Offset::ZERO
                } else {
                    self.offset_at(b[k as usize % b.len()])
                }
            }
        }
    }
}

struct Model {
    streams: Vec<Option<MStream>>,
    /// Every incarnation token the store has handed out, per name.
    history: Vec<Vec<Incarnation>>,
    counter: u64,
}

fn producer_id(i: u8) -> String {
    format!("p{i}")
}

impl Model {
    /// Whether the store handed out `token` before, for any name.
    fn issued(&self, token: &Incarnation) -> bool {
        self.history.iter().flatten().any(|i| i == token)
    }

    fn get(&self, s: usize) -> Result<&MStream, Error> {
        match &self.streams[s] {
            None => Err(Error::NotFound),
            Some(m) if m.soft_deleted => Err(Error::Gone),
            Some(m) => Ok(m),
        }
    }

    fn expect_token(&self, s: usize, sel: ExpectSel) -> Option<Incarnation> {
        let wrong = || Incarnation::new("wrong-token").expect("valid token");
        match sel {
            ExpectSel::None => None,
            ExpectSel::Right => Some(
                self.streams[s]
                    .as_ref()
                    .map_or_else(wrong, |m| m.incarnation.clone()),
            ),
            ExpectSel::Wrong => Some(wrong()),
            ExpectSel::Stale => {
                let cur = self.streams[s].as_ref().map(|m| m.incarnation.clone());
                Some(
                    self.history[s]
                        .iter()
                        .rev()
                        .find(|i| Some(*i) != cur.as_ref())
                        .cloned()
                        .unwrap_or_else(wrong),
                )
            }
        }
    }

    fn check_expect(m: &MStream, e: Option<&Incarnation>) -> Result<(), Error> {
        match e {
            Some(e) if *e != m.incarnation => Err(Error::IncarnationMismatch {
                current: m.incarnation.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Live forks of stream `s`: present streams (even soft-deleted ones) that read from it.
    fn has_forks(&self, s: usize) -> bool {
        self.streams
            .iter()
            .flatten()
            .any(|f| f.fork.is_some_and(|(src, _)| src == s))
    }

    fn info(&self, s: usize) -> Option<ModelInfo> {
        let m = self.streams[s].as_ref()?;
        Some(ModelInfo {
            ct: m.ct.clone(),
            tail: m.tail(),
            closed: m.closed,
            incarnation: m.incarnation.clone(),
            earliest: m.earliest,
            snapshot: m.latest().map(|x| {
                (
                    x.offset,
                    x.digest.clone(),
                    x.ct.clone(),
                    x.blob.len() as u64,
                )
            }),
            fork: m.fork.map(|(src, at)| (NAMES[src].to_owned(), at)),
            seq: m.seq.clone(),
        })
    }

    /// Resolves a fork's divergence point in source `src` as the engine must.
    fn fork_position(src: &MStream, at: Option<Offset>, sub: u64) -> Result<u64, Error> {
        let tail = src.len();
        let bad = |s: &str| Error::InvalidForkPosition(s.to_owned());
        let at = at.map_or(tail, |o| o.bytes);
        if at > tail {
            return Err(bad("beyond tail"));
        }
        if at < src.earliest.bytes {
            return Err(bad("before the retained start"));
        }
        if !src.is_boundary(at) {
            return Err(bad("not a boundary"));
        }
        let mut pos = at;
        if sub > 0 {
            if src.json {
                for _ in 0..sub {
                    match src.next_boundary(pos) {
                        Some(b) if b <= tail => pos = b,
                        _ => return Err(bad("sub-offset past the tail")),
                    }
                }
            } else {
                let next = src.next_boundary(pos).unwrap_or(tail).min(tail);
                if pos + sub > next {
                    return Err(bad("sub-offset past the message"));
                }
                pos += sub;
            }
        }
        Ok(pos)
    }

    /// Drops a hard-deleted fork's claim on its source, collecting soft-deleted sources that no
    /// fork reads any more, up the chain.
    fn release(&mut self, mut fork_of: Option<usize>) {
        while let Some(src) = fork_of {
            let soft = self.streams[src].as_ref().is_some_and(|m| m.soft_deleted);
            if !soft || self.has_forks(src) {
                return;
            }
            fork_of = self.streams[src]
                .as_ref()
                .and_then(|m| m.fork.map(|(s, _)| s));
            self.streams[src] = None;
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct ModelInfo {
    ct: String,
    tail: Offset,
    closed: bool,
    incarnation: Incarnation,
    earliest: Offset,
    snapshot: Option<(Offset, String, String, u64)>,
    fork: Option<(String, Offset)>,
    seq: Option<String>,
}

fn real_info(i: &StreamInfo) -> ModelInfo {
    ModelInfo {
        ct: i.content_type.clone(),
        tail: i.tail,
        closed: i.closed,
        incarnation: i.incarnation.clone(),
        earliest: i.earliest,
        snapshot: i
            .snapshot
            .as_ref()
            .map(|x| (x.offset, x.digest.clone(), x.content_type.clone(), x.len)),
        fork: i.fork.as_ref().map(|(n, o)| (n.as_str().to_owned(), *o)),
        seq: i.stream_seq.clone(),
    }
}

/// Whether two errors are the same refusal (variant and the fields a caller acts on).
fn same_error(a: &Error, b: &Error) -> bool {
    use Error::*;
    match (a, b) {
        (IncarnationMismatch { current: x }, IncarnationMismatch { current: y }) => x == y,
        (StreamClosed { tail: x }, StreamClosed { tail: y }) => x == y,
        (ContentTypeMismatch { expected: x }, ContentTypeMismatch { expected: y }) => x == y,
        (
            StreamSeqConflict {
                tail: t1,
                last_seq: s1,
            },
            StreamSeqConflict {
                tail: t2,
                last_seq: s2,
            },
        ) => t1 == t2 && s1 == s2,
        (
            ProducerSeqGap {
                expected: e1,
                received: r1,
            },
            ProducerSeqGap {
                expected: e2,
                received: r2,
            },
        ) => e1 == e2 && r1 == r2,
        (ProducerEpochStale { current: x }, ProducerEpochStale { current: y }) => x == y,
        (ProducerKeyConflict { epoch: x }, ProducerKeyConflict { epoch: y }) => x == y,
        (OffsetGone { earliest: x }, OffsetGone { earliest: y }) => x == y,
        (OffsetBeyondTail { tail: x }, OffsetBeyondTail { tail: y }) => x == y,
        (SnapshotStale { latest: x }, SnapshotStale { latest: y }) => x == y,
        (SnapshotMatchFailed { current: x }, SnapshotMatchFailed { current: y }) => x == y,
        (NotOnBoundary(x), NotOnBoundary(y)) => x == y,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

fn compare<T: std::fmt::Debug, U: std::fmt::Debug>(
    what: &str,
    model: &Result<T, Error>,
    real: &Result<U, Error>,
    same: impl Fn(&T, &U) -> bool,
) -> Result<(), String> {
    let ok = match (model, real) {
        (Ok(m), Ok(r)) => same(m, r),
        (Err(m), Err(r)) => same_error(m, r),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: model {model:?}, store {real:?}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Concrete requests

struct Bodies {
    data: Vec<u8>,
    /// The stored pieces the body becomes on a stream of this kind (when valid).
    pieces: Vec<Vec<u8>>,
}

fn make_body(model: &mut Model, json: bool, b: &BodySel) -> Bodies {
    model.counter += 1;
    let c = model.counter;
    if b.bad {
        return Bodies {
            data: if json {
                b"{nope".to_vec()
            } else {
                b"raw".to_vec()
            },
            pieces: vec![b"raw".to_vec()],
        };
    }
    let pad = if b.big {
        "x".repeat(1500)
    } else {
        "y".repeat((c % 7) as usize)
    };
    if !json {
        if b.n == 0 {
            return Bodies {
                data: Vec::new(),
                pieces: Vec::new(),
            };
        }
        let d = format!("<{c}{pad}>").into_bytes();
        return Bodies {
            data: d.clone(),
            pieces: vec![d],
        };
    }
    if b.n == 0 {
        return Bodies {
            data: b"[]".to_vec(),
            pieces: Vec::new(),
        };
    }
    let msgs: Vec<String> = (0..b.n)
        .map(|i| {
            if (c + u64::from(i)).is_multiple_of(5) {
                format!("[{c},{i},\"{pad}\"]")
            } else {
                format!("{{\"c\":{c},\"i\":{i},\"p\":\"{pad}\"}}")
            }
        })
        .collect();
    let data = if b.n == 1 && !b.array && !msgs[0].starts_with('[') {
        msgs[0].clone()
    } else {
        format!(" [ {} ]", msgs.join(" , "))
    };
    Bodies {
        data: data.into_bytes(),
        pieces: msgs
            .into_iter()
            .map(|m| format!("{m},").into_bytes())
            .collect(),
    }
}

fn make_seq(m: Option<&MStream>, s: Option<&SeqSel>) -> Option<String> {
    Some(match s? {
        SeqSel::Num(n) => format!("{n:020}"),
        SeqSel::Count(d) => {
            let count = m.map_or(0, |m| m.tail().messages);
            let n = i64::try_from(count).expect("a message count fits in an i64") + i64::from(*d);
            format!("{:020}", n.max(0))
        }
        SeqSel::Lit(s) => (*s).to_owned(),
        SeqSel::TooLong => "7".repeat(257),
    })
}

/// The seed's filter: printable ASCII only (others ignored), at most 256 bytes.
fn filter_seq(s: Option<String>) -> Result<Option<String>, Error> {
    match s {
        Some(s) if !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) => Ok(None),
        Some(s) if s.len() > 256 => Err(Error::TooLarge("Stream-Seq".into())),
        o => Ok(o),
    }
}

fn make_producer(m: Option<&MStream>, p: &ProdSel) -> Producer {
    let id = producer_id(p.id);
    let known = m
        .and_then(|m| m.producers.get(&id))
        .map(|&(e, s, _)| (e, s));
    let (epoch, seq) = match (p.mode, known) {
        (0..=2, Some((e, s))) => (e, s + 1),
        (0..=2, None) => (0, 0),
        (3, Some((e, s))) => (e, s),
        (3, None) => (0, 0),
        (4, Some((e, s))) => (e, s.saturating_sub(1)),
        (4, None) => (1, 0),
        (5, Some((e, s))) => (e, s + 2),
        (5, None) => (0, 1),
        (6, Some((e, _))) => (e + 1, 0),
        (6, None) => (2, 0),
        (7, Some((e, _))) if e > 0 => (e - 1, 0),
        (7, Some((e, _))) => (e + 1, 1),
        (7, None) => (0, 0),
        (8, _) => {
            return Producer {
                id,
                epoch: 0,
                seq: 1 << 53,
            };
        }
        (_, Some((e, s))) => (e, s + 1),
        (_, None) => (0, 0),
    };
    Producer { id, epoch, seq }
}

// ---------------------------------------------------------------------------------------------
// The harness

struct Harness {
    model: Model,
    store: Option<Store>,
    dir: std::path::PathBuf,
    /// The temporary directories of the store and of its crash images, kept until the end.
    dirs: Vec<tempfile::TempDir>,
    log: Vec<String>,
}

fn options() -> Options {
    // Two journal shards whatever the machine's default, so the model covers both.
    Options::default()
        .with_journal_shards(2)
        .with_durability(Durability::Buffered)
        .with_checkpoint_bytes(64 << 10)
        .with_segment_bytes(4096)
}

impl Harness {
    fn new() -> Result<Harness, String> {
        let d = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = d.path().to_path_buf();
        let store = Store::open(&dir, options()).map_err(|e| e.to_string())?;
        Ok(Harness {
            model: Model {
                streams: vec![None; NAMES.len()],
                history: vec![Vec::new(); NAMES.len()],
                counter: 0,
            },
            store: Some(store),
            dir,
            dirs: vec![d],
            log: Vec::new(),
        })
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store is open")
    }

    fn run(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Create {
                s,
                kind,
                body,
                closed,
                seq,
                expect,
            } => self.create(*s, *kind, body, *closed, seq.as_ref(), *expect),
            Op::Append {
                s,
                body,
                ct,
                close,
                seq,
                producer,
                expect,
            } => self.append(
                *s,
                Some(body),
                *ct,
                *close,
                seq.as_ref(),
                producer.as_ref(),
                *expect,
            ),
            Op::Close { s, expect } => self.append(*s, None, 0, true, None, None, *expect),
            Op::Read {
                s,
                from,
                tail,
                max,
                messages,
                expect,
            } => self.read(*s, *from, *tail, *max, *messages, *expect),
            Op::Head { s, expect } => {
                let e = self.model.expect_token(*s, *expect);
                let want = self
                    .model
                    .get(*s)
                    .and_then(|m| Model::check_expect(m, e.as_ref()))
                    .map(|()| self.model.info(*s));
                let got = self.store().head(&name(NAMES[*s]), &Guard::from(e.clone()));
                compare("head", &want, &got, |m, r| {
                    m.as_ref() == Some(&real_info(r))
                })
            }
            Op::Delete { s, expect } => self.delete(*s, *expect),
            Op::Fork { s, src, at, sub } => self.fork(*s, *src, *at, *sub),
            Op::Publish {
                s,
                at,
                blob,
                json_ct,
                matching,
            } => self.publish(*s, *at, *blob, *json_ct, *matching),
            Op::ReadSnapshot { s, at } => self.read_snapshot(*s, *at),
            Op::Retention { s, at } => self.retention(*s, *at),
            Op::Checkpoint => self
                .store()
                .checkpoint()
                .map_err(|e| format!("checkpoint: {e}")),
            Op::Reopen => {
                let store = self.store.take().expect("store is open");
                store.shutdown().map_err(|e| format!("shutdown: {e}"))?;
                drop(store);
                self.store =
                    Some(Store::open(&self.dir, options()).map_err(|e| format!("reopen: {e}"))?);
                self.verify_all()
            }
            Op::Crash => {
                let store = self.store.take().expect("store is open");
                let copy = crash_image(store, &self.dir).map_err(|e| e.to_string())?;
                self.dir = copy.path().to_path_buf();
                self.dirs.push(copy);
                self.store = Some(
                    Store::open(&self.dir, options())
                        .map_err(|e| format!("open after crash: {e}"))?,
                );
                self.verify_all()
            }
        }
    }

    fn create(
        &mut self,
        s: usize,
        kind: u8,
        body: &BodySel,
        closed: bool,
        seq: Option<&SeqSel>,
        expect: ExpectSel,
    ) -> Result<(), String> {
        let (ct, norm) = match kind {
            0 => (Some("application/json"), "application/json"),
            1 => (Some("Application/JSON"), "application/json"),
            2 => (Some("text/plain"), "text/plain"),
            3 => (None, "application/octet-stream"),
            _ => (
                Some("application/json; charset=utf-8"),
                "application/json;charset=utf-8",
            ),
        };
        let json = is_json(norm);
        let b = make_body(&mut self.model, json, body);
        let e = self.model.expect_token(s, expect);
        let seq_raw = make_seq(None, seq);
        let mut req = CreateOptions::new().data(b.data.clone());
        req.content_type = ct.map(str::to_owned);
        req.closed = closed;
        req.stream_seq.clone_from(&seq_raw);
        req.expect.clone_from(&e);
        let want: Result<Option<bool>, Error> = (|| {
            let seq = filter_seq(seq_raw)?;
            if let Some(m) = &self.model.streams[s] {
                if m.soft_deleted {
                    return Err(Error::ConfigMismatch(""));
                }
                Model::check_expect(m, e.as_ref())?;
                if m.ct != norm || closed != m.closed || m.fork.is_some() {
                    return Err(Error::ConfigMismatch(""));
                }
                return Ok(Some(false));
            }
            if e.is_some() {
                return Err(Error::IncarnationMissing);
            }
            if json && body.bad {
                return Err(Error::InvalidJson(String::new()));
            }
            let _ = seq;
            Ok(Some(true))
        })();
        let got = self.store().create(&name(NAMES[s]), req);
        self.log
            .push(format!("  -> {:?}", got.as_ref().map(|c| c.created)));
        compare("create", &want, &got, |m, r| *m == Some(r.created))?;
        if let (Ok(Some(true)), Ok(c)) = (&want, &got) {
            if self.model.issued(&c.info.incarnation) {
                return Err(format!(
                    "create reused an incarnation token {}",
                    c.info.incarnation
                ));
            }
            self.model.history[s].push(c.info.incarnation.clone());
            let pieces = b
                .pieces
                .into_iter()
                .map(|data| Piece {
                    data,
                    counted: true,
                })
                .collect();
            self.model.streams[s] = Some(MStream {
                json,
                ct: norm.to_owned(),
                incarnation: c.info.incarnation.clone(),
                pieces,
                closed,
                seq: filter_seq(make_seq(None, seq)).ok().flatten(),
                producers: BTreeMap::new(),
                digests: BTreeMap::new(),
                earliest: Offset::ZERO,
                snapshots: Vec::new(),
                fork: None,
                soft_deleted: false,
            });
        }
        if let Ok(c) = &got {
            let want = self.model.info(s);
            if want.as_ref() != Some(&real_info(&c.info)) {
                return Err(format!(
                    "create info: model {want:?}, store {:?}",
                    real_info(&c.info)
                ));
            }
        }
        Ok(())
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per field of `Op::Append`, as the harness decodes it"
    )]
    fn append(
        &mut self,
        s: usize,
        body: Option<&BodySel>,
        ct: u8,
        close: bool,
        seq: Option<&SeqSel>,
        producer: Option<&ProdSel>,
        expect: ExpectSel,
    ) -> Result<(), String> {
        let json = self.model.streams[s].as_ref().is_some_and(|m| m.json);
        let b = match body {
            Some(sel) => make_body(&mut self.model, json, sel),
            None => Bodies {
                data: Vec::new(),
                pieces: Vec::new(),
            },
        };
        let m = self.model.streams[s].as_ref();
        let stream_ct = m.map_or("application/octet-stream".to_owned(), |m| m.ct.clone());
        let req_ct = match ct {
            0 => None,
            1 => Some(match stream_ct.split_once(';') {
                Some((essence, params)) => format!("{}; {params}", essence.to_uppercase()),
                None => stream_ct.to_uppercase(),
            }),
            _ => Some("text/html".to_owned()),
        };
        let seq_raw = make_seq(m, seq);
        let seq_f = filter_seq(seq_raw.clone());
        let prod = producer.map(|p| make_producer(m, p));
        let digest = producer.and_then(|p| match p.digest {
            1 | 2 => Some(BodyDigest::of(&b.data)),
            3 => Some(BodyDigest::of(&[b.data.as_slice(), b"\xff"].concat())),
            _ => None,
        });
        let digest_ok = producer.is_none_or(|p| p.digest != 3);
        let e = self.model.expect_token(s, expect);
        let mut req = AppendRequest::new(b.data.clone());
        req.producer_digest = digest;
        req.content_type.clone_from(&req_ct);
        req.close = close;
        req.stream_seq.clone_from(&seq_raw);
        req.producer.clone_from(&prod);
        req.expect.clone_from(&e);
        let has_data = !b.data.is_empty();
        // What the engine must answer, in the documented order of checks.
        let want: Result<(AppendStatus, Option<(u64, u64)>), Error> = (|| {
            let seq = filter_seq(seq_raw.clone())?;
            if let Some(p) = &prod
                && (p.id.is_empty() || p.epoch >= 1 << 53 || p.seq >= 1 << 53)
            {
                return Err(Error::InvalidArgument(String::new()));
            }
            let m = self.model.get(s)?;
            Model::check_expect(m, e.as_ref())?;
            let known = prod
                .as_ref()
                .and_then(|p| m.producers.get(&p.id).map(|st| (p, *st)));
            if let Some((p, (pe, ps, ptail))) = known
                && p.epoch == pe
                && p.seq <= ps
            {
                // Ursula 0.11's row 8: the claim's and the newest write's identities are kept.
                let (claim, newest) = m.digests.get(&p.id).copied().unwrap_or_default();
                let kept = if p.seq == 0 {
                    Some(claim)
                } else if p.seq == ps {
                    Some(newest)
                } else {
                    None
                };
                if kept.is_some_and(|k| k != digest) {
                    return Err(Error::ProducerKeyConflict { epoch: pe });
                }
                let original_tail = (p.seq == ps).then_some(ptail);
                return Ok((AppendStatus::Duplicate { original_tail }, Some((pe, ps))));
            }
            if m.closed {
                if !has_data && close {
                    let echo = prod
                        .as_ref()
                        .and_then(|p| m.producers.get(&p.id))
                        .map(|&(e, s, _)| (e, s));
                    return Ok((AppendStatus::AlreadyClosed, echo));
                }
                return Err(Error::StreamClosed { tail: m.tail() });
            }
            if has_data
                && req_ct
                    .as_deref()
                    .is_some_and(|c| c.to_lowercase().replace("; ", ";") != m.ct.to_lowercase())
            {
                return Err(Error::ContentTypeMismatch {
                    expected: m.ct.clone(),
                });
            }
            if let Some(p) = &prod {
                match m.producers.get(&p.id) {
                    None if p.seq != 0 => {
                        return Err(Error::ProducerSeqGap {
                            expected: 0,
                            received: p.seq,
                        });
                    }
                    None => {}
                    Some(&(pe, _, _)) if p.epoch < pe => {
                        return Err(Error::ProducerEpochStale { current: pe });
                    }
                    Some(&(pe, _, _)) if p.epoch > pe && p.seq != 0 => {
                        return Err(Error::ProducerEpochSeqNotZero);
                    }
                    Some(&(pe, _, _)) if p.epoch > pe => {}
                    Some(&(_, ps, _)) if p.seq != ps + 1 => {
                        return Err(Error::ProducerSeqGap {
                            expected: ps + 1,
                            received: p.seq,
                        });
                    }
                    Some(_) => {}
                }
            }
            if let (Some(new), Some(last)) = (&seq, &m.seq)
                && new.as_bytes() <= last.as_bytes()
            {
                return Err(Error::StreamSeqConflict {
                    tail: m.tail(),
                    last_seq: last.clone(),
                });
            }
            if !digest_ok {
                return Err(Error::ProducerDigestMismatch);
            }
            if json && has_data && body.is_some_and(|b| b.bad) {
                return Err(Error::InvalidJson(String::new()));
            }
            if !has_data && !close {
                return Err(Error::EmptyAppend);
            }
            Ok((
                AppendStatus::Appended,
                prod.as_ref().map(|p| (p.epoch, p.seq)),
            ))
        })();
        let got = self.store().append(&name(NAMES[s]), req);
        self.log
            .push(format!("  -> {:?}", got.as_ref().map(|o| o.status)));
        // Apply an accepted append to the model.
        if let Ok((AppendStatus::Appended, _)) = &want {
            let m = self.model.streams[s].as_mut().expect("stream exists");
            m.pieces.extend(b.pieces.into_iter().map(|data| Piece {
                data,
                counted: true,
            }));
            m.closed |= close;
            if let Ok(Some(v)) = &seq_f {
                m.seq = Some(v.clone());
            }
            let tail = m.tail();
            if let Some(p) = &prod {
                m.producers.insert(p.id.clone(), (p.epoch, p.seq, tail));
                let claim = if p.seq == 0 {
                    digest
                } else {
                    m.digests.get(&p.id).and_then(|d| d.0)
                };
                m.digests.insert(p.id.clone(), (claim, digest));
            }
        }
        let (tail, closed, inc) = match self.model.streams[s].as_ref() {
            Some(m) => (m.tail(), m.closed, m.incarnation.clone()),
            None => (
                Offset::ZERO,
                false,
                Incarnation::new("none").expect("token"),
            ),
        };
        compare("append", &want, &got, |(status, echo), r| {
            *status == r.status
                && *echo == r.producer
                && r.tail == tail
                && r.closed == closed
                && r.incarnation == inc
        })
    }

    fn read(
        &mut self,
        s: usize,
        from: Option<PosSel>,
        tail_sel: bool,
        max: Option<u64>,
        messages: bool,
        expect: ExpectSel,
    ) -> Result<(), String> {
        // (start, next, body, up_to_date, closed, messages)
        type Want = (Offset, Offset, Vec<u8>, bool, bool, Vec<(Offset, Vec<u8>)>);
        let e = self.model.expect_token(s, expect);
        let m = self.model.streams[s].as_ref();
        let from = match (tail_sel, from, m) {
            (true, _, _) => ReadFrom::Tail,
            (_, None, _) => ReadFrom::Start,
            (_, Some(p), Some(m)) => ReadFrom::At(m.pos(p)),
            (_, Some(_), None) => ReadFrom::At(Offset::ZERO),
        };
        let mut req = ReadRequest::from(from);
        req.max_bytes = max;
        req.expect.clone_from(&e);
        let want: Result<Want, Error> = (|| {
            let m = self.model.get(s)?;
            let tail = m.tail();
            let start = match from {
                // The seed: once retention trimmed the start, a read from the start answers 410.
                ReadFrom::Start if m.earliest.bytes > 0 => {
                    return Err(Error::OffsetGone {
                        earliest: m.earliest,
                    });
                }
                ReadFrom::Start => m.earliest,
                ReadFrom::Tail => tail,
                ReadFrom::At(o) => o,
            };
            if start.bytes > tail.bytes {
                return Err(Error::OffsetBeyondTail { tail });
            }
            if start.bytes < m.earliest.bytes {
                return Err(Error::OffsetGone {
                    earliest: m.earliest,
                });
            }
            // A read that would answer 404, 410 or 416 still does with Stream-Incarnation.
            Model::check_expect(m, e.as_ref())?;
            if m.json && !m.is_boundary(start.bytes) && start.bytes != tail.bytes {
                return Err(Error::InvalidOffset(String::new()));
            }
            let maxb = max.unwrap_or(MAX_READ).clamp(1, MAX_READ);
            let from_b = start.bytes;
            let mut to = if from == ReadFrom::Tail {
                from_b
            } else {
                tail.bytes.min(from_b + maxb)
            };
            if m.json && to < tail.bytes && to > from_b {
                let bs = m.boundaries();
                to = bs
                    .iter()
                    .copied()
                    .filter(|&b| b > from_b && b <= to)
                    .max()
                    .unwrap_or_else(|| {
                        m.next_boundary(from_b)
                            .unwrap_or(tail.bytes)
                            .min(tail.bytes)
                    });
            }
            let data = m.data();
            let slice = &data[from_b as usize..to as usize];
            let body = if m.json {
                let mut v = b"[".to_vec();
                v.extend_from_slice(slice.strip_suffix(b",").unwrap_or(slice));
                v.push(b']');
                v
            } else {
                slice.to_vec()
            };
            let up = to == tail.bytes;
            let next = if up { tail } else { m.offset_at(to) };
            let msgs = m
                .spans()
                .iter()
                .zip(&m.pieces)
                .filter(|((a, b, c), _)| *c && *a >= from_b && *b <= to)
                .map(|((a, _, _), p)| {
                    let d = if m.json {
                        p.data[..p.data.len() - 1].to_vec()
                    } else {
                        p.data.clone()
                    };
                    (m.offset_at(*a), d)
                })
                .collect();
            Ok((m.offset_at(from_b), next, body, up, up && m.closed, msgs))
        })();
        let n = name(NAMES[s]);
        if messages {
            let got = self.store().read_messages(&n, &req);
            compare("read_messages", &want, &got, |w, (msgs, c)| {
                let gm: Vec<(Offset, Vec<u8>)> =
                    msgs.iter().map(|x| (x.start, x.data.to_vec())).collect();
                w.0 == c.start
                    && w.1 == c.next
                    && w.3 == c.up_to_date
                    && w.4 == c.closed
                    && w.5 == gm
            })
        } else {
            let got = self.store().read(&n, &req);
            compare("read", &want, &got, |w, c| {
                w.0 == c.start
                    && w.1 == c.next
                    && w.2 == c.to_vec()
                    && w.3 == c.up_to_date
                    && w.4 == c.closed
            })
        }
    }

    fn delete(&mut self, s: usize, expect: ExpectSel) -> Result<(), String> {
        let e = self.model.expect_token(s, expect);
        let want: Result<(), Error> = self
            .model
            .get(s)
            .and_then(|m| Model::check_expect(m, e.as_ref()));
        let got = self
            .store()
            .delete(&name(NAMES[s]), &Guard::from(e.clone()));
        compare("delete", &want, &got, |(), ()| true)?;
        if want.is_ok() {
            if self.model.has_forks(s) {
                self.model.streams[s].as_mut().expect("exists").soft_deleted = true;
            } else {
                let src = self.model.streams[s]
                    .take()
                    .and_then(|m| m.fork.map(|(x, _)| x));
                self.model.release(src);
            }
        }
        Ok(())
    }

    fn fork(&mut self, s: usize, src: usize, at: Option<PosSel>, sub: u8) -> Result<(), String> {
        let sub = u64::from(sub);
        let at_off = match (at, self.model.streams[src].as_ref()) {
            (Some(p), Some(m)) => Some(m.pos(p)),
            (Some(_), None) => Some(Offset::ZERO),
            (None, _) => None,
        };
        let mut from = ForkFrom::tail(name(NAMES[src])).sub_offset(sub);
        from.offset = at_off;
        let req = CreateOptions::new().fork(from);
        let want: Result<(bool, u64), Error> = (|| {
            if let Some(t) = &self.model.streams[s] {
                if t.soft_deleted || t.closed {
                    return Err(Error::ConfigMismatch(""));
                }
                let Some((tsrc, base)) = t.fork else {
                    return Err(Error::ConfigMismatch(""));
                };
                if tsrc != src {
                    return Err(Error::ConfigMismatch(""));
                }
                let differs = match at_off {
                    None => sub != 0,
                    Some(o) => {
                        let srcm = self.model.streams[src]
                            .as_ref()
                            .expect("a fork's source exists");
                        match Model::fork_position(srcm, Some(o), sub) {
                            Ok(pos) => pos != base.bytes,
                            Err(_) => o.bytes != base.bytes || sub != 0,
                        }
                    }
                };
                return if differs {
                    Err(Error::ConfigMismatch(""))
                } else {
                    Ok((false, base.bytes))
                };
            }
            let srcm = match &self.model.streams[src] {
                None => return Err(Error::ForkSourceNotFound),
                Some(m) if m.soft_deleted => return Err(Error::ForkSourceGone),
                Some(m) => m,
            };
            Ok((true, Model::fork_position(srcm, at_off, sub)?))
        })();
        let got = self.store().create(&name(NAMES[s]), req);
        self.log.push(format!(
            "  -> {:?}",
            got.as_ref().map(|c| (c.created, c.info.tail))
        ));
        compare("fork", &want, &got, |w, r| w.0 == r.created)?;
        if let (Ok((true, pos)), Ok(c)) = (&want, &got) {
            let srcm = self.model.streams[src].as_ref().expect("source exists");
            let mut pieces = Vec::new();
            let mut at = 0u64;
            for p in &srcm.pieces {
                let len = p.data.len() as u64;
                if at + len <= *pos {
                    pieces.push(p.clone());
                } else if at < *pos {
                    pieces.push(Piece {
                        data: p.data[..(*pos - at) as usize].to_vec(),
                        counted: false,
                    });
                }
                at += len;
            }
            let base = srcm.offset_at(*pos);
            if self.model.issued(&c.info.incarnation) {
                return Err("fork reused an incarnation token".into());
            }
            self.model.history[s].push(c.info.incarnation.clone());
            self.model.streams[s] = Some(MStream {
                json: srcm.json,
                ct: srcm.ct.clone(),
                incarnation: c.info.incarnation.clone(),
                pieces,
                closed: false,
                seq: None,
                producers: BTreeMap::new(),
                digests: BTreeMap::new(),
                earliest: srcm.earliest,
                snapshots: Vec::new(),
                fork: Some((src, base)),
                soft_deleted: false,
            });
        }
        if let Ok(c) = &got {
            let want = self.model.info(s);
            if want.as_ref() != Some(&real_info(&c.info)) {
                return Err(format!(
                    "fork info: model {want:?}, store {:?}",
                    real_info(&c.info)
                ));
            }
        }
        Ok(())
    }

    fn publish(
        &mut self,
        s: usize,
        at: PosSel,
        blob: u8,
        json_ct: bool,
        matching: Option<bool>,
    ) -> Result<(), String> {
        let m = self.model.streams[s].as_ref();
        let offset = m.map_or(Offset::ZERO, |m| m.pos(at));
        let data = format!("{{\"blob\":{blob}}}").into_bytes();
        let ct = if json_ct {
            "application/json"
        } else {
            "application/octet-stream"
        };
        let digest_req = match matching {
            None => None,
            Some(true) => Some(
                m.and_then(|m| m.latest())
                    .map_or("sha256:none".to_owned(), |x| x.digest.clone()),
            ),
            Some(false) => Some("sha256:wrong".to_owned()),
        };
        let want: Result<Option<MSnap>, Error> = (|| {
            let m = self.model.get(s)?;
            let tail = m.tail();
            if offset.bytes > tail.bytes {
                return Err(Error::OffsetBeyondTail { tail });
            }
            if offset.bytes < m.earliest.bytes {
                return Err(Error::OffsetGone {
                    earliest: m.earliest,
                });
            }
            if let Some(d) = &digest_req
                && m.latest().map(|l| &l.digest) != Some(d)
            {
                return Err(Error::SnapshotMatchFailed {
                    current: m.latest().map(|l| l.digest.clone()),
                });
            }
            if let Some(x) = m.snapshots.iter().find(|x| x.offset.bytes == offset.bytes) {
                return if x.blob == data && x.ct == ct {
                    Ok(Some(x.clone()))
                } else {
                    Err(Error::SnapshotConflict)
                };
            }
            if let Some(l) = m.latest()
                && l.offset.bytes > offset.bytes
            {
                return Err(Error::SnapshotStale { latest: l.offset });
            }
            if !m.is_boundary(offset.bytes) && offset.bytes != tail.bytes {
                return Err(Error::NotOnBoundary(offset));
            }
            Ok(None)
        })();
        let mut req = PublishSnapshot::new(offset, &data[..]).content_type(ct);
        req.if_digest.clone_from(&digest_req);
        let got = self
            .store()
            .publish_snapshot(&name(NAMES[s]), req)
            .map(|p| (p.snapshot, p.stream));
        compare("publish", &want, &got, |w, (info, _)| match w {
            Some(x) => x.digest == info.digest && x.offset == info.offset,
            None => info.content_type == ct && info.len == data.len() as u64,
        })?;
        if let (Ok(None), Ok((info, _))) = (&want, &got) {
            if !info.digest.starts_with("sha256:") || info.digest.len() != 7 + 64 {
                return Err(format!("malformed digest {}", info.digest));
            }
            let m = self.model.streams[s].as_mut().expect("exists");
            let canonical = m.offset_at(offset.bytes);
            if info.offset != canonical {
                return Err(format!("snapshot offset {} != {}", info.offset, canonical));
            }
            m.snapshots.push(MSnap {
                offset: canonical,
                ct: ct.to_owned(),
                blob: data,
                digest: info.digest.clone(),
            });
        }
        if let Ok((_, sinfo)) = &got {
            let want = self.model.info(s);
            if want.as_ref() != Some(&real_info(sinfo)) {
                return Err(format!(
                    "publish info: model {want:?}, store {:?}",
                    real_info(sinfo)
                ));
            }
        }
        Ok(())
    }

    fn read_snapshot(&mut self, s: usize, at: Option<PosSel>) -> Result<(), String> {
        let m = self.model.streams[s].as_ref();
        let offset = at.map(|p| m.map_or(Offset::ZERO, |m| m.pos(p)));
        let want: Result<(MSnap, Offset, bool), Error> = (|| {
            let m = self.model.get(s)?;
            let x = match offset {
                None => m.latest(),
                Some(o) => m.snapshots.iter().find(|x| x.offset.bytes == o.bytes),
            };
            let x = x.ok_or(Error::SnapshotNotFound)?;
            Ok((x.clone(), m.tail(), m.closed))
        })();
        let mut req = SnapshotRequest::latest();
        req.offset = offset;
        let got = self.store().snapshot(&name(NAMES[s]), &req);
        compare("snapshot", &want, &got, |(x, tail, closed), r| {
            x.offset == r.info.offset
                && x.digest == r.info.digest
                && x.ct == r.info.content_type
                && x.blob == r.data.as_ref()
                && *tail == r.tail
                && *closed == r.closed
        })
    }

    fn retention(&mut self, s: usize, at: PosSel) -> Result<(), String> {
        let offset = self.model.streams[s]
            .as_ref()
            .map_or(Offset::ZERO, |m| m.pos(at));
        let want: Result<(), Error> = (|| {
            let m = self.model.get(s)?;
            if !m.is_boundary(offset.bytes) {
                return Err(Error::NotOnBoundary(offset));
            }
            match m.latest() {
                Some(l) if l.offset.bytes >= offset.bytes => Ok(()),
                _ => Err(Error::RetentionBeyondSnapshot),
            }
        })();
        let got = self
            .store()
            .set_retention(&name(NAMES[s]), &RetentionRequest::to(offset));
        compare("retention", &want, &got, |(), _| true)?;
        if want.is_ok() {
            let m = self.model.streams[s].as_mut().expect("exists");
            let canonical = m.offset_at(offset.bytes);
            if canonical.bytes > m.earliest.bytes {
                m.earliest = canonical;
                let latest = m.latest().map(|l| l.offset);
                m.snapshots
                    .retain(|x| x.offset >= canonical || Some(x.offset) == latest);
            }
        }
        if let Ok(info) = &got {
            let want = self.model.info(s);
            if want.as_ref() != Some(&real_info(info)) {
                return Err(format!(
                    "retention info: model {want:?}, store {:?}",
                    real_info(info)
                ));
            }
        }
        Ok(())
    }

    /// Every stream, read whole and in small chunks, its metadata, and the listing.
    fn verify_all(&mut self) -> Result<(), String> {
        for (s, &nm) in NAMES.iter().enumerate() {
            let n = name(nm);
            let want = self.model.get(s).map(|m| {
                (
                    m.data()[m.earliest.bytes as usize..].to_vec(),
                    self.model.info(s),
                )
            });
            for max in [None, Some(50)] {
                let got = crate::util::read_to_tail(self.store(), &n, max).map(|(d, _)| d);
                let json = self.model.streams[s].as_ref().is_some_and(|m| m.json);
                compare(
                    &format!("full read of {nm} (max {max:?})"),
                    &want,
                    &got,
                    |(d, _), r| {
                        if json {
                            let mut d = d.clone();
                            d.pop();
                            d == *r
                        } else {
                            d == r
                        }
                    },
                )?;
            }
            let got = self.store().head(&n, &Guard::NONE);
            compare(&format!("head of {nm}"), &want, &got, |(_, i), r| {
                i.as_ref() == Some(&real_info(r))
            })?;
        }
        let listed: Vec<String> = self
            .store()
            .list("m/")
            .map_err(|e| e.to_string())?
            .iter()
            .map(|n| n.as_str().to_owned())
            .collect();
        let expected: Vec<String> = (0..NAMES.len())
            .filter(|&s| self.model.get(s).is_ok())
            .map(|s| NAMES[s].to_owned())
            .collect();
        if listed != expected {
            return Err(format!("list: model {expected:?}, store {listed:?}"));
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), String> {
    let mut h = Harness::new()?;
    for (i, op) in ops.iter().enumerate() {
        h.log.push(format!("#{i} {op:?}"));
        let r = h
            .run(op)
            .and_then(|()| if i % 8 == 7 { h.verify_all() } else { Ok(()) });
        if let Err(e) = r {
            let tail: Vec<&String> = h.log.iter().rev().take(12).rev().collect();
            return Err(format!(
                "op #{i} {op:?}: {e}\nrecent:\n{}",
                tail.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
    }
    h.verify_all()?;
    if let Some(store) = h.store.take() {
        store
            .shutdown()
            .map_err(|e| format!("final shutdown: {e}"))?;
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops).map_err(TestCaseError::fail)?;
    }
}
