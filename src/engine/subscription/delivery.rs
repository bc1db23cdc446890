//! Webhook delivery state: the due jobs (each marked as being sent until its result is
//! recorded), whether a wake is still current, and results with the retry schedule. The
//! deliverer that sends them is the embedding program's (`brook serve`'s `http/webhook.rs`).

use std::time::{SystemTime, UNIX_EPOCH};

use super::super::Engine;
use super::{Delivery, Delta, State};
use crate::error::Result;
use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{DeliveryKind, Wake, WebhookJob, WebhookResult};

/// The first webhook retry waits 1 s; each later one twice as long, up to 60 s (PROTOCOL.md 7.1),
/// each with up to 20% jitter either way.
const RETRY_FIRST_MS: u64 = 1000;
/// The longest wait between webhook retries.
const RETRY_MAX_MS: u64 = 60_000;

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

impl Engine {
    /// Webhook wakes due for a delivery attempt now, each marked as being sent.
    pub(crate) fn take_webhook_jobs(&self) -> Vec<WebhookJob> {
        let mut st = self.subs_state();
        let now = now_ms();
        let mut jobs = Vec::new();
        let State { subs, sending, .. } = &mut *st;
        for (path, sub) in subs.iter() {
            let DeliveryKind::Webhook { url } = &sub.config.delivery else {
                continue;
            };
            let Some(w) = &sub.d.wake else { continue };
            if w.delivered || sub.d.next_attempt_at > now || sending.contains(path) {
                continue;
            }
            sending.insert(path.clone());
            jobs.push(WebhookJob {
                url: url.clone(),
                wake: sub.wake_view(w),
                root: sub.config.root.clone(),
                base_url: sub.config.base_url.clone(),
            });
        }
        jobs
    }

    /// Whether (`path`, `generation`, `wake_id`) is still the subscription's current wake.
    pub(crate) fn wake_is_current(&self, path: &str, generation: u64, wake_id: &str) -> bool {
        self.subs_state()
            .subs
            .get(path)
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
            WebhookResult::Accepted => self.webhook_delivery(wake, |d, ttl_ms| {
                d.failed = false;
                d.attempts = 0;
                let lease = now_ms() + ttl_ms;
                if let Some(w) = d.wake.as_mut() {
                    w.delivered = true;
                    w.lease_until = Some(lease);
                }
            }),
            WebhookResult::Failed => self.webhook_delivery(wake, |d, _| {
                d.failed = true;
                d.attempts = d.attempts.saturating_add(1);
                d.next_attempt_at = now_ms() + retry_delay_ms(d.attempts);
            }),
        }
    }

    /// Records the delivery state `f` makes of the subscription's current one (given its
    /// lease in ms), unless `wake` stopped being its current wake meanwhile.
    fn webhook_delivery(&self, wake: &Wake, f: impl FnOnce(&mut Delivery, u64)) -> Result<()> {
        let path = wake.subscription.as_str();
        let mut st = self.subs_state();
        let sub = st.sub(path)?;
        if sub.fence(wake.generation, &wake.wake_id).is_err() {
            return Ok(());
        }
        let mut d = sub.d.clone();
        f(&mut d, sub.config.lease_ttl.as_millis() as u64);
        self.commit(&mut st, path, &Delta::wake(d))
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
}
