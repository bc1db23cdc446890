//! Subscriptions as engine state (DESIGN.md section 15).
//!
//! Every subscription change is one JSON record appended, durably, to the system stream
//! `__ds/subscriptions` before it takes effect in memory: the record holds the subscription's
//! whole new state (configuration, links with acknowledged offsets, generation, the current wake
//! and its lease, the retry schedule), or its deletion. The system stream is an ordinary brook
//! stream, so these records go through the shard journals, group commit, checkpoints and
//! recovery like any append. After [`COMPACT_AFTER`] records the whole state is published as a
//! snapshot of that stream at its tail and retention moves there, so opening a store reads one
//! snapshot and the records after it: it does not scan streams.
//!
//! Appends reach this module through [`Hook`]: the shard thread calls [`Hook::touched`] for every
//! stream a batch published, which returns after one relaxed atomic load while no subscription
//! exists. Otherwise the name is queued for the subscription thread, which links newly created
//! streams that match a pattern (at their start), issues wakes, expires leases and appends
//! pull-wake events.
//!
//! Lock order: `state` is taken before any stream lock (appends to the system stream and to
//! wake streams are made while holding it); [`Hook`]'s queue is a leaf.

mod codec;
pub(crate) mod glob;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use event_listener::Listener;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use serde_json::{Value, json};

use super::Engine;
use crate::error::{Error, Result};
use crate::name::ReadFrom;
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{
    AckOutcome, DeliveryKind, Link, LinkType, MAX_LEASE_TTL, MAX_SUBSCRIPTION_ID_LEN,
    MIN_LEASE_TTL, SubscriptionConfig, SubscriptionInfo, SubscriptionStatus, Wake, WakeStream,
    WebhookJob, WebhookResult,
};
use crate::types::{AppendRequest, CreateOptions, ReadRequest};

/// The system stream holding the subscription records.
pub(crate) const SYSTEM_STREAM: &str = "__ds/subscriptions";
/// Records appended since the last snapshot before the state is snapshotted again.
pub(crate) const COMPACT_AFTER: u64 = 1024;
/// How often the subscription thread looks at leases and retries when nothing else wakes it.
const TICK: Duration = Duration::from_millis(100);
/// After a pass over published streams, how long the subscription thread lets the next ones
/// gather before it looks again (a wake follows an append by at most about this much).
const LINGER: Duration = Duration::from_millis(5);
/// The first webhook retry waits 1 s; each later one twice as long, up to 60 s (PROTOCOL.md 7.1),
/// each with up to 20% jitter either way.
const RETRY_FIRST_MS: u64 = 1000;
/// The longest wait between webhook retries.
const RETRY_MAX_MS: u64 = 60_000;

/// The append path's view of subscriptions: whether any exist, which streams can concern one,
/// and the streams published since the subscription thread last looked.
pub(crate) struct Hook {
    active: AtomicBool,
    filter: RwLock<Filter>,
    queue: Mutex<HookQueue>,
    cv: Condvar,
}

/// The streams a publish can concern: every linked stream, and every stream under a pattern's
/// literal prefix (the thread matches the pattern itself).
#[derive(Default)]
struct Filter {
    names: HashSet<StreamName>,
    prefixes: Vec<String>,
}

#[derive(Default)]
struct HookQueue {
    touched: HashSet<StreamName>,
    stop: bool,
    /// The thread waits on `cv`: only then does a touch notify it.
    sleeping: bool,
}

impl Hook {
    /// A hook with no subscriptions.
    pub(crate) fn new() -> Arc<Hook> {
        Arc::new(Hook {
            active: AtomicBool::new(false),
            filter: RwLock::new(Filter::default()),
            queue: Mutex::new(HookQueue::default()),
            cv: Condvar::new(),
        })
    }

    /// Called by a committer for each stream a batch published. While no subscription exists
    /// that is one relaxed load; otherwise a stream no subscription can concern costs a read
    /// lock, a hash lookup and the pattern prefixes; one that can is queued for the
    /// subscription thread, which is woken only if it sleeps (so a burst of appends wakes it once).
    #[inline]
    pub(crate) fn touched(&self, name: &StreamName) {
        if self.active.load(Ordering::Relaxed) {
            self.touched_active(name);
        }
    }

    /// [`Hook::touched`] while subscriptions exist.
    fn touched_active(&self, name: &StreamName) {
        if name.as_str().starts_with("__ds/") {
            return;
        }
        {
            let f = self.filter.read();
            if !f.names.contains(name)
                && !f
                    .prefixes
                    .iter()
                    .any(|p| name.as_str().starts_with(p.as_str()))
            {
                return;
            }
        }
        let mut q = self.queue.lock();
        q.touched.insert(name.clone());
        if q.sleeping {
            self.cv.notify_one();
        }
    }

    /// Rebuilds the filter from every subscription.
    fn refresh(&self, subs: &BTreeMap<String, Sub>) {
        let mut f = Filter::default();
        for sub in subs.values() {
            f.names.extend(sub.links.keys().cloned());
            if let Some(p) = &sub.config.pattern {
                f.prefixes
                    .push(format!("{}{}", sub.config.root, glob::literal_prefix(p)));
            }
        }
        *self.filter.write() = f;
        self.active.store(!subs.is_empty(), Ordering::Relaxed);
    }

    /// Tells the subscription thread to stop.
    pub(crate) fn stop(&self) {
        self.queue.lock().stop = true;
        self.cv.notify_all();
    }

    /// Waits up to `TICK` for touched names; `None` once stopped.
    fn wait(&self) -> Option<Vec<StreamName>> {
        let mut q = self.queue.lock();
        if q.touched.is_empty() && !q.stop {
            q.sleeping = true;
            self.cv.wait_for(&mut q, TICK);
            q.sleeping = false;
        }
        if q.stop {
            return None;
        }
        Some(q.touched.drain().collect())
    }
}

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
    /// The tails when the wake was issued (a claim refreshes them).
    tails: Vec<(StreamName, Offset)>,
    /// The worker holding the lease (pull-wake).
    holder: Option<String>,
    /// When the lease ends (ms since the epoch); leases run once claimed (pull-wake) or once
    /// delivered (webhook).
    lease_until: Option<u64>,
    /// A webhook receiver accepted the wake.
    delivered: bool,
}

/// A subscription's whole state, as one record holds it.
#[derive(Clone, Debug)]
pub(super) struct Sub {
    id: String,
    config: SubscriptionConfig,
    created_at: u64,
    links: BTreeMap<StreamName, LinkRec>,
    generation: u64,
    wake: Option<WakeRec>,
    /// The last webhook delivery attempt failed.
    failed: bool,
    attempts: u32,
    next_attempt_at: u64,
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
    subs: BTreeMap<String, Sub>,
    /// Records appended since the last snapshot.
    since_snapshot: u64,
    /// Webhook wakes handed to a delivery task and not yet answered (in memory only: after a
    /// restart every undelivered wake is delivered again).
    sending: HashSet<String>,
    counter: u64,
    /// The system stream exists (it is created with the first subscription).
    system_stream: bool,
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

/// A wake id: `w_` and 96 bits of a hash of the time, a counter, the process and the
/// subscription.
fn new_wake_id(st: &mut State, sub: &str) -> String {
    use sha2::Digest;
    st.counter += 1;
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = sha2::Sha256::new();
    h.update(t.to_le_bytes());
    h.update(st.counter.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(sub.as_bytes());
    format!("w_{}", super::hex(&h.finalize()[..12]))
}

/// The delay before retry number `attempts` (1-based): 1 s doubling to 60 s, jittered by up
/// to 20% either way (the jitter comes from the wall clock's nanoseconds).
fn retry_delay_ms(attempts: u32) -> u64 {
    let base = RETRY_FIRST_MS
        .saturating_mul(1u64 << attempts.saturating_sub(1).min(16))
        .min(RETRY_MAX_MS);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let spread = base / 5;
    base - spread + nanos % (2 * spread + 1)
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

    fn status(&self) -> SubscriptionStatus {
        if self.failed {
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
            subscription: self.id.clone(),
            wake_id: w.id.clone(),
            generation: self.generation,
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
            generation: self.generation,
            wake: self.wake.as_ref().map(|w| self.wake_view(w)),
            holder: self.wake.as_ref().and_then(|w| w.holder.clone()),
        }
    }

    /// The wake matches `generation` and `wake_id`, else `Fenced`.
    fn fence(&self, generation: u64, wake_id: &str) -> Result<&WakeRec> {
        match &self.wake {
            Some(w) if self.generation == generation && w.id == wake_id => Ok(w),
            _ => Err(Error::Fenced),
        }
    }
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

    fn subs_state(&self) -> MutexGuard<'_, State> {
        self.subs.state.lock()
    }

    /// A stream's durable tail, `None` when it does not exist (or is gone).
    fn tail_of(&self, name: &StreamName) -> Option<Offset> {
        self.head(name, None).ok().map(|i| i.tail)
    }

    /// Appends one record to the system stream and waits until it is durable; compacts after
    /// [`COMPACT_AFTER`] records.
    fn persist(&self, st: &mut State, record: &Value) -> Result<()> {
        let sys = system_stream();
        if !st.system_stream {
            self.create(&sys, CreateOptions::json())?.wait()?;
            st.system_stream = true;
        }
        self.append(
            &sys,
            AppendRequest::new(record.to_string()).content_type("application/json"),
        )?
        .wait()?;
        st.since_snapshot += 1;
        if st.since_snapshot >= COMPACT_AFTER {
            // A failed compaction leaves the records in place: nothing is lost.
            match self.compact(st) {
                Ok(()) => st.since_snapshot = 0,
                Err(e) => tracing::warn!(error = %e, "subscription compaction failed"),
            }
        }
        Ok(())
    }

    /// Publishes the whole state as a snapshot of the system stream at its tail and moves its
    /// retention there.
    fn compact(&self, st: &State) -> Result<()> {
        let sys = system_stream();
        let blob = codec::encode_snapshot(st.subs.values()).to_string();
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
        Ok(())
    }

    /// Stores `sub` durably, then installs it.
    fn save(&self, st: &mut State, sub: Sub) -> Result<()> {
        self.persist(st, &codec::encode_sub(&sub))?;
        let same_streams = st.subs.get(&sub.id).is_some_and(|old| {
            old.config.pattern == sub.config.pattern && old.links.keys().eq(sub.links.keys())
        });
        st.subs.insert(sub.id.clone(), sub);
        if !same_streams {
            self.subs.hook.refresh(&st.subs);
        }
        Ok(())
    }

    /// Loads the subscriptions from the system stream (creating it on first use) and starts the
    /// subscription thread. Every subscription is re-examined at once: wakes that were in
    /// flight are delivered again, pending work gets a wake.
    pub(super) fn start_subscriptions(
        self: &Arc<Self>,
        replayed: impl IntoIterator<Item = String>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let sys = system_stream();
        let mut subs = BTreeMap::new();
        let mut since = 0u64;
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
                subs.insert(sub.id.clone(), sub);
            }
            from = ReadFrom::At(snap.info.offset);
        }
        if exists {
            loop {
                let (messages, chunk) = self.read_messages(&sys, &ReadRequest::from(from))?;
                for m in &messages {
                    since += 1;
                    match codec::decode_record(&m.data)? {
                        codec::Record::Sub(sub) => {
                            subs.insert(sub.id.clone(), *sub);
                        }
                        codec::Record::Delete(id) => {
                            subs.remove(&id);
                        }
                    }
                }
                if chunk.up_to_date || messages.is_empty() {
                    break;
                }
                from = ReadFrom::At(chunk.next);
            }
        }
        let any = !subs.is_empty();
        {
            let mut st = self.subs_state();
            st.subs = subs;
            st.since_snapshot = since;
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

    /// One pass of the subscription thread: links `touched` streams that newly match a
    /// pattern, expires leases, and issues wakes for pending work (`all`: every subscription,
    /// not only those the touched streams concern).
    fn subs_tick(&self, touched: &[StreamName], all: bool) {
        let mut st = self.subs_state();
        let now = now_ms();
        let ids: Vec<String> = st.subs.keys().cloned().collect();
        for id in ids {
            let Some(sub) = st.subs.get(&id) else {
                continue;
            };
            // Most subscriptions, most of the time, concern none of this: look without copying.
            let expiring = sub.wake.as_ref().is_some_and(|w| {
                w.lease_until.is_some_and(|t| t <= now) && (w.holder.is_some() || w.delivered)
            });
            let concerned = all
                || expiring
                || touched
                    .iter()
                    .any(|n| sub.links.contains_key(n) || sub.matches(n));
            if !concerned {
                continue;
            }
            let mut next = sub.clone();
            let mut dirty = false;
            let mut look = all;
            for name in touched {
                if next.links.contains_key(name) {
                    look = true;
                } else if next.matches(name) && self.tail_of(name).is_some() {
                    // Created after the subscription: linked at its start.
                    next.links.insert(
                        name.clone(),
                        LinkRec {
                            explicit: false,
                            glob: true,
                            acked: Offset::ZERO,
                        },
                    );
                    dirty = true;
                    look = true;
                }
            }
            if let Some(w) = &next.wake
                && w.lease_until.is_some_and(|t| t <= now)
                && (w.holder.is_some() || w.delivered)
            {
                tracing::info!(subscription = %id, generation = next.generation, "lease expired");
                next.wake = None;
                dirty = true;
                look = true;
            }
            let mut announce = None;
            if look && next.wake.is_none() && self.issue_wake(&mut st, &mut next) {
                dirty = true;
                announce = Some(next.generation);
            }
            if dirty {
                if let Err(e) = self.save(&mut st, next.clone()) {
                    tracing::warn!(subscription = %id, error = %e, "saving a subscription failed");
                    continue;
                }
                self.subs.changed.notify(usize::MAX);
                if announce.is_some() {
                    self.announce(&next);
                }
            }
        }
    }

    /// Issues a wake on `sub` (not yet saved) if any linked stream has unacknowledged data;
    /// `true` when it did.
    fn issue_wake(&self, st: &mut State, sub: &mut Sub) -> bool {
        let tails: Vec<(StreamName, Offset)> = sub
            .links
            .keys()
            .filter_map(|n| self.tail_of(n).map(|t| (n.clone(), t)))
            .collect();
        let pending = tails
            .iter()
            .any(|(n, t)| sub.links.get(n).is_some_and(|l| *t > l.acked));
        if !pending {
            return false;
        }
        sub.generation += 1;
        sub.wake = Some(WakeRec {
            id: new_wake_id(st, &sub.id),
            tails,
            holder: None,
            lease_until: None,
            delivered: false,
        });
        sub.failed = false;
        sub.attempts = 0;
        sub.next_attempt_at = 0;
        true
    }

    /// After a pull-wake wake is saved: appends its event to the wake stream (a missing wake
    /// stream is logged; the wake stays claimable).
    fn announce(&self, sub: &Sub) {
        let DeliveryKind::PullWake { wake_stream } = &sub.config.delivery else {
            return;
        };
        let Some(w) = &sub.wake else { return };
        let stream = w
            .tails
            .iter()
            .find(|(n, t)| sub.links.get(n).is_some_and(|l| *t > l.acked))
            .map_or(String::new(), |(n, _)| {
                codec::relative(&sub.config.root, n).to_owned()
            });
        let event = json!({
            "type": "wake",
            "subscription_id": sub.id,
            "stream": stream,
            "generation": sub.generation,
            "wake_id": w.id,
            "ts": now_ms(),
        });
        let sent = self
            .append(
                wake_stream,
                AppendRequest::new(event.to_string()).content_type("application/json"),
            )
            .and_then(crate::Pending::wait);
        if let Err(e) = sent {
            tracing::warn!(subscription = %sub.id, wake_stream = %wake_stream.as_str(), error = %e,
                "appending a wake event failed");
        }
    }

    /// Creates a subscription, or confirms an identical one (`false`); a different one under
    /// the id is [`Error::SubscriptionExists`].
    pub(crate) fn create_subscription(
        &self,
        id: &str,
        config: SubscriptionConfig,
    ) -> Result<(SubscriptionInfo, bool)> {
        validate(id, &config)?;
        let mut st = self.subs_state();
        if let Some(old) = st.subs.get(id) {
            return if old.config.identity() == config.identity() {
                Ok((old.info(), false))
            } else {
                Err(Error::SubscriptionExists)
            };
        }
        let mut sub = Sub {
            id: id.to_owned(),
            config,
            created_at: now_ms(),
            links: BTreeMap::new(),
            generation: 0,
            wake: None,
            failed: false,
            attempts: 0,
            next_attempt_at: 0,
        };
        if let Some(pattern) = &sub.config.pattern {
            let prefix = format!("{}{}", sub.config.root, glob::literal_prefix(pattern));
            for name in self.list(&prefix)? {
                if sub.matches(&name)
                    && let Some(tail) = self.tail_of(&name)
                {
                    sub.links.insert(
                        name,
                        LinkRec {
                            explicit: false,
                            glob: true,
                            acked: tail,
                        },
                    );
                }
            }
        }
        for name in sub.config.streams.clone() {
            self.link_explicit(&mut sub, name);
        }
        let info = sub.info();
        self.save(&mut st, sub)?;
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok((info, true))
    }

    /// Links `name` explicitly to `sub` (not saved): at its tail, or its start if it does not
    /// exist yet; an existing link keeps its offset.
    fn link_explicit(&self, sub: &mut Sub, name: StreamName) {
        let glob = sub.matches(&name);
        let tail = self.tail_of(&name).unwrap_or(Offset::ZERO);
        let l = sub.links.entry(name).or_insert(LinkRec {
            explicit: true,
            glob,
            acked: tail,
        });
        l.explicit = true;
    }

    /// The subscription `id`.
    pub(crate) fn subscription(&self, id: &str) -> Result<SubscriptionInfo> {
        self.subs_state()
            .subs
            .get(id)
            .map(Sub::info)
            .ok_or(Error::SubscriptionNotFound)
    }

    /// The ids of every subscription, sorted.
    pub(crate) fn subscriptions(&self) -> Vec<String> {
        self.subs_state().subs.keys().cloned().collect()
    }

    /// Deletes the subscription: its wake, lease and cursors go with it, and callbacks, acks
    /// and releases for it fail from now on.
    pub(crate) fn delete_subscription(&self, id: &str) -> Result<()> {
        let mut st = self.subs_state();
        if !st.subs.contains_key(id) {
            return Err(Error::SubscriptionNotFound);
        }
        self.persist(&mut st, &codec::encode_delete(id))?;
        st.subs.remove(id);
        st.sending.remove(id);
        self.subs.hook.refresh(&st.subs);
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(())
    }

    /// Runs `f` on a copy of the subscription and saves the copy when `f` succeeds.
    fn update<T>(
        &self,
        id: &str,
        f: impl FnOnce(&Engine, &mut State, &mut Sub) -> Result<T>,
    ) -> Result<T> {
        let mut st = self.subs_state();
        let mut sub = st
            .subs
            .get(id)
            .cloned()
            .ok_or(Error::SubscriptionNotFound)?;
        let generation = sub.generation;
        let out = f(self, &mut st, &mut sub)?;
        self.save(&mut st, sub.clone())?;
        if sub.generation != generation {
            // `f` issued a wake: announce it (still under `state`, so in generation order).
            self.announce(&sub);
        }
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(out)
    }

    /// Links streams explicitly (at their tails; idempotent).
    pub(crate) fn link_streams(&self, id: &str, streams: &[StreamName]) -> Result<()> {
        self.update(id, |e, _, sub| {
            for n in streams {
                e.link_explicit(sub, n.clone());
            }
            Ok(())
        })
    }

    /// Removes an explicit link (idempotent); a glob link to the stream stays.
    pub(crate) fn unlink_stream(&self, id: &str, stream: &StreamName) -> Result<()> {
        self.update(id, |_, _, sub| {
            if let Some(l) = sub.links.get_mut(stream) {
                l.explicit = false;
                if !l.glob {
                    sub.links.remove(stream);
                }
            }
            Ok(())
        })
    }

    /// Claims the pull-wake subscription's work for `worker`: its current wake, or a new one
    /// when it has pending work. [`Error::AlreadyClaimed`] while another lease runs,
    /// [`Error::NoPendingWork`] when every linked stream is acknowledged.
    pub(crate) fn claim(&self, id: &str, worker: &str) -> Result<Wake> {
        let mut st = self.subs_state();
        let mut sub = st
            .subs
            .get(id)
            .cloned()
            .ok_or(Error::SubscriptionNotFound)?;
        if !matches!(sub.config.delivery, DeliveryKind::PullWake { .. }) {
            return Err(invalid("only a pull-wake subscription can be claimed"));
        }
        let now = now_ms();
        if let Some(w) = &sub.wake
            && let (Some(holder), Some(until)) = (&w.holder, w.lease_until)
        {
            if until > now {
                return Err(Error::AlreadyClaimed {
                    holder: holder.clone(),
                    generation: sub.generation,
                });
            }
            // An expired lease the thread has not cleared yet: clear it now.
            sub.wake = None;
        }
        if sub.wake.is_none() && !self.issue_wake(&mut st, &mut sub) {
            // Save a cleared lease even when nothing is pending.
            if st.subs.get(id).is_some_and(|s| s.wake.is_some()) {
                self.save(&mut st, sub)?;
            }
            return Err(Error::NoPendingWork);
        }
        let tails: Vec<(StreamName, Offset)> = sub
            .links
            .keys()
            .filter_map(|n| self.tail_of(n).map(|t| (n.clone(), t)))
            .collect();
        let lease = now + sub.config.lease_ttl.as_millis() as u64;
        if let Some(w) = sub.wake.as_mut() {
            w.tails = tails;
            w.holder = Some(worker.to_owned());
            w.lease_until = Some(lease);
        }
        let wake = sub
            .wake
            .as_ref()
            .map(|w| sub.wake_view(w))
            .expect("a wake was just set");
        self.save(&mut st, sub)?;
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(wake)
    }

    /// Acknowledges offsets for the wake (`generation`, `wake_id`), else [`Error::Fenced`].
    /// Without `done` it extends the lease (a heartbeat); with `done` it ends the wake and
    /// issues the next one if work remains. An offset for an unlinked stream, behind the
    /// acknowledged one or past the tail is [`Error::InvalidAckOffset`] and nothing is applied.
    pub(crate) fn ack(
        &self,
        id: &str,
        generation: u64,
        wake_id: &str,
        acks: &[(StreamName, Offset)],
        done: bool,
    ) -> Result<AckOutcome> {
        self.update(id, |e, st, sub| {
            let w = sub.fence(generation, wake_id)?;
            if matches!(sub.config.delivery, DeliveryKind::PullWake { .. }) && w.holder.is_none() {
                return Err(Error::Fenced);
            }
            for (name, offset) in acks {
                let Some(l) = sub.links.get(name) else {
                    return Err(Error::InvalidAckOffset(format!(
                        "{} is not linked to the subscription",
                        name.as_str()
                    )));
                };
                if *offset < l.acked {
                    return Err(Error::InvalidAckOffset(format!(
                        "{offset} is behind the acknowledged offset {}",
                        l.acked
                    )));
                }
                match e.tail_of(name) {
                    Some(tail) if *offset <= tail => {}
                    _ => {
                        return Err(Error::InvalidAckOffset(format!(
                            "{offset} is beyond the tail of {}",
                            name.as_str()
                        )));
                    }
                }
            }
            for (name, offset) in acks {
                if let Some(l) = sub.links.get_mut(name) {
                    l.acked = *offset;
                }
            }
            if done {
                sub.wake = None;
                let next_wake = e.issue_wake(st, sub);
                Ok(AckOutcome { next_wake })
            } else {
                let lease = now_ms() + sub.config.lease_ttl.as_millis() as u64;
                if let Some(w) = sub.wake.as_mut() {
                    w.lease_until = Some(lease);
                }
                Ok(AckOutcome { next_wake: false })
            }
        })
    }

    /// Gives the wake (`generation`, `wake_id`) back without acknowledging; a new wake follows
    /// if work remains. A stale wake is [`Error::Fenced`].
    pub(crate) fn release(&self, id: &str, generation: u64, wake_id: &str) -> Result<()> {
        self.update(id, |e, st, sub| {
            sub.fence(generation, wake_id)?;
            sub.wake = None;
            e.issue_wake(st, sub);
            Ok(())
        })
    }

    /// Waits until the subscription has a wake nobody holds, up to `timeout`; `false` on
    /// timeout. [`Error::SubscriptionNotFound`] if it is (or gets) deleted.
    pub(crate) fn wait_for_work(&self, id: &str, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.subs.changed.listen();
            {
                let st = self.subs_state();
                let sub = st.subs.get(id).ok_or(Error::SubscriptionNotFound)?;
                let now = now_ms();
                let claimable = sub
                    .wake
                    .as_ref()
                    .is_some_and(|w| w.holder.is_none() || w.lease_until.is_some_and(|t| t <= now));
                if claimable {
                    return Ok(true);
                }
            }
            // Leases expire without a notification: look again at least every TICK.
            let until = deadline.min(Instant::now() + TICK);
            if listener.wait_deadline(until).is_none() && Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    /// Webhook wakes due for a delivery attempt now, each marked as being sent.
    pub(crate) fn take_webhook_jobs(&self) -> Vec<WebhookJob> {
        let mut st = self.subs_state();
        let now = now_ms();
        let mut jobs = Vec::new();
        let State { subs, sending, .. } = &mut *st;
        for sub in subs.values() {
            let DeliveryKind::Webhook { url } = &sub.config.delivery else {
                continue;
            };
            let Some(w) = &sub.wake else { continue };
            if w.delivered || sub.next_attempt_at > now || sending.contains(&sub.id) {
                continue;
            }
            sending.insert(sub.id.clone());
            jobs.push(WebhookJob {
                url: url.clone(),
                wake: sub.wake_view(w),
                root: sub.config.root.clone(),
                base_url: sub.config.base_url.clone(),
            });
        }
        jobs
    }

    /// Whether (`id`, `generation`, `wake_id`) is still the subscription's current wake.
    pub(crate) fn wake_is_current(&self, id: &str, generation: u64, wake_id: &str) -> bool {
        self.subs_state()
            .subs
            .get(id)
            .is_some_and(|s| s.fence(generation, wake_id).is_ok())
    }

    /// Records how a webhook delivery attempt ended (ignored when the wake is no longer
    /// current, e.g. the subscription was deleted meanwhile), then wakes whoever waits on
    /// [`Engine::subscription_change`]: the subscription may have another wake due now that
    /// this one is no longer being sent.
    pub(crate) fn webhook_result(&self, wake: &Wake, result: WebhookResult) -> Result<()> {
        let recorded = self.record_webhook(wake, result);
        self.subs.changed.notify(usize::MAX);
        recorded
    }

    /// [`Engine::webhook_result`] without its notification.
    fn record_webhook(&self, wake: &Wake, result: WebhookResult) -> Result<()> {
        self.subs_state().sending.remove(&wake.subscription);
        if !self.wake_is_current(&wake.subscription, wake.generation, &wake.wake_id) {
            return Ok(());
        }
        let acks: Vec<(StreamName, Offset)> = wake
            .streams
            .iter()
            .map(|s| (s.stream.clone(), s.tail))
            .collect();
        match result {
            WebhookResult::Done => self
                .ack(
                    &wake.subscription,
                    wake.generation,
                    &wake.wake_id,
                    &acks,
                    true,
                )
                .map(|_| ()),
            WebhookResult::Accepted => self.update(&wake.subscription, |_, _, sub| {
                sub.failed = false;
                sub.attempts = 0;
                let lease = now_ms() + sub.config.lease_ttl.as_millis() as u64;
                if let Some(w) = sub.wake.as_mut() {
                    w.delivered = true;
                    w.lease_until = Some(lease);
                }
                Ok(())
            }),
            WebhookResult::Failed => self.update(&wake.subscription, |_, _, sub| {
                sub.failed = true;
                sub.attempts = sub.attempts.saturating_add(1);
                sub.next_attempt_at = now_ms() + retry_delay_ms(sub.attempts);
                Ok(())
            }),
        }
    }
}

/// The subscription thread: waits for touched streams (or `TICK`), then runs a tick. The first
/// tick looks at every subscription.
fn subscription_thread(engine: &Weak<Engine>, hook: &Hook, mut all: bool) {
    while let Some(touched) = hook.wait() {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if engine.subs.hook.active.load(Ordering::Relaxed) || !touched.is_empty() {
            engine.subs_tick(&touched, all);
        }
        all = false;
        drop(engine);
        if !touched.is_empty() {
            // Let the next burst of appends gather (they do not wake a thread that is not
            // waiting): one pass per LINGER at most while appends keep coming.
            std::thread::sleep(LINGER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_double_to_a_minute_with_jitter() {
        for (attempt, base) in [(1, 1000), (2, 2000), (3, 4000), (7, 60_000), (40, 60_000)] {
            let d = retry_delay_ms(attempt);
            assert!(
                d >= base - base / 5 && d <= base + base / 5,
                "{attempt}: {d}"
            );
        }
    }

    #[test]
    fn ids_and_leases_are_validated() {
        let ok = SubscriptionConfig::webhook("http://localhost/x").pattern("a/*");
        assert!(validate("sub-1", &ok).is_ok());
        assert!(validate("", &ok).is_err());
        assert!(validate("a/b", &ok).is_err());
        assert!(validate("s", &SubscriptionConfig::webhook("http://localhost/x")).is_err());
        let short = ok.clone().lease_ttl(Duration::from_millis(10));
        assert!(validate("s", &short).is_err());
        assert!(validate("s", &ok.root("v1")).is_err());
    }
}
