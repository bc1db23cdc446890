//! Subscriptions (PROTOCOL.md sections 6 and 7): durable cursors over a set of streams that
//! wake a worker when the streams hold data it has not acknowledged.
//!
//! A subscription links streams explicitly ([`SubscriptionConfig::stream`]) or by a glob
//! ([`SubscriptionConfig::pattern`]: `*` is one path segment, `**` zero or more) and keeps one
//! acknowledged offset per linked stream. When a linked stream's tail passes its acknowledged
//! offset and no wake is in flight, the store issues a [`Wake`]: a new generation, a fresh wake
//! id and the tails of the linked streams with pending work (never every link). A pull-wake subscription announces it with a JSON event on
//! its wake stream and waits for a worker to [`Store::claim`](crate::Store::claim) it; a
//! webhook subscription has it delivered by the server (`brook serve`).
//!
//! Every change to a subscription (its configuration, links, acknowledged offsets, wakes and
//! leases) is durable when the call that made it returns, as an append is, and costs what it
//! changes, not the size of the subscription.
//!
//! A subscription's id is unique under its root: the [`Store`](crate::Store) calls name it by
//! its path, the root followed by the id ([`SubscriptionInfo::path`]).

use std::time::{Duration, SystemTime};

use crate::name::{Offset, StreamName};

/// The default lease of a wake: 30 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// The shortest lease a subscription may ask for: 1 s.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
/// The longest lease a subscription may ask for: 10 minutes.
pub const MAX_LEASE_TTL: Duration = Duration::from_mins(10);
/// The longest subscription id: 256 bytes (printable ASCII, no `/`).
pub const MAX_SUBSCRIPTION_ID_LEN: usize = 256;

/// How a subscription's wakes reach a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryKind {
    /// The server POSTs each wake, signed, to `url` (delivered by `brook serve` only).
    Webhook {
        /// The receiver's URL.
        url: String,
    },
    /// Each wake is announced by a JSON event appended to `wake_stream` (which the application
    /// creates); workers claim the wake.
    PullWake {
        /// The stream wake events go to.
        wake_stream: StreamName,
    },
}

/// What a subscription is: how it delivers, which streams it follows, its lease.
///
/// Two configurations are the same subscription when every field but `base_url` is equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionConfig {
    /// Webhook or pull-wake.
    pub delivery: DeliveryKind,
    /// A glob over stream paths relative to `root`.
    pub pattern: Option<String>,
    /// Streams linked explicitly, sorted and without duplicates.
    pub streams: Vec<StreamName>,
    /// How long a claimed (or delivered) wake stays leased without a heartbeat.
    pub lease_ttl: Duration,
    /// A human-readable description.
    pub description: Option<String>,
    /// The stream root the subscription's paths are relative to: `""` for the store's root, or a
    /// prefix ending in `/` (the HTTP server uses the path before `__ds/`).
    pub root: String,
    /// Where callbacks for this subscription are addressed (the server sets it from the
    /// creating request's host and root); not part of the subscription's identity.
    pub base_url: Option<String>,
}

impl SubscriptionConfig {
    /// A pull-wake subscription announcing its wakes on `wake_stream`, with no streams yet.
    #[must_use]
    pub fn pull_wake(wake_stream: StreamName) -> Self {
        Self::with(DeliveryKind::PullWake { wake_stream })
    }

    /// A webhook subscription delivering to `url`, with no streams yet.
    #[must_use]
    pub fn webhook(url: impl Into<String>) -> Self {
        Self::with(DeliveryKind::Webhook { url: url.into() })
    }

    fn with(delivery: DeliveryKind) -> Self {
        SubscriptionConfig {
            delivery,
            pattern: None,
            streams: Vec::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            description: None,
            root: String::new(),
            base_url: None,
        }
    }

    /// Follows every stream whose path (relative to the root) matches `glob`.
    #[must_use]
    pub fn pattern(mut self, glob: impl Into<String>) -> Self {
        self.pattern = Some(glob.into());
        self
    }

    /// Follows `stream` explicitly.
    #[must_use]
    pub fn stream(mut self, stream: StreamName) -> Self {
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
            self.streams.sort();
        }
        self
    }

    /// Sets the lease (1 s to 10 minutes).
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Sets the description.
    #[must_use]
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// Sets the root that paths are relative to (`""` or a prefix ending in `/`).
    #[must_use]
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The configuration without its `base_url`, for comparing identities.
    pub(crate) fn identity(&self) -> SubscriptionConfig {
        SubscriptionConfig {
            base_url: None,
            ..self.clone()
        }
    }
}

/// Why a stream is linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkType {
    /// It matches the subscription's pattern.
    Glob,
    /// It was named explicitly (which wins when both hold).
    Explicit,
}

impl LinkType {
    /// `glob` or `explicit`, as the protocol names them.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkType::Glob => "glob",
            LinkType::Explicit => "explicit",
        }
    }
}

/// One linked stream and how far the subscription has processed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The stream.
    pub stream: StreamName,
    /// Why it is linked.
    pub link_type: LinkType,
    /// Everything before this offset is processed.
    pub acked: Offset,
}

/// One linked stream in a wake's snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WakeStream {
    /// The stream.
    pub stream: StreamName,
    /// Why it is linked.
    pub link_type: LinkType,
    /// Everything before this offset is processed.
    pub acked: Offset,
    /// The stream's durable tail when the snapshot was taken.
    pub tail: Offset,
}

impl WakeStream {
    /// Whether the stream held unacknowledged data when the snapshot was taken.
    pub fn has_pending(&self) -> bool {
        self.tail > self.acked
    }
}

/// Whether delivery is working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubscriptionStatus {
    /// Delivery is operating normally.
    Active,
    /// A webhook delivery failed and a retry is scheduled.
    Failed,
}

impl SubscriptionStatus {
    /// `active` or `failed`, as the protocol names them.
    pub fn as_str(self) -> &'static str {
        match self {
            SubscriptionStatus::Active => "active",
            SubscriptionStatus::Failed => "failed",
        }
    }
}

/// A subscription as it stands.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SubscriptionInfo {
    /// Its id (unique under its root: [`SubscriptionInfo::path`] names it in the store).
    pub id: String,
    /// Its configuration.
    pub config: SubscriptionConfig,
    /// Its linked streams, by name.
    pub links: Vec<Link>,
    /// When it was created.
    pub created_at: SystemTime,
    /// Whether delivery is working.
    pub status: SubscriptionStatus,
    /// The generation of the newest wake (0 before the first).
    pub generation: u64,
    /// The current wake, if one is in flight or leased.
    pub wake: Option<Wake>,
    /// Who holds the current wake's lease.
    pub holder: Option<String>,
}

impl SubscriptionInfo {
    /// The subscription's path: its root followed by its id (`v1/orders`; `orders` under the
    /// store's root), which the [`Store`](crate::Store) calls take to name it.
    pub fn path(&self) -> String {
        format!("{}{}", self.config.root, self.id)
    }
}

/// A wake: one generation of a subscription's work, with the tails it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wake {
    /// The subscription's path (its root followed by its id; see [`SubscriptionInfo::path`]).
    pub subscription: String,
    /// Unique per wake.
    pub wake_id: String,
    /// The subscription's fencing counter; grows with every wake.
    pub generation: u64,
    /// The linked streams with pending work when the wake was issued or claimed, with their
    /// acknowledged offsets and tails: at most 1000 (the rest come with the next wake), never
    /// the links with nothing pending.
    pub streams: Vec<WakeStream>,
    /// How long the lease lasts without a heartbeat.
    pub lease_ttl: Duration,
}

/// The answer to a finished ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AckOutcome {
    /// Whether work remained, so that a new wake was issued.
    pub next_wake: bool,
}

/// Which wake an ack, a release or a delivery is for: its subscription, generation and wake
/// id, as a [`Wake`] carries them (`WakeRef::from(&wake)`) or a callback token names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeRef<'a> {
    /// The subscription's path (its root followed by its id).
    pub subscription: &'a str,
    /// The wake's generation.
    pub generation: u64,
    /// The wake's id.
    pub wake_id: &'a str,
}

impl<'a> From<&'a Wake> for WakeRef<'a> {
    fn from(w: &'a Wake) -> WakeRef<'a> {
        WakeRef {
            subscription: &w.subscription,
            generation: w.generation,
            wake_id: &w.wake_id,
        }
    }
}

/// A webhook wake due for a delivery attempt, from
/// [`Store::take_webhook_jobs`](crate::Store::take_webhook_jobs): the wake and where it goes.
/// The store holds no webhook client: the program that takes the job sends it (`brook serve`
/// signs and POSTs it) and reports how it ended with
/// [`Store::record_webhook`](crate::Store::record_webhook).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WebhookJob {
    /// The receiver's URL.
    pub url: String,
    /// The wake to deliver.
    pub wake: Wake,
    /// The subscription's root (paths in the body are relative to it; the wake's
    /// `subscription` is this root followed by the id).
    pub root: String,
    /// The base URL callbacks are addressed at.
    pub base_url: Option<String>,
}

/// How a webhook delivery attempt ended, for
/// [`Store::record_webhook`](crate::Store::record_webhook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookResult {
    /// The receiver answered 2xx with `{"done": true}`: the wake's tails are acknowledged and
    /// the wake ends (a new one follows if work remains).
    Done,
    /// It answered another 2xx: it took the wake and will call back (ack or release); the
    /// wake's lease starts now.
    Accepted,
    /// No 2xx in time: the subscription is marked failed and a retry is scheduled (1 s
    /// doubling to 60 s, 20% jitter either way; the schedule is durable).
    Failed,
}
