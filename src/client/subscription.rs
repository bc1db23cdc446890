//! Subscriptions from the client side (PROTOCOL.md sections 6 and 7): managing them, a
//! pull-wake worker loop, and verifying a webhook's signature against the server's JWKS.
//!
//! Paths are relative to the [`Client`](super::Client)'s base URL, which is the stream root:
//! `Client::new("http://host/v1/stream")?.subscription("s1")` addresses
//! `http://host/v1/stream/__ds/subscriptions/s1`.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Value, json};

use super::error::{Error, Result};
use super::types::Position;

/// A subscription's configuration, as `PUT __ds/subscriptions/{id}` takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct SubscriptionSpec(Value);

impl SubscriptionSpec {
    /// A webhook subscription delivering to `url`.
    pub fn webhook(url: &str) -> Self {
        SubscriptionSpec(json!({"type": "webhook", "webhook": {"url": url}}))
    }

    /// A pull-wake subscription announcing its wakes on the stream `wake_stream`.
    pub fn pull_wake(wake_stream: &str) -> Self {
        SubscriptionSpec(json!({"type": "pull-wake", "wake_stream": wake_stream}))
    }

    /// Follows the streams matching `glob` (`*` one segment, `**` any number).
    #[must_use]
    pub fn pattern(mut self, glob: &str) -> Self {
        self.0["pattern"] = json!(glob);
        self
    }

    /// Follows `path` explicitly.
    #[must_use]
    pub fn stream(mut self, path: &str) -> Self {
        match self.0.get_mut("streams").and_then(Value::as_array_mut) {
            Some(list) => list.push(json!(path)),
            None => self.0["streams"] = json!([path]),
        }
        self
    }

    /// The lease (1 s to 10 minutes).
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.0["lease_ttl_ms"] = json!(ttl.as_millis() as u64);
        self
    }

    /// A description.
    #[must_use]
    pub fn description(mut self, text: &str) -> Self {
        self.0["description"] = json!(text);
        self
    }
}

/// A wake a worker claimed (or a webhook delivered): what to process, and the token that
/// fences its acks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The wake's id.
    pub wake_id: String,
    /// The wake's generation.
    pub generation: u64,
    /// The Bearer token for acks and releases of this wake.
    pub token: String,
    /// The linked streams.
    pub streams: Vec<ClaimedStream>,
    /// The lease.
    pub lease_ttl: Duration,
}

/// One linked stream of a [`Claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedStream {
    /// The stream's path, relative to the root.
    pub path: String,
    /// Processed up to here.
    pub acked: Position,
    /// The tail when the wake was taken.
    pub tail: Position,
    /// Whether there is data past `acked`.
    pub has_pending: bool,
}

fn field<'a>(v: &'a Value, k: &str) -> Result<&'a Value> {
    v.get(k)
        .ok_or_else(|| Error::InvalidResponse(format!("no {k} in the subscription response")))
}

fn text(v: &Value, k: &str) -> Result<String> {
    field(v, k)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::InvalidResponse(format!("{k} is not a string")))
}

impl Claim {
    /// Reads a claim response (or a webhook body, whose token is `callback_token`).
    pub fn from_json(v: &Value) -> Result<Claim> {
        let token = v
            .get("token")
            .or_else(|| v.get("callback_token"))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::InvalidResponse("no token in the wake".into()))?
            .to_owned();
        let streams = field(v, "streams")?
            .as_array()
            .ok_or_else(|| Error::InvalidResponse("streams is not an array".into()))?
            .iter()
            .map(|s| {
                Ok(ClaimedStream {
                    path: text(s, "path")?,
                    acked: Position::new(text(s, "acked_offset")?),
                    tail: Position::new(text(s, "tail_offset")?),
                    has_pending: s
                        .get("has_pending")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Claim {
            wake_id: text(v, "wake_id")?,
            generation: field(v, "generation")?
                .as_u64()
                .ok_or_else(|| Error::InvalidResponse("generation is not a number".into()))?,
            token,
            streams,
            lease_ttl: Duration::from_millis(
                v.get("lease_ttl_ms").and_then(Value::as_u64).unwrap_or(0),
            ),
        })
    }
}

/// One subscription URL (`{root}/__ds/subscriptions/{id}`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct SubscriptionHandle {
    http: reqwest::Client,
    url: String,
    /// The client's `Authorization` value (`Bearer <token>`), if it has one.
    auth: Option<reqwest::header::HeaderValue>,
}

/// Whether `e` is the protocol error `code`.
pub fn is_code(e: &Error, code: &str) -> bool {
    matches!(e, Error::Http { code: Some(c), .. } if c == code)
}

impl SubscriptionHandle {
    pub(crate) fn new(
        http: reqwest::Client,
        url: String,
        auth: Option<reqwest::header::HeaderValue>,
    ) -> Self {
        SubscriptionHandle { http, url, auth }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        suffix: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let mut req = self.http.request(method, format!("{}{suffix}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        } else if let Some(a) = &self.auth {
            req = req.header(reqwest::header::AUTHORIZATION, a.clone());
        }
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let res = req.send().await.map_err(Error::Transport)?;
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.map_err(Error::Transport)?;
        if !(200..300).contains(&status) {
            return Err(Error::from_reply(status, &headers, &bytes));
        }
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| Error::InvalidResponse(format!("not JSON: {e}")))?
        };
        Ok((status, v))
    }

    /// Creates the subscription (`true`) or confirms an identical one (`false`); returns the
    /// server's view of it too. A different configuration under the id is an
    /// [`Error::Http`] 409 `SUBSCRIPTION_ALREADY_EXISTS`.
    pub async fn create(&self, spec: &SubscriptionSpec) -> Result<(bool, Value)> {
        let (status, v) = self
            .send(reqwest::Method::PUT, "", None, Some(&spec.0))
            .await?;
        Ok((status == 201, v))
    }

    /// The subscription as the server sees it (its JSON: streams with acked offsets, status,
    /// generation, ...).
    pub async fn get(&self) -> Result<Value> {
        Ok(self.send(reqwest::Method::GET, "", None, None).await?.1)
    }

    /// Deletes the subscription.
    pub async fn delete(&self) -> Result<()> {
        self.send(reqwest::Method::DELETE, "", None, None).await?;
        Ok(())
    }

    /// Links streams explicitly (at their tails).
    pub async fn add_streams(&self, paths: &[&str]) -> Result<()> {
        self.send(
            reqwest::Method::POST,
            "/streams",
            None,
            Some(&json!({ "streams": paths })),
        )
        .await?;
        Ok(())
    }

    /// Removes an explicit link.
    pub async fn remove_stream(&self, path: &str) -> Result<()> {
        let encoded: String = path
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        self.send(
            reqwest::Method::DELETE,
            &format!("/streams/{encoded}"),
            None,
            None,
        )
        .await?;
        Ok(())
    }

    /// Claims the pending wake for `worker`. 409 `ALREADY_CLAIMED` or `NO_PENDING_WORK` come
    /// back as [`Error::Http`] (see [`is_code`]).
    pub async fn claim(&self, worker: &str) -> Result<Claim> {
        let (_, v) = self
            .send(
                reqwest::Method::POST,
                "/claim",
                None,
                Some(&json!({ "worker": worker })),
            )
            .await?;
        Claim::from_json(&v)
    }

    /// Acknowledges `acks` (path, processed up to) for `claim`; `done` ends the wake (the
    /// answer says whether another wake followed), otherwise it is a heartbeat.
    pub async fn ack(&self, claim: &Claim, acks: &[(&str, &Position)], done: bool) -> Result<bool> {
        self.ack_at("/ack", claim, acks, done).await
    }

    /// The webhook form of [`SubscriptionHandle::ack`]: `POST .../callback` with the wake's
    /// callback token.
    pub async fn callback(
        &self,
        claim: &Claim,
        acks: &[(&str, &Position)],
        done: bool,
    ) -> Result<bool> {
        self.ack_at("/callback", claim, acks, done).await
    }

    async fn ack_at(
        &self,
        suffix: &str,
        claim: &Claim,
        acks: &[(&str, &Position)],
        done: bool,
    ) -> Result<bool> {
        let acks: Vec<Value> = acks
            .iter()
            .map(|(s, o)| json!({"stream": s, "offset": o.as_str()}))
            .collect();
        let body = json!({
            "wake_id": claim.wake_id,
            "generation": claim.generation,
            "acks": acks,
            "done": done,
        });
        let (_, v) = self
            .send(
                reqwest::Method::POST,
                suffix,
                Some(&claim.token),
                Some(&body),
            )
            .await?;
        Ok(v.get("next_wake").and_then(Value::as_bool).unwrap_or(false))
    }

    /// Gives `claim` back without acknowledging.
    pub async fn release(&self, claim: &Claim) -> Result<()> {
        let body = json!({"wake_id": claim.wake_id, "generation": claim.generation});
        self.send(
            reqwest::Method::POST,
            "/release",
            Some(&claim.token),
            Some(&body),
        )
        .await?;
        Ok(())
    }

    /// A pull-wake worker loop: claims work as `worker`, hands each claim to `process` (which
    /// returns the acks to make: path and offset processed up to), acks them with `done`, and
    /// repeats; when there is nothing to claim it waits `idle` and tries again. A `process`
    /// error releases the claim and ends the loop with that error. Stops after `max_wakes`
    /// wakes (`None`: never).
    pub async fn run_worker<F, Fut>(
        &self,
        worker: &str,
        idle: Duration,
        max_wakes: Option<usize>,
        mut process: F,
    ) -> Result<usize>
    where
        F: FnMut(Claim) -> Fut,
        Fut: Future<Output = Result<(Claim, Vec<(String, Position)>)>>,
    {
        let mut wakes = 0;
        while max_wakes.is_none_or(|m| wakes < m) {
            let claim = match self.claim(worker).await {
                Ok(c) => c,
                Err(e) if is_code(&e, "NO_PENDING_WORK") || is_code(&e, "ALREADY_CLAIMED") => {
                    tokio::time::sleep(idle).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let keep = claim.clone();
            match process(claim).await {
                Ok((claim, acks)) => {
                    let acks: Vec<(&str, &Position)> =
                        acks.iter().map(|(p, o)| (p.as_str(), o)).collect();
                    self.ack(&claim, &acks, true).await?;
                    wakes += 1;
                }
                Err(e) => {
                    let _ = self.release(&keep).await;
                    return Err(e);
                }
            }
        }
        Ok(wakes)
    }
}

/// Verifies a webhook request: `signature` is its `Webhook-Signature` header
/// (`t=..,kid=..,ed25519=..`), `body` its raw body, `jwks` the server's JWK Set (the JSON of
/// `jwks_url`). The signature must be by the key named `kid`, over `"<t>.<body>"`, and `t` within
/// `window` of now (PROTOCOL.md 12.10 suggests five minutes).
pub fn verify_webhook(jwks: &Value, signature: &str, body: &[u8], window: Duration) -> Result<()> {
    use ed25519_dalek::Verifier;
    let bad = |why: &str| Error::InvalidArgument(format!("webhook signature: {why}"));
    let mut t = None;
    let mut kid = None;
    let mut sig = None;
    for part in signature.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("kid", v)) => kid = Some(v),
            Some(("ed25519", v)) => sig = Some(v),
            _ => {}
        }
    }
    let (Some(t), Some(kid), Some(sig)) = (t, kid, sig) else {
        return Err(bad("malformed header"));
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now.abs_diff(t) > window.as_secs() {
        return Err(bad("timestamp outside the replay window"));
    }
    let jwk = jwks
        .get("keys")
        .and_then(Value::as_array)
        .and_then(|keys| keys.iter().find(|k| k["kid"] == kid))
        .ok_or_else(|| bad("unknown kid"))?;
    if jwk["kty"] != "OKP" || jwk["crv"] != "Ed25519" {
        return Err(bad("not an Ed25519 key"));
    }
    let x = jwk["x"]
        .as_str()
        .and_then(|x| B64.decode(x).ok())
        .and_then(|x| <[u8; 32]>::try_from(x.as_slice()).ok())
        .ok_or_else(|| bad("bad key"))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&x).map_err(|_| bad("bad key"))?;
    let sig = B64
        .decode(sig)
        .ok()
        .and_then(|s| ed25519_dalek::Signature::from_slice(&s).ok())
        .ok_or_else(|| bad("bad signature encoding"))?;
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(body);
    key.verify(&msg, &sig)
        .map_err(|_| bad("the signature does not verify"))
}
