//! The subscription thread: links streams that newly match a pattern, expires leases, issues
//! wakes for pending work and announces pull-wake ones on their wake streams; and finding the
//! pending work itself ([`Engine::pending`]), which claims and acks share.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Weak;

use serde_json::json;

use super::super::Engine;
use super::hook::Hook;
use super::{
    Delivery, Delta, LINGER, LinkRec, MAX_WAKE_STREAMS, State, Sub, WakeRec, codec, new_wake_id,
};
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::DeliveryKind;
use crate::types::AppendRequest;

/// The subscription thread: waits for touched streams (or `TICK`), then runs a tick. The first
/// tick looks at every subscription.
pub(super) fn subscription_thread(engine: &Weak<Engine>, hook: &Hook, mut all: bool) {
    while hook.wait() {
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let touched = engine.subs_tick(all);
        all = false;
        drop(engine);
        if touched {
            // Let the next burst of appends gather (they do not wake a thread that is not
            // waiting): one pass per LINGER at most while appends keep coming.
            std::thread::sleep(LINGER);
        }
    }
}

/// Whether `w`'s lease ran out by `now` (a claimed pull-wake or a delivered webhook).
fn expired(w: &WakeRec, now: u64) -> bool {
    w.lease_until.is_some_and(|t| t <= now) && (w.holder.is_some() || w.delivered)
}

/// The delivery state after `d` with a new wake over `tails`: the next generation, a fresh
/// id, no holder, and the retry schedule reset.
pub(super) fn next_wake(d: &Delivery, path: &str, tails: Vec<(StreamName, Offset)>) -> Delivery {
    Delivery {
        generation: d.generation + 1,
        wake: Some(WakeRec {
            id: new_wake_id(path),
            tails,
            holder: None,
            lease_until: None,
            delivered: false,
        }),
        failed: false,
        attempts: 0,
        next_attempt_at: 0,
    }
}

impl Engine {
    /// One pass of the subscription thread: takes the touched streams, links those that newly
    /// match a pattern, expires leases, and issues wakes for pending work (`all`: every
    /// subscription, not only those the touched streams concern). `true` when any stream was
    /// touched.
    fn subs_tick(&self, all: bool) -> bool {
        let mut st = self.subs_state();
        let mut touched = self.subs.hook.take();
        if all {
            touched.extend(self.unlinked_matches(&st, &touched));
        }
        let now = now_ms();
        // Most subscriptions, most of the time, concern none of this: look without copying.
        let paths: Vec<String> = st
            .subs
            .iter()
            .filter(|(_, sub)| {
                all || sub.recheck
                    || sub.d.wake.as_ref().is_some_and(|w| expired(w, now))
                    || touched
                        .iter()
                        .any(|n| sub.links.contains_key(n) || sub.matches(n))
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in paths {
            self.tick_one(&mut st, &path, &touched, all, now);
        }
        !touched.is_empty()
    }

    /// The streams in the name index that match a subscription's pattern and are not linked to
    /// it (nor in `touched`), for the first pass after an open: a stream created just before a
    /// crash is linked by that pass when the journal replay saw its create, but not when a
    /// checkpoint took the create from the journal before the subscription thread recorded the
    /// link. Names only, one listing of each pattern's literal prefix (every match of which
    /// is linked, and looked at by the same pass, in the usual case); whether each stream
    /// still exists is the pass's look.
    fn unlinked_matches(&self, st: &State, touched: &[StreamName]) -> Vec<StreamName> {
        const PAGE: usize = 1024;
        let touched: std::collections::HashSet<&StreamName> = touched.iter().collect();
        let mut out = std::collections::BTreeSet::new();
        for sub in st.subs.values() {
            let Some(pattern) = &sub.config.pattern else {
                continue;
            };
            let prefix = format!(
                "{}{}",
                sub.config.root,
                super::glob::literal_prefix(pattern)
            );
            let mut after: Option<String> = None;
            loop {
                let page = self.names.page(&prefix, after.as_deref(), PAGE);
                let last = page.len() < PAGE;
                for n in page {
                    if let Ok(name) = StreamName::new(&n)
                        && !sub.links.contains_key(&name)
                        && sub.matches(&name)
                        && !touched.contains(&name)
                    {
                        out.insert(name);
                    }
                    after = Some(n);
                }
                if last {
                    break;
                }
            }
        }
        out.into_iter().collect()
    }

    /// [`Engine::subs_tick`] for the subscription at `path`: one record at most.
    fn tick_one(&self, st: &mut State, path: &str, touched: &[StreamName], all: bool, now: u64) {
        let max_links = self.options.max_links_per_subscription;
        let Ok(sub) = st.sub_mut(path) else {
            return;
        };
        let mut look = all || std::mem::take(&mut sub.recheck);
        let mut links = Vec::new();
        let mut skipped = 0usize;
        for name in touched {
            if sub.links.contains_key(name) {
                sub.candidates.insert(name.clone());
                look = true;
            } else if sub.matches(name) {
                // At its limit a pattern links no more: the stream is not refused (it may be
                // another tenant's), it is only not followed; its next append tries again.
                if sub.links.len() + links.len() >= max_links {
                    skipped += 1;
                    continue;
                }
                if self.tail_of(name).is_none() {
                    continue;
                }
                // Created after the subscription: linked at its start.
                let link = LinkRec {
                    explicit: false,
                    glob: true,
                    acked: Offset::ZERO,
                };
                links.push((name.clone(), link));
                look = true;
            }
        }
        // Once until a link goes: every append to such a stream would log it again.
        if skipped > 0 && !sub.limit_logged {
            sub.limit_logged = true;
            tracing::warn!(subscription = %path, skipped, limit = max_links,
                "a subscription at its link limit did not link newly matching streams");
        }
        let mut next = None;
        if let Some(w) = &sub.d.wake
            && expired(w, now)
        {
            tracing::info!(subscription = %path, generation = sub.d.generation, "lease expired");
            next = Some(Delivery {
                wake: None,
                ..sub.d.clone()
            });
            look = true;
        }
        let mut announce = false;
        let in_flight = next.as_ref().unwrap_or(&sub.d).wake.is_some();
        if look && !in_flight {
            let tails = self.pending(sub, &[], &links);
            if !tails.is_empty() {
                next = Some(next_wake(next.as_ref().unwrap_or(&sub.d), path, tails));
                announce = true;
            }
        }
        if links.is_empty() && next.is_none() {
            return;
        }
        let delta = Delta {
            kind: if links.is_empty() { "wake" } else { "link" },
            links,
            delivery: next,
            ..Delta::default()
        };
        if let Err(e) = self.commit(st, path, &delta) {
            tracing::warn!(subscription = %path, error = %e, "saving a subscription failed");
            return;
        }
        self.subs.changed.notify(usize::MAX);
        if announce && let Ok(sub) = st.sub(path) {
            self.announce(sub);
        }
    }

    /// The linked streams of `sub` with data past their acknowledged offset, with their tails:
    /// at most [`MAX_WAKE_STREAMS`], the candidates from the name after the last one the
    /// previous wake named, then around, with the touched streams not taken by the thread yet
    /// and the links `new` (not applied yet) first. `acks` are offsets an ack is about to
    /// record. A candidate whose tail is at or behind its recorded offset, or whose stream is
    /// gone, stops being one (an append to it touches it again). Costs one `head` per stream
    /// looked at, never one per link.
    pub(super) fn pending(
        &self,
        sub: &mut Sub,
        acks: &[(StreamName, Offset)],
        new: &[(StreamName, LinkRec)],
    ) -> Vec<(StreamName, Offset)> {
        self.subs.hook.peek(|n| {
            if sub.links.contains_key(n) {
                sub.candidates.insert(n.clone());
            }
        });
        let mut out = Vec::new();
        for (name, link) in new {
            if out.len() == MAX_WAKE_STREAMS {
                return out;
            }
            if let Some(t) = self.tail_of(name)
                && t > link.acked
            {
                out.push((name.clone(), t));
            }
        }
        let acked: HashMap<&StreamName, Offset> = acks.iter().map(|(n, o)| (n, *o)).collect();
        let mut settled = Vec::new();
        // From the name after the previous wake's last, then around to it.
        let resume = sub.resume_after.as_ref();
        let after = sub.candidates.range::<StreamName, _>((
            resume.map_or(Bound::Unbounded, Bound::Excluded),
            Bound::Unbounded,
        ));
        let before = sub
            .candidates
            .iter()
            .take_while(|n| resume.is_some_and(|s| *n <= s));
        for name in after.chain(before) {
            if out.len() == MAX_WAKE_STREAMS {
                break;
            }
            let Some(l) = sub.links.get(name) else {
                settled.push(name.clone());
                continue;
            };
            match self.tail_of(name) {
                Some(t) if t > l.acked => {
                    if t > acked.get(name).copied().unwrap_or(l.acked) {
                        out.push((name.clone(), t));
                    }
                }
                _ => settled.push(name.clone()),
            }
        }
        for n in settled {
            sub.candidates.remove(&n);
        }
        out
    }

    /// After a pull-wake wake is saved: appends its event to the wake stream (a missing wake
    /// stream is logged; the wake stays claimable).
    pub(super) fn announce(&self, sub: &Sub) {
        let DeliveryKind::PullWake { wake_stream } = &sub.config.delivery else {
            return;
        };
        let Some(w) = &sub.d.wake else { return };
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
            "generation": sub.d.generation,
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
            tracing::warn!(subscription = %sub.path(), wake_stream = %wake_stream.as_str(),
                error = %e, "appending a wake event failed");
        }
    }
}
