//! Retention policies: how much of a stream's start a store drops by itself, by age and by size
//! (DESIGN.md, "Retention policies"). The policy types, their sidecar encoding, and the figures
//! the enforcer reports; the enforcer itself is `engine::retention`.
//!
//! A policy is per stream (set at create, stored with the stream's configuration), and a store's
//! default ([`Options::with_retention_default`](crate::Options::with_retention_default)) fills
//! each limit a stream leaves unset. Enforcement drops whole sealed segments from the start of
//! the stream, so the earliest readable offset always advances to a segment's first offset; it
//! never goes past the latest snapshot (when the stream has one) nor past the lowest offset a
//! subscription linking the stream has acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};

/// The largest limit a policy takes (2^53-1, for JavaScript clients, as Stream-TTL).
pub const MAX_RETENTION_LIMIT: u64 = (1 << 53) - 1;

/// A stream's retention policy: each limit, when set, lets the store drop the oldest sealed
/// segments that are past it. Both unset (the default) is no policy of the stream's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RetentionPolicy {
    /// Drop a sealed segment once its newest message is older than this many seconds.
    pub max_age: Option<u64>,
    /// Drop the oldest sealed segments while the stream retains more than this many bytes
    /// (from its earliest offset to its tail, in the stored representation).
    pub max_bytes: Option<u64>,
}

impl RetentionPolicy {
    /// No limit.
    #[must_use]
    pub fn new() -> Self {
        RetentionPolicy::default()
    }

    /// Drops sealed segments whose newest message is older than `seconds`.
    #[must_use]
    pub fn max_age(mut self, seconds: u64) -> Self {
        self.max_age = Some(seconds);
        self
    }

    /// Keeps the stream's retained bytes at most `bytes` (plus its unsealed last segment).
    #[must_use]
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Neither limit is set.
    pub fn is_empty(&self) -> bool {
        self.max_age.is_none() && self.max_bytes.is_none()
    }

    /// This policy, each unset limit taken from `default`.
    #[must_use]
    pub fn or(self, default: RetentionPolicy) -> RetentionPolicy {
        RetentionPolicy {
            max_age: self.max_age.or(default.max_age),
            max_bytes: self.max_bytes.or(default.max_bytes),
        }
    }

    /// The age limit as a duration.
    pub fn max_age_duration(&self) -> Option<Duration> {
        self.max_age.map(Duration::from_secs)
    }

    /// Refuses a limit of 0 (it would drop every sealed segment at once; leave the limit unset
    /// for none) or above [`MAX_RETENTION_LIMIT`].
    pub(crate) fn validate(&self) -> Result<()> {
        for (what, v) in [("max age", self.max_age), ("max bytes", self.max_bytes)] {
            if let Some(v) = v
                && !(1..=MAX_RETENTION_LIMIT).contains(&v)
            {
                return Err(Error::InvalidArgument(format!(
                    "retention {what} must be from 1 to {MAX_RETENTION_LIMIT} (got {v})"
                )));
            }
        }
        Ok(())
    }

    /// Encodes the policy: max age `opt<u64>`, max bytes `opt<u64>`.
    pub(crate) fn encode(&self, e: &mut Enc) {
        for v in [self.max_age, self.max_bytes] {
            match v {
                None => e.u8(0),
                Some(v) => {
                    e.u8(1);
                    e.u64(v);
                }
            }
        }
    }

    /// Decodes a policy written by [`RetentionPolicy::encode`]; `None` if malformed.
    pub(crate) fn decode(d: &mut Dec<'_>) -> Option<RetentionPolicy> {
        let mut one = || match d.u8()? {
            0 => Some(None),
            1 => Some(Some(d.u64()?)),
            _ => None,
        };
        Some(RetentionPolicy {
            max_age: one()?,
            max_bytes: one()?,
        })
    }
}

/// What the retention enforcer did since the store was opened (part of
/// [`Stats`](crate::Stats)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionStats {
    /// Enforcement passes over the store's streams.
    pub passes: u64,
    /// Times the age limit moved a stream's earliest offset.
    pub age_runs: u64,
    /// Times the size limit moved a stream's earliest offset.
    pub bytes_runs: u64,
    /// Whole segments dropped from the start of streams.
    pub trimmed_segments: u64,
    /// Bytes (stored representation) the earliest offsets advanced over.
    pub trimmed_bytes: u64,
    /// Times a policy would have trimmed further but the latest snapshot stopped it.
    pub held_by_snapshot: u64,
    /// Times a policy would have trimmed further but a subscription's acknowledged offset
    /// stopped it.
    pub held_by_subscription: u64,
}

/// The enforcer's counters (relaxed atomics), read as [`RetentionStats`].
#[derive(Default)]
pub(crate) struct RetentionCounters {
    pub(crate) passes: AtomicU64,
    pub(crate) age_runs: AtomicU64,
    pub(crate) bytes_runs: AtomicU64,
    pub(crate) trimmed_segments: AtomicU64,
    pub(crate) trimmed_bytes: AtomicU64,
    pub(crate) held_by_snapshot: AtomicU64,
    pub(crate) held_by_subscription: AtomicU64,
}

impl RetentionCounters {
    /// The counters as they stand.
    pub(crate) fn snapshot(&self) -> RetentionStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RetentionStats {
            passes: l(&self.passes),
            age_runs: l(&self.age_runs),
            bytes_runs: l(&self.bytes_runs),
            trimmed_segments: l(&self.trimmed_segments),
            trimmed_bytes: l(&self.trimmed_bytes),
            held_by_snapshot: l(&self.held_by_snapshot),
            held_by_subscription: l(&self.held_by_subscription),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_round_trips_and_fills_from_the_default() {
        for p in [
            RetentionPolicy::new(),
            RetentionPolicy::new().max_age(60),
            RetentionPolicy::new().max_bytes(1 << 20),
            RetentionPolicy::new().max_age(1).max_bytes(2),
        ] {
            let mut e = Enc::default();
            p.encode(&mut e);
            let mut d = Dec::new(&e.buf);
            assert_eq!(RetentionPolicy::decode(&mut d), Some(p));
            assert!(d.buf.is_empty());
        }
        let own = RetentionPolicy::new().max_age(5);
        let all = own.or(RetentionPolicy::new().max_age(9).max_bytes(7));
        assert_eq!(all, RetentionPolicy::new().max_age(5).max_bytes(7));
        assert!(RetentionPolicy::new().max_bytes(0).validate().is_err());
        assert!(own.validate().is_ok());
    }
}
