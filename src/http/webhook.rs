//! Webhook delivery (PROTOCOL.md 7.1): one task takes the engine's due webhook wakes and hands
//! each to a delivery task, at most [`MAX_IN_FLIGHT`] sending at once and at most one per
//! subscription (the engine marks a wake as being sent until its result is recorded).
//!
//! A delivery POSTs the wake's JSON body with `Webhook-Signature: t=..,kid=..,ed25519=..` over
//! `"<t>.<body>"`, with no redirects, and waits at most `ServerConfig::webhook_timeout` (10 s)
//! for the whole answer, reading at most [`MAX_RESPONSE`] bytes of it. A 2xx whose body is `{"done": true}`
//! acks the wake's tails; any other 2xx leaves the wake to the receiver's callback (its lease
//! starts then); anything else, or no answer in time, marks the subscription `failed` and
//! schedules a retry (1 s doubling to 60 s, 20% jitter; the schedule is durable). Nothing here
//! runs on an append's path, so a slow or dead receiver delays only its own subscription, and
//! costs at most one request body and one connection.
//!
//! Every connection goes only where the address policy ([`policy`]) and the operator's
//! `ServerConfig::webhook_allow` let it: host names are resolved by the policy's resolver on
//! each connect, IP literals are checked before each request, proxies from the environment are
//! not used (a proxy would resolve the host itself), and redirects are not followed. A refused
//! attempt fails as "refused by policy" without connecting.

pub(crate) mod policy;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::sync::Semaphore;

use crate::state::now_ms;
use crate::subscription::{WebhookJob, WebhookResult};

use super::AppState;
use super::keys::{Keys, TOKEN_LIFETIME_MS};
use super::subscriptions::wake_streams;
use crate::{Store, WeakStore};

/// Webhook requests in flight at once, across all subscriptions: 32.
pub(crate) const MAX_IN_FLIGHT: usize = 32;
/// The most of a receiver's response body that is read: 64 KiB.
pub(crate) const MAX_RESPONSE: usize = 64 << 10;
/// How often the delivery loop looks for due retries when nothing wakes it.
const POLL: Duration = Duration::from_millis(250);

/// What the delivery tasks share. The store is held weakly, so a dropped router or server lets
/// the store close (the loop then ends); each engine call upgrades it for the call's length.
#[derive(Clone)]
struct Ctx {
    store: WeakStore,
    keys: Arc<Result<Keys, String>>,
    /// The operator's `webhook_allow`.
    allow: Arc<[ipnet::IpNet]>,
}

impl Ctx {
    fn store(&self) -> Option<Store> {
        self.store.upgrade()
    }
}

/// Starts the delivery loop on the current tokio runtime. It ends when the server shuts down or
/// every [`AppState`] (and so the shutdown channel's sender) is gone, or the store closes.
pub(crate) fn spawn(app: &AppState) {
    let ctx = Ctx {
        store: app.store.downgrade(),
        keys: app.keys.clone(),
        allow: app.config.webhook_allow.clone().into(),
    };
    tokio::spawn(run(ctx, app.config.webhook_timeout, app.shutdown.clone()));
}

/// The delivery client: the policy's resolver, no proxies, no redirects, `timeout` per attempt.
fn client(timeout: Duration, allow: Arc<[ipnet::IpNet]>) -> reqwest::Result<reqwest::Client> {
    let resolver = policy::PolicyResolver::new(allow, policy::system_lookup);
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(resolver))
        .build()
}

async fn run(ctx: Ctx, timeout: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    // Built for the first job, not at start: building it loads the system's certificate
    // authorities (the CA bundle parsed, some 20 million instructions and a few hundred KiB
    // kept), which a server that never delivers a webhook does not need.
    let mut http: Option<reqwest::Client> = None;
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let Some(store) = ctx.store() else {
            return;
        };
        let listener = store.subscription_change();
        // With no subscription at all there is nothing to look for (one atomic load).
        let jobs = if store.has_subscriptions() {
            tokio::task::spawn_blocking(move || store.take_webhook_jobs())
                .await
                .unwrap_or_default()
        } else {
            drop(store);
            Vec::new()
        };
        for job in jobs {
            let c = match &http {
                Some(c) => c.clone(),
                None => match client(timeout, ctx.allow.clone()) {
                    Ok(c) => http.insert(c).clone(),
                    Err(e) => {
                        tracing::error!(error = %e, "webhook delivery disabled: no HTTP client");
                        return;
                    }
                },
            };
            tokio::spawn(deliver(ctx.clone(), c, permits.clone(), job));
        }
        tokio::select! {
            () = listener => {}
            () = tokio::time::sleep(POLL) => {}
            // A shutdown, or the sender dropped with the last AppState.
            _ = shutdown.wait_for(|down| *down) => return,
        }
    }
}

/// `s` with every byte but the URL-unreserved ones percent-encoded.
fn encode(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The body of a wake's webhook request, with a fresh callback token.
fn body(keys: &Keys, job: &WebhookJob) -> String {
    let w = &job.wake;
    let exp = now_ms() + TOKEN_LIFETIME_MS + w.lease_ttl.as_millis() as u64;
    let base = job.base_url.as_deref().unwrap_or("");
    // The wake names the subscription by its path; the protocol's body by its id.
    let id = w
        .subscription
        .strip_prefix(job.root.as_str())
        .unwrap_or(&w.subscription);
    json!({
            "subscription_id": id,
            "wake_id": w.wake_id,
            "generation": w.generation,
            "streams": wake_streams(&job.root, w),
            "callback_url": format!("{base}__ds/subscriptions/{}/callback", encode(id)),
            "callback_token": keys.token(id, &job.root, w.generation, &w.wake_id, exp),
    })
    .to_string()
}

async fn deliver(ctx: Ctx, client: reqwest::Client, permits: Arc<Semaphore>, job: WebhookJob) {
    let Ok(_permit) = permits.acquire_owned().await else {
        return;
    };
    let w = job.wake.clone();
    let (result, why) = attempt(&ctx, &client, &job).await;
    if result == WebhookResult::Failed {
        tracing::warn!(subscription = %w.subscription, generation = w.generation,
            url = %job.url, why, "webhook delivery failed");
    } else {
        tracing::debug!(subscription = %w.subscription, generation = w.generation,
            ?result, "webhook delivered");
    }
    let Some(store) = ctx.store() else {
        return;
    };
    let recorded = tokio::task::spawn_blocking(move || store.record_webhook(&w, result)).await;
    if let Ok(Err(e)) = recorded {
        tracing::warn!(error = %e, "recording a webhook result failed");
    }
}

/// One delivery attempt: skipped (as failed, which the engine ignores) when the wake is no
/// longer current, e.g. its subscription was deleted while it waited for a permit.
async fn attempt(ctx: &Ctx, client: &reqwest::Client, job: &WebhookJob) -> (WebhookResult, String) {
    let failed = |why: String| (WebhookResult::Failed, why);
    let Some(store) = ctx.store() else {
        return failed("the store is closed".into());
    };
    let w = job.wake.clone();
    let current = tokio::task::spawn_blocking(move || store.wake_is_current(&w))
        .await
        .unwrap_or(false);
    if !current {
        return failed("the wake is no longer current".into());
    }
    let Ok(keys) = ctx.keys.as_ref() else {
        return failed("the signing keys are unavailable".into());
    };
    // The resolver judges host names at connect time; it is never asked about IP literals.
    let url = match reqwest::Url::parse(&job.url) {
        Ok(url) => url,
        Err(e) => return failed(format!("not a URL: {e}")),
    };
    let Some(host) = url.host() else {
        return failed("the URL has no host".into());
    };
    if let Err(refused) = policy::check_literal(&host, &ctx.allow) {
        return failed(refused.to_string());
    }
    let body = body(keys, job);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let signature = keys.webhook_signature(t, body.as_bytes());
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    let mut res = match sent {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => return failed(format!("the receiver answered {}", r.status())),
        Err(e) => {
            return failed(match policy::refusal_in(&e) {
                // The resolver's reason (the addresses refused) is for the log only.
                Some(refused) => format!("{refused} ({})", refused.cause),
                None => chain(&e),
            });
        }
    };
    let mut answer = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => {
                if answer.len() + chunk.len() > MAX_RESPONSE {
                    break;
                }
                answer.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return failed(format!("reading the answer: {}", chain(&e))),
        }
    }
    let done = serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v.get("done").and_then(serde_json::Value::as_bool))
        .unwrap_or(false);
    let result = if done {
        WebhookResult::Done
    } else {
        WebhookResult::Accepted
    };
    (result, String::new())
}
