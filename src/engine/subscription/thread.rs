//! The subscription thread: links streams that newly match a pattern, expires leases, issues
//! wakes for pending work and announces pull-wake ones on their wake streams.

use std::sync::Weak;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::super::Engine;
use super::hook::Hook;
use super::{LINGER, LinkRec, State, Sub, WakeRec, codec, new_wake_id};
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::DeliveryKind;
use crate::types::AppendRequest;

/// The subscription thread: waits for touched streams (or `TICK`), then runs a tick. The first
/// tick looks at every subscription.
pub(super) fn subscription_thread(engine: &Weak<Engine>, hook: &Hook, mut all: bool) {
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

impl Engine {
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
    pub(super) fn issue_wake(&self, st: &mut State, sub: &mut Sub) -> bool {
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
    pub(super) fn announce(&self, sub: &Sub) {
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
}
