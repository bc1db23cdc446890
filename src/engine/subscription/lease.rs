//! The pull-wake worker's calls: claim a wake (its lease starts), ack (a heartbeat, or done),
//! release, and wait for work; acks and releases are fenced by generation and wake id.

use std::time::{Duration, Instant};

use event_listener::Listener;

use super::super::Engine;
use super::{TICK, invalid};
use crate::error::{Error, Result};
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{AckOutcome, DeliveryKind, Wake};

impl Engine {
    /// Claims the pull-wake subscription's work for `worker`: its current wake, or a new one
    /// when it has pending work. [`Error::AlreadyClaimed`] while another lease runs,
    /// [`Error::NoPendingWork`] when every linked stream is acknowledged.
    pub(crate) fn claim(&self, id: &str, worker: &str) -> Result<Wake> {
        let mut st = self.subs_state();
        let mut sub = st.sub(id)?.clone();
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
                let sub = st.sub(id)?;
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
}
