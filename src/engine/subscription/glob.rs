//! Glob patterns over `/`-separated stream paths: `*` matches exactly one segment, `**` zero or
//! more segments, any other segment matches itself (`%2A` in a pattern stands for a literal `*`).

/// Whether `path` matches `pattern`. Empty segments (leading, trailing or doubled `/`) are
/// ignored on both sides.
pub(crate) fn matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match_from(&pat, &segs)
}

/// The literal directory prefix of `pattern` (its segments before the first wildcard, each
/// followed by `/`): every matching path starts with it, so listing can start there.
pub(crate) fn literal_prefix(pattern: &str) -> String {
    let mut out = String::new();
    for seg in pattern.split('/').filter(|s| !s.is_empty()) {
        if seg == "*" || seg == "**" || seg.contains('%') {
            break;
        }
        out.push_str(seg);
        out.push('/');
    }
    out
}

/// Whether `pattern` is acceptable: not empty, at most 1024 bytes, no control characters.
pub(crate) fn valid(pattern: &str) -> bool {
    !pattern.split('/').all(str::is_empty)
        && pattern.len() <= crate::name::MAX_NAME_LEN
        && !pattern.chars().any(char::is_control)
}

fn match_from(pat: &[&str], segs: &[&str]) -> bool {
    match pat.split_first() {
        None => segs.is_empty(),
        Some((&"**", rest)) => (0..=segs.len()).any(|i| match_from(rest, &segs[i..])),
        Some((&"*", rest)) => !segs.is_empty() && match_from(rest, &segs[1..]),
        Some((lit, rest)) => match segs.split_first() {
            Some((seg, tail)) => literal(lit) == *seg && match_from(rest, tail),
            None => false,
        },
    }
}

/// A literal pattern segment with `%2A` / `%2a` read as `*`.
fn literal(seg: &str) -> std::borrow::Cow<'_, str> {
    if seg.contains('%') {
        std::borrow::Cow::Owned(seg.replace("%2A", "*").replace("%2a", "*"))
    } else {
        std::borrow::Cow::Borrowed(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_star_is_one_segment() {
        assert!(matches("events/*", "events/a"));
        assert!(!matches("events/*", "events/a/b"));
        assert!(!matches("events/*", "events"));
        assert!(!matches("events/*", "other/a"));
    }

    #[test]
    fn double_star_is_zero_or_more_segments() {
        assert!(matches("events/**", "events"));
        assert!(matches("events/**", "events/a/b/c"));
        assert!(matches("**", "x"));
        assert!(matches("**/last", "a/b/last"));
        assert!(matches("**/last", "last"));
        assert!(!matches("**/last", "a/last/b"));
        assert!(matches("a/**/z", "a/z"));
        assert!(matches("a/**/z", "a/b/c/z"));
    }

    #[test]
    fn literals_and_escapes() {
        assert!(matches("a/%2A", "a/*"));
        assert!(!matches("a/%2A", "a/b"));
        assert!(matches("/a/b/", "a/b"));
        assert_eq!(literal_prefix("v1/events/*/x"), "v1/events/");
        assert_eq!(literal_prefix("**"), "");
        assert!(!valid("/"));
        assert!(valid("a/*"));
    }
}
