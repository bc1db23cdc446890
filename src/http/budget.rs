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

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::error::ApiError;
use super::limits::RETRY_AFTER_SECS;

/// The most bytes a lease holds and still counts as small: a small lease may draw on the
/// reserve and is charged to nobody, so the common request (a body of a few KiB that came with
/// its head, an 8 KiB read buffer) pays one atomic update and takes no lock. A lease that grows
/// past it (a large upload, a hyper connection's buffers, a slow reader's queue past its first
/// step) is large: it stays out of the reserve, and when it has an [`Owner`] it is charged to
/// that owner's shares.
pub(crate) const SMALL: u64 = 64 << 10;

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

/// Why a lease was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The whole budget is held.
    Budget,
    /// Only the reserve is left, and the lease is large.
    Reserve,
    /// The lease's peer address holds its share.
    Peer,
    /// The lease's token holds its share.
    Token,
}

impl Cause {
    /// Every cause, in the order of the budget's counters.
    pub(crate) const ALL: [Cause; 4] = [Cause::Budget, Cause::Reserve, Cause::Peer, Cause::Token];

    /// The metrics label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Cause::Budget => "budget",
            Cause::Reserve => "reserve",
            Cause::Peer => "peer",
            Cause::Token => "token",
        }
    }
}

/// Who a large lease is charged to: a key of its peer's address and one of its bearer token,
/// 0 for none. Keys are the budget's keyed hashes ([`Budget::peer`], [`Budget::token`]): a
/// client cannot choose values that collide with another's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The peer's address (an IPv6 peer's /64).
    peer: u64,
    /// The bearer token.
    token: u64,
}

impl Owner {
    /// No one: the lease is charged to no share.
    pub(crate) const NONE: Owner = Owner { peer: 0, token: 0 };

    /// Whether the lease is charged to no share.
    fn is_none(self) -> bool {
        self == Owner::NONE
    }

    /// This owner with `token` (a key from [`Budget::token`]) as its token.
    pub(crate) fn with_token(self, token: u64) -> Owner {
        Owner { token, ..self }
    }
}

/// How a budget is divided: its limit, the reserve only small leases may take, and the share
/// one peer address and one token may hold of large leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The most bytes all leases may hold together.
    pub(crate) limit: u64,
    /// The last bytes of the limit, which only small leases may take.
    pub(crate) reserve: u64,
    /// The most bytes of large leases one peer address may hold.
    pub(crate) per_peer: u64,
    /// The most bytes of large leases one token may hold.
    pub(crate) per_token: u64,
}

impl Shape {
    /// A budget of `limit` with nothing reserved and no shares.
    #[cfg(test)]
    pub(crate) fn flat(limit: u64) -> Shape {
        Shape {
            limit,
            reserve: 0,
            per_peer: limit,
            per_token: limit,
        }
    }
}

/// The bytes of large leases each peer and each token holds now (keys absent at zero).
#[derive(Debug, Default)]
struct Shares {
    peers: HashMap<u64, u64>,
    tokens: HashMap<u64, u64>,
}

/// Adds `n` to `key`'s count in `map`.
fn charge(map: &mut HashMap<u64, u64>, key: u64, n: u64) {
    if key != 0 && n > 0 {
        *map.entry(key).or_insert(0) += n;
    }
}

/// Takes `n` from `key`'s count in `map`, forgetting a key at zero.
fn discharge(map: &mut HashMap<u64, u64>, key: u64, n: u64) {
    if key == 0 || n == 0 {
        return;
    }
    if let Some(held) = map.get_mut(&key) {
        *held = held.saturating_sub(n);
        if *held == 0 {
            map.remove(&key);
        }
    }
}

/// The budget's limit and what each use holds of it.
#[derive(Debug)]
pub(crate) struct Budget {
    /// How it is divided.
    shape: Shape,
    /// Bytes held now, over every use: the one figure leases are checked against.
    total: AtomicU64,
    /// Bytes held now, per use.
    held: [AtomicU64; 3],
    /// Leases refused, per use.
    refused: [AtomicU64; 3],
    /// Leases refused, per [`Cause`].
    causes: [AtomicU64; 4],
    /// Set when a lease is refused for want of room (cause `Budget` or `Reserve`), cleared when
    /// readiness next finds an eighth of what lies outside the reserve free.
    starved: AtomicBool,
    /// What each peer and token holds of large leases; locked only by large leases with an
    /// owner, when they grow or shrink.
    shares: Mutex<Shares>,
    /// The key of the owners' hashes, random per process.
    keys: std::hash::RandomState,
}

impl Budget {
    /// A budget of `limit` bytes with nothing reserved and no shares, none of it held.
    #[cfg(test)]
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Budget::shaped(Shape::flat(limit))
    }

    /// A budget divided as `shape`, none of it held.
    pub(crate) fn shaped(shape: Shape) -> Arc<Budget> {
        Arc::new(Budget {
            shape,
            total: AtomicU64::new(0),
            held: Default::default(),
            refused: Default::default(),
            causes: Default::default(),
            starved: AtomicBool::new(false),
            shares: Mutex::default(),
            keys: std::hash::RandomState::new(),
        })
    }

    /// The limit, in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.shape.limit
    }

    /// How the budget is divided.
    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    /// Bytes `what` holds now.
    pub(crate) fn held(&self, what: Use) -> u64 {
        self.held[what.at()].load(Ordering::Relaxed)
    }

    /// Leases for `what` refused since the server started.
    pub(crate) fn refused(&self, what: Use) -> u64 {
        self.refused[what.at()].load(Ordering::Relaxed)
    }

    /// Leases refused for `cause` since the server started.
    pub(crate) fn refused_for(&self, cause: Cause) -> u64 {
        self.causes[cause as usize].load(Ordering::Relaxed)
    }

    /// Bytes held now, over every use.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether what lies outside the reserve is spent (readiness says so): less than one small
    /// lease of it is left, or a lease was refused for want of room and less than an eighth of
    /// it has been free since. The eighth keeps a server that refuses uploads from reporting
    /// ready between two refusals (each upload's growth needs room in steps of half its size).
    pub(crate) fn exhausted(&self) -> bool {
        let shared = self.shape.limit.saturating_sub(self.shape.reserve);
        let left = shared.saturating_sub(self.total());
        if left < SMALL {
            return true;
        }
        if self.starved.load(Ordering::Relaxed) {
            if left < shared / 8 {
                return true;
            }
            self.starved.store(false, Ordering::Relaxed);
        }
        false
    }

    /// The owner key of a peer at `ip`: the address, or an IPv6 address's /64 (one host holds a
    /// whole /64 as easily as one address).
    pub(crate) fn peer(&self, ip: IpAddr) -> Owner {
        let key = match ip {
            IpAddr::V4(v4) => u128::from(v4.to_bits()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => u128::from(v4.to_bits()),
                None => (v6.to_bits() >> 64) | (1 << 127),
            },
        };
        Owner {
            peer: self.keys.hash_one(key) | 1,
            token: 0,
        }
    }

    /// The owner key of a bearer token.
    pub(crate) fn token(&self, token: &[u8]) -> u64 {
        self.keys.hash_one(token) | 1
    }

    /// Counts a refusal of `what` for `cause`.
    fn refuse(&self, what: Use, cause: Cause) -> Cause {
        if matches!(cause, Cause::Budget | Cause::Reserve) {
            self.starved.store(true, Ordering::Relaxed);
        }
        self.refused[what.at()].fetch_add(1, Ordering::Relaxed);
        self.causes[cause as usize].fetch_add(1, Ordering::Relaxed);
        cause
    }

    /// Adds `n` to the total if it stays within `ceiling`; on refusal, the cause.
    fn add(&self, n: u64, ceiling: u64) -> Result<(), Cause> {
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= ceiling)
            })
            .map(|_| ())
            .map_err(|held| {
                if held.saturating_add(n) > self.shape.limit {
                    Cause::Budget
                } else {
                    Cause::Reserve
                }
            })
    }

    /// Takes `n` more bytes for `what`; `large` when the lease holds more than [`SMALL`] with
    /// them (it may not take the reserve), and `charged` of them charged to `owner`'s shares.
    fn take(
        &self,
        what: Use,
        n: u64,
        large: bool,
        owner: Owner,
        charged: u64,
    ) -> Result<(), Cause> {
        if n == 0 {
            return Ok(());
        }
        let ceiling = if large {
            self.shape.limit.saturating_sub(self.shape.reserve)
        } else {
            self.shape.limit
        };
        let taken = if charged == 0 {
            self.add(n, ceiling)
        } else {
            // The shares and the total change together under the lock, so concurrent leases
            // of one owner never pass its share between them.
            let mut shares = self.shares.lock();
            let over = |map: &HashMap<u64, u64>, key: u64, cap: u64| {
                key != 0 && map.get(&key).copied().unwrap_or(0).saturating_add(charged) > cap
            };
            if over(&shares.peers, owner.peer, self.shape.per_peer) {
                Err(Cause::Peer)
            } else if over(&shares.tokens, owner.token, self.shape.per_token) {
                Err(Cause::Token)
            } else {
                self.add(n, ceiling).map(|()| {
                    charge(&mut shares.peers, owner.peer, charged);
                    charge(&mut shares.tokens, owner.token, charged);
                })
            }
        };
        match taken {
            Ok(()) => {
                self.held[what.at()].fetch_add(n, Ordering::Relaxed);
                Ok(())
            }
            Err(cause) => Err(self.refuse(what, cause)),
        }
    }

    /// Gives `n` bytes of `what` back, `charged` of them to `owner`'s shares.
    fn give(&self, what: Use, n: u64, owner: Owner, charged: u64) {
        if n == 0 {
            return;
        }
        if charged > 0 {
            let mut shares = self.shares.lock();
            discharge(&mut shares.peers, owner.peer, charged);
            discharge(&mut shares.tokens, owner.token, charged);
        }
        self.held[what.at()].fetch_sub(n, Ordering::Relaxed);
        self.total.fetch_sub(n, Ordering::AcqRel);
    }

    /// A lease of `n` bytes for `what`, charged to no one, or 503 `MEMORY_BUDGET` when the
    /// budget cannot spare them.
    #[cfg(test)]
    pub(crate) fn lease(self: &Arc<Self>, what: Use, n: u64) -> Result<Lease, ApiError> {
        self.lease_for(what, n, Owner::NONE)
    }

    /// A lease of `n` bytes for `what`, charged to `owner` once it is large.
    pub(crate) fn lease_for(
        self: &Arc<Self>,
        what: Use,
        n: u64,
        owner: Owner,
    ) -> Result<Lease, ApiError> {
        let mut lease = Lease::empty_for(self, what, owner);
        lease.grow(n)?;
        Ok(lease)
    }

    /// [`Budget::lease_for`], refused with the cause alone.
    pub(crate) fn try_lease_for(
        self: &Arc<Self>,
        what: Use,
        n: u64,
        owner: Owner,
    ) -> Result<Lease, Cause> {
        let mut lease = Lease::empty_for(self, what, owner);
        lease.try_grow(n)?;
        Ok(lease)
    }

    /// What `peer` and `token` hold of large leases now.
    #[cfg(test)]
    fn share_of(&self, owner: Owner) -> (u64, u64) {
        let shares = self.shares.lock();
        (
            shares.peers.get(&owner.peer).copied().unwrap_or(0),
            shares.tokens.get(&owner.token).copied().unwrap_or(0),
        )
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
    /// Who they are charged to once the lease is large.
    owner: Owner,
    /// Bytes charged to the owner's shares: 0 while the lease is small (or has no owner),
    /// else all of `bytes`.
    charged: u64,
}

impl Lease {
    /// A lease holding nothing yet, charged to no one.
    pub(crate) fn empty(budget: &Arc<Budget>, what: Use) -> Lease {
        Lease::empty_for(budget, what, Owner::NONE)
    }

    /// A lease holding nothing yet, charged to `owner` once it is large.
    pub(crate) fn empty_for(budget: &Arc<Budget>, what: Use, owner: Owner) -> Lease {
        Lease {
            budget: budget.clone(),
            what,
            bytes: 0,
            owner,
            charged: 0,
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds `n` more bytes, or answers 503 `MEMORY_BUDGET` (holding what it held before).
    pub(crate) fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        self.try_grow(n)
            .map_err(|cause| over_budget(self.what, cause, &self.budget.shape))
    }

    /// [`Lease::grow`], refused with the cause alone.
    pub(crate) fn try_grow(&mut self, n: u64) -> Result<(), Cause> {
        let after = self.bytes.saturating_add(n);
        let large = after > SMALL;
        // The first growth past SMALL charges all the lease holds; later ones what they add.
        let charged = if self.charged > 0 {
            n
        } else if large && !self.owner.is_none() {
            after
        } else {
            0
        };
        self.budget.take(self.what, n, large, self.owner, charged)?;
        self.bytes = after;
        self.charged += charged;
        Ok(())
    }

    /// Holds exactly `n` bytes: gives back what is above it, or takes what is missing (`Err`,
    /// holding what it held before, when the budget cannot spare it).
    pub(crate) fn resize(&mut self, n: u64) -> Result<(), ApiError> {
        match n.cmp(&self.bytes) {
            std::cmp::Ordering::Greater => self.grow(n - self.bytes),
            std::cmp::Ordering::Less => {
                let back = self.bytes - n;
                let discharged = if self.charged > 0 { back } else { 0 };
                self.budget.give(self.what, back, self.owner, discharged);
                self.bytes = n;
                self.charged -= discharged;
                Ok(())
            }
            std::cmp::Ordering::Equal => Ok(()),
        }
    }
}

impl Drop for Lease {
    /// Gives every byte held back.
    fn drop(&mut self) {
        self.budget
            .give(self.what, self.bytes, self.owner, self.charged);
    }
}

/// 503 `MEMORY_BUDGET`: the budget (divided as `shape`) cannot spare what a request needs for
/// `what`, for `cause`.
pub(crate) fn over_budget(what: Use, cause: Cause, shape: &Shape) -> ApiError {
    let doing = match what {
        Use::Bodies => "read this request's body",
        Use::Queued => "queue this response",
        Use::Buffers => "buffer this connection",
    };
    let why = match cause {
        Cause::Budget => format!(
            "this server's memory budget ({} bytes) is spent",
            shape.limit
        ),
        Cause::Reserve => format!(
            "only the reserve of this server's memory budget ({} of {} bytes, kept for small \
             requests) is left",
            shape.reserve, shape.limit
        ),
        Cause::Peer => format!(
            "this client's address holds its share of the memory budget ({} bytes)",
            shape.per_peer
        ),
        Cause::Token => format!(
            "this token holds its share of the memory budget ({} bytes)",
            shape.per_token
        ),
    };
    ApiError::Unavailable {
        code: "MEMORY_BUDGET",
        detail: format!(
            "{why}: it cannot spare what it needs to {doing}; nothing was written; retry later"
        ),
        retry_after: RETRY_AFTER_SECS,
    }
}

/// The most a body of `n` bytes holds of the budget while it is read (`body::read_body`): its
/// buffer, and the buffer before it while the bytes move to the last (half as large), plus a
/// frame's worth.
pub(crate) fn body_peak(n: u64) -> u64 {
    n + n / 2 + (1 << 20)
}

/// How the budget of `config` is divided on a store whose largest append is `max_body` bytes
/// (see the fields of [`ServerConfig`](super::ServerConfig) for the defaults' reasons).
pub(crate) fn shape(config: &super::ServerConfig, max_body: u64) -> Shape {
    let limit = config.max_memory;
    let reserve = config.memory_reserve.unwrap_or(limit / 8).min(limit);
    let outside = limit - reserve;
    let share = (limit / 4).max(body_peak(max_body)).min(outside);
    Shape {
        limit,
        reserve,
        per_peer: config.max_memory_per_peer.unwrap_or(share),
        per_token: config
            .max_memory_per_token
            .or(config.max_memory_per_peer)
            .unwrap_or(share),
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

    /// Large leases stay out of the reserve while small ones may take it; a large lease with an
    /// owner is charged to its peer's and its token's shares, refused past either, and gives
    /// them back when it shrinks or ends.
    #[test]
    fn large_leases_leave_the_reserve_and_keep_to_their_shares() {
        const K: u64 = 1 << 10;
        let budget = Budget::shaped(Shape {
            limit: 1024 * K,
            reserve: 256 * K,
            per_peer: 512 * K,
            per_token: 300 * K,
        });
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        let alice = budget.peer(ip("10.0.0.1"));
        let bob = budget.peer(ip("10.0.0.2"));
        let mut a = budget
            .lease_for(Use::Bodies, 500 * K, alice)
            .expect("within alice's share");
        assert_eq!(budget.share_of(alice).0, 500 * K);
        assert_eq!(a.try_grow(20 * K), Err(Cause::Peer));
        // Bob's token holds its share: his address has room, the token has none.
        let bob_token = bob.with_token(budget.token(b"bob"));
        let b = budget
            .lease_for(Use::Bodies, 268 * K, bob_token)
            .expect("768 KiB: all of what lies outside the reserve");
        assert!(budget.exhausted());
        assert_eq!(
            budget.try_lease_for(Use::Bodies, 70 * K, bob_token).err(),
            Some(Cause::Token),
            "268 + 70 KiB: past the token's share before the reserve is even asked"
        );
        assert_eq!(
            budget.try_lease_for(Use::Bodies, 100 * K, bob).err(),
            Some(Cause::Reserve)
        );
        // Small leases, charged to no one, take the reserve.
        let small: Vec<Lease> = (0..4)
            .map(|_| budget.lease_for(Use::Bodies, SMALL, bob).expect("small"))
            .collect();
        assert_eq!(
            budget.share_of(bob).0,
            268 * K,
            "small leases are charged to nobody"
        );
        assert_eq!(
            budget.try_lease_for(Use::Buffers, 1, Owner::NONE).err(),
            Some(Cause::Budget)
        );
        assert_eq!(budget.refused_for(Cause::Reserve), 1);
        assert_eq!(budget.refused_for(Cause::Budget), 1);
        assert_eq!(budget.refused_for(Cause::Peer), 1);
        assert_eq!(budget.refused_for(Cause::Token), 1);
        drop(small);
        a.resize(10 * K).expect("shrinking");
        assert_eq!(
            budget.share_of(alice).0,
            10 * K,
            "a shrunk lease stays charged"
        );
        drop((a, b));
        assert_eq!(budget.share_of(alice), (0, 0));
        assert_eq!(budget.share_of(bob_token), (0, 0));
        assert!(budget.shares.lock().peers.is_empty());
        assert_eq!(budget.total(), 0);
        // An IPv6 peer is its /64; an IPv4-mapped one its IPv4 address.
        assert_eq!(
            budget.peer(ip("2001:db8::1")),
            budget.peer(ip("2001:db8::ffff:2"))
        );
        assert_ne!(
            budget.peer(ip("2001:db8::1")),
            budget.peer(ip("2001:db8:0:1::1"))
        );
        assert_eq!(budget.peer(ip("::ffff:10.0.0.1")), alice);
    }

    /// The default shares: a quarter of the budget, or one largest append's peak if more, never
    /// past what lies outside the reserve.
    #[test]
    fn the_default_shape_fits_one_largest_append() {
        let config = |max_memory| super::super::ServerConfig {
            max_memory,
            ..super::super::ServerConfig::default()
        };
        let s = shape(&config(192 << 20), 64 << 20);
        assert_eq!(s.reserve, 24 << 20);
        assert_eq!(s.per_peer, (96 << 20) + (1 << 20));
        assert_eq!(s.per_token, s.per_peer);
        let s = shape(&config(192 << 20), 1 << 20);
        assert_eq!(s.per_peer, 48 << 20);
        let s = shape(&config(32 << 20), 64 << 20);
        assert_eq!(
            s.per_peer,
            28 << 20,
            "at most what lies outside the reserve"
        );
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
