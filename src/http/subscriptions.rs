//! The protocol's reserved routes under `{root}__ds/` (PROTOCOL.md sections 6 and 7), where
//! `{root}` is the request path before `__ds/` (empty, or ending in `/`), and stream paths in
//! bodies are relative to it:
//!
//! | route | methods | does |
//! |---|---|---|
//! | `__ds/jwks.json` | `GET` | the webhook signing keys (`application/jwk-set+json`) |
//! | `__ds/subscriptions/{id}` | `PUT` `GET` `DELETE` | create (201) or re-confirm (200); read; delete (204) |
//! | `__ds/subscriptions/{id}/streams` | `POST` | link streams explicitly (204) |
//! | `__ds/subscriptions/{id}/streams/{path}` | `DELETE` | remove an explicit link (204) |
//! | `__ds/subscriptions/{id}/callback` | `POST` | a webhook receiver's ack (Bearer callback token) |
//! | `__ds/subscriptions/{id}/claim` | `POST` | a pull-wake worker claims the pending wake |
//! | `__ds/subscriptions/{id}/ack` | `POST` | ack or heartbeat (Bearer claim token) |
//! | `__ds/subscriptions/{id}/release` | `POST` | give the wake back (Bearer claim token, 204) |
//!
//! A subscription belongs to the root it was created under: the engine keys it by its path,
//! `{root}{id}`, so each root has its own ids and a route under another root never reaches it.
//!
//! Tokens are verified without server state (`keys.rs`): a bad signature, or a token for
//! another subscription or root, is 401 `TOKEN_INVALID`, an expired token 401 `TOKEN_EXPIRED`,
//! and a token or request whose generation or wake id is not the current one 409 `FENCED`.

use std::time::{Duration, UNIX_EPOCH};

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::name::{Offset, StreamName};
use crate::state::now_ms;
use crate::subscription::{DeliveryKind, SubscriptionConfig, SubscriptionInfo, Wake};

use super::error::{ApiError, Op};
use super::keys::{Keys, TOKEN_LIFETIME_MS, TokenError};
use super::webhook::policy;
use super::{AppState, blocking};

/// The largest subscription request body: 1 MiB.
const MAX_BODY: usize = 1 << 20;

/// Sends a `__ds/{rest}` request under `root` to its handler.
pub(crate) async fn dispatch(
    app: &AppState,
    root: &str,
    rest: &str,
    parts: Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let m = parts.method.clone();
    if rest == "jwks.json" {
        return match m {
            Method::GET | Method::HEAD => jwks(app),
            _ => Err(ApiError::MethodNotAllowed {
                allow: "GET, HEAD, OPTIONS",
            }),
        };
    }
    let Some(sub_path) = rest.strip_prefix("subscriptions/") else {
        return Err(ApiError::no_such_route(parts.uri.path()));
    };
    let (id, action) = match sub_path.split_once('/') {
        Some((id, action)) => (decode(id), Some(action)),
        None => (decode(sub_path), None),
    };
    if id.is_empty() {
        return Err(ApiError::no_such_route(parts.uri.path()));
    }
    let ctx = Ctx {
        app: app.clone(),
        root: root.to_owned(),
        path: crate::engine::subscription::sub_path(root, &id),
        id,
        base: base_url(app, &parts, root),
    };
    match (action, m) {
        (None, Method::PUT) => ctx.put(body).await,
        (None, Method::GET) => ctx.get().await,
        (None, Method::DELETE) => ctx.delete().await,
        (None, _) => Err(ApiError::MethodNotAllowed {
            allow: "GET, PUT, DELETE, OPTIONS",
        }),
        (Some("streams"), Method::POST) => ctx.link(body).await,
        (Some(a), Method::DELETE) if a.starts_with("streams/") => {
            ctx.unlink(&decode(&a["streams/".len()..])).await
        }
        (Some("callback" | "ack"), Method::POST) => ctx.ack(&parts, body).await,
        (Some("claim"), Method::POST) => ctx.claim(body).await,
        (Some("release"), Method::POST) => ctx.release(&parts, body).await,
        (Some("streams" | "callback" | "ack" | "claim" | "release"), _) => {
            Err(ApiError::MethodNotAllowed {
                allow: "POST, OPTIONS",
            })
        }
        (Some(a), _) if a.starts_with("streams/") => Err(ApiError::MethodNotAllowed {
            allow: "DELETE, OPTIONS",
        }),
        _ => Err(ApiError::no_such_route(parts.uri.path())),
    }
}

/// Percent-decoding of a path segment (`%XX` only; invalid escapes stay as they are).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The absolute URL of the stream root (`http://host/v1/stream/`), from `public_url` or the
/// request's `Host`.
fn base_url(app: &AppState, parts: &Parts, root: &str) -> String {
    let full = super::request::absolute_url(app, parts);
    let path = parts.uri.path();
    let origin = full.strip_suffix(path).unwrap_or(&full);
    format!("{origin}/{root}")
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut res = Response::new(Body::from(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn no_content() -> Response {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    res
}

fn keys(app: &AppState) -> Result<&Keys, ApiError> {
    app.keys
        .as_ref()
        .as_ref()
        .map_err(|e| ApiError::internal(&format!("subscription keys unavailable: {e}")))
}

fn jwks(app: &AppState) -> Result<Response, ApiError> {
    let mut res = json_response(StatusCode::OK, &keys(app)?.jwks());
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/jwk-set+json"),
    );
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    Ok(res)
}

fn bad(detail: impl Into<String>) -> ApiError {
    ApiError::bad_request("INVALID_ARGUMENT", detail)
}

fn unauthorized(code: &'static str, detail: &str) -> ApiError {
    ApiError::Http {
        status: StatusCode::UNAUTHORIZED,
        code,
        detail: detail.to_owned(),
    }
}

fn conflict(code: &'static str, detail: impl Into<String>) -> ApiError {
    ApiError::Http {
        status: StatusCode::CONFLICT,
        code,
        detail: detail.into(),
    }
}

/// Whether a webhook URL may be used (PROTOCOL.md 6.2 and 12.8), decided without connecting:
/// `https://`, or plain `http://` only to `localhost`, a 127.0.0.0/8 address or `[::1]` (the
/// protocol's development exception), to a host the address policy lets webhooks reach
/// (`webhook/policy.rs`): an IP literal outside the refused ranges or inside `allow`, or a name
/// that `lookup` resolves, within `timeout`, to at least one such address. Loopback is refused
/// like any local target unless `allow` covers it, so the development exception needs the
/// operator's `--webhook-allow 127.0.0.0/8`. Deliveries apply the policy again on every
/// connect; this check only answers early.
pub(crate) async fn check_webhook_url(
    url: &str,
    allow: &[ipnet::IpNet],
    lookup: policy::Lookup,
    timeout: Duration,
) -> Result<(), String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    let host = u.host().ok_or("the URL has no host")?;
    match u.scheme() {
        "https" => {}
        "http" => {
            let development = match &host {
                url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
                url::Host::Ipv4(a) => a.is_loopback(),
                url::Host::Ipv6(a) => a.is_loopback(),
            };
            if !development {
                return Err("plain http:// is allowed only to localhost or 127.0.0.x".into());
            }
        }
        other => return Err(format!("the scheme {other}: is not allowed")),
    }
    let url::Host::Domain(name) = host else {
        return policy::check_literal(&host, allow).map_err(|r| r.to_string());
    };
    match tokio::time::timeout(timeout, policy::reachable(name, allow, lookup)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(unreachable)) => Err(unreachable.to_string()),
        Err(_) => Err(policy::Unreachable {
            host: name.to_owned(),
            cause: "the lookup timed out".into(),
        }
        .to_string()),
    }
}

/// The JSON of a wake's streams, paths relative to `root`.
pub(crate) fn wake_streams(root: &str, wake: &Wake) -> Vec<Value> {
    wake.streams
        .iter()
        .map(|s| {
            json!({
                "path": relative(root, &s.stream),
                "link_type": s.link_type.as_str(),
                "acked_offset": s.acked.to_string(),
                "tail_offset": s.tail.to_string(),
                "has_pending": s.has_pending(),
            })
        })
        .collect()
}

fn relative<'a>(root: &str, name: &'a StreamName) -> &'a str {
    name.as_str().strip_prefix(root).unwrap_or(name.as_str())
}

fn rfc3339_ms(t: std::time::SystemTime) -> String {
    let ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let nanos = i128::try_from(ms * 1_000_000).unwrap_or(0);
    let dt = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.millisecond()
    )
}

/// One subscription request: the app, the root, the subscription id and its path (the key the
/// store knows it by), and the root's URL.
struct Ctx {
    app: AppState,
    root: String,
    id: String,
    path: String,
    base: String,
}

impl Ctx {
    fn name(&self, path: &str) -> Result<StreamName, ApiError> {
        let path = path.strip_prefix('/').unwrap_or(path);
        StreamName::new(&format!("{}{path}", self.root))
            .map_err(|e| ApiError::bad_request("INVALID_STREAM_NAME", format!("{path}: {e}")))
    }

    async fn body(&self, body: Body) -> Result<Value, ApiError> {
        // The declared length (hyper's from `Content-Length`, brook's loop's from the body).
        let declared = http_body::Body::size_hint(&body).exact();
        let rules = self.app.body_rules();
        let held = super::body::read_body(body, declared, MAX_BODY, &rules).await?;
        let bytes = held.bytes;
        if bytes.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request("INVALID_JSON", format!("invalid JSON body: {e}")))
    }

    /// The subscription under this root.
    async fn info(&self) -> Result<SubscriptionInfo, ApiError> {
        let store = self.app.store.clone();
        let path = self.path.clone();
        blocking(Op::Read, move || store.subscription(&path)).await
    }

    fn view(&self, info: &SubscriptionInfo) -> Result<Value, ApiError> {
        let c = &info.config;
        let streams: Vec<Value> = info
            .links
            .iter()
            .map(|l| {
                json!({
                    "path": relative(&self.root, &l.stream),
                    "link_type": l.link_type.as_str(),
                    "acked_offset": l.acked.to_string(),
                })
            })
            .collect();
        let (kind, webhook, wake_stream) = match &c.delivery {
            DeliveryKind::Webhook { url } => (
                "webhook",
                json!({
                    "url": url,
                    "signing": {
                        "alg": "ed25519",
                        "kid": keys(&self.app)?.kid(),
                        "jwks_url": format!("{}__ds/jwks.json", self.base),
                    },
                }),
                Value::Null,
            ),
            DeliveryKind::PullWake { wake_stream } => (
                "pull-wake",
                Value::Null,
                Value::from(relative(&self.root, wake_stream)),
            ),
        };
        Ok(json!({
            "id": info.id,
            "subscription_id": info.id,
            "type": kind,
            "pattern": c.pattern,
            "streams": streams,
            "webhook": webhook,
            "wake_stream": wake_stream,
            "lease_ttl_ms": c.lease_ttl.as_millis() as u64,
            "created_at": rfc3339_ms(info.created_at),
            "status": info.status.as_str(),
            "description": c.description,
            "generation": info.generation,
        }))
    }

    async fn put(&self, body: Body) -> Result<Response, ApiError> {
        let v = self.body(body).await?;
        let mut config = match v.get("type").and_then(Value::as_str) {
            Some("webhook") => {
                let url = v
                    .pointer("/webhook/url")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a webhook subscription needs webhook.url"))?;
                let config = &self.app.config;
                let lookup = policy::system_lookup;
                check_webhook_url(url, &config.webhook_allow, lookup, config.webhook_timeout)
                    .await
                    .map_err(|why| {
                        // Where to look when a development receiver on loopback is refused.
                        let hint = if why.starts_with("refused by policy") {
                            " (the server's --webhook-allow CIDR permits a range)"
                        } else {
                            ""
                        };
                        let detail = format!("{url}: {why}{hint}");
                        ApiError::bad_request("WEBHOOK_URL_REJECTED", detail)
                    })?;
                SubscriptionConfig::webhook(url)
            }
            Some("pull-wake") => {
                let wake = v
                    .get("wake_stream")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a pull-wake subscription needs wake_stream"))?;
                SubscriptionConfig::pull_wake(self.name(wake)?)
            }
            _ => return Err(bad("type must be \"webhook\" or \"pull-wake\"")),
        };
        config.root.clone_from(&self.root);
        config.base_url = Some(self.base.clone());
        match v.get("pattern") {
            None | Some(Value::Null) => {}
            Some(Value::String(p)) => config = config.pattern(p.clone()),
            Some(_) => return Err(bad("pattern must be a string")),
        }
        match v.get("streams") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for item in items {
                    let path = item.as_str().ok_or_else(|| bad("streams holds strings"))?;
                    config = config.stream(self.name(path)?);
                }
            }
            Some(_) => return Err(bad("streams must be an array")),
        }
        match v.get("lease_ttl_ms") {
            None | Some(Value::Null) => {}
            Some(n) => {
                let ms = n
                    .as_u64()
                    .ok_or_else(|| bad("lease_ttl_ms must be an integer"))?;
                config = config.lease_ttl(Duration::from_millis(ms));
            }
        }
        match v.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) => config = config.description(d.clone()),
            Some(_) => return Err(bad("description must be a string")),
        }
        let store = self.app.store.clone();
        let id = self.id.clone();
        let (info, created) =
            blocking(Op::Create, move || store.create_subscription(&id, config)).await?;
        let status = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(json_response(status, &self.view(&info)?))
    }

    async fn get(&self) -> Result<Response, ApiError> {
        let info = self.info().await?;
        Ok(json_response(StatusCode::OK, &self.view(&info)?))
    }

    async fn delete(&self) -> Result<Response, ApiError> {
        let store = self.app.store.clone();
        let path = self.path.clone();
        blocking(Op::Read, move || store.delete_subscription(&path)).await?;
        Ok(no_content())
    }

    async fn link(&self, body: Body) -> Result<Response, ApiError> {
        let v = self.body(body).await?;
        let items = v
            .get("streams")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("the body needs a streams array"))?;
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            names.push(self.name(item.as_str().ok_or_else(|| bad("streams holds strings"))?)?);
        }
        let store = self.app.store.clone();
        let path = self.path.clone();
        blocking(Op::Read, move || store.link_streams(&path, &names)).await?;
        Ok(no_content())
    }

    async fn unlink(&self, path: &str) -> Result<Response, ApiError> {
        let name = self.name(path)?;
        let store = self.app.store.clone();
        let path = self.path.clone();
        blocking(Op::Read, move || store.unlink_stream(&path, &name)).await?;
        Ok(no_content())
    }

    /// The wake a request names, checked against its Bearer token: the token must verify, be
    /// for this subscription, and name the same generation and wake id as the body.
    fn fenced_wake(&self, parts: &Parts, v: &Value) -> Result<(u64, String), ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("TOKEN_INVALID", "a Bearer token is required"))?;
        let claims = keys(&self.app)?
            .verify_token(token.trim(), now_ms())
            .map_err(|e| match e {
                TokenError::Invalid => unauthorized("TOKEN_INVALID", "the token does not verify"),
                TokenError::Expired => unauthorized("TOKEN_EXPIRED", "the token has expired"),
            })?;
        // A token without a root was issued before ids were scoped to roots; its wake id
        // still fences it to its own subscription's wake.
        if claims.sub != self.id || claims.root.as_ref().is_some_and(|r| *r != self.root) {
            return Err(unauthorized(
                "TOKEN_INVALID",
                "the token is for another subscription",
            ));
        }
        let generation = v
            .get("generation")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("the body needs generation"))?;
        let wake_id = v
            .get("wake_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("the body needs wake_id"))?;
        if claims.generation != generation || claims.wake_id != wake_id {
            return Err(conflict(
                "FENCED",
                "the token is for another generation or wake",
            ));
        }
        Ok((generation, wake_id.to_owned()))
    }

    async fn ack(&self, parts: &Parts, body: Body) -> Result<Response, ApiError> {
        let v = self.body(body).await?;
        let (generation, wake_id) = self.fenced_wake(parts, &v)?;
        let mut acks = Vec::new();
        if let Some(items) = v.get("acks") {
            let items = items
                .as_array()
                .ok_or_else(|| bad("acks must be an array"))?;
            for a in items {
                let stream = a
                    .get("stream")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("each ack needs a stream"))?;
                let offset = a
                    .get("offset")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("each ack needs an offset"))?;
                let offset: Offset = offset.parse().map_err(|_| {
                    conflict(
                        "INVALID_OFFSET",
                        format!("{offset} is not an offset of the stream"),
                    )
                })?;
                let name = self.name(stream).map_err(|_| {
                    conflict("INVALID_OFFSET", format!("{stream} is not a linked stream"))
                })?;
                acks.push((name, offset));
            }
        }
        let done = v.get("done").and_then(Value::as_bool).unwrap_or(false);
        let store = self.app.store.clone();
        let path = self.path.clone();
        let outcome = blocking(Op::Read, move || {
            let wake = crate::subscription::WakeRef {
                subscription: &path,
                generation,
                wake_id: &wake_id,
            };
            store.ack(wake, &acks, done)
        })
        .await?;
        Ok(json_response(
            StatusCode::OK,
            &json!({"ok": true, "next_wake": outcome.next_wake}),
        ))
    }

    async fn claim(&self, body: Body) -> Result<Response, ApiError> {
        let v = self.body(body).await?;
        let worker = v
            .get("worker")
            .and_then(Value::as_str)
            .unwrap_or("anonymous")
            .to_owned();
        let store = self.app.store.clone();
        let path = self.path.clone();
        let wake = blocking(Op::Read, move || store.claim(&path, &worker)).await?;
        let exp = now_ms() + TOKEN_LIFETIME_MS + wake.lease_ttl.as_millis() as u64;
        let token =
            keys(&self.app)?.token(&self.id, &self.root, wake.generation, &wake.wake_id, exp);
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "wake_id": wake.wake_id,
                "generation": wake.generation,
                "token": token,
                "streams": wake_streams(&self.root, &wake),
                "lease_ttl_ms": wake.lease_ttl.as_millis() as u64,
            }),
        ))
    }

    async fn release(&self, parts: &Parts, body: Body) -> Result<Response, ApiError> {
        let v = self.body(body).await?;
        let (generation, wake_id) = self.fenced_wake(parts, &v)?;
        let store = self.app.store.clone();
        let path = self.path.clone();
        blocking(Op::Read, move || {
            store.release(crate::subscription::WakeRef {
                subscription: &path,
                generation,
                wake_id: &wake_id,
            })
        })
        .await?;
        Ok(no_content())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// A resolver table for the URL checks: no test asks a DNS server.
    fn table(
        host: String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let ip = |s: &str| s.parse::<IpAddr>().expect("a test address");
        Box::pin(async move {
            match host.as_str() {
                "hooks.example.com" => Ok(vec![ip("8.8.8.8")]),
                "localhost" | "localhost." | "box.internal" => Ok(vec![ip("127.0.0.1"), ip("::1")]),
                "metadata.google.internal" => Ok(vec![ip("169.254.169.254")]),
                _ => Err(std::io::Error::other("no such host")),
            }
        })
    }

    async fn check(url: &str, allow: &[&str]) -> Result<(), String> {
        let allow: Vec<ipnet::IpNet> = allow.iter().map(|s| s.parse().expect("a CIDR")).collect();
        check_webhook_url(url, &allow, table, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn webhook_urls_follow_section_12_8() {
        for ok in [
            "https://hooks.example.com/x",
            "https://8.8.8.8/h",
            "https://[2606:4700:4700::1111]/h",
            "https://[::ffff:8.8.8.8]/h",
        ] {
            assert_eq!(check(ok, &[]).await, Ok(()), "{ok}");
        }
        // The development exception, and loopback over https, once the operator allows it.
        for ok in [
            "http://localhost:8080/h",
            "http://127.0.0.1:9/h",
            "http://127.0.0.7/h",
            "https://127.0.0.1/h",
            "https://localhost./h",
            "https://box.internal/h",
        ] {
            assert_eq!(check(ok, &["127.0.0.0/8"]).await, Ok(()), "{ok}");
        }
        assert_eq!(check("http://[::1]:80/h", &["::1/128"]).await, Ok(()));
        // Refused by the protocol's scheme rule, whatever the allow list says.
        for bad in [
            "http://10.0.0.1/hook",
            "http://example.com/h",
            "http://localhost./h",
            "http://[::ffff:127.0.0.1]/h",
            "ftp://example.com/h",
            "not a url",
        ] {
            let e = check(bad, &["0.0.0.0/0", "::/0"]).await.expect_err(bad);
            assert!(!e.contains("refused by policy"), "{bad}: {e}");
        }
        // Refused by the address policy, before any connection.
        for bad in [
            "http://localhost:8080/h",
            "http://127.0.0.1:9/h",
            "http://[::1]:80/h",
            "https://localhost/h",
            "https://localhost./h",
            "https://box.internal/h",
            "https://10.1.2.3/h",
            "https://192.168.1.1/h",
            "https://172.16.0.1/h",
            "https://100.64.0.1/h",
            "https://169.254.169.254/latest",
            "https://metadata.google.internal/computeMetadata/v1/",
            "https://nowhere.test/h",
            "https://127.0.0.1/h",
            "https://[fe80::1]/h",
            "https://[fd00::1]/h",
            "https://[::ffff:10.0.0.1]/h",
            "https://[::ffff:127.0.0.1]/h",
            "https://[::7f00:1]/h",
            "https://[::a9fe:a9fe]/h",
            "https://[64:ff9b::a9fe:a9fe]/h",
            "https://[64:ff9b::7f00:1]/h",
            "https://[2002:a9fe:a9fe::1]/h",
            "https://[2002:7f00:1::1]/h",
            "https://0.0.0.0/h",
            "https://[::]/h",
            "https://224.0.0.1/h",
            "https://255.255.255.255/h",
        ] {
            let e = check(bad, &[]).await.expect_err(bad);
            assert!(e.starts_with("refused by policy: "), "{bad}: {e}");
        }
        // An allow entry admits its range only.
        let e = check("https://10.2.0.1/h", &["10.1.0.0/16"]).await;
        assert!(e.is_err_and(|e| e.contains("10.0.0.0/8")));
        assert_eq!(check("https://10.1.0.1/h", &["10.1.0.0/16"]).await, Ok(()));
    }

    #[test]
    fn path_segments_decode() {
        assert_eq!(decode("manual%2Fb"), "manual/b");
        assert_eq!(decode("a%zz"), "a%zz");
        assert_eq!(decode("plain"), "plain");
    }
}
