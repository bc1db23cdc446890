//! Stream names that can move to a stricter Durable Streams server: Ursula's
//! `/{bucket}/{stream}` paths (`tonbo-io/ursula`, `crates/ursula-stream/src/validate.rs`).
//!
//! `brook serve --portable-names` refuses every other name at create time, and `brook mirror
//! --ursula-names` maps brook names onto such paths.

/// Shortest bucket name Ursula accepts.
const BUCKET_MIN: usize = 4;
/// Longest bucket name Ursula accepts.
const BUCKET_MAX: usize = 64;
/// Longest stream segment, and longest `bucket/stream` identity, Ursula accepts.
const IDENTITY_MAX: usize = 122;

/// Whether `bucket` is an Ursula bucket name: 4 to 64 bytes of `[a-z0-9_-]`.
pub(crate) fn is_bucket(bucket: &str) -> bool {
    (BUCKET_MIN..=BUCKET_MAX).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Why `stream` cannot be a stream segment under `bucket`, if it cannot: empty, over 122
/// bytes, containing `/`, NUL or `..`, the reserved `streams`, or a `bucket/stream` identity
/// over 122 bytes.
pub(crate) fn stream_problem(bucket: &str, stream: &str) -> Option<String> {
    if stream.is_empty() {
        return Some("the stream segment is empty".into());
    }
    if stream.contains('/') || stream.contains('\0') || stream.contains("..") {
        return Some("the stream segment contains '/', NUL or '..'".into());
    }
    if stream == "streams" {
        return Some("the stream segment 'streams' is reserved".into());
    }
    if stream.len() > IDENTITY_MAX || bucket.len() + 1 + stream.len() > IDENTITY_MAX {
        return Some(format!("bucket/stream is longer than {IDENTITY_MAX} bytes"));
    }
    None
}

/// Why the stream name `name` (without its leading `/`) could not move to a server with
/// Ursula's rules, if it could not: it must be exactly `bucket/stream`, the bucket 4 to 64 of
/// `[a-z0-9_-]`, the stream segment as [`stream_problem`] says. Only the server checks whole
/// names (`--portable-names`); the mirror maps them segment by segment.
#[cfg(feature = "http")]
pub(crate) fn name_problem(name: &str) -> Option<String> {
    let Some((bucket, stream)) = name.split_once('/') else {
        return Some("a portable name is bucket/stream: it has no '/'".into());
    };
    if !is_bucket(bucket) {
        return Some(format!(
            "the bucket '{bucket}' is not {BUCKET_MIN} to {BUCKET_MAX} bytes of [a-z0-9_-]"
        ));
    }
    stream_problem(bucket, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "http")]
    fn portable_names_follow_ursulas_rules() {
        for ok in ["chat/room-1", "a_b-/x.y", "tenant42/orders:2026"] {
            assert_eq!(name_problem(ok), None, "{ok}");
        }
        for bad in [
            "chat",
            "abc/x",
            "Chat/x",
            "chat/a/b",
            "chat/",
            "chat/streams",
            "chat/a..b",
            &format!("{}/x", "b".repeat(65)),
            &format!("chat/{}", "s".repeat(118)),
        ] {
            assert!(name_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(name_problem(&format!("chat/{}", "s".repeat(117))), None);
    }

    #[test]
    fn buckets_are_lowercase_digits_dash_and_underscore() {
        assert!(is_bucket("a-_9") && !is_bucket("a.bc"));
    }
}
