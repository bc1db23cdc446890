//! The server's memory budget: one limit ([`ServerConfig::max_memory`](super::ServerConfig))
//! on the heap bytes that clients can make the server hold, whoever they are.
//!
//! Three uses draw on it, each counted on its own for the metrics:
//!
//! * [`Use::Bodies`]: request bodies being read (an append's body is held whole until it is
//!   written; a snapshot upload only the few frames in flight to its temporary file);
//! * [`Use::Queued`]: response bytes rendered for a reader and not yet taken by its socket
//!   (SSE and bootstrap frames waiting for a slow reader);
//! * [`Use::Buffers`]: the connections' own read buffers.
//!
//! A use takes a [`Lease`] before it holds the bytes, never after, and the lease gives them
//! back when dropped. A lease that would take the total past the limit is refused: the request
//! is answered 503 `MEMORY_BUDGET` with `Retry-After` (problem+json) before its bytes are read
//! or rendered, so the server never grows past its budget to serve one more request. What is
//! not counted: bodies that are views of the store's files (catch-up reads are mapped page
//! cache, sent by `sendfile`), and the engine's own buffers (bounded by the store's options).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::ApiError;
use super::limits::RETRY_AFTER_SECS;

/// What a lease holds bytes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Request bodies being read.
    Bodies,
    /// Response bytes waiting for a slow reader.
    Queued,
    /// Connections' read buffers.
    Buffers,
}

impl Use {
    /// Every use, in the order of the budget's counters.
    pub(crate) const ALL: [Use; 3] = [Use::Bodies, Use::Queued, Use::Buffers];

    /// The metrics label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Use::Bodies => "request_bodies",
            Use::Queued => "queued_writes",
            Use::Buffers => "connection_buffers",
        }
    }

    /// The index of this use's counters.
    fn at(self) -> usize {
        self as usize
    }
}

/// The budget's limit and what each use holds of it.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The most bytes all leases may hold together.
    limit: u64,
    /// Bytes held now, over every use: the one figure leases are checked against.
    total: AtomicU64,
    /// Bytes held now, per use.
    held: [AtomicU64; 3],
    /// Leases refused, per use.
    refused: [AtomicU64; 3],
}

impl Budget {
    /// A budget of `limit` bytes, none of it held.
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            total: AtomicU64::new(0),
            held: Default::default(),
            refused: Default::default(),
        })
    }

    /// The limit, in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes `what` holds now.
    pub(crate) fn held(&self, what: Use) -> u64 {
        self.held[what.at()].load(Ordering::Relaxed)
    }

    /// Leases for `what` refused since the server started.
    pub(crate) fn refused(&self, what: Use) -> u64 {
        self.refused[what.at()].load(Ordering::Relaxed)
    }

    /// Takes `n` more bytes for `what` if the total stays within the limit.
    fn take(&self, what: Use, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        let taken = self
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok();
        if taken {
            self.held[what.at()].fetch_add(n, Ordering::Relaxed);
        } else {
            self.refused[what.at()].fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Gives `n` bytes of `what` back.
    fn give(&self, what: Use, n: u64) {
        if n == 0 {
            return;
        }
        self.held[what.at()].fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::AcqRel);
    }

    /// A lease of `n` bytes for `what`, or 503 `MEMORY_BUDGET` when the budget cannot spare
    /// them.
    pub(crate) fn lease(self: &Arc<Self>, what: Use, n: u64) -> Result<Lease, ApiError> {
        let mut lease = Lease::empty(self, what);
        lease.grow(n)?;
        Ok(lease)
    }
}

/// Bytes held of a [`Budget`] for one use, given back when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The budget the bytes are held of.
    budget: Arc<Budget>,
    /// What they are held for.
    what: Use,
    /// How many are held.
    bytes: u64,
}

impl Lease {
    /// A lease holding nothing yet.
    pub(crate) fn empty(budget: &Arc<Budget>, what: Use) -> Lease {
        Lease {
            budget: budget.clone(),
            what,
            bytes: 0,
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `n` more bytes, or answers 503 `MEMORY_BUDGET` (holding what it held before).
    pub(crate) fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        if self.budget.take(self.what, n) {
            self.bytes += n;
            Ok(())
        } else {
            Err(over_budget(self.what, self.budget.limit))
        }
    }

    /// Holds exactly `n` bytes: gives back what is above it, or takes what is missing (`Err`,
    /// holding what it held before, when the budget cannot spare it).
    pub(crate) fn resize(&mut self, n: u64) -> Result<(), ApiError> {
        match n.cmp(&self.bytes) {
            std::cmp::Ordering::Greater => self.grow(n - self.bytes),
            std::cmp::Ordering::Less => {
                self.budget.give(self.what, self.bytes - n);
                self.bytes = n;
                Ok(())
            }
            std::cmp::Ordering::Equal => Ok(()),
        }
    }
}

impl Drop for Lease {
    /// Gives every byte held back.
    fn drop(&mut self) {
        self.budget.give(self.what, self.bytes);
    }
}

/// 503 `MEMORY_BUDGET`: the budget cannot spare what a request needs for `what`.
pub(crate) fn over_budget(what: Use, limit: u64) -> ApiError {
    let doing = match what {
        Use::Bodies => "read this request's body",
        Use::Queued => "queue this response",
        Use::Buffers => "buffer this connection",
    };
    ApiError::Unavailable {
        code: "MEMORY_BUDGET",
        detail: format!(
            "this server's memory budget ({limit} bytes) cannot spare what it needs to {doing}; \
             nothing was written; retry later"
        ),
        retry_after: RETRY_AFTER_SECS,
    }
}

/// The default budget on a machine with `physical` bytes of memory: an eighth of it, between
/// 32 MiB and 192 MiB.
pub(crate) fn default_limit(physical: Option<u64>) -> u64 {
    const MIN: u64 = 32 << 20;
    const MAX: u64 = 192 << 20;
    physical.map_or(MAX, |p| (p / 8).clamp(MIN, MAX))
}

/// The machine's physical memory, from `/proc/meminfo` (`None` where there is none).
pub(crate) fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leases are refused past the limit, whatever their use, and give their bytes back when
    /// dropped or shrunk.
    #[test]
    fn leases_stay_within_the_limit() {
        let budget = Budget::new(100);
        let a = budget.lease(Use::Bodies, 60).expect("60 of 100");
        let mut b = budget.lease(Use::Queued, 40).expect("100 of 100");
        let refused = budget.lease(Use::Buffers, 1).expect_err("101 of 100");
        assert_eq!(refused.code(), "MEMORY_BUDGET");
        assert_eq!(budget.refused(Use::Buffers), 1);
        assert_eq!(budget.held(Use::Bodies), 60);
        b.resize(10).expect("shrinking always succeeds");
        assert_eq!(budget.held(Use::Queued), 10);
        let c = budget.lease(Use::Buffers, 30).expect("100 of 100 again");
        assert!(b.grow(1).is_err(), "the budget is full");
        assert_eq!(b.bytes(), 10, "a refused growth keeps what was held");
        drop((a, c));
        assert_eq!(budget.held(Use::Bodies), 0);
        assert_eq!(budget.held(Use::Buffers), 0);
        b.grow(90).expect("100 of 100 once the others are gone");
        drop(b);
        assert_eq!(budget.total.load(Ordering::Relaxed), 0);
    }

    /// The default is an eighth of the machine, bounded.
    #[test]
    fn the_default_follows_the_machine() {
        assert_eq!(default_limit(Some(24 << 30)), 192 << 20);
        assert_eq!(default_limit(Some(1 << 30)), 128 << 20);
        assert_eq!(default_limit(Some(64 << 20)), 32 << 20);
        assert_eq!(default_limit(None), 192 << 20);
    }
}
