//! Live-read cursors (PROTOCOL.md 10.1): time is cut into 20-second intervals counted from
//! 2024-10-09T00:00:00Z, and a cursor is an interval number. A response's cursor is the current
//! interval, except that a client already at or past it gets its own cursor plus 1 to 3600
//! seconds of random jitter (in whole intervals, at least one), so cursors only move forward and
//! a CDN never serves the same cached empty response forever.

use std::hash::{BuildHasher, RandomState};
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

/// The cursor to answer a request that echoed `client` (if any) with.
pub(crate) fn response_cursor(client: Option<u64>, now: SystemTime) -> u64 {
    let current = interval_at(now);
    match client {
        Some(c) if c >= current => c.saturating_add(jitter_intervals()),
        _ => current,
    }
}

/// 1 to 3600 seconds of jitter, as whole intervals (at least one).
fn jitter_intervals() -> u64 {
    // A fresh `RandomState` is seeded differently each time: enough randomness for jitter.
    let r = RandomState::new().hash_one(SystemTime::now());
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
}
