//! Byte ranges on snapshot reads (RFC 9110 section 14, as Ursula 0.11 honours them): the one
//! `Range` a snapshot read serves, and the `Content-Range` of its 206 or 416.
//!
//! A snapshot read honours a single range, `bytes=a-b`, `bytes=a-` or `bytes=-n`. Anything else
//! (several ranges, another unit, a value that does not parse, or a request with `If-Range`)
//! gets the whole body as 200, which RFC 9110 allows a server to do. Stream reads keep their
//! offset protocol and ignore `Range`.

use axum::http::{HeaderMap, header};

/// The one byte range a snapshot read honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ByteRange {
    /// `bytes=first-last`, `first <= last`.
    Bounded(u64, u64),
    /// `bytes=first-`.
    From(u64),
    /// `bytes=-len`: the last `len` bytes.
    Suffix(u64),
}

/// What a range selects of a body of `total` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Selected {
    /// 206: bytes `first..=last`.
    Partial {
        /// The first byte.
        first: u64,
        /// The last byte (inclusive).
        last: u64,
        /// The body's length.
        total: u64,
    },
    /// 416: the range selects nothing.
    Unsatisfiable {
        /// The body's length.
        total: u64,
    },
}

impl Selected {
    /// The `Content-Range` value: `bytes first-last/total` or `bytes */total`.
    pub(crate) fn content_range(self) -> String {
        match self {
            Selected::Partial { first, last, total } => format!("bytes {first}-{last}/{total}"),
            Selected::Unsatisfiable { total } => format!("bytes */{total}"),
        }
    }
}

/// A plain decimal position: digits only.
fn position(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl ByteRange {
    /// The range a request asks for and a snapshot read honours; `None` for none, several,
    /// one this server does not honour, or a request with `If-Range` (the whole body then).
    pub(crate) fn of(headers: &HeaderMap) -> Option<ByteRange> {
        if headers.contains_key(header::IF_RANGE) {
            return None;
        }
        let mut values = headers.get_all(header::RANGE).iter();
        let value = values.next()?.to_str().ok()?;
        if values.next().is_some() {
            return None;
        }
        ByteRange::parse(value)
    }

    /// Parses one `Range` value.
    fn parse(value: &str) -> Option<ByteRange> {
        let (unit, spec) = value.split_once('=')?;
        if !unit.trim().eq_ignore_ascii_case("bytes") {
            return None;
        }
        let (first, last) = spec.trim().split_once('-')?;
        match (position(first), position(last)) {
            (Some(a), Some(b)) if a <= b => Some(ByteRange::Bounded(a, b)),
            (Some(a), None) if last.is_empty() => Some(ByteRange::From(a)),
            (None, Some(n)) if first.is_empty() => Some(ByteRange::Suffix(n)),
            _ => None,
        }
    }

    /// What the range selects of a body of `total` bytes; `None` for the whole body as 200 (a
    /// nonzero suffix of an empty body is satisfiable, but no 206 can express it).
    pub(crate) fn select(self, total: u64) -> Option<Selected> {
        let none = Selected::Unsatisfiable { total };
        let Some(end) = total.checked_sub(1) else {
            return match self {
                ByteRange::Suffix(n) if n > 0 => None,
                _ => Some(none),
            };
        };
        let (first, last) = match self {
            ByteRange::Bounded(a, b) => (a, b.min(end)),
            ByteRange::From(a) => (a, end),
            ByteRange::Suffix(0) => return Some(none),
            ByteRange::Suffix(n) => (total.saturating_sub(n), end),
        };
        Some(if first <= last && last < total {
            Selected::Partial { first, last, total }
        } else {
            none
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{ByteRange, Selected};

    #[test]
    fn single_ranges_parse_and_others_do_not() {
        assert_eq!(
            ByteRange::parse("bytes=0-4"),
            Some(ByteRange::Bounded(0, 4))
        );
        assert_eq!(ByteRange::parse("Bytes = 5-"), Some(ByteRange::From(5)));
        assert_eq!(ByteRange::parse("bytes=-3"), Some(ByteRange::Suffix(3)));
        for other in [
            "bytes=0-1,3-4",
            "bytes=4-2",
            "items=0-1",
            "bytes=-",
            "bytes=a-b",
            "0-1",
        ] {
            assert_eq!(ByteRange::parse(other), None, "{other}");
        }
    }

    #[test]
    fn ranges_select_within_the_body() {
        let p = |first, last| {
            Some(Selected::Partial {
                first,
                last,
                total: 10,
            })
        };
        assert_eq!(ByteRange::Bounded(2, 4).select(10), p(2, 4));
        assert_eq!(ByteRange::Bounded(8, 99).select(10), p(8, 9));
        assert_eq!(ByteRange::From(9).select(10), p(9, 9));
        assert_eq!(ByteRange::Suffix(3).select(10), p(7, 9));
        assert_eq!(ByteRange::Suffix(30).select(10), p(0, 9));
        let none = Some(Selected::Unsatisfiable { total: 10 });
        assert_eq!(ByteRange::From(10).select(10), none);
        assert_eq!(ByteRange::Suffix(0).select(10), none);
        assert_eq!(ByteRange::Suffix(1).select(0), None);
        assert_eq!(
            ByteRange::From(0).select(0),
            Some(Selected::Unsatisfiable { total: 0 })
        );
        assert_eq!(
            Selected::Partial {
                first: 1,
                last: 2,
                total: 3
            }
            .content_range(),
            "bytes 1-2/3"
        );
    }
}
