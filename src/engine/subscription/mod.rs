//! Subscriptions as engine state (DESIGN.md section 15).
//!
//! Every subscription change is one JSON record appended, durably, to the system stream
//! `__ds/subscriptions` before it takes effect in memory. A create writes the subscription's
//! whole state (a `sub` record); every later change writes only what it changes (a delta
//! record: new or changed links, removed links, acknowledged offsets, the delivery state of
//! [`Delivery`]), which is applied by [`Sub::apply`] both when it is made and when it is
//! replayed, so a change costs what it changes and not the size of the subscription. The system
//! stream is an ordinary brook stream, so these records go through the shard journals, group
//! commit, checkpoints and recovery like any append. Once the records since the last snapshot
//! outweigh it (and at least [`COMPACT_MIN_BYTES`]), the whole state is published as a snapshot
//! of that stream at its tail and retention moves there, so opening a store reads one snapshot
//! and at most about as many bytes of records after it: it does not scan streams.
//!
//! A subscription is keyed by its path: its root followed by its id (`alice/` and `orders` are
//! `alice/orders`; the id alone under the store's root). Ids hold no `/` and roots are empty or
//! end in `/`, so the path names one (root, id) pair, and two roots may use the same id.
//!
//! Appends reach this module through [`Hook`]: the shard thread calls [`Hook::touched`] for every
//! stream a batch published, which returns after one relaxed atomic load while no subscription
//! exists. Otherwise the name is queued for the subscription thread, which links newly created
//! streams that match a pattern (at their start), issues wakes, expires leases and appends
//! pull-wake events.
//!
//! Pending work is found without looking at every link: each subscription keeps, in memory,
//! the links that may have data past their acknowledged offset (`Sub::candidates`), and a wake,
//! a claim or an ack looks only at those and at the touched streams not yet taken by the thread.
//! Invariant: a link whose stream's tail is past its acknowledged offset is a candidate, or its
//! stream is in the hook's queue. New links enter as candidates (they may have been appended to
//! while they were being made), every touched linked stream becomes one, and a candidate leaves
//! only when its tail was seen at or behind its acknowledged offset (or the stream was gone).
//!
//! Lock order: `state` is taken before any stream lock (appends to the system stream and to
//! wake streams are made while holding it); [`Hook`]'s queue and filter are leaves. The thread
//! takes the queue's names while holding `state`, so a caller holding `state` sees every
//! published name either in the queue or among the candidates.
//!
//! This module holds the state (`Sub`, `State`), its records and their recovery, and
//! creating, linking and deleting subscriptions; the rest by behaviour:
//!
//! | module | what |
//! |---|---|
//! | `hook` | the append path's view: whether any subscription exists, the touched-stream queue |
//! | `thread` | the subscription thread: new links, lease expiry, issuing and announcing wakes |
//! | `lease` | the pull-wake worker's calls: claim, ack, release, wait for work |
//! | `delivery` | webhook delivery state: due jobs, results, the retry schedule |
//! | `codec` | the system stream's JSON records and snapshot |
//! | `glob` | stream patterns: `*`, `**`, literal prefixes |

mod codec;
mod delivery;
pub(crate) mod glob;
mod hook;
mod lease;
mod thread;

pub(crate) use hook::Hook;
use thread::subscription_thread;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;

use super::Engine;
use crate::error::{Error, Result};
use crate::name::ReadFrom;
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{
    DeliveryKind, Link, LinkType, MAX_LEASE_TTL, MAX_SUBSCRIPTION_ID_LEN, MIN_LEASE_TTL,
    SubscriptionConfig, SubscriptionInfo, SubscriptionStatus, Wake, WakeStream,
};
use crate::types::{AppendRequest, CreateOptions, ReadRequest};

/// The system stream holding the subscription records.
pub(crate) const SYSTEM_STREAM: &str = "__ds/subscriptions";
/// The least record bytes since the last snapshot before the state is snapshotted again: 256
/// KiB, about a thousand small records. Past it, the state is snapshotted once the records
/// outweigh the last snapshot, so the snapshots written cost at most as much again as the
/// records, and an open replays at most about a snapshot's worth of records.
pub(crate) const COMPACT_MIN_BYTES: u64 = 256 << 10;
/// The most streams one wake names: 1000. A wake names the linked streams with pending work
/// (never every link); past this many the rest wait for the next wake (issued as soon as this
/// one ends), taken from the name after this wake's last, so every stream has its turn and a
/// claim or webhook body stays under about 200 KiB.
pub(crate) const MAX_WAKE_STREAMS: usize = 1000;
/// How often the subscription thread looks at leases and retries when nothing else wakes it.
const TICK: Duration = Duration::from_millis(100);
/// After a pass over published streams, how long the subscription thread lets the next ones
/// gather before it looks again (a wake follows an append by at most about this much).
const LINGER: Duration = Duration::from_millis(5);

/// One linked stream's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LinkRec {
    explicit: bool,
    glob: bool,
    acked: Offset,
}

/// The current wake of a subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WakeRec {
    id: String,
    /// The linked streams with pending work when the wake was issued, with their tails (a
    /// claim refreshes them), at most [`MAX_WAKE_STREAMS`]. Records written before brook
    /// recorded only these hold every link; the view shows them all, as it did then.
    tails: Vec<(StreamName, Offset)>,
    /// The worker holding the lease (pull-wake).
    holder: Option<String>,
    /// When the lease ends (ms since the epoch); leases run once claimed (pull-wake) or once
    /// delivered (webhook).
    lease_until: Option<u64>,
    /// A webhook receiver accepted the wake.
    delivered: bool,
}

/// What wakes, claims, leases and webhook results change: written whole by each such change
/// (small, as a wake names only streams with pending work).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Delivery {
    generation: u64,
    wake: Option<WakeRec>,
    /// The last webhook delivery attempt failed.
    failed: bool,
    attempts: u32,
    next_attempt_at: u64,
}

/// A subscription's state.
#[derive(Clone, Debug)]
pub(super) struct Sub {
    id: String,
    config: SubscriptionConfig,
    created_at: u64,
    links: BTreeMap<StreamName, LinkRec>,
    d: Delivery,
    /// In memory only: the links whose stream may hold data past its acknowledged offset (the
    /// module's invariant). Every link after a load or a create.
    candidates: BTreeSet<StreamName>,
    /// In memory only: the last stream the previous wake named, where the next one starts
    /// looking (so a wake of [`MAX_WAKE_STREAMS`] takes every stream in turn).
    resume_after: Option<StreamName>,
    /// In memory only: the subscription thread should look for pending work at its next pass
    /// (set when links were made outside it).
    recheck: bool,
    /// In memory only: the log said the subscription is at its link limit (said again after a
    /// link is removed).
    limit_logged: bool,
}

/// One change to a subscription after its create, as one delta record holds it. Applied by
/// [`Sub::apply`] in this order: removed links, new or changed links, acknowledged offsets,
/// the delivery state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Delta {
    /// The record's `e`: `link`, `ack` or `wake`, naming what made it (replay does not
    /// depend on it).
    kind: &'static str,
    links: Vec<(StreamName, LinkRec)>,
    unlink: Vec<StreamName>,
    acks: Vec<(StreamName, Offset)>,
    delivery: Option<Delivery>,
}

impl Delta {
    fn wake(delivery: Delivery) -> Delta {
        Delta {
            kind: "wake",
            delivery: Some(delivery),
            ..Delta::default()
        }
    }
}

/// The subscriptions of a store.
pub(crate) struct Subscriptions {
    /// Shared with the shards.
    pub(crate) hook: Arc<Hook>,
    state: Mutex<State>,
    /// Notified whenever a wake is issued or cleared, so waiting workers and the webhook
    /// deliverer look again.
    pub(crate) changed: event_listener::Event,
}

#[derive(Default)]
struct State {
    /// By path (root and id).
    subs: BTreeMap<String, Sub>,
    /// Bytes of records appended since the last snapshot (or since the stream began).
    since_snapshot: u64,
    /// Bytes of the last snapshot.
    snapshot_bytes: u64,
    /// Webhook wakes handed to a delivery task and not yet answered, by path (in memory only:
    /// after a restart every undelivered wake is delivered again).
    sending: HashSet<String>,
    /// The system stream exists (it is created with the first subscription).
    system_stream: bool,
}

impl State {
    /// The subscription at `path`; `SubscriptionNotFound` when there is none.
    fn sub(&self, path: &str) -> Result<&Sub> {
        self.subs.get(path).ok_or(Error::SubscriptionNotFound)
    }

    /// [`State::sub`], to change.
    fn sub_mut(&mut self, path: &str) -> Result<&mut Sub> {
        self.subs.get_mut(path).ok_or(Error::SubscriptionNotFound)
    }
}

impl Subscriptions {
    /// Empty; [`Engine::start_subscriptions`] loads the durable state.
    pub(crate) fn new(hook: Arc<Hook>) -> Self {
        Subscriptions {
            hook,
            state: Mutex::new(State::default()),
            changed: event_listener::Event::new(),
        }
    }
}

fn system_stream() -> StreamName {
    StreamName(SYSTEM_STREAM.into())
}

fn invalid(what: impl Into<String>) -> Error {
    Error::InvalidArgument(what.into())
}

/// The path of the subscription `id` under `root`: the key it is stored and addressed by.
pub(crate) fn sub_path(root: &str, id: &str) -> String {
    format!("{root}{id}")
}

/// A wake id: `w_` and 96 bits of a hash of the time, a counter, the process and the
/// subscription's path.
fn new_wake_id(path: &str) -> String {
    use sha2::Digest;
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = sha2::Sha256::new();
    h.update(t.to_le_bytes());
    h.update(n.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(path.as_bytes());
    format!("w_{}", super::hex(&h.finalize()[..12]))
}

/// Checks a configuration before it is stored.
fn validate(id: &str, config: &SubscriptionConfig) -> Result<()> {
    if id.is_empty()
        || id.len() > MAX_SUBSCRIPTION_ID_LEN
        || !id.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
    {
        return Err(invalid(format!(
            "a subscription id is 1 to {MAX_SUBSCRIPTION_ID_LEN} printable ASCII bytes without '/'"
        )));
    }
    if config.pattern.is_none() && config.streams.is_empty() {
        return Err(invalid("a subscription needs a pattern or streams"));
    }
    if let Some(p) = &config.pattern
        && !glob::valid(p)
    {
        return Err(invalid(format!("invalid pattern {p:?}")));
    }
    if !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&config.lease_ttl) {
        return Err(invalid("lease_ttl must be from 1 s to 10 minutes"));
    }
    if !(config.root.is_empty() || config.root.ends_with('/')) {
        return Err(invalid("a subscription root is empty or ends in '/'"));
    }
    if let DeliveryKind::Webhook { url } = &config.delivery
        && url.is_empty()
    {
        return Err(invalid("a webhook subscription needs a URL"));
    }
    Ok(())
}

impl Sub {
    /// A new subscription with no links and no wake.
    fn new(id: String, config: SubscriptionConfig, created_at: u64) -> Sub {
        Sub {
            id,
            config,
            created_at,
            links: BTreeMap::new(),
            d: Delivery::default(),
            candidates: BTreeSet::new(),
            resume_after: None,
            recheck: false,
            limit_logged: false,
        }
    }

    /// Its path: the key it is stored by.
    fn path(&self) -> String {
        sub_path(&self.config.root, &self.id)
    }

    fn matches(&self, name: &StreamName) -> bool {
        let Some(pattern) = &self.config.pattern else {
            return false;
        };
        if let DeliveryKind::PullWake { wake_stream } = &self.config.delivery
            && wake_stream == name
        {
            return false;
        }
        name.as_str()
            .strip_prefix(self.config.root.as_str())
            .is_some_and(|rel| glob::matches(pattern, rel))
    }

    /// Applies `delta` (made now, or replayed), returning the streams whose explicit link it
    /// made (`true`) or ended (`false`), for the hook's filter. Acks for streams not linked are
    /// skipped (a record only acks linked streams; replay stays total).
    fn apply(&mut self, delta: &Delta) -> Vec<(StreamName, bool)> {
        let mut explicit = Vec::new();
        if !delta.unlink.is_empty() {
            self.limit_logged = false;
        }
        for name in &delta.unlink {
            if let Some(old) = self.links.remove(name) {
                self.candidates.remove(name);
                if old.explicit {
                    explicit.push((name.clone(), false));
                }
            }
        }
        for (name, link) in &delta.links {
            let was = self.links.insert(name.clone(), link.clone());
            let was_explicit = was.is_some_and(|l| l.explicit);
            if was_explicit != link.explicit {
                explicit.push((name.clone(), link.explicit));
            }
            self.candidates.insert(name.clone());
        }
        for (name, offset) in &delta.acks {
            if let Some(l) = self.links.get_mut(name) {
                l.acked = *offset;
            }
        }
        if let Some(d) = &delta.delivery {
            if let Some(last) = d.wake.as_ref().and_then(|w| w.tails.last()) {
                self.resume_after = Some(last.0.clone());
            }
            self.d = d.clone();
        }
        explicit
    }

    fn status(&self) -> SubscriptionStatus {
        if self.d.failed {
            SubscriptionStatus::Failed
        } else {
            SubscriptionStatus::Active
        }
    }

    fn link_type(l: &LinkRec) -> LinkType {
        if l.explicit {
            LinkType::Explicit
        } else {
            LinkType::Glob
        }
    }

    fn wake_view(&self, w: &WakeRec) -> Wake {
        let streams = w
            .tails
            .iter()
            .filter_map(|(name, tail)| {
                self.links.get(name).map(|l| WakeStream {
                    stream: name.clone(),
                    link_type: Self::link_type(l),
                    acked: l.acked,
                    tail: (*tail).max(l.acked),
                })
            })
            .collect();
        Wake {
            subscription: self.path(),
            wake_id: w.id.clone(),
            generation: self.d.generation,
            streams,
            lease_ttl: self.config.lease_ttl,
        }
    }

    fn info(&self) -> SubscriptionInfo {
        SubscriptionInfo {
            id: self.id.clone(),
            config: self.config.clone(),
            links: self
                .links
                .iter()
                .map(|(n, l)| Link {
                    stream: n.clone(),
                    link_type: Self::link_type(l),
                    acked: l.acked,
                })
                .collect(),
            created_at: UNIX_EPOCH + Duration::from_millis(self.created_at),
            status: self.status(),
            generation: self.d.generation,
            wake: self.d.wake.as_ref().map(|w| self.wake_view(w)),
            holder: self.d.wake.as_ref().and_then(|w| w.holder.clone()),
        }
    }

    /// The wake matches `generation` and `wake_id`, else `Fenced`.
    fn fence(&self, generation: u64, wake_id: &str) -> Result<&WakeRec> {
        match &self.d.wake {
            Some(w) if self.d.generation == generation && w.id == wake_id => Ok(w),
            _ => Err(Error::Fenced),
        }
    }

    /// The link records of the streams in `config.streams` (or `names`) not explicitly linked
    /// yet: at their tail, or their start if they do not exist; a glob link keeps its offset
    /// and becomes explicit too.
    fn explicit_links(&self, engine: &Engine, names: &[StreamName]) -> Vec<(StreamName, LinkRec)> {
        let mut out: Vec<(StreamName, LinkRec)> = Vec::new();
        for name in names {
            if out.iter().any(|(n, _)| n == name) {
                continue;
            }
            match self.links.get(name) {
                Some(l) if l.explicit => {}
                Some(l) => out.push((
                    name.clone(),
                    LinkRec {
                        explicit: true,
                        ..l.clone()
                    },
                )),
                None => out.push((
                    name.clone(),
                    LinkRec {
                        explicit: true,
                        glob: self.matches(name),
                        acked: engine.tail_of(name).unwrap_or(Offset::ZERO),
                    },
                )),
            }
        }
        out
    }
}

/// Streams a change would link that are not linked yet, counted against `limit`:
/// `LinkLimit` when the subscription would pass it.
fn check_links(sub: &Sub, new: &[(StreamName, LinkRec)], limit: usize) -> Result<()> {
    let added = new
        .iter()
        .filter(|(n, _)| !sub.links.contains_key(n))
        .count();
    if sub.links.len() + added > limit {
        return Err(Error::LinkLimit { limit });
    }
    Ok(())
}

impl Engine {
    /// A future that resolves at the next change: a wake issued, delivered or cleared, a
    /// subscription created or deleted. Registered now, so no change after this call is missed.
    pub(crate) fn subscription_change(&self) -> event_listener::EventListener {
        self.subs.changed.listen()
    }

    /// Whether any subscription exists (one relaxed atomic load).
    pub(crate) fn has_subscriptions(&self) -> bool {
        self.subs.hook.active.load(Ordering::Relaxed)
    }

    /// The lowest offset any subscription linking `name` has acknowledged: retention keeps
    /// what a subscriber has not acknowledged (DESIGN.md, "Retention policies"). One lookup per
    /// subscription, asked only for a stream retention would trim.
    pub(crate) fn acked_floor(&self, name: &StreamName) -> Option<Offset> {
        let st = self.subs_state();
        st.subs
            .values()
            .filter_map(|s| s.links.get(name).map(|l| l.acked))
            .min()
    }

    fn subs_state(&self) -> MutexGuard<'_, State> {
        self.subs.state.lock()
    }

    /// A stream's durable tail, `None` when it does not exist (or is gone).
    fn tail_of(&self, name: &StreamName) -> Option<Offset> {
        self.head(name, None).ok().map(|i| i.tail)
    }

    /// Appends one record to the system stream and waits until it is durable; compacts once
    /// the records since the last snapshot outweigh it (and [`COMPACT_MIN_BYTES`]).
    fn persist(&self, st: &mut State, record: &Value) -> Result<()> {
        let sys = system_stream();
        if !st.system_stream {
            self.create(&sys, CreateOptions::json())?.wait()?;
            st.system_stream = true;
        }
        let bytes = record.to_string();
        let len = bytes.len() as u64;
        self.append(
            &sys,
            AppendRequest::new(bytes).content_type("application/json"),
        )?
        .wait()?;
        st.since_snapshot += len;
        Ok(())
    }

    /// Snapshots the state when the records since the last snapshot call for it. Called after a
    /// record took effect in memory, so the snapshot holds it.
    fn maybe_compact(&self, st: &mut State) {
        if st.since_snapshot < COMPACT_MIN_BYTES.max(st.snapshot_bytes) {
            return;
        }
        // A failed compaction leaves the records in place: nothing is lost.
        match self.compact(st) {
            Ok(bytes) => {
                st.since_snapshot = 0;
                st.snapshot_bytes = bytes;
            }
            Err(e) => tracing::warn!(error = %e, "subscription compaction failed"),
        }
    }

    /// Publishes the whole state as a snapshot of the system stream at its tail and moves its
    /// retention there; returns the snapshot's size.
    fn compact(&self, st: &State) -> Result<u64> {
        let sys = system_stream();
        let blob = codec::encode_snapshot(st.subs.values());
        let tail = self.head(&sys, None)?.tail;
        let mut reader = blob.as_bytes();
        self.publish_snapshot(
            &sys,
            tail,
            Some("application/json"),
            &mut reader,
            None,
            None,
        )?;
        self.set_retention(&sys, tail, None)?;
        Ok(blob.len() as u64)
    }

    /// Records `delta` for the subscription at `path` durably, then applies it (and its links
    /// to the hook's filter) and compacts if due.
    fn commit(&self, st: &mut State, path: &str, delta: &Delta) -> Result<()> {
        let (root, id) = {
            let sub = st.sub(path)?;
            (sub.config.root.clone(), sub.id.clone())
        };
        self.persist(st, &codec::encode_delta(&root, &id, delta))?;
        let changed = st.sub_mut(path)?.apply(delta);
        self.subs.hook.explicit_changed(&changed);
        self.maybe_compact(st);
        Ok(())
    }

    /// Loads the subscriptions from the system stream and starts the subscription thread.
    /// Every subscription is re-examined at once: wakes that were in flight are delivered
    /// again, pending work gets a wake.
    pub(super) fn start_subscriptions(
        self: &Arc<Self>,
        replayed: impl IntoIterator<Item = String>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let sys = system_stream();
        let mut subs: BTreeMap<String, Sub> = BTreeMap::new();
        let mut since = 0u64;
        let mut snapshot_bytes = 0u64;
        let mut from = ReadFrom::Start;
        // The system stream is created with the first subscription: a store that never had one
        // has none, and opening it writes nothing.
        let exists = match self.head(&sys, None) {
            Ok(_) => true,
            Err(Error::NotFound) => false,
            Err(e) => return Err(e),
        };
        if exists && let Ok(snap) = self.snapshot(&sys, None, None) {
            for sub in codec::decode_snapshot(&snap.data)? {
                subs.insert(sub.path(), sub);
            }
            snapshot_bytes = snap.data.len() as u64;
            from = ReadFrom::At(snap.info.offset);
        }
        if exists {
            loop {
                let (messages, chunk) = self.read_messages(&sys, &ReadRequest::from(from))?;
                for m in &messages {
                    since += m.data.len() as u64;
                    replay(&mut subs, codec::decode_record(&m.data)?)?;
                }
                if chunk.up_to_date || messages.is_empty() {
                    break;
                }
                from = ReadFrom::At(chunk.next);
            }
        }
        for sub in subs.values_mut() {
            // Whatever was appended while the store was closed: look at every link once.
            sub.candidates = sub.links.keys().cloned().collect();
        }
        let any = !subs.is_empty();
        {
            let mut st = self.subs_state();
            st.subs = subs;
            st.since_snapshot = since;
            st.snapshot_bytes = snapshot_bytes;
            st.system_stream = exists;
            self.subs.hook.refresh(&st.subs);
        }
        if any {
            tracing::info!(
                subscriptions = self.subs_state().subs.len(),
                "loaded subscriptions"
            );
            // Streams the journal replay touched may have been created or appended to after the
            // last record: look at them as if just published.
            let mut q = self.subs.hook.queue.lock();
            for n in replayed {
                q.touched.insert(StreamName(n.into()));
            }
        }
        let weak = Arc::downgrade(self);
        let hook = self.subs.hook.clone();
        Ok(std::thread::Builder::new()
            .name("brook-subscriptions".into())
            .spawn(move || subscription_thread(&weak, &hook, any))?)
    }

    /// Creates a subscription, or confirms an identical one (`false`); a different one under
    /// the same root and id is [`Error::SubscriptionExists`]. Refused with
    /// [`Error::SubscriptionLimit`] when its root holds `max_subscriptions_per_root` already,
    /// and [`Error::LinkLimit`] when it would link more than `max_links_per_subscription`.
    pub(crate) fn create_subscription(
        &self,
        id: &str,
        config: SubscriptionConfig,
    ) -> Result<(SubscriptionInfo, bool)> {
        validate(id, &config)?;
        let path = sub_path(&config.root, id);
        let mut st = self.subs_state();
        if let Some(old) = st.subs.get(&path) {
            return if old.config.identity() == config.identity() {
                Ok((old.info(), false))
            } else {
                Err(Error::SubscriptionExists)
            };
        }
        let limit = self.options.max_subscriptions_per_root;
        let held = st
            .subs
            .values()
            .filter(|s| s.config.root == config.root)
            .count();
        if held >= limit {
            return Err(Error::SubscriptionLimit { limit });
        }
        let max_links = self.options.max_links_per_subscription;
        let mut sub = Sub::new(id.to_owned(), config, now_ms());
        if let Some(pattern) = &sub.config.pattern {
            // Listed a page at a time, so a pattern over too many streams is refused after
            // reading one page past the limit, not all of them.
            let prefix = format!("{}{}", sub.config.root, glob::literal_prefix(pattern));
            let mut after: Option<String> = None;
            loop {
                let page = self.list_page(&prefix, after.as_deref(), 1024)?;
                for s in page.streams {
                    if sub.matches(&s.name) {
                        let link = LinkRec {
                            explicit: false,
                            glob: true,
                            acked: s.tail,
                        };
                        sub.links.insert(s.name, link);
                    }
                }
                if sub.links.len() > max_links {
                    return Err(Error::LinkLimit { limit: max_links });
                }
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
        }
        let explicit = sub.explicit_links(self, &sub.config.streams.clone());
        check_links(&sub, &explicit, max_links)?;
        for (name, link) in explicit {
            sub.links.insert(name, link);
        }
        self.persist(&mut st, &codec::encode_sub(&sub))?;
        // The tails above were read before the hook's filter covered these streams: an append
        // in between is found by looking at every link once.
        sub.candidates = sub.links.keys().cloned().collect();
        sub.recheck = true;
        let info = sub.info();
        st.subs.insert(path, sub);
        self.subs.hook.refresh(&st.subs);
        self.maybe_compact(&mut st);
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok((info, true))
    }

    /// The subscription at `path`.
    pub(crate) fn subscription(&self, path: &str) -> Result<SubscriptionInfo> {
        self.subs_state().sub(path).map(Sub::info)
    }

    /// The paths of every subscription, sorted.
    pub(crate) fn subscriptions(&self) -> Vec<String> {
        self.subs_state().subs.keys().cloned().collect()
    }

    /// Deletes the subscription: its wake, lease and cursors go with it, and callbacks, acks
    /// and releases for it fail from now on.
    pub(crate) fn delete_subscription(&self, path: &str) -> Result<()> {
        let mut st = self.subs_state();
        let (root, id) = {
            let sub = st.sub(path)?;
            (sub.config.root.clone(), sub.id.clone())
        };
        self.persist(&mut st, &codec::encode_delete(&root, &id))?;
        st.subs.remove(path);
        st.sending.remove(path);
        self.subs.hook.refresh(&st.subs);
        self.maybe_compact(&mut st);
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(())
    }

    /// Links streams explicitly (at their tails; idempotent). [`Error::LinkLimit`] when the
    /// subscription would pass `max_links_per_subscription`; nothing is linked then.
    pub(crate) fn link_streams(&self, path: &str, streams: &[StreamName]) -> Result<()> {
        let mut st = self.subs_state();
        let sub = st.sub(path)?;
        let links = sub.explicit_links(self, streams);
        if links.is_empty() {
            return Ok(());
        }
        check_links(sub, &links, self.options.max_links_per_subscription)?;
        let delta = Delta {
            kind: "link",
            links,
            ..Delta::default()
        };
        self.commit(&mut st, path, &delta)?;
        // Their tails were read before the filter covered them (see `create_subscription`).
        st.sub_mut(path)?.recheck = true;
        Ok(())
    }

    /// Removes an explicit link (idempotent); a glob link to the stream stays.
    pub(crate) fn unlink_stream(&self, path: &str, stream: &StreamName) -> Result<()> {
        let mut st = self.subs_state();
        let sub = st.sub(path)?;
        let delta = match sub.links.get(stream) {
            Some(l) if l.explicit && l.glob => Delta {
                kind: "link",
                links: vec![(
                    stream.clone(),
                    LinkRec {
                        explicit: false,
                        ..l.clone()
                    },
                )],
                ..Delta::default()
            },
            Some(l) if l.explicit => Delta {
                kind: "link",
                unlink: vec![stream.clone()],
                ..Delta::default()
            },
            _ => return Ok(()),
        };
        self.commit(&mut st, path, &delta)
    }
}

/// Applies one replayed record to `subs`.
fn replay(subs: &mut BTreeMap<String, Sub>, record: codec::Record) -> Result<()> {
    match record {
        codec::Record::Sub(sub) => {
            subs.insert(sub.path(), *sub);
        }
        codec::Record::Delete {
            root: Some(root),
            id,
        } => {
            subs.remove(&sub_path(&root, &id));
        }
        // Written before ids were scoped to their root, when an id named one subscription
        // in the whole store: the one with that id, whatever its root.
        codec::Record::Delete { root: None, id } => {
            subs.retain(|_, s| s.id != id);
        }
        codec::Record::Delta { root, id, delta } => {
            let sub = subs
                .get_mut(&sub_path(&root, &id))
                .ok_or_else(|| codec::corrupt("a change to a subscription that does not exist"))?;
            sub.apply(&delta);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Options;

    /// The records of a store written by brook before delta records and root-scoped ids
    /// (commit 27f684f), as that binary wrote them: a pattern subscription `top` at the store's
    /// root, an explicit one `nested` and a deleted one `gone` under `v1/`, wakes, a claim and a
    /// heartbeat ack. Taken from its journal after kill -9; only `lease_until` of the claim is
    /// moved to 2100, so the lease still runs when the test does.
    const OLD_RECORDS: [&str; 8] = [
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/","created_at":1796615305580,"description":null,"e":"sub","failed":false,"generation":0,"id":"top","kind":"pull-wake","lease_ttl_ms":600000,"links":[["jobs/1",false,true,"0000000000000001_0000000000000002"]],"next_attempt_at":0,"pattern":"jobs/*","root":"","streams":[],"target":"wake","wake":null}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/v1/","created_at":1796615305593,"description":null,"e":"sub","failed":false,"generation":0,"id":"nested","kind":"pull-wake","lease_ttl_ms":30000,"links":[["v1/jobs/1",true,false,"0000000000000000_0000000000000000"]],"next_attempt_at":0,"pattern":null,"root":"v1/","streams":["v1/jobs/1"],"target":"v1/wake","wake":null}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/v1/","created_at":1796615305605,"description":null,"e":"sub","failed":false,"generation":0,"id":"gone","kind":"pull-wake","lease_ttl_ms":30000,"links":[["v1/jobs/1",true,false,"0000000000000000_0000000000000000"]],"next_attempt_at":0,"pattern":null,"root":"v1/","streams":["v1/jobs/1"],"target":"v1/wake","wake":null}"#,
        r#"{"e":"del","id":"gone"}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/","created_at":1796615305580,"description":null,"e":"sub","failed":false,"generation":1,"id":"top","kind":"pull-wake","lease_ttl_ms":600000,"links":[["jobs/1",false,true,"0000000000000001_0000000000000002"]],"next_attempt_at":0,"pattern":"jobs/*","root":"","streams":[],"target":"wake","wake":{"delivered":false,"holder":null,"id":"w_e5570dcd54c98c69682f0566","lease_until":null,"tails":[["jobs/1","0000000000000002_0000000000000004"]]}}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/v1/","created_at":1796615305593,"description":null,"e":"sub","failed":false,"generation":1,"id":"nested","kind":"pull-wake","lease_ttl_ms":30000,"links":[["v1/jobs/1",true,false,"0000000000000000_0000000000000000"]],"next_attempt_at":0,"pattern":null,"root":"v1/","streams":["v1/jobs/1"],"target":"v1/wake","wake":{"delivered":false,"holder":null,"id":"w_46ee2447794ad80669b582f3","lease_until":null,"tails":[["v1/jobs/1","0000000000000001_0000000000000002"]]}}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/","created_at":1796615305580,"description":null,"e":"sub","failed":false,"generation":1,"id":"top","kind":"pull-wake","lease_ttl_ms":600000,"links":[["jobs/1",false,true,"0000000000000001_0000000000000002"]],"next_attempt_at":0,"pattern":"jobs/*","root":"","streams":[],"target":"wake","wake":{"delivered":false,"holder":"w1","id":"w_e5570dcd54c98c69682f0566","lease_until":4102444800000,"tails":[["jobs/1","0000000000000002_0000000000000004"]]}}"#,
        r#"{"attempts":0,"base_url":"http://127.0.0.1:4599/","created_at":1796615305580,"description":null,"e":"sub","failed":false,"generation":1,"id":"top","kind":"pull-wake","lease_ttl_ms":600000,"links":[["jobs/1",false,true,"0000000000000002_0000000000000004"]],"next_attempt_at":0,"pattern":"jobs/*","root":"","streams":[],"target":"wake","wake":{"delivered":false,"holder":"w1","id":"w_e5570dcd54c98c69682f0566","lease_until":4102444800000,"tails":[["jobs/1","0000000000000002_0000000000000004"]]}}"#,
    ];

    fn n(s: &str) -> StreamName {
        StreamName::new(s).expect("valid")
    }

    fn json(e: &Engine, name: &str, first: &str, then: Option<&str>) -> Result<()> {
        e.create(&n(name), CreateOptions::json().data(first.to_owned()))?
            .wait()?;
        if let Some(body) = then {
            e.append(
                &n(name),
                AppendRequest::new(body.to_owned()).content_type("application/json"),
            )?
            .wait()?;
        }
        Ok(())
    }

    /// A store whose subscription records have the old shape opens: its subscriptions load
    /// under their roots, the deleted one stays deleted, the claim, its lease and the ack hold,
    /// and the next changes (delta records on top of the old ones) survive a reopen.
    #[test]
    fn a_store_with_old_records_opens() -> Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let e = Engine::open(dir.path(), Options::default())?;
            json(&e, "wake", "[]", None)?;
            json(&e, "v1/wake", "[]", None)?;
            json(&e, "jobs/1", "[1]", Some("[2]"))?;
            json(&e, "v1/jobs/1", "[]", Some("[7]"))?;
            assert_eq!(e.tail_of(&n("jobs/1")), Some(Offset::new(2, 4)));
            assert_eq!(e.tail_of(&n("v1/jobs/1")), Some(Offset::new(1, 2)));
            e.create(&system_stream(), CreateOptions::json())?.wait()?;
            for r in OLD_RECORDS {
                e.append(
                    &system_stream(),
                    AppendRequest::new(r.to_owned()).content_type("application/json"),
                )?
                .wait()?;
            }
        }
        let e = Engine::open(dir.path(), Options::default())?;
        assert_eq!(
            e.subscriptions(),
            vec!["top".to_owned(), "v1/nested".to_owned()]
        );
        let top = e.subscription("top")?;
        assert_eq!((top.generation, top.holder.as_deref()), (1, Some("w1")));
        assert_eq!(top.links[0].acked, Offset::new(2, 4));
        let nested = e.subscription("v1/nested")?;
        assert_eq!(
            (nested.id.as_str(), nested.config.root.as_str()),
            ("nested", "v1/")
        );
        assert!(matches!(
            e.subscription("v1/gone"),
            Err(Error::SubscriptionNotFound)
        ));
        // The old claim is still held, and its wake acks as before.
        assert!(matches!(
            e.claim("top", "w2"),
            Err(Error::AlreadyClaimed { .. })
        ));
        let out = e.ack("top", 1, "w_e5570dcd54c98c69682f0566", &[], true)?;
        assert!(!out.next_wake);
        let wake = e.claim("v1/nested", "w3")?;
        assert_eq!(wake.subscription, "v1/nested");
        assert_eq!(wake.streams.len(), 1);
        e.ack(
            "v1/nested",
            wake.generation,
            &wake.wake_id,
            &[(n("v1/jobs/1"), Offset::new(1, 2))],
            true,
        )?;
        drop(e);
        let e = Engine::open(dir.path(), Options::default())?;
        assert!(e.subscription("top")?.wake.is_none());
        let nested = e.subscription("v1/nested")?;
        assert_eq!(nested.links[0].acked, Offset::new(1, 2));
        assert!(nested.wake.is_none());
        Ok(())
    }

    #[test]
    fn ids_and_leases_are_validated() {
        let ok = SubscriptionConfig::webhook("http://localhost/x").pattern("a/*");
        assert!(validate("sub-1", &ok).is_ok());
        let refused = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(refused(validate("", &ok)), "an empty id");
        assert!(refused(validate("a/b", &ok)), "an id with a slash");
        let no_pattern = SubscriptionConfig::webhook("http://localhost/x");
        assert!(refused(validate("s", &no_pattern)), "no pattern");
        let short = ok.clone().lease_ttl(Duration::from_millis(10));
        assert!(refused(validate("s", &short)), "a lease too short");
        assert!(
            refused(validate("s", &ok.root("v1"))),
            "a root without its slash"
        );
    }
}
