//! The pull-wake worker's calls: claim a wake (its lease starts), ack (a heartbeat, or done),
//! release, and wait for work; acks and releases are fenced by generation and wake id. Each
//! writes one delta record: the acknowledged offsets it changes and the delivery state.

use std::time::{Duration, Instant};

use event_listener::Listener;

use super::super::Engine;
use super::thread::next_wake;
use super::{Delivery, Delta, TICK, invalid};
use crate::error::{Error, Result};
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{AckOutcome, DeliveryKind, Wake};

impl Engine {
    /// Claims the pull-wake subscription's work for `worker`: its current wake, or a new one
    /// when it has pending work. [`Error::AlreadyClaimed`] while another lease runs,
    /// [`Error::NoPendingWork`] when every linked stream is acknowledged.
    pub(crate) fn claim(&self, path: &str, worker: &str) -> Result<Wake> {
        let mut st = self.subs_state();
        let sub = st.sub_mut(path)?;
        if !matches!(sub.config.delivery, DeliveryKind::PullWake { .. }) {
            return Err(invalid("only a pull-wake subscription can be claimed"));
        }
        let now = now_ms();
        let mut d = sub.d.clone();
        if let Some(w) = &d.wake
            && let (Some(holder), Some(until)) = (&w.holder, w.lease_until)
        {
            if until > now {
                return Err(Error::AlreadyClaimed {
                    holder: holder.clone(),
                    generation: d.generation,
                });
            }
            // An expired lease the thread has not cleared yet: clear it now.
            d.wake = None;
        }
        // The wake's streams as they stand now (a wake issued a while ago may have more).
        let tails = self.pending(sub, &[], &[]);
        if d.wake.is_none() {
            if tails.is_empty() {
                // Save a cleared lease even when nothing is pending.
                if sub.d.wake.is_some() {
                    self.commit(&mut st, path, &Delta::wake(d))?;
                    drop(st);
                    self.subs.changed.notify(usize::MAX);
                }
                return Err(Error::NoPendingWork);
            }
            d = next_wake(&d, path, tails);
        } else if let Some(w) = d.wake.as_mut() {
            w.tails = tails;
        }
        let lease = now + sub.config.lease_ttl.as_millis() as u64;
        if let Some(w) = d.wake.as_mut() {
            w.holder = Some(worker.to_owned());
            w.lease_until = Some(lease);
        }
        self.commit(&mut st, path, &Delta::wake(d))?;
        let sub = st.sub(path)?;
        let wake = sub
            .d
            .wake
            .as_ref()
            .map(|w| sub.wake_view(w))
            .expect("a wake was just set");
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
        path: &str,
        generation: u64,
        wake_id: &str,
        acks: &[(StreamName, Offset)],
        done: bool,
    ) -> Result<AckOutcome> {
        let mut st = self.subs_state();
        let sub = st.sub_mut(path)?;
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
            match self.tail_of(name) {
                Some(tail) if *offset <= tail => {}
                _ => {
                    return Err(Error::InvalidAckOffset(format!(
                        "{offset} is beyond the tail of {}",
                        name.as_str()
                    )));
                }
            }
        }
        let mut next_wake_issued = false;
        let d = if done {
            let cleared = Delivery {
                wake: None,
                ..sub.d.clone()
            };
            let tails = self.pending(sub, acks, &[]);
            if tails.is_empty() {
                cleared
            } else {
                next_wake_issued = true;
                next_wake(&cleared, path, tails)
            }
        } else {
            let mut d = sub.d.clone();
            let lease = now_ms() + sub.config.lease_ttl.as_millis() as u64;
            if let Some(w) = d.wake.as_mut() {
                w.lease_until = Some(lease);
            }
            d
        };
        let delta = Delta {
            kind: "ack",
            acks: acks.to_vec(),
            delivery: Some(d),
            ..Delta::default()
        };
        self.commit(&mut st, path, &delta)?;
        if next_wake_issued {
            // Still under `state`, so wake events go out in generation order.
            self.announce(st.sub(path)?);
        }
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(AckOutcome {
            next_wake: next_wake_issued,
        })
    }

    /// Gives the wake (`generation`, `wake_id`) back without acknowledging; a new wake follows
    /// if work remains. A stale wake is [`Error::Fenced`].
    pub(crate) fn release(&self, path: &str, generation: u64, wake_id: &str) -> Result<()> {
        let mut st = self.subs_state();
        let sub = st.sub_mut(path)?;
        sub.fence(generation, wake_id)?;
        let cleared = Delivery {
            wake: None,
            ..sub.d.clone()
        };
        let tails = self.pending(sub, &[], &[]);
        let issued = !tails.is_empty();
        let d = if issued {
            next_wake(&cleared, path, tails)
        } else {
            cleared
        };
        self.commit(&mut st, path, &Delta::wake(d))?;
        if issued {
            self.announce(st.sub(path)?);
        }
        drop(st);
        self.subs.changed.notify(usize::MAX);
        Ok(())
    }

    /// Waits until the subscription has a wake nobody holds, up to `timeout`; `false` on
    /// timeout. [`Error::SubscriptionNotFound`] if it is (or gets) deleted.
    pub(crate) fn wait_for_work(&self, path: &str, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.subs.changed.listen();
            {
                let st = self.subs_state();
                let sub = st.sub(path)?;
                let now = now_ms();
                let claimable =
                    sub.d.wake.as_ref().is_some_and(|w| {
                        w.holder.is_none() || w.lease_until.is_some_and(|t| t <= now)
                    });
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
}
