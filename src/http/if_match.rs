//! `If-Match` on an append, brook's extension behind `--append-if-match` (off by default, when
//! the header is ignored on appends as Ursula ignores it): the entity tag a read of the tail
//! carries, `"{incarnation}:{start}:{next}[:c]"` ([`ReadTag`]), as a precondition that the
//! stream is still that incarnation, its tail still `next`, and closed exactly when `:c` says.
//! The read's start does not matter: every read that reached the tail names the same tail.
//!
//! A refusal is 412 `TAIL_MOVED` with the current tail's tag, which is not the seed's 412 (the
//! seed's means "the stream you knew is gone"); docs/http.md says how a client tells them
//! apart.

use axum::http::HeaderValue;

use crate::headers::parse_offset;
use crate::name::Offset;
use crate::{Incarnation, TailMatch};

use super::error::ApiError;
use super::reply::ReadTag;

/// What `If-Match` on an append means (`brook serve --append-if-match`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendIfMatch {
    /// The header is ignored on appends, as Ursula ignores it (the seed: "Ursula has no
    /// precondition on the stream's tail offset").
    #[default]
    Ignored,
    /// brook's extension: the tag of a read that reached the tail is a precondition on the
    /// tail, refused with 412 `TAIL_MOVED` when it moved. A client of such a server must tell
    /// this 412 from the seed's `INCARNATION_MISMATCH` by its code.
    TailPrecondition,
}

/// The entity tag of `incarnation`'s tail at `tail`: what a read that ends there carries, as
/// the read starting at the tail has it.
pub(crate) fn tail_tag(incarnation: &Incarnation, tail: Offset, closed: bool) -> String {
    ReadTag {
        incarnation: incarnation.clone(),
        start: tail,
        next: tail,
        closed,
    }
    .text()
}

/// The append's tail precondition from its `If-Match`: `None` without one or for `*` (any
/// current stream, which the append's own lookup requires). One strong tag this server issued;
/// anything else is 400 `INVALID_ARGUMENT` naming why.
pub(crate) fn tail_match(value: Option<&HeaderValue>) -> Result<Option<TailMatch>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let bad = |why: &str| ApiError::bad_request("INVALID_ARGUMENT", format!("If-Match {why}"));
    let text = value
        .to_str()
        .map_err(|_| bad("is not visible ASCII"))?
        .trim();
    if text == "*" {
        return Ok(None);
    }
    if text.starts_with("W/") {
        return Err(bad(
            "names a weak entity tag: an append's precondition compares strong tags, and brook \
             issues only strong ones (a proxy that weakens them must pass them through)",
        ));
    }
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|t| !t.contains('"'))
        .ok_or_else(|| bad("on an append must be one entity tag or *"))?;
    let not_ours = || bad("is not an entity tag of a read of this server");
    let (rest, closed) = match inner.strip_suffix(":c") {
        Some(rest) => (rest, true),
        None => (inner, false),
    };
    let mut parts = rest.rsplitn(3, ':');
    let next = parts.next().ok_or_else(not_ours)?;
    let start = parts.next().ok_or_else(not_ours)?;
    let incarnation = parts.next().ok_or_else(not_ours)?;
    let tail = parse_offset(next).map_err(|_| not_ours())?;
    parse_offset(start).map_err(|_| not_ours())?;
    let incarnation = Incarnation::new(incarnation).map_err(|_| not_ours())?;
    Ok(Some(TailMatch {
        incarnation,
        tail,
        closed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Result<Option<TailMatch>, ApiError> {
        tail_match(Some(&HeaderValue::from_str(v).expect("a header value")))
    }

    /// A read's tag parses back to its incarnation, end and closure, whatever its start.
    #[test]
    fn a_read_tag_round_trips() {
        let inc = Incarnation::new("a1b2").expect("a token");
        for closed in [false, true] {
            let read = ReadTag {
                incarnation: inc.clone(),
                start: Offset::new(1, 5),
                next: Offset::new(3, 9),
                closed,
            }
            .text();
            let m = parse(&read).expect("parses").expect("a precondition");
            assert_eq!(m.incarnation, inc);
            assert_eq!(m.tail, Offset::new(3, 9));
            assert_eq!(m.closed, closed);
            let tail = tail_tag(&inc, Offset::new(3, 9), closed);
            assert_eq!(parse(&tail).expect("parses"), Some(m));
        }
        assert_eq!(parse(" * ").expect("parses"), None);
        assert!(tail_match(None).expect("absent").is_none());
    }

    /// Weak tags, lists and tags of no read are refused with a reason.
    #[test]
    fn other_tags_are_refused() {
        for v in [
            "W/\"a:0000000000000000_0000000000000000:0000000000000000_0000000000000000\"",
            "\"a\", \"b\"",
            "\"x\"",
            "\"a:b:c\"",
            "unquoted",
            "\"\"",
        ] {
            assert!(parse(v).is_err(), "{v}");
        }
    }
}
