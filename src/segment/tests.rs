//! The segment set's unit tests: appends, rolls, reopens, flushes, damage, placed bodies and
//! cold blocks.

use super::*;
use crate::name::Offset;
use crate::state::Body;
use set::WRITE_BUFFERS;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

thread_local! {
    /// Set by a test: opening a resting segment's log fails as if the process had no
    /// descriptor free (`EMFILE`).
    pub(super) static NO_DESCRIPTORS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Opens the segments in `dir` from the start (no retention) to `end`.
fn open_whole(
    dir: &std::path::Path,
    end: Offset,
    segment_bytes: u64,
    replaying: bool,
) -> Result<SegmentSet> {
    SegmentSet::open(
        dir,
        Offset::ZERO,
        Offset::ZERO,
        end,
        segment_bytes,
        &[],
        replaying,
    )
}

fn body(msgs: &[&[u8]]) -> Body {
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for m in msgs {
        data.extend_from_slice(m);
        ends.push(data.len() as u32);
    }
    Body::new(data.into(), ends)
}

#[test]
#[cfg(feature = "tier")]
fn cold_segments_read_as_whole_message_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 3 << 20).unwrap();
    let mut expect = Vec::new();
    // 300-byte messages: a 1 MiB block boundary falls inside one.
    for i in 0..12_000u32 {
        let m = format!("{i:0300}");
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    set.flush().unwrap();
    assert!(set.segs.len() > 1);
    let first_len = set.segs[1].base.bytes;
    assert!(set.make_cold(0));
    assert!(
        !set.make_cold(set.segs[1].base.bytes),
        "the open segment never goes cold"
    );
    let pieces = set.read(10, first_len + 10).unwrap().unwrap();
    let mut got = Vec::new();
    let mut blocks = Vec::new();
    for p in pieces {
        match p {
            Piece::Local(b) => got.extend_from_slice(&b),
            Piece::Cold(c) => {
                assert_eq!(c.seg_base, 0);
                assert!(c.block.0 <= c.want.0 && c.want.1 <= c.block.1);
                assert!(set.is_boundary(c.block.0) && set.is_boundary(c.block.1));
                let block = &expect[c.block.0 as usize..c.block.1 as usize];
                set.check_block(0, c.block, block).unwrap();
                let mut bad = block.to_vec();
                bad[5] ^= 1;
                assert!(matches!(
                    set.check_block(0, c.block, &bad),
                    Err(crate::Error::Corrupt { .. })
                ));
                got.extend_from_slice(&expect[c.want.0 as usize..c.want.1 as usize]);
                blocks.push(c.block);
            }
        }
    }
    assert_eq!(got, &expect[10..(first_len + 10) as usize]);
    assert!(blocks.len() >= 3, "{blocks:?}");
    assert!(blocks.windows(2).all(|w| w[0].1 == w[1].0));
    assert!(!set.verified(0, 10));
}

#[test]
fn append_read_roll_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 4096).unwrap();
    let mut expect = Vec::new();
    for i in 0..200u32 {
        let m = format!("message-{i:05}-").repeat(3);
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    assert!(set.segs.len() > 1, "rolled");
    let end = set.end();
    assert_eq!(end, Offset::new(200, expect.len() as u64));
    let got: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, expect);
    let m = 42u64; // each message is "message-NNNNN-" three times
    assert!(set.is_boundary(m * 2));
    assert!(!set.is_boundary(m * 2 + 1));
    assert_eq!(set.offset_at(m * 5), Offset::new(5, m * 5));
    assert_eq!(set.offset_at(m * 5 + 3), Offset::new(5, m * 5 + 3));
    assert_eq!(set.boundary_for_read(0, 100), 84);
    assert_eq!(set.boundary_for_read(0, 10), 42);
    assert_eq!(
        set.message_ranges(42, 168),
        vec![(42, 84), (84, 126), (126, 168)]
    );
    let late = 150 * m;
    assert!(set.is_boundary(late));
    assert_eq!(set.offset_at(late + 1), Offset::new(150, late + 1));
    assert_eq!(set.next_boundary_after(late + 1), Some(late + m));
    drop(set);
    let mut set = open_whole(dir.path(), end, 4096, false).unwrap();
    let got: Vec<u8> = set.read_local(100, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, &expect[100..]);
    // Reopening at an earlier end (a checkpoint before a crash) drops later segments.
    let early = Offset::new(10, 420);
    drop(set);
    let set = open_whole(dir.path(), early, 4096, false).unwrap();
    assert_eq!(set.end(), early);
    assert_eq!(set.segs.len(), 1);
}

/// Bodies whose size does not divide `FLUSH_AT` never make the write buffer grow past
/// a flush's worth (what is buffered is written first instead of copied into a larger
/// buffer), and every byte still reads back, flushed or not.
#[test]
fn the_write_buffer_never_grows_past_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    let mut expect = Vec::new();
    for (i, size) in [
        1usize, 4096, 4096, 4096, 4096, 5000, 300, 9000, 4095, 16_383,
    ]
    .into_iter()
    .cycle()
    .take(60)
    .enumerate()
    {
        let m: Vec<u8> = (0..size).map(|j| (i + j) as u8).collect();
        set.append(set.end(), &body(&[&m])).unwrap();
        expect.extend_from_slice(&m);
        let s = set.segs.last().unwrap();
        assert!(
            s.unwritten.capacity() <= FLUSH_AT + size,
            "capacity {} after a {size} B body",
            s.unwritten.capacity()
        );
        assert!(s.unwritten.len() < FLUSH_AT, "a full buffer is written");
    }
    let end = set.end().bytes;
    let got: Vec<u8> = set.read_local(0, end).unwrap().unwrap().concat();
    assert_eq!(got, expect);
    drop(set);
    let set = open_whole(dir.path(), Offset::new(60, end), 1 << 20, false);
    let got: Vec<u8> = set.unwrap().read_local(0, end).unwrap().unwrap().concat();
    assert_eq!(got, expect, "dropping the set wrote what was buffered");
}

/// Index entries wait with the buffered bytes and reach the index file at a flush (the map
/// is read-only), not at a read; boundaries read the same before and after, a body of many
/// small messages is flushed once its entries fill a buffer, and a reopened set finds every
/// entry.
#[test]
fn index_entries_are_written_at_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    set.append(set.end(), &body(&[b"ab", b"cde"])).unwrap();
    set.append(set.end(), &body(&[b"f"])).unwrap();
    let s = set.segs.last().unwrap();
    assert_eq!(
        (s.idx_written, s.idx_pending.len()),
        (0, 3 * ENTRY as usize)
    );
    let idx = std::fs::read(idx_path(dir.path(), 0)).unwrap();
    assert!(
        idx[IDX_HEADER as usize..].iter().all(|&b| b == 0),
        "nothing written yet"
    );
    let ends = |set: &SegmentSet| (1..=6).filter(|&p| set.is_boundary(p)).collect::<Vec<_>>();
    assert_eq!(ends(&set), [2, 5, 6]);
    // A read writes the bytes it serves, not their entries.
    let got: Vec<u8> = set.read_local(0, 6).unwrap().unwrap().concat();
    assert_eq!(got, b"abcdef");
    let s = set.segs.last().unwrap();
    assert!(s.unwritten.is_empty() && s.idx_pending.len() == 3 * ENTRY as usize);
    set.flush().unwrap();
    let s = set.segs.last().unwrap();
    assert_eq!((s.idx_written, s.idx_pending.len()), (3, 0));
    assert_eq!(ends(&set), [2, 5, 6]);
    let idx = std::fs::read(idx_path(dir.path(), 0)).unwrap();
    let at = IDX_HEADER as usize + 2 * ENTRY as usize;
    assert_eq!(
        idx[at..at + 8],
        6u64.to_le_bytes(),
        "the third entry ends at 6"
    );
    // 4096 one-byte messages: 64 KiB of entries for 4 KiB of data.
    let many: Vec<&[u8]> = vec![b"x"; 4096];
    set.append(set.end(), &body(&many)).unwrap();
    let s = set.segs.last().unwrap();
    assert!(
        s.idx_pending.is_empty() && s.idx_written == s.count,
        "flushed by its entries"
    );
    let end = set.end();
    drop(set);
    let mut set = open_whole(dir.path(), end, 1 << 20, false).unwrap();
    assert_eq!(set.end(), Offset::new(4099, 4102));
    assert!(set.is_boundary(4101) && set.is_boundary(5));
    let got: Vec<u8> = set.read_local(0, 6).unwrap().unwrap().concat();
    assert_eq!(got, b"abcdef");
}

#[test]
fn a_damaged_last_message_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    set.append(Offset::ZERO, &body(&[b"hello", b"world"]))
        .unwrap();
    let end = set.end();
    drop(set);
    let log = log_path(dir.path(), 0);
    let f = OpenOptions::new().write(true).open(&log).unwrap();
    f.write_all_at(b"W", 5).unwrap();
    assert!(matches!(
        open_whole(dir.path(), end, 1 << 20, false),
        Err(Error::Corrupt { .. })
    ));
}

/// Replay adopts a placed body where the writer put it, across a roll the writer made
/// (whatever segment size this open has), and adopts nothing whose bytes are missing or
/// differ; once replay is over, the logs past the last segment go.
#[test]
fn replay_adopts_placed_bytes_where_the_writer_put_them() {
    use crate::engine::journal::Placed;
    let dir = tempfile::tempdir().unwrap();
    let a = body(&[&[1u8; 3000]]);
    let b = body(&[&[2u8; 1000], &[3u8; 2500]]);
    let c = body(&[&[4u8; 5000]]);
    let placed = |x: &Body| Placed {
        len: x.data.len() as u32,
        crc: crc32fast::hash(&x.data),
    };
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 4096).unwrap();
    set.append(Offset::ZERO, &a).unwrap();
    set.flush().unwrap();
    let after_a = set.end();
    set.append_placed(after_a, &b).unwrap();
    set.write_placed().unwrap();
    let after_b = set.end();
    // The first segment holds 6500 bytes now: `c` rolls to a second one.
    set.append_placed(after_b, &c).unwrap();
    set.write_placed().unwrap();
    let end = set.end();
    assert_eq!(set.segs.len(), 2);
    drop(set);
    let mut all = a.data.to_vec();
    all.extend_from_slice(&b.data);
    all.extend_from_slice(&c.data);
    for size in [4096, 1 << 20] {
        let mut set = open_whole(dir.path(), after_a, size, true).unwrap();
        let got = set.adopt(after_a, &b.ends, placed(&b)).unwrap();
        assert_eq!(got.map(|g| g.data), Some(b.data.clone()), "size {size}");
        let got = set.adopt(after_b, &c.ends, placed(&c)).unwrap();
        assert_eq!(got.map(|g| g.data), Some(c.data.clone()), "size {size}");
        assert_eq!((set.end(), set.segs.len()), (end, 2), "size {size}");
        let read: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
        assert_eq!(read, all, "size {size}");
        assert_eq!(set.message_ranges(0, end.bytes).len(), 4);
    }
    // Bytes that fail the CRC, or lie past the log's end, are not adopted.
    let mut set = open_whole(dir.path(), after_a, 4096, true).unwrap();
    let wrong = Placed {
        crc: placed(&b).crc ^ 1,
        ..placed(&b)
    };
    assert!(set.adopt(after_a, &b.ends, wrong).unwrap().is_none());
    assert_eq!(set.end(), after_a);
    let past = Placed {
        len: 1 << 20,
        crc: 0,
    };
    assert!(set.adopt(after_a, &[1 << 20], past).unwrap().is_none());
    // Replay ended before the roll: its log goes with the end of replay.
    let rolled = log_path(dir.path(), after_b.bytes);
    assert!(rolled.exists());
    set.end_replay().unwrap();
    assert!(!rolled.exists());
    assert!(!idx_path(dir.path(), after_b.bytes).exists());
}

/// Placed bodies are held, not copied, and written after the bytes copied before them, in
/// order, whether a read, a copied body, a flush or `write_placed` writes them.
#[test]
fn held_placed_bodies_reach_the_log_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    let mut all = Vec::new();
    let mut at = Offset::ZERO;
    for k in 0..40u32 {
        let len = if k % 3 == 0 { 100 } else { 2500 + k as usize };
        let b = body(&[&vec![(k % 251) as u8; len]]);
        if k % 3 == 0 {
            set.append(at, &b).unwrap();
        } else {
            set.append_placed(at, &b).unwrap();
        }
        all.extend_from_slice(&b.data);
        at = set.end();
        if k % 7 == 6 {
            set.write_placed().unwrap();
        }
        if k % 11 == 10 {
            // A read of everything so far writes what is pending first.
            let read: Vec<u8> = set.read_local(0, at.bytes).unwrap().unwrap().concat();
            assert_eq!(read, all, "after body {k}");
        }
    }
    set.write_placed().unwrap();
    set.flush().unwrap();
    let log = std::fs::read(log_path(dir.path(), 0)).unwrap();
    assert_eq!(&log[..all.len()], &all[..]);
    drop(set);
    let mut set = open_whole(dir.path(), at, 1 << 20, false).unwrap();
    let read: Vec<u8> = set.read_local(0, at.bytes).unwrap().unwrap().concat();
    assert_eq!(read, all);
}

#[test]
fn room_made_for_a_batch_rolls_ahead_and_allocates_what_the_batch_writes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 8192).unwrap();
    let big = vec![7u8; 9000];
    set.append(set.end(), &body(&[&big])).unwrap();
    assert_eq!(set.segs.len(), 1);
    // The first segment is full: the room for the next batch is in a new one, made now.
    let mut room = crate::fs::Headroom::new(0);
    assert!(set.make_room(3 * 5000, 3, false, &mut room).unwrap());
    assert_eq!(set.segs.len(), 2, "rolled ahead");
    assert_eq!(
        set.segs[1].base,
        set.end(),
        "the new segment starts at the end"
    );
    let log = dir
        .path()
        .join(format!("{:020}.log", set.segs[1].base.bytes));
    let allocated = std::fs::metadata(&log).unwrap().blocks() * 512;
    assert!(
        allocated >= 3 * 5000,
        "the batch's bytes have blocks: {allocated}"
    );
    // The batch's appends all go there, past `segment_bytes`, without another roll.
    for _ in 0..3 {
        set.append(set.end(), &body(&[&[1u8; 5000]])).unwrap();
    }
    assert_eq!(set.segs.len(), 2);
    set.flush().unwrap();
    assert_eq!(
        std::fs::metadata(&log).unwrap().blocks() * 512,
        allocated,
        "writing the batch allocated nothing more"
    );
    // Past the room, appends roll as before.
    set.append(set.end(), &body(&[b"next"])).unwrap();
    assert_eq!(set.segs.len(), 3);
    let end = set.end();
    drop(set);
    let mut set = open_whole(dir.path(), end, 8192, false).unwrap();
    let got: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got.len() as u64, end.bytes);
    assert!(got.ends_with(b"next"));
}

/// A set put at rest closes every file and keeps everything answered from its indexes; the
/// next read or append reopens them, and what it then holds is what a reopen from disk finds.
/// The store's count follows the files, and a log cut short while at rest is `Corrupt` at
/// the wake instead of a short read.
#[test]
fn a_set_at_rest_closes_its_files_and_wakes_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let files = std::sync::Arc::new(SegmentUse::default());
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 4096).unwrap();
    set.count_in(&files);
    assert_eq!(
        files.get(),
        1,
        "one segment: its log (the index is only mapped)"
    );
    let mut expect = Vec::new();
    for i in 0..150u32 {
        let m = format!("rest-{i:05}-").repeat(4);
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    let segs = set.segs.len();
    assert!(segs >= 2, "rolled");
    assert_eq!(files.get(), segs);
    // Unflushed bytes and index entries are written by the rest, not lost.
    assert!(set.segs.last().unwrap().pending() > 0);
    assert!(set.rest().unwrap());
    assert_eq!((set.files_held(), files.get()), (0, 0));
    assert!(set.segs.iter().all(|s| s.log.is_none()));
    // What the indexes answer needs no file.
    let end = set.end();
    assert_eq!(end, Offset::new(150, expect.len() as u64));
    let m = 44u64; // "rest-NNNNN-" four times
    assert!(set.is_boundary(7 * m) && !set.is_boundary(7 * m + 1));
    assert_eq!(set.offset_at(9 * m), Offset::new(9, 9 * m));
    // A read wakes it.
    let got: Vec<u8> = set.read_local(m, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, &expect[m as usize..]);
    assert_eq!(files.get(), segs);
    // An append opens only the log it writes (the sealed ones stay closed), and rolls on as
    // before.
    assert!(set.rest().unwrap());
    for i in 150..300u32 {
        let m = format!("rest-{i:05}-").repeat(4);
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    assert!(set.segs.len() > segs);
    assert_eq!(files.get(), set.segs.len() - segs + 1);
    assert_eq!(set.files_held(), files.get());
    let end = set.end();
    assert!(set.rest().unwrap());
    drop(set);
    assert_eq!(files.get(), 0, "a dropped set leaves the count");
    let mut reopened = open_whole(dir.path(), end, 4096, false).unwrap();
    let got: Vec<u8> = reopened.read_local(0, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, expect);
    // A log cut short behind the store's back while the set rests.
    assert!(reopened.rest().unwrap());
    let last = reopened.segs.last().unwrap().base.bytes;
    let log = OpenOptions::new()
        .write(true)
        .open(dir.path().join(format!("{last:020}.log")))
        .unwrap();
    log.set_len(1).unwrap();
    assert!(matches!(
        reopened.read_local(0, end.bytes),
        Err(crate::Error::Corrupt { .. })
    ));
}

/// The descriptors of this process that name a file under `dir`.
fn fds_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
        .count()
}

/// An open segment holds one descriptor, its log's: the index is opened to write a batch of
/// entries or to grow, and closed again, whatever the process does meanwhile (a test thread
/// elsewhere may open files of its own, but none under this directory). Entries written that
/// way are what a reopen reads, and an index cut short behind the store's back is `Corrupt`
/// at the next write of entries, not a write past its end.
#[test]
fn an_open_segment_holds_only_its_log_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    assert_eq!(fds_under(dir.path()), 1, "a new segment");
    let mut expect = Vec::new();
    // Past the index's first length (1024 entries) and past a flush's worth of entries, so
    // the index both grows and is written while the set is open.
    for i in 0..3000u32 {
        let m = format!("m{i:05}");
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
        if i % 500 == 0 {
            assert_eq!(fds_under(dir.path()), 1, "after append {i}");
        }
    }
    set.flush().unwrap();
    assert_eq!(set.segs.len(), 1);
    assert_eq!(fds_under(dir.path()), 1, "after a flush");
    let end = set.end();
    drop(set);
    assert_eq!(fds_under(dir.path()), 0);
    let mut reopened = open_whole(dir.path(), end, 1 << 20, false).unwrap();
    assert_eq!(fds_under(dir.path()), 1, "a reopened segment");
    let got: Vec<u8> = reopened.read_local(0, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, expect);
    assert_eq!(reopened.offset_at(6 * 2999), Offset::new(2999, 6 * 2999));
    // The index cut short: the next entries written find it shorter than its map.
    OpenOptions::new()
        .write(true)
        .open(dir.path().join(format!("{:020}.idx", 0)))
        .unwrap()
        .set_len(64)
        .unwrap();
    reopened.append(reopened.end(), &body(&[b"after"])).unwrap();
    assert!(matches!(
        reopened.flush(),
        Err(crate::Error::Corrupt { .. })
    ));
}

/// The store's write buffers are bounded together: a set's buffers grow only within its share
/// of [`WRITE_BUFFERS`] and what the budget has left. With no room left, an append to an empty
/// buffer is written to the log at once (its entries kept in at most `IDX_FLOOR`); a full
/// buffer that may not grow is written and keeps its room, so the appends after it buffer
/// again; a set past its share (more sets took buffers) gives its room back when full. The
/// counts follow each set's buffers and leave with the set.
#[test]
fn write_buffers_past_the_store_budget_write_through() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let shared = std::sync::Arc::new(SegmentUse::default());
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    set.count_in(&shared);
    let log = || std::fs::read(dir.path().join(format!("{:020}.log", 0))).unwrap();
    let mut expect = Vec::new();
    let add = |set: &mut SegmentSet, expect: &mut Vec<u8>, i: u32| {
        let m = format!("buffered-{i:04}|").repeat(8);
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    };
    let cap = |set: &SegmentSet| {
        let s = set.segs.last().unwrap();
        (s.unwritten.capacity(), s.idx_pending.capacity())
    };
    for i in 0..10 {
        add(&mut set, &mut expect, i);
    }
    let own = shared.buffered();
    assert!(own >= 10 * 120, "buffered bytes are counted: {own}");
    assert_eq!(shared.buffering.load(Ordering::Relaxed), 1);
    assert!(
        log()[..expect.len()].iter().all(|&b| b == 0),
        "nothing written yet"
    );
    // The rest of the store takes the whole budget.
    shared.buffered.fetch_add(WRITE_BUFFERS, Ordering::Relaxed);
    set.flush().unwrap();
    assert_eq!(
        shared.buffered(),
        WRITE_BUFFERS,
        "a flush gives the buffers back"
    );
    assert_eq!(shared.buffering.load(Ordering::Relaxed), 0);
    for i in 10..50 {
        add(&mut set, &mut expect, i);
        assert_eq!(cap(&set).0, 0, "append {i} was buffered");
        assert!(
            cap(&set).1 <= IDX_FLOOR,
            "the entries' buffer grew past its floor"
        );
        assert_eq!(
            &log()[..expect.len()],
            &expect[..],
            "append {i} is in the log"
        );
    }
    // Room again: appends buffer.
    shared.buffered.fetch_sub(WRITE_BUFFERS, Ordering::Relaxed);
    add(&mut set, &mut expect, 50);
    let room = cap(&set).0;
    assert!(room > 0);
    // Past the budget again with bytes buffered: the buffer takes what fits its room and does
    // not grow; once full, its bytes are written (with the body that did not fit, or before
    // it) and it keeps its room for the appends after.
    shared.buffered.fetch_add(WRITE_BUFFERS, Ordering::Relaxed);
    let mut i = 51;
    let mut written = 0;
    while written < 3 {
        let before = set.segs.last().unwrap().unwritten.len();
        add(&mut set, &mut expect, i);
        i += 1;
        let s = set.segs.last().unwrap();
        assert_eq!(s.unwritten.capacity(), room, "the buffer grew or went back");
        if s.unwritten.len() < before {
            written += 1;
            let on_disk = expect.len() - s.unwritten.len();
            assert_eq!(
                &log()[..on_disk],
                &expect[..on_disk],
                "the full buffer was written"
            );
        }
        assert!(i < 500, "the buffer never filled");
    }
    shared.buffered.fetch_sub(WRITE_BUFFERS, Ordering::Relaxed);
    // Many more sets holding buffers: this one's share is under what it holds, and when its
    // buffer is full it gives the room back.
    shared.buffering.fetch_add(1 << 20, Ordering::Relaxed);
    while cap(&set).0 == room {
        add(&mut set, &mut expect, i);
        i += 1;
        assert!(i < 1000, "the buffer was never given back");
    }
    let share = WRITE_BUFFERS / ((1 << 20) + 1);
    let (data, idx) = cap(&set);
    assert!(
        data + idx <= share.max(IDX_FLOOR),
        "past its share: {data} + {idx} bytes"
    );
    shared.buffering.fetch_sub(1 << 20, Ordering::Relaxed);
    let end = set.end();
    let got: Vec<u8> = set.read_local(0, end.bytes).unwrap().unwrap().concat();
    assert_eq!(got, expect);
    drop(set);
    assert_eq!(shared.buffered(), 0, "a dropped set leaves the count");
    assert_eq!(shared.buffering.load(Ordering::Relaxed), 0);
}

/// A set resumed from its record, with no descriptor free: a batch that would write its log is
/// refused when its room is made (before its journal record), and appends already past that
/// point whose buffers pass their share are buffered instead of failing; with descriptors
/// back, everything reads back in order.
#[test]
fn a_resting_set_without_descriptors_buffers_rather_than_fails() {
    let dir = tempfile::tempdir().unwrap();
    let files = std::sync::Arc::new(SegmentUse::default());
    let mut set = SegmentSet::create(dir.path(), Offset::ZERO, 1 << 20).unwrap();
    set.count_in(&files);
    let mut room = crate::fs::Headroom::new(0);
    set.make_room(1000, 40, false, &mut room).unwrap();
    let mut expect = Vec::new();
    for i in 0..20u32 {
        let m = format!("msg-{i:04};");
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    set.flush().unwrap();
    let record = set.record().expect("nothing buffered");
    let end = set.end();
    drop(set);
    let mut set = SegmentSet::resume(dir.path(), &record, end, 1 << 20).unwrap();
    set.count_in(&files);
    assert_eq!(set.files_held(), 0, "resumed: nothing open");
    NO_DESCRIPTORS.set(true);
    // A small batch within the room set aside stays in the buffers: it opens nothing.
    assert!(set.make_room(12, 1, false, &mut room).is_ok());
    // One that writes (placed, or a large body) is refused before its journal record.
    for (bytes, placed) in [(12, true), (WRITE_THROUGH as u64, false)] {
        assert!(matches!(
            set.make_room(bytes, 1, placed, &mut room),
            Err(Error::TooManyOpenFiles)
        ));
    }
    // A batch judged to stay in the buffers, applied after the share shrank (other streams
    // took buffers meanwhile): what the share would have written is buffered, not failed.
    set.make_room(50 * 12, 50, false, &mut room).unwrap();
    files
        .buffering
        .fetch_add(100_000, std::sync::atomic::Ordering::Relaxed);
    for i in 0..50u32 {
        let m = format!("more-{i:05};");
        set.append(set.end(), &body(&[m.as_bytes()])).unwrap();
        expect.extend_from_slice(m.as_bytes());
    }
    files
        .buffering
        .fetch_sub(100_000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(set.files_held(), 0);
    NO_DESCRIPTORS.set(false);
    let got: Vec<u8> = set
        .read_local(0, set.end().bytes)
        .unwrap()
        .unwrap()
        .concat();
    assert_eq!(got, expect);
    assert_eq!(set.end().messages, 70);
}
