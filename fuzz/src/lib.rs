//! The logic of brook's fuzz targets, shared by the cargo-fuzz binaries in `fuzz_targets/` and by
//! the integration test that runs each target on a few thousand random inputs
//! (`tests/it/fuzz_logic.rs`). Every function panics when an invariant breaks; that is what a
//! fuzzer reports.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use brook::{
    AppendRequest, AppendStatus, CreateOptions, Durability, Error, Guard, Offset, Options,
    Producer, ReadFrom, ReadRequest, Store, StreamName,
};

/// The journal record decoder never panics, and what it accepts re-encodes to a fixed point.
pub fn journal_record(data: &[u8]) {
    if let Some(p1) = brook::fuzzing::journal_record(data) {
        let p2 = brook::fuzzing::journal_record(&p1).expect("a re-encoded record decodes");
        assert_eq!(p1, p2, "re-encoding a decoded record is not a fixed point");
    }
}

/// The sidecar decoder never panics, and what it accepts re-encodes to a fixed point.
pub fn sidecar(data: &[u8]) {
    if let Some(i1) = brook::fuzzing::sidecar(data) {
        let i2 = brook::fuzzing::sidecar(&i1).expect("a re-encoded sidecar decodes");
        assert_eq!(i1, i2, "re-encoding a decoded sidecar is not a fixed point");
    }
}

/// Recovery's scan of a journal file never panics and never reports more than the file holds.
/// With the first byte odd, the input is framed as a valid header and CRC-correct frames around
/// arbitrary payloads, so the record decoder is reached; otherwise it is the raw file.
pub fn journal_scan(data: &[u8]) {
    let (file, frames) = match data.split_first() {
        Some((&b, rest)) if b & 1 == 1 => {
            let mut f = brook::fuzzing::journal_header(0, 4096);
            let mut frames = 0;
            // Payloads are the rest, cut at 0xff bytes; the last frame may be cut short.
            for payload in rest.split(|&x| x == 0xff) {
                f.extend_from_slice(&brook::fuzzing::journal_frame(payload));
                frames += 1;
            }
            if b & 2 == 2 {
                let cut = f.len() - (b as usize >> 2) % f.len().clamp(1, 32);
                f.truncate(cut);
            }
            (f, frames)
        }
        _ => (data.to_vec(), usize::MAX),
    };
    let mut tmp = tempfile::Builder::new()
        .suffix(".wal")
        .tempfile()
        .expect("temporary file");
    tmp.write_all(&file).expect("write");
    tmp.flush().expect("flush");
    if let Ok((records, end_lsn, _torn)) = brook::fuzzing::journal_scan(tmp.path(), 0) {
        assert!(records <= frames, "{records} records from {frames} frames");
        if frames != usize::MAX {
            assert!(
                end_lsn >= 4096 && end_lsn - 4096 <= file.len() as u64,
                "end LSN {end_lsn} past the file"
            );
        }
    }
}

/// A byte source that yields zeros once the input is used up.
struct In<'a>(&'a [u8]);

impl In<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u8(&mut self) -> u8 {
        self.byte().unwrap_or(0)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
}

/// A stream as the model keeps it.
#[derive(Clone, Debug)]
struct M {
    json: bool,
    /// Messages in their stored form (JSON text followed by `,`, or the appended bytes).
    msgs: Vec<Vec<u8>>,
    closed: bool,
    seq: Option<String>,
    producers: HashMap<String, (u64, u64, Offset)>,
}

impl M {
    fn data(&self) -> Vec<u8> {
        self.msgs.concat()
    }
    fn offset_at(&self, pos: u64) -> Offset {
        let mut at = 0;
        let mut n = 0;
        for m in &self.msgs {
            at += m.len() as u64;
            if at > pos {
                break;
            }
            n += 1;
        }
        Offset::new(n, pos)
    }
    fn tail(&self) -> Offset {
        Offset::new(
            self.msgs.len() as u64,
            self.msgs.iter().map(|m| m.len() as u64).sum(),
        )
    }
    fn boundaries(&self) -> Vec<u64> {
        let mut b = vec![0];
        let mut at = 0;
        for m in &self.msgs {
            at += m.len() as u64;
            b.push(at);
        }
        b
    }
}

/// Runs operation sequences decoded from bytes against a store and a model.
pub struct Ops {
    dir: PathBuf,
    store: Option<Store>,
}

fn options() -> Options {
    Options::default()
        .with_durability(Durability::Buffered)
        .with_segment_bytes(4096)
        .with_checkpoint_bytes(64 << 10)
}

fn kind(e: &Error) -> std::mem::Discriminant<Error> {
    std::mem::discriminant(e)
}

impl Ops {
    /// Opens (creating) a store in `dir`.
    pub fn open(dir: &Path) -> brook::Result<Ops> {
        Ok(Ops {
            dir: dir.to_path_buf(),
            store: Some(Store::open(dir, options())?),
        })
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("the store is open")
    }

    /// Decodes `data` as operations on three streams named `{prefix}/0..3` (which must not
    /// exist yet) and checks every outcome against the model.
    pub fn run(&mut self, prefix: &str, data: &[u8]) {
        let mut input = In(data);
        let names: Vec<StreamName> = (0..3)
            .map(|i| StreamName::new(&format!("{prefix}/{i}")).expect("valid name"))
            .collect();
        let mut model: Vec<Option<M>> = vec![None; 3];
        let mut ops = 0;
        while let Some(op) = input.byte() {
            ops += 1;
            if ops > 300 {
                break;
            }
            let s = (input.u8() % 3) as usize;
            let n = &names[s];
            match op {
                255 => {
                    let store = self.store.take().expect("open");
                    drop(store);
                    self.store = Some(Store::open(&self.dir, options()).expect("reopen"));
                    for (i, m) in model.iter().enumerate() {
                        check_all(self.store(), &names[i], m.as_ref());
                    }
                    continue;
                }
                254 => {
                    self.store().checkpoint().expect("checkpoint");
                    continue;
                }
                _ => {}
            }
            match op % 7 {
                0 => {
                    let b = input.u8();
                    let (json, closed) = (b & 1 == 1, b & 2 == 2);
                    let ct = if json {
                        "application/json"
                    } else {
                        "application/octet-stream"
                    };
                    let mut req = CreateOptions::with_content_type(ct);
                    req.closed = closed;
                    let r = self.store().create(n, req);
                    match (&model[s], r) {
                        (None, Ok(c)) => {
                            assert!(
                                c.created && c.info.tail == Offset::ZERO && c.info.closed == closed,
                                "{c:?}"
                            );
                            model[s] = Some(M {
                                json,
                                msgs: Vec::new(),
                                closed,
                                seq: None,
                                producers: HashMap::new(),
                            });
                        }
                        (Some(m), Ok(c)) => assert!(
                            !c.created && m.json == json && m.closed == closed,
                            "{c:?} for {m:?}"
                        ),
                        (Some(m), Err(Error::ConfigMismatch(_))) => {
                            assert!(m.json != json || m.closed != closed);
                        }
                        (m, r) => panic!("create of {n} ({m:?}) answered {r:?}"),
                    }
                }
                1..=4 => {
                    let json = model[s].as_ref().is_some_and(|m| m.json);
                    // The body: JSON numbers (one, or an array of up to three), or raw bytes.
                    let (data, msgs): (Vec<u8>, Vec<Vec<u8>>) = if op % 7 == 4 {
                        (Vec::new(), Vec::new())
                    } else if json {
                        let k = 1 + input.u8() % 3;
                        let vals: Vec<String> = (0..k).map(|_| input.u8().to_string()).collect();
                        let text = if k == 1 {
                            vals[0].clone()
                        } else {
                            format!("[{}]", vals.join(","))
                        };
                        (
                            text.into_bytes(),
                            vals.into_iter()
                                .map(|v| format!("{v},").into_bytes())
                                .collect(),
                        )
                    } else {
                        let len = (input.u8() % 40) as usize;
                        let d = input.bytes(len);
                        let msgs = if d.is_empty() {
                            Vec::new()
                        } else {
                            vec![d.clone()]
                        };
                        (d, msgs)
                    };
                    let producer = (op % 7 == 2).then(|| {
                        let b = input.u8();
                        Producer {
                            id: format!("p{}", b & 1),
                            epoch: u64::from((b >> 1) % 3),
                            seq: u64::from((b >> 3) % 6),
                        }
                    });
                    let seq = (op % 7 == 3).then(|| format!("{:02}", input.u8() % 100));
                    let close = op % 7 == 4 || input.u8() % 16 == 0;
                    let mut req = AppendRequest::new(data.clone());
                    req.close = close;
                    req.stream_seq.clone_from(&seq);
                    req.producer.clone_from(&producer);
                    let r = self.store().append(n, req);
                    let Some(m) = model[s].as_mut() else {
                        assert!(
                            matches!(r, Err(Error::NotFound)),
                            "append to a missing stream answered {r:?}"
                        );
                        continue;
                    };
                    // The documented order: producer duplicate, closed, producer, Stream-Seq, body.
                    let want: Result<AppendStatus, Error> = (|| {
                        if let Some(p) = &producer
                            && let Some(&(e, q, t)) = m.producers.get(&p.id)
                            && p.epoch == e
                            && p.seq <= q
                        {
                            return Ok(AppendStatus::Duplicate {
                                original_tail: (p.seq == q).then_some(t),
                            });
                        }
                        if m.closed {
                            return if data.is_empty() && close {
                                Ok(AppendStatus::AlreadyClosed)
                            } else {
                                Err(Error::StreamClosed { tail: m.tail() })
                            };
                        }
                        if let Some(p) = &producer {
                            match m.producers.get(&p.id) {
                                None if p.seq != 0 => {
                                    return Err(Error::ProducerSeqGap {
                                        expected: 0,
                                        received: p.seq,
                                    });
                                }
                                Some(&(e, _, _)) if p.epoch < e => {
                                    return Err(Error::ProducerEpochStale { current: e });
                                }
                                Some(&(e, _, _)) if p.epoch > e && p.seq != 0 => {
                                    return Err(Error::ProducerEpochSeqNotZero);
                                }
                                Some(&(e, q, _)) if p.epoch == e && p.seq != q + 1 => {
                                    return Err(Error::ProducerSeqGap {
                                        expected: q + 1,
                                        received: p.seq,
                                    });
                                }
                                _ => {}
                            }
                        }
                        if let (Some(new), Some(last)) = (&seq, &m.seq)
                            && new <= last
                        {
                            return Err(Error::StreamSeqConflict {
                                tail: m.tail(),
                                last_seq: last.clone(),
                            });
                        }
                        if data.is_empty() && !close {
                            return Err(Error::EmptyAppend);
                        }
                        Ok(AppendStatus::Appended)
                    })();
                    match (&want, &r) {
                        (Ok(AppendStatus::Appended), Ok(o)) => {
                            m.msgs.extend(msgs);
                            m.closed |= close;
                            if seq.is_some() {
                                m.seq.clone_from(&seq);
                            }
                            if let Some(p) = &producer {
                                m.producers.insert(p.id.clone(), (p.epoch, p.seq, m.tail()));
                            }
                            assert!(
                                o.status == AppendStatus::Appended
                                    && o.tail == m.tail()
                                    && o.closed == m.closed,
                                "{o:?}"
                            );
                        }
                        (Ok(w), Ok(o)) => {
                            assert!(*w == o.status && o.tail == m.tail(), "{w:?} but {o:?}");
                        }
                        (Err(w), Err(e)) => assert!(kind(w) == kind(e), "{w:?} but {e:?}"),
                        _ => panic!("append to {n}: model {want:?}, store {r:?}"),
                    }
                }
                5 => {
                    let (k, maxb) = (input.u8(), input.u8());
                    let m = model[s].as_ref();
                    let from = m.map_or(Offset::ZERO, |m| {
                        let b = m.boundaries();
                        m.offset_at(b[k as usize % b.len()])
                    });
                    let max_bytes = (maxb != 0).then_some(u64::from(maxb) * 3);
                    let mut req = ReadRequest::from(ReadFrom::At(from));
                    req.max_bytes = max_bytes;
                    let r = self.store().read(n, &req);
                    let Some(m) = m else {
                        assert!(
                            matches!(r, Err(Error::NotFound)),
                            "read of a missing stream answered {r:?}"
                        );
                        continue;
                    };
                    let c = r.unwrap_or_else(|e| panic!("read of {n} at {from}: {e}"));
                    let data = m.data();
                    let tail = m.tail();
                    let mut to =
                        max_bytes.map_or(tail.bytes, |x| tail.bytes.min(from.bytes + x.max(1)));
                    if m.json && to < tail.bytes {
                        let b = m.boundaries();
                        to = b
                            .iter()
                            .copied()
                            .filter(|&x| x > from.bytes && x <= to)
                            .max()
                            .unwrap_or_else(|| {
                                b.iter()
                                    .copied()
                                    .find(|&x| x > from.bytes)
                                    .unwrap_or(tail.bytes)
                            });
                    }
                    let slice = &data[from.bytes as usize..to as usize];
                    let body = if m.json {
                        [b"[", slice.strip_suffix(b",").unwrap_or(slice), b"]"].concat()
                    } else {
                        slice.to_vec()
                    };
                    assert_eq!(
                        c.to_vec(),
                        body,
                        "read of {n} at {from} (max {max_bytes:?})"
                    );
                    assert_eq!(c.up_to_date, to == tail.bytes);
                    assert_eq!(
                        c.next,
                        if to == tail.bytes {
                            tail
                        } else {
                            m.offset_at(to)
                        }
                    );
                    assert_eq!(c.closed, c.up_to_date && m.closed);
                }
                _ => {
                    let r = self.store().delete(n, &Guard::NONE);
                    match (&model[s], r) {
                        (Some(_), Ok(())) => model[s] = None,
                        (None, Err(Error::NotFound)) => {}
                        (m, r) => panic!("delete of {n} ({m:?}) answered {r:?}"),
                    }
                }
            }
        }
        for (i, m) in model.iter().enumerate() {
            check_all(self.store(), &names[i], m.as_ref());
        }
    }
}

/// A whole stream reads back exactly as the model holds it.
fn check_all(store: &Store, n: &StreamName, m: Option<&M>) {
    let r = store.read(n, &ReadRequest::from(ReadFrom::Start));
    match m {
        None => assert!(
            matches!(r, Err(Error::NotFound)),
            "{n} should not exist: {r:?}"
        ),
        Some(m) => {
            let c = r.unwrap_or_else(|e| panic!("read of {n}: {e}"));
            let data = m.data();
            let body = if m.json {
                [b"[", data.strip_suffix(b",").unwrap_or(&data), b"]"].concat()
            } else {
                data
            };
            assert_eq!(c.to_vec(), body, "{n}");
            assert_eq!(c.next, m.tail(), "{n}");
            assert_eq!(c.closed, m.closed, "{n}");
            let h = store
                .head(n, &Guard::NONE)
                .unwrap_or_else(|e| panic!("head of {n}: {e}"));
            assert_eq!(h.stream_seq, m.seq, "{n}");
        }
    }
}
