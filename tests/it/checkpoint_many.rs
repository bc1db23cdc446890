//! Checkpoints of many dirty streams at once: a writer in a child process (this test binary,
//! re-executed) appends one producer append to each of many streams, checkpoints, and again,
//! and is killed with SIGKILL at random moments, so kills land inside checkpoints that write
//! hundreds of sidecars. The parent reopens the store each time and checks every stream: each
//! acknowledged append is there, in order, with nothing in between that was never attempted,
//! and a retry of the producer's last acknowledged append is answered as a duplicate.
//!
//! Replay a run with `BROOK_TEST_SEED`.

use std::io::Write;
use std::time::{Duration, Instant};

use brook::*;

use crate::util::{R, Rng, name, read_to_tail, run_then_kill, typed};

const DIR: &str = "BROOK_CKPT_MANY_DIR";
const ROUND: &str = "BROOK_CKPT_MANY_ROUND";
const NEXT: &str = "BROOK_CKPT_MANY_NEXT";
const STREAMS: usize = 300;

fn options() -> Options {
    // Buffered, so a kill leaves the journal unsynced and the checkpoint is what makes state
    // durable; checkpoints only when the writer asks, so every one covers every stream.
    Options::default()
        .with_journal_shards(2)
        .with_durability(Durability::Buffered)
        .with_max_open_streams(4 * STREAMS)
        .with_checkpoint_bytes(1 << 30)
}

fn stream(t: usize) -> StreamName {
    name(&format!("many/{t:04}"))
}

fn message(t: usize, k: u64) -> String {
    format!("t{t}k{k:08};")
}

/// The append `k` of stream `t`, the producer's `seq` of epoch `round`.
fn request(t: usize, k: u64, round: u64, seq: u64) -> AppendRequest {
    AppendRequest::new(message(t, k)).producer(Producer::new("p", round, seq))
}

/// The writer, run only in a child process started by `kill_during_checkpoints_of_many_streams`.
#[test]
fn checkpoint_many_child() -> R {
    let Ok(dir) = std::env::var(DIR) else {
        return Ok(());
    };
    let round: u64 = std::env::var(ROUND)?.parse()?;
    let next: Vec<u64> = std::env::var(NEXT)?
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let store = Store::open(&dir, options())?;
    let mut out = std::io::stdout();
    writeln!(out, "READY")?;
    out.flush()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for sweep in 0u64.. {
        if Instant::now() > deadline {
            break;
        }
        let pending = (0..STREAMS)
            .map(|t| store.submit_append(&stream(t), request(t, next[t] + sweep, round, sweep)))
            .collect::<Result<Vec<_>>>()?;
        let mut acks = Vec::new();
        for (t, p) in pending.into_iter().enumerate() {
            let o = p.wait()?;
            if o.status != AppendStatus::Appended {
                return Err(format!("stream {t}: {o:?}").into());
            }
            writeln!(acks, "ACK {t} {}", next[t] + sweep)?;
        }
        out.write_all(&acks)?;
        out.flush()?;
        store.checkpoint()?;
    }
    Ok(())
}

#[test]
fn kill_during_checkpoints_of_many_streams() -> R {
    let mut rng = Rng::from_env("kill_during_checkpoints_of_many_streams");
    let dir = tempfile::tempdir()?;
    {
        let store = Store::open(dir.path(), options())?;
        for t in 0..STREAMS {
            store.create(&stream(t), typed("text/plain"))?;
        }
    }
    let mut next = vec![0u64; STREAMS];
    let mut acked_total = 0;
    for round in 0..8u64 {
        let next_s: Vec<String> = next.iter().map(u64::to_string).collect();
        let lines = run_then_kill(
            "checkpoint_many::checkpoint_many_child",
            &[
                (DIR, dir.path().display().to_string()),
                (ROUND, round.to_string()),
                (NEXT, next_s.join(",")),
            ],
            Duration::from_millis(50 + rng.below(400)),
        )?;
        // The highest acknowledged k per stream this round.
        let mut acked: Vec<Option<u64>> = vec![None; STREAMS];
        for l in &lines {
            let mut w = l.split_whitespace();
            if w.next() == Some("ACK") {
                let t: usize = w.next().ok_or("ACK without stream")?.parse()?;
                let k: u64 = w.next().ok_or("ACK without k")?.parse()?;
                acked[t] = Some(k);
                acked_total += 1;
            }
        }
        let store = Store::open(dir.path(), options())?;
        for t in 0..STREAMS {
            let (data, _) = read_to_tail(&store, &stream(t), None)?;
            let expect: String = (0..)
                .map(|k| message(t, k))
                .scan(0, |len, m| {
                    *len += m.len();
                    (*len <= data.len()).then_some(m)
                })
                .collect();
            assert_eq!(
                std::str::from_utf8(&data)?,
                expect,
                "stream {t} after round {round}: not the messages 0.. in order"
            );
            let have = (data.len() / message(t, 0).len()) as u64;
            if let Some(k) = acked[t] {
                assert!(have > k, "stream {t} round {round}: acknowledged {k} lost");
                let retry = store.append(&stream(t), request(t, k, round, k - next[t]))?;
                assert!(
                    matches!(retry.status, AppendStatus::Duplicate { .. }),
                    "stream {t} round {round}: retry of acknowledged {k} gave {retry:?}"
                );
            }
            next[t] = have;
        }
    }
    assert!(acked_total > 0, "no append was acknowledged");
    eprintln!("kill_during_checkpoints_of_many_streams: {acked_total} acknowledged appends");
    Ok(())
}
