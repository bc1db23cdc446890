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

use std::collections::{BTreeMap, HashSet};
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
/// Records appended since the last snapshot before the state is snapshotted again.
pub(crate) const COMPACT_AFTER: u64 = 1024;
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

impl State {
    /// The subscription `id`; `SubscriptionNotFound` when there is none.
    fn sub(&self, id: &str) -> Result<&Sub> {
        self.subs.get(id).ok_or(Error::SubscriptionNotFound)
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

    /// The lowest acknowledged offset of each stream any subscription links: retention keeps
    /// what a subscriber has not acknowledged (DESIGN.md, "Retention policies").
    pub(crate) fn acked_floors(&self) -> std::collections::HashMap<StreamName, Offset> {
        let st = self.subs_state();
        let mut floors = std::collections::HashMap::new();
        for (name, link) in st.subs.values().flat_map(|s| s.links.iter()) {
            floors
                .entry(name.clone())
                .and_modify(|o: &mut Offset| *o = (*o).min(link.acked))
                .or_insert(link.acked);
        }
        floors
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
        self.subs_state().sub(id).map(Sub::info)
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
        let mut sub = st.sub(id)?.clone();
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
}
#[cfg(test)]
mod tests {
    use super::*;

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
