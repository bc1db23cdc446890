//! Domain newtypes: stream names, offsets, incarnation tokens and content types, with their parsing.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest stream name brook accepts, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Longest fork chain brook creates: a fork of a stream that is itself this many forks deep is
/// refused (`ForkTooDeep`), so a read of any fork holds at most this many ancestors open.
pub const MAX_FORK_DEPTH: usize = 64;

/// Last path segments reserved for the snapshot, retention and bootstrap routes.
pub const RESERVED_SEGMENTS: [&str; 3] = ["snapshot", "retention", "bootstrap"];

/// First path segments reserved for routes that are not streams: `__ds` for the protocol's own
/// (subscriptions, their JWKS) and `__brook` for brook's operations routes (health, metrics,
/// listing).
pub const RESERVED_PREFIXES: [&str; 2] = ["__ds", "__brook"];

/// A stream's name: a `/`-separated path such as `v1/stream/chat-42`.
///
/// Valid names are 1 to 1024 bytes of UTF-8 without NUL or other control characters,
/// with no empty, `.` or `..` segment (a single leading `/` is dropped). The last segment may not be
/// `snapshot`, `retention` or `bootstrap`, and the second-to-last may not be `snapshot` or
/// `retention`: those shapes address the snapshot, retention and bootstrap routes of the stream
/// before them. Nor may a name end in `incarnation/{token}`, `incarnation/{token}/chunk/{offset}`
/// or `snapshot/{offset}/parts`: those address a stream's immutable reads and snapshot parts.
/// The first segment may not be `__ds` or `__brook` (`RESERVED_PREFIXES`), and no segment may be
/// `__ds` (the protocol's routes live at `{root}/__ds/` under any root).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName(pub(crate) Arc<str>);

impl StreamName {
    /// Parses and validates a name.
    pub fn new(name: &str) -> Result<Self> {
        let name = name.strip_prefix('/').unwrap_or(name);
        if name.is_empty() {
            return Err(Error::InvalidArgument("stream name is empty".into()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::TooLarge(format!(
                "stream name is longer than {MAX_NAME_LEN} bytes"
            )));
        }
        // ASCII names (nearly all) are checked byte by byte; others char by char.
        let control = if name.is_ascii() {
            name.bytes().any(|b| b.is_ascii_control())
        } else {
            name.chars().any(char::is_control)
        };
        if control {
            return Err(Error::InvalidArgument(
                "stream name contains a control character".into(),
            ));
        }
        let first = name.split_once('/').map_or(name, |(first, _)| first);
        if RESERVED_PREFIXES.contains(&first) {
            return Err(Error::InvalidArgument(format!(
                "stream names may not start with the reserved segment '{first}'"
            )));
        }

        // The last two segments, for the reserved shapes below. Segments are found by a byte
        // scan for `/` (ASCII, so never inside a multi-byte character): for names of a few
        // dozen bytes that costs less than `str::split`'s searcher.
        let (mut last, mut second_last) = ("", None);
        // The third- and fourth-to-last, for the snapshot-part and incarnation shapes.
        let (mut third_last, mut fourth_last) = (None, None);
        let mut rest = Some(name);
        while let Some(r) = rest {
            let (seg, more) = match r.as_bytes().iter().position(|&b| b == b'/') {
                Some(i) => (&r[..i], Some(&r[i + 1..])),
                None => (r, None),
            };
            rest = more;
            if seg.is_empty() {
                return Err(Error::InvalidArgument(
                    "stream name has an empty segment".into(),
                ));
            }
            // `{root}/__ds/...` addresses the protocol's routes under any stream root.
            if seg == "__ds" {
                return Err(Error::InvalidArgument(
                    "stream names may not contain the reserved segment '__ds'".into(),
                ));
            }
            // Without a `%`, a segment decodes to itself (and has no NUL: that is a control
            // character, refused above).
            let (dots, nul) = if seg.as_bytes().contains(&b'%') {
                let decoded = percent_decode_lossy(seg);
                (decoded == "." || decoded == "..", decoded.contains('\0'))
            } else {
                (seg == "." || seg == "..", false)
            };
            if dots {
                return Err(Error::InvalidArgument(
                    "stream name has a '.' or '..' segment".into(),
                ));
            }
            if nul {
                return Err(Error::InvalidArgument("stream name contains NUL".into()));
            }
            fourth_last = third_last;
            third_last = second_last;
            second_last = Some(last);
            last = seg;
        }
        if RESERVED_SEGMENTS.contains(&last) {
            return Err(Error::InvalidArgument(format!(
                "stream names may not end in the reserved segment '{last}'"
            )));
        }
        // `second_last` is the empty placeholder when the name has one segment.
        if matches!(second_last, Some("snapshot" | "retention")) {
            return Err(Error::InvalidArgument(
                "stream names may not have 'snapshot' or 'retention' as their second-to-last segment"
                    .into(),
            ));
        }
        // `{s}/incarnation/{token}/...` and `{s}/snapshot/{offset}/parts` (Ursula 0.11's
        // immutable reads and snapshot parts). For names shorter than a shape the segments
        // before the first are `None` or `Some("")`, which match nothing.
        if second_last == Some("incarnation")
            || (fourth_last == Some("incarnation") && second_last == Some("chunk"))
        {
            return Err(Error::InvalidArgument(
                "stream names may not end in 'incarnation/{token}' or \
                 'incarnation/{token}/chunk/{offset}' (the reserved segment 'incarnation')"
                    .into(),
            ));
        }
        if third_last == Some("snapshot") && last == "parts" {
            return Err(Error::InvalidArgument(
                "stream names may not end in 'snapshot/{offset}/parts' (the reserved segment \
                 'snapshot')"
                    .into(),
            ));
        }
        Ok(StreamName(name.into()))
    }

    /// The name as a string, without a leading `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn percent_decode_lossy(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamName({:?})", self.0)
    }
}

impl FromStr for StreamName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StreamName::new(s)
    }
}

/// A position in a stream: the number of whole messages before it and its byte position.
///
/// Offsets print as `%016d_%016d` (`messages_bytes`), fixed width, so lexicographic order is
/// stream order. The byte position counts the stream's stored representation: raw bytes for
/// byte streams; for `application/json` streams each message's JSON text plus one separator byte.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset {
    /// Whole messages before this position.
    pub messages: u64,
    /// Byte position.
    pub bytes: u64,
}

impl Offset {
    /// The start of every stream, `0000000000000000_0000000000000000`.
    pub const ZERO: Offset = Offset {
        messages: 0,
        bytes: 0,
    };
    /// Largest value of each half (16 decimal digits).
    pub const MAX_PART: u64 = 9_999_999_999_999_999;

    /// An offset from its two halves.
    pub const fn new(messages: u64, bytes: u64) -> Self {
        Offset { messages, bytes }
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Digits::offset(*self).as_str())
    }
}

/// The two-digit strings `00` to `99`, back to back.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// Writes `n`'s digits at the end of `out`, which is all `0`s and long enough.
fn fill_right(out: &mut [u8], mut n: u64) {
    let mut at = out.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        out[at] = DIGIT_PAIRS[pair];
        out[at + 1] = DIGIT_PAIRS[pair + 1];
    }
    if n >= 10 {
        let pair = n as usize * 2;
        out[at - 2] = DIGIT_PAIRS[pair];
        out[at - 1] = DIGIT_PAIRS[pair + 1];
    } else if n > 0 {
        out[at - 1] = b'0' + n as u8;
    }
}

/// The decimal text of an integer or an [`Offset`], rendered into a stack buffer: exactly what
/// their `Display` writes (`{}`, and `{:016}_{:016}`), without the formatting machinery or a
/// `String` (a response carries several of them).
pub(crate) struct Digits {
    /// The text, `buf[..len]`.
    buf: [u8; 41],
    /// Its length.
    len: usize,
}

impl Digits {
    /// `n` in decimal, as `{}` writes it.
    #[cfg(any(feature = "http", test))]
    pub(crate) fn u64(n: u64) -> Digits {
        let mut d = Digits {
            buf: [0; 41],
            len: 0,
        };
        d.push(n, 1);
        d
    }

    /// An offset, as its `Display` writes it: `%016d_%016d`.
    pub(crate) fn offset(o: Offset) -> Digits {
        let mut d = Digits {
            buf: [b'0'; 41],
            len: 33,
        };
        // Every offset brook makes: two halves of exactly 16 digits.
        if o.messages <= Offset::MAX_PART && o.bytes <= Offset::MAX_PART {
            fill_right(&mut d.buf[..16], o.messages);
            d.buf[16] = b'_';
            fill_right(&mut d.buf[17..33], o.bytes);
            return d;
        }
        d.len = 0;
        d.push(o.messages, 16);
        d.buf[d.len] = b'_';
        d.len += 1;
        d.push(o.bytes, 16);
        d
    }

    /// Appends `n` in decimal, zero-padded to at least `width` (at most 20) digits.
    fn push(&mut self, mut n: u64, width: usize) {
        let mut tmp = [b'0'; 20];
        let mut at = tmp.len();
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            at -= 2;
            tmp[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            at -= 2;
            let pair = n as usize * 2;
            tmp[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            tmp[at] = b'0' + n as u8;
        }
        // `tmp` is all zeros before `at`.
        let from = at.min(tmp.len() - width);
        let digits = &tmp[from..];
        self.buf[self.len..self.len + digits.len()].copy_from_slice(digits);
        self.len += digits.len();
    }

    /// The text's bytes (ASCII digits and `_`), without [`Digits::as_str`]'s UTF-8 check.
    #[cfg(feature = "http")]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII digits and `_` were written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Debug for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offset({self})")
    }
}

impl FromStr for Offset {
    type Err = Error;
    /// Parses exactly 16 digits, `_`, 16 digits.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidArgument(format!("malformed offset {s:?}"));
        let b = s.as_bytes();
        if b.len() != 33 || b[16] != b'_' {
            return Err(bad());
        }
        // 16 digits are at most 10^16 - 1: no overflow.
        let part = |p: &[u8]| -> Option<u64> {
            p.iter().try_fold(0u64, |n, &d| {
                d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
            })
        };
        match (part(&b[..16]), part(&b[17..])) {
            (Some(messages), Some(bytes)) => Ok(Offset { messages, bytes }),
            _ => Err(bad()),
        }
    }
}

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The start of the stream (the wire's `offset=-1`). Once retention has trimmed the start,
    /// a read from here is [`Error::OffsetGone`] carrying the earliest retained offset: the
    /// messages before it can no longer be read (or counted), and the caller must say so by
    /// reading from that offset explicitly.
    Start,
    /// The current tail (the wire's `offset=now`): no existing data.
    Tail,
    /// A position previously returned by brook.
    At(Offset),
}

impl FromStr for ReadFrom {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "-1" => Ok(ReadFrom::Start),
            "now" => Ok(ReadFrom::Tail),
            _ => s.parse().map(ReadFrom::At),
        }
    }
}

/// An opaque token naming one incarnation of a stream: fresh on every creation, unique even when
/// a name is deleted and created again, stable across restarts.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Incarnation(Arc<str>);

impl Incarnation {
    /// Longest token accepted from a caller.
    pub const MAX_LEN: usize = 128;

    /// Wraps a token received from a caller (any printable ASCII up to [`Self::MAX_LEN`] bytes).
    pub fn new(token: &str) -> Result<Self> {
        if token.is_empty()
            || token.len() > Self::MAX_LEN
            || !token.bytes().all(|b| (0x21..0x7f).contains(&b))
        {
            return Err(Error::InvalidArgument(
                "malformed Stream-Incarnation".into(),
            ));
        }
        Ok(Incarnation(token.into()))
    }

    pub(crate) fn from_raw(s: String) -> Self {
        Incarnation(s.into())
    }

    /// The token, shared (journal records name the incarnation they apply to).
    pub(crate) fn shared(&self) -> Arc<str> {
        self.0.clone()
    }

    /// The token.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Incarnation({})", self.0)
    }
}

/// Normalizes a media type: type and subtype lower-cased, parameters kept in order with their
/// names lower-cased and values as given (a quoted string whole, with its quotes and escapes:
/// a `;` inside one separates nothing), whitespace around `;` and `=` removed. A parameter
/// without `=`, a value that is neither a token nor a closed quoted string, or anything after a
/// value but `;` is malformed.
///
/// `Application/JSON ; Charset=utf-8` becomes `application/json;charset=utf-8`.
pub fn normalize_content_type(ct: &str) -> Result<String> {
    // The common case, a bare `type/subtype` already in lower case, is its own normal form.
    if is_normal_essence(ct) {
        return Ok(ct.to_owned());
    }
    let semi = ct.find(';').unwrap_or(ct.len());
    let essence = ct[..semi].trim().to_ascii_lowercase();
    let valid_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match essence.split_once('/') {
        Some((t, s)) if valid_token(t) && valid_token(s) => {}
        _ => {
            return Err(Error::InvalidArgument(format!(
                "malformed content type {ct:?}"
            )));
        }
    }
    // Parameters (RFC 9110 section 5.6.6): `;` OWS name `=` (token / quoted-string), the
    // name lower-cased, the value kept as sent (a quoted string with its quotes and escapes,
    // so a `;` or `"` inside one is part of the value, not a separator).
    let malformed = || Error::InvalidArgument(format!("malformed content type {ct:?}"));
    let mut out = essence;
    let mut rest = &ct[semi..];
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        let Some(after) = rest.strip_prefix(';') else {
            if rest.is_empty() {
                break;
            }
            return Err(malformed());
        };
        rest = after.trim_start_matches([' ', '\t']);
        if rest.is_empty() || rest.starts_with(';') {
            continue; // an empty parameter, as `text/plain;` or `a/b;;c=d`
        }
        let eq = rest.find('=').ok_or_else(malformed)?;
        let name = rest[..eq].trim_end_matches([' ', '\t']);
        if !valid_token(name) {
            return Err(malformed());
        }
        rest = rest[eq + 1..].trim_start_matches([' ', '\t']);
        let value_len = if rest.starts_with('"') {
            quoted_len(rest).ok_or_else(malformed)?
        } else {
            rest.find([';', ' ', '\t']).unwrap_or(rest.len())
        };
        let value = &rest[..value_len];
        if value.is_empty() || (!value.starts_with('"') && !valid_token(value)) {
            return Err(malformed());
        }
        out.push(';');
        out.push_str(&name.to_ascii_lowercase());
        out.push('=');
        out.push_str(value);
        rest = &rest[value_len..];
    }
    Ok(out)
}

/// The length of the quoted string at the start of `s` (which starts with `"`), through its
/// closing quote; `None` when it is not closed. `\` escapes the next character.
fn quoted_len(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Whether `ct` is `type/subtype` of lower-case token characters, without parameters or
/// whitespace: what [`normalize_content_type`] would return unchanged.
pub(crate) fn is_normal_essence(ct: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$&-^_.+".contains(&b))
    };
    // A byte scan: for a type of a dozen bytes it costs less than `str::split_once`'s searcher.
    ct.as_bytes()
        .iter()
        .position(|&b| b == b'/')
        .is_some_and(|i| token(&ct[..i]) && token(&ct[i + 1..]))
}

/// Whether a normalized content type selects JSON mode (`application/json`, any parameters).
pub fn is_json(ct: &str) -> bool {
    ct.strip_prefix("application/json")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_sort() {
        let a = Offset::new(3, 120);
        let s = a.to_string();
        assert_eq!(s, "0000000000000003_0000000000000120");
        assert_eq!(s.parse::<Offset>().unwrap(), a);
        assert!(Offset::new(3, 121).to_string() > s);
        assert!(
            "0000000000000000_0000000000000000"
                .parse::<Offset>()
                .is_ok()
        );
        assert!(
            "9999999999999999_9999999999999999"
                .parse::<Offset>()
                .is_ok()
        );
        for bad in [
            "",
            "-1",
            "0_0",
            "000000000000000a_0000000000000000",
            "0000000000000000-0000000000000000",
        ] {
            assert!(
                matches!(bad.parse::<Offset>(), Err(Error::InvalidArgument(ref m)) if m.starts_with("malformed offset")),
                "{bad}"
            );
        }
    }

    /// `Digits` writes what `format!` writes, at every length and past the 16-digit halves.
    #[test]
    fn digits_match_format() {
        let mut n = 1u64;
        let mut values = vec![0, 9, 10, 99, 100, 101, u64::MAX, Offset::MAX_PART];
        while let Some(m) = n.checked_mul(10) {
            values.extend([n - 1, n, n + 1, n * 7 + 3]);
            n = m;
        }
        for &v in &values {
            assert_eq!(Digits::u64(v).as_str(), v.to_string());
            for &w in &values[..8] {
                let o = Offset::new(v, w);
                assert_eq!(Digits::offset(o).as_str(), format!("{v:016}_{w:016}"));
                assert_eq!(o.to_string(), format!("{v:016}_{w:016}"));
            }
        }
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(StreamName::new("/a/b").unwrap().as_str(), "a/b");
        for bad in [
            "",
            "/",
            "a//b",
            "a/../b",
            "a/%2e%2e/b",
            "a/./b",
            "a\0b",
            "x/snapshot",
            "x/bootstrap",
            "x/retention/5",
            "x/snapshot/0",
            "x/incarnation/t",
            "incarnation/t",
            "x/incarnation/t/chunk/0",
            "x/snapshot/0/parts",
            "snapshot/0/parts",
        ] {
            assert!(
                matches!(StreamName::new(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(StreamName::new("snapshots/x").is_ok());
        for fine in [
            "incarnation",
            "x/incarnation",
            "x/chunk/0",
            "a/incarnation/t/x/0",
            "parts",
        ] {
            assert!(StreamName::new(fine).is_ok(), "{fine:?}");
        }
        for reserved in [
            "__ds",
            "__ds/subscriptions/x",
            "__brook/metrics",
            "/__brook",
            "x/__ds",
            "v1/stream/__ds/jwks.json",
        ] {
            let err = StreamName::new(reserved).unwrap_err().to_string();
            assert!(err.contains("reserved segment"), "{reserved}: {err}");
        }
        assert!(StreamName::new("x/__brook").is_ok());
        assert!(StreamName::new("__dsx/y").is_ok());
        for (bad, why) in [
            ("a/%2e/b", "'.' or '..'"),
            ("a/%00/b", "NUL"),
            ("a/b\u{85}", "control"),
            ("snapshot/x", "second-to-last"),
            ("retention/x/y/snapshot", "reserved"),
        ] {
            let e = StreamName::new(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        for good in [
            "snapshots",
            "retention/x/y",
            "caf\u{e9}/%41",
            "a/.../b",
            "a/%2e%2e%2e",
        ] {
            assert!(StreamName::new(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn content_types_normalize_keeping_parameters() {
        assert_eq!(
            normalize_content_type("Application/JSON ; Charset=utf-8").unwrap(),
            "application/json;charset=utf-8"
        );
        assert_eq!(normalize_content_type("text/plain").unwrap(), "text/plain");
        assert!(matches!(
            normalize_content_type("nonsense"),
            Err(Error::InvalidArgument(m)) if m.starts_with("malformed content type")
        ));
        for ct in [
            "text/PLAIN",
            "text/plain ",
            "text/",
            "/plain",
            "a/b/c",
            "text/pl ain",
        ] {
            let slow = normalize_content_type(&format!("{ct};"));
            assert_eq!(normalize_content_type(ct).ok(), slow.ok(), "{ct:?}");
        }
        assert!(is_json("application/json;charset=utf-8"));
        assert!(!is_json("application/jsonx"));
    }

    /// A quoted parameter value is one value: its `;`, `=`, escaped quotes and spaces are kept,
    /// so two types that differ inside the quotes stay different.
    #[test]
    fn quoted_parameter_values_are_kept_whole() {
        let n = |ct: &str| normalize_content_type(ct);
        assert_eq!(
            n(r#"text/plain; x="a;b\"c""#).unwrap(),
            r#"text/plain;x="a;b\"c""#
        );
        assert_eq!(
            n(r#"Text/Plain ; X = "a; b" ; y=z"#).unwrap(),
            r#"text/plain;x="a; b";y=z"#
        );
        assert_ne!(
            n(r#"a/b; x="1;2""#).unwrap(),
            n(r#"a/b; x="1";2""#).unwrap_or_default()
        );
        for bad in [
            r#"text/plain; x="unclosed"#,
            "text/plain; novalue",
            "text/plain; x=",
            "text/plain; x=a b",
            r#"text/plain; x="a"b"#,
            "text/plain; =v",
            "text/plain; x=a\"b",
        ] {
            assert!(
                matches!(n(bad), Err(Error::InvalidArgument(ref m)) if m.starts_with("malformed content type")),
                "{bad:?} -> {:?}",
                n(bad)
            );
        }
        assert_eq!(n("a/b;;c=d;").unwrap(), "a/b;c=d");
    }
}
