//! Buffers between requests. A connection takes its read buffer when bytes arrive and its
//! output buffer when it answers, and gives both back once a request is read and answered with
//! nothing more waiting, so an idle keep-alive connection, one waiting for its append's commit
//! and one streaming an SSE body hold none. Each worker thread keeps up to [`KEEP`] of each
//! given back for its next requests: a fresh 8 KiB allocation and its release per request cost
//! about 1,700 instructions (glibc's `malloc` and `free` for a chunk past its per-thread cache),
//! 8% of a small append. What the threads keep is at most `KEEP` x 9 KiB each, outside the
//! memory budget (which counts what connections hold).

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

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

/// A copy of `bytes` (a request's head, and a small body that came with it) in one allocation
/// of at most twice their length, shared by every view of it. A `Bytes` copied from a slice
/// takes a second allocation at its first view (the header values, the body), and frees two:
/// about 200 instructions of a small append.
pub(super) fn copy(bytes: &[u8]) -> Bytes {
    match bytes.len() {
        0..=256 => Bytes::from_owner(Inline::<256>::of(bytes)),
        257..=512 => Bytes::from_owner(Inline::<512>::of(bytes)),
        513..=1024 => Bytes::from_owner(Inline::<1024>::of(bytes)),
        1025..=2048 => Bytes::from_owner(Inline::<2048>::of(bytes)),
        _ => Bytes::copy_from_slice(bytes),
    }
}

/// Up to `N` bytes held in place (see [`copy`]).
struct Inline<const N: usize> {
    /// How many of `bytes` are held.
    len: usize,
    /// The bytes, then zeros.
    bytes: [u8; N],
}

impl<const N: usize> Inline<N> {
    /// `from`, at most `N` bytes.
    fn of(from: &[u8]) -> Self {
        let mut bytes = [0; N];
        bytes[..from.len()].copy_from_slice(from);
        Inline {
            len: from.len(),
            bytes,
        }
    }
}

impl<const N: usize> AsRef<[u8]> for Inline<N> {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
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

    /// A copy holds its bytes whatever their length, and its views share it.
    #[test]
    fn copies_hold_their_bytes() {
        for n in [0, 1, 255, 256, 257, 512, 1000, 2048, 2049, 5000] {
            let from: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut c = copy(&from);
            assert_eq!(&c[..], &from[..], "{n} bytes");
            let tail = c.split_off(n / 2);
            assert_eq!((&c[..], &tail[..]), (&from[..n / 2], &from[n / 2..]));
        }
    }
}
