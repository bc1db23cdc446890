//! Buffers between requests. A connection takes its read buffer when bytes arrive and its
//! output buffer when it answers, and gives both back once a request is read and answered with
//! nothing more waiting, so an idle keep-alive connection, one waiting for its append's commit
//! and one streaming an SSE body hold none. Each worker thread keeps up to [`KEEP`] of each
//! given back for its next requests: a fresh 8 KiB allocation and its release per request cost
//! about 1,700 instructions (glibc's `malloc` and `free` for a chunk past its per-thread cache),
//! 8% of a small append. What the threads keep is at most `KEEP` x 9 KiB each, outside the
//! memory budget (which counts what connections hold).

use std::cell::RefCell;

use bytes::BytesMut;

use super::READ_BUF;

/// The most buffers of each kind a worker thread keeps.
const KEEP: usize = 32;

/// The room an output buffer is given for a response head.
const OUT_BUF: usize = 1 << 10;

thread_local! {
    static READ: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static OUT: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty read buffer with room for [`READ_BUF`] bytes.
pub(super) fn read_buf() -> BytesMut {
    READ.with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(READ_BUF))
}

/// Gives back `buf`, empty and no longer needed: kept if nothing else holds its allocation
/// (a body moved out of it keeps it) and it has its first room.
pub(super) fn give_read(mut buf: BytesMut) {
    buf.clear();
    if buf.capacity() == READ_BUF || buf.try_reclaim(READ_BUF) && buf.capacity() == READ_BUF {
        READ.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP {
                s.push(buf);
            }
        });
    }
}

/// An empty output buffer with room for a common response head.
pub(super) fn out_buf() -> Vec<u8> {
    OUT.with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| Vec::with_capacity(OUT_BUF))
}

/// Gives back `out`, no longer needed (kept unless it grew past a head's room).
pub(super) fn give_out(mut out: Vec<u8>) {
    if out.capacity() == 0 || out.capacity() > 4 * OUT_BUF {
        return;
    }
    out.clear();
    OUT.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEEP {
            s.push(out);
        }
    });
}

#[cfg(test)]
mod tests {
    use bytes::{Buf, Bytes};

    use super::*;

    fn kept() -> usize {
        READ.with(|s| s.borrow().len())
    }

    /// A buffer whose request was copied out of it is kept for the next; one whose allocation
    /// went with a body is not, and the kept ones are bounded.
    #[test]
    fn read_buffers_are_kept_when_nothing_else_holds_them() {
        let before = kept();
        let mut buf = read_buf();
        buf.extend_from_slice(&[b'x'; 300]);
        let head = Bytes::copy_from_slice(&buf[..200]);
        buf.advance(300);
        give_read(buf);
        assert_eq!(kept(), before + 1, "a read buffer copied out of is kept");
        let mut buf = read_buf();
        assert_eq!(kept(), before);
        assert_eq!(buf.capacity(), READ_BUF);
        buf.extend_from_slice(&[b'y'; 5000]);
        let body = buf.split_to(5000).freeze();
        give_read(buf);
        assert_eq!(kept(), before, "a buffer a body holds is not kept");
        assert_eq!((head.len(), body.len()), (200, 5000));
        for _ in 0..2 * KEEP {
            give_read(BytesMut::with_capacity(READ_BUF));
        }
        assert_eq!(kept(), KEEP);
    }
}
