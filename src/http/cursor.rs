//! Live-read cursors (PROTOCOL.md 10.1): time is cut into 20-second intervals counted from
//! 2024-10-09T00:00:00Z, and a cursor is an interval number. A response's cursor is the current
//! interval, except that a client already at or past it gets its own cursor plus 1 to 3600
//! seconds of jitter (in whole intervals, at least one), so cursors only move forward and a CDN
//! never serves the same cached empty response forever.
//!
//! A long-poll's jitter is a hash of its URL's stream, offset and cursor rather than a fresh
//! random number ([`collapsing_cursor`]): the pollers a cache collapsed into one request, or
//! that asked the same URL on their own, get the same next cursor and so keep asking the same
//! URLs, which the cache can collapse again. A random jitter would scatter them over separate
//! keys after their first uncacheable answer (a `204`) and for good.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 2024-10-09T00:00:00Z in Unix seconds.
const EPOCH_SECS: u64 = 1_728_432_000;
/// The interval length.
const INTERVAL_SECS: u64 = 20;

/// The interval `now` falls in (0 before the epoch).
pub(crate) fn interval_at(now: SystemTime) -> u64 {
    let secs = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    secs.saturating_sub(EPOCH_SECS) / INTERVAL_SECS
}

/// The cursor to answer a request that echoed `client` (if any) with, its jitter random (SSE,
/// whose responses no cache keeps).
pub(crate) fn response_cursor(client: Option<u64>, now: SystemTime) -> u64 {
    // A fresh `RandomState` is seeded differently each time: enough randomness for jitter.
    let r = RandomState::new().hash_one(SystemTime::now());
    next_cursor(client, now, r)
}

/// The cursor to answer a long-poll that echoed `client` (if any) with: the same for every
/// request with the same `url` (stream and offset) and cursor in the same interval, its jitter
/// a hash of them (this module's docs say why).
pub(crate) fn collapsing_cursor(client: Option<u64>, now: SystemTime, url: impl Hash) -> u64 {
    // `DefaultHasher::new` has fixed keys: every request, on every thread, hashes alike.
    let mut h = DefaultHasher::new();
    url.hash(&mut h);
    client.hash(&mut h);
    next_cursor(client, now, h.finish())
}

/// The current interval, or `client` plus the jitter `r` picks when it is at or past it.
fn next_cursor(client: Option<u64>, now: SystemTime, r: u64) -> u64 {
    let current = interval_at(now);
    match client {
        Some(c) if c >= current => c.saturating_add(jitter_intervals(r)),
        _ => current,
    }
}

/// 1 to 3600 seconds of jitter picked by `r`, as whole intervals (at least one).
fn jitter_intervals(r: u64) -> u64 {
    let secs = 1 + r % 3600;
    (secs / INTERVAL_SECS).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cursors count 20-second intervals from the epoch, and an echoed cursor at or past the current
    /// interval moves forward by 1 to 180 intervals.
    #[test]
    fn cursors_are_intervals_and_never_go_back() {
        let at = UNIX_EPOCH + Duration::from_secs(EPOCH_SECS + 20 * 1000 + 5);
        assert_eq!(interval_at(at), 1000);
        assert_eq!(response_cursor(None, at), 1000);
        assert_eq!(response_cursor(Some(999), at), 1000);
        for _ in 0..100 {
            let c = response_cursor(Some(1000), at);
            assert!((1001..=1180).contains(&c), "{c}");
            let c = response_cursor(Some(5000), at);
            assert!((5001..=5180).contains(&c), "{c}");
        }
        assert_eq!(interval_at(UNIX_EPOCH), 0);
    }

    /// A long-poll's cursor is the same for the same stream, offset and cursor, moves forward
    /// by 1 to 180 intervals like a random one, and differs between URLs.
    #[test]
    fn long_poll_cursors_are_alike_per_url() {
        let at = UNIX_EPOCH + Duration::from_secs(EPOCH_SECS + 20 * 1000 + 5);
        assert_eq!(collapsing_cursor(None, at, ("s", 1)), 1000);
        assert_eq!(collapsing_cursor(Some(7), at, ("s", 1)), 1000);
        let mut seen = std::collections::BTreeSet::new();
        for offset in 0..200_u64 {
            let c = collapsing_cursor(Some(1000), at, ("s", offset));
            assert!((1001..=1180).contains(&c), "{c}");
            assert_eq!(c, collapsing_cursor(Some(1000), at, ("s", offset)));
            seen.insert(c);
        }
        assert!(seen.len() > 50, "spread over the jitter: {}", seen.len());
        let next = collapsing_cursor(Some(1000), at, ("s", 3));
        assert!(collapsing_cursor(Some(next), at, ("s", 3)) > next);
    }
}
