//! Little-endian encoding helpers shared by the on-disk formats. Every read is bounds-checked:
//! bytes from disk never panic, they fail with `None`.

use crate::name::Offset;

/// Appends little-endian values to a buffer.
#[derive(Default)]
pub(crate) struct Enc {
    pub(crate) buf: Vec<u8>,
}

impl Enc {
    pub(crate) fn with(buf: Vec<u8>) -> Self {
        Enc { buf }
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        // Lengths above u32::MAX never occur: appends are bounded by Options (at most 1 GiB).
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
    }
    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    pub(crate) fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    pub(crate) fn offset(&mut self, o: Offset) {
        self.u64(o.messages);
        self.u64(o.bytes);
    }
}

/// Reads little-endian values from a slice; `None` when the slice is too short or malformed.
pub(crate) struct Dec<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Dec { buf }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
    /// An optional string: `Some(None)` when absent, `None` (as for every method here) when the
    /// input is truncated or malformed.
    #[expect(
        clippy::option_option,
        reason = "the outer `None` is a malformed input, as for every reader method; the inner one an absent string"
    )]
    pub(crate) fn opt_string(&mut self) -> Option<Option<String>> {
        match self.u8()? {
            0 => Some(None),
            1 => Some(Some(self.string()?)),
            _ => None,
        }
    }
    pub(crate) fn offset(&mut self) -> Option<Offset> {
        Some(Offset::new(self.u64()?, self.u64()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_short_input() {
        let mut e = Enc::default();
        e.u8(7);
        e.u64(1 << 40);
        e.opt_str(Some("hé"));
        e.offset(Offset::new(3, 9));
        let mut d = Dec::new(&e.buf);
        assert_eq!(d.u8(), Some(7));
        assert_eq!(d.u64(), Some(1 << 40));
        assert_eq!(d.opt_string(), Some(Some("hé".to_string())));
        assert_eq!(d.offset(), Some(Offset::new(3, 9)));
        assert_eq!(d.u8(), None);
        let mut short = Dec::new(&e.buf[..5]);
        assert_eq!(short.u8(), Some(7));
        assert_eq!(short.u64(), None);
    }
}
