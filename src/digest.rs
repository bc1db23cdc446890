//! [`BodyDigest`], the identity of a producer's write (Ursula 0.11's `Producer-Digest`), and
//! [`TailMatch`], brook's precondition on a stream's tail.

use std::fmt;

use crate::name::{Incarnation, Offset};

/// The BLAKE3-256 digest of an append's body as sent, the identity Ursula 0.11's
/// `Producer-Digest` names: a retry under the same producer key whose digest differs is another
/// write, refused rather than answered as a duplicate. Rendered and parsed as 64 lowercase hex
/// digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BodyDigest([u8; 32]);

impl BodyDigest {
    /// The digest of `body`.
    #[must_use]
    pub fn of(body: &[u8]) -> BodyDigest {
        BodyDigest(*blake3::hash(body).as_bytes())
    }

    /// The digest whose 32 bytes are `bytes`.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> BodyDigest {
        BodyDigest(bytes)
    }

    /// The digest's 32 bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses 64 lowercase hex digits (the only form Ursula accepts); `None` for anything else.
    #[must_use]
    pub fn parse(text: &str) -> Option<BodyDigest> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(BodyDigest(out))
    }
}

impl fmt::Display for BodyDigest {
    /// 64 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BodyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyDigest({self})")
    }
}

/// A precondition on a stream's tail, brook's extension (Ursula has none): the append applies
/// only if the stream is `incarnation`, its tail is `tail` and it is closed exactly when
/// `closed` says, checked atomically with the append after producer deduplication; otherwise it
/// fails with [`Error::TailMoved`] naming the current tail and applies nothing.
///
/// [`Error::TailMoved`]: crate::Error::TailMoved
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailMatch {
    /// The stream incarnation the caller read.
    pub incarnation: Incarnation,
    /// The tail the caller read.
    pub tail: Offset,
    /// Whether the stream was closed at that tail.
    pub closed: bool,
}

#[cfg(test)]
mod tests {
    use super::BodyDigest;

    /// The digest renders as 64 lowercase hex digits that parse back; other forms are refused.
    #[test]
    fn renders_and_parses_lowercase_hex() {
        let d = BodyDigest::of(b"abc");
        // BLAKE3's published test vector for "abc".
        let hex = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85";
        assert_eq!(d.to_string(), hex);
        assert_eq!(BodyDigest::parse(hex), Some(d));
        assert_eq!(BodyDigest::parse(&hex.to_uppercase()), None);
        assert_eq!(BodyDigest::parse(&hex[1..]), None);
        assert_eq!(BodyDigest::parse(&format!("{}g", &hex[1..])), None);
        assert_eq!(BodyDigest::parse(""), None);
    }
}
