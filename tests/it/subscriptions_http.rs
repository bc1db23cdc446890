//! Subscriptions over a real socket against the `brook serve` binary: webhook signatures checked
//! by an independent Ed25519 implementation (Node's `crypto.verify`), kill -9 mid-delivery and
//! mid-lease, a receiver that never answers, lease expiry and fencing, unsafe URLs.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

pub(crate) type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A `brook serve` child on a fixed port and data directory, killed (SIGKILL) when dropped.
pub(crate) struct Brook {
    child: Child,
    pub(crate) base: String,
}

impl Brook {
    pub(crate) async fn start(dir: &Path, port: u16, extra: &[&str]) -> R<Brook> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_brook"))
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir)
            // The receivers of these tests listen on loopback, which webhooks reach only when
            // the operator allows it.
            .args(["--webhook-allow", "127.0.0.0/8"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Ready, not just listening: the port answers 503 STARTING while the store opens.
        let deadline = Instant::now() + Duration::from_secs(20);
        let ready = format!("http://127.0.0.1:{port}/__brook/ready");
        let client = reqwest::Client::new();
        loop {
            let ok = client
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                break;
            }
            if Instant::now() > deadline {
                // Not left running behind a failed test.
                let _ = child.kill();
                let _ = child.wait();
                return Err("brook serve did not become ready".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Brook {
            child,
            base: format!("http://127.0.0.1:{port}/v1/stream/"),
        })
    }

    /// The server's process id (for `/proc/{pid}/io` and `/proc/{pid}/status`).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: nothing flushed or checkpointed by brook itself.
    pub(crate) fn kill(mut self) -> R {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Brook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> R<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One request a receiver got.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    signature: String,
    pub(crate) body: String,
}

/// What the receiver answers.
#[derive(Clone)]
pub(crate) enum Mode {
    /// 200 with this JSON body.
    Answer(&'static str),
    /// Reads the request and never answers.
    Hang,
}

/// A minimal HTTP/1.1 webhook receiver on 127.0.0.1.
pub(crate) struct Receiver {
    pub(crate) url: String,
    got: Arc<Mutex<Vec<Received>>>,
    mode: Arc<Mutex<Mode>>,
}

impl Receiver {
    pub(crate) async fn start(mode: Mode) -> R<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let got = Arc::new(Mutex::new(Vec::new()));
        let mode = Arc::new(Mutex::new(mode));
        let (g, m) = (got.clone(), mode.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (g, m) = (g.clone(), m.clone());
                tokio::spawn(async move {
                    let Some(req) = read_request(&mut sock).await else {
                        return;
                    };
                    g.lock().await.push(req);
                    let mode = m.lock().await.clone();
                    match mode {
                        Mode::Answer(body) => {
                            let res = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = sock.write_all(res.as_bytes()).await;
                        }
                        Mode::Hang => {
                            tokio::time::sleep(Duration::from_hours(1)).await;
                        }
                    }
                });
            }
        });
        Ok(Receiver { url, got, mode })
    }

    async fn count(&self) -> usize {
        self.got.lock().await.len()
    }

    /// Waits until at least `n` requests arrived, returning the newest.
    pub(crate) async fn wait_for(&self, n: usize) -> R<Received> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            {
                let got = self.got.lock().await;
                if got.len() >= n {
                    return Ok(got[got.len() - 1].clone());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no webhook request #{n}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Received> {
    let (head, body) = crate::http_support::read_request(sock).await?;
    Some(Received {
        signature: crate::http_support::head_value(&head, "webhook-signature").unwrap_or_default(),
        body: String::from_utf8_lossy(&body).to_string(),
    })
}

/// Verifies a webhook signature with Node's own Ed25519 (`crypto.verify`), independent of the
/// crate brook signs with.
fn node_verifies(jwks: &str, signature: &str, body: &str) -> R<bool> {
    const SCRIPT: &str = r"
const [jwks, header, body] = process.argv.slice(1);
const crypto = require('crypto');
const p = Object.fromEntries(header.split(',').map((kv) => kv.split('=')));
const jwk = JSON.parse(jwks).keys.find((k) => k.kid === p.kid);
if (!jwk) process.exit(2);
const key = crypto.createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x }, format: 'jwk' });
const ok = crypto.verify(null, Buffer.from(p.t + '.' + body), key, Buffer.from(p.ed25519, 'base64url'));
process.exit(ok ? 0 : 1);
";
    let status = Command::new("node")
        .args(["-e", SCRIPT, jwks, signature, body])
        .status()?;
    Ok(status.success())
}

pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    pub(crate) fn new(base: &str) -> Api {
        Api {
            client: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
    ) -> R<(u16, Value)> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let res = req.send().await?;
        let status = res.status().as_u16();
        let text = res.text().await?;
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, v))
    }

    pub(crate) async fn put(&self, path: &str, body: &Value) -> R<(u16, Value)> {
        self.call(reqwest::Method::PUT, path, None, Some(body.to_string()))
            .await
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> R<(u16, Value)> {
        self.call(reqwest::Method::POST, path, token, Some(body.to_string()))
            .await
    }

    pub(crate) async fn get(&self, path: &str) -> R<(u16, Value)> {
        self.call(reqwest::Method::GET, path, None, None).await
    }

    pub(crate) async fn stream(&self, path: &str, body: &str) -> R {
        let res = self
            .client
            .put(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await?;
        assert_eq!(res.status().as_u16(), 201, "create {path}");
        Ok(())
    }

    pub(crate) async fn append(&self, path: &str, body: &str) -> R<String> {
        let res = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await?;
        assert!(res.status().is_success(), "append {path}");
        Ok(res
            .headers()
            .get("stream-next-offset")
            .ok_or("no Stream-Next-Offset")?
            .to_str()?
            .to_owned())
    }

    pub(crate) async fn tail(&self, path: &str) -> R<String> {
        let res = self
            .client
            .head(format!("{}{path}", self.base))
            .send()
            .await?;
        Ok(res
            .headers()
            .get("stream-next-offset")
            .ok_or("no Stream-Next-Offset")?
            .to_str()?
            .to_owned())
    }

    /// Polls the subscription until `ok` holds for its JSON.
    pub(crate) async fn wait_sub(&self, id: &str, ok: impl Fn(&Value) -> bool) -> R<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, v) = self.get(&format!("__ds/subscriptions/{id}")).await?;
            assert_eq!(status, 200, "{v}");
            if ok(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(format!("subscription {id} never got there: {v}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub(crate) fn acked(v: &Value, path: &str) -> Option<String> {
    v["streams"]
        .as_array()?
        .iter()
        .find(|s| s["path"] == path)
        .and_then(|s| s["acked_offset"].as_str())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_signatures_verify_with_node_and_done_acks_the_snapshot() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &[]).await?;
    let api = Api::new(&server.base);
    let rx = Receiver::start(Mode::Answer(r#"{"done":true}"#)).await?;
    let (status, created) = api
        .put(
            "__ds/subscriptions/hook",
            &json!({"type": "webhook", "pattern": "events/**", "webhook": {"url": rx.url}}),
        )
        .await?;
    assert_eq!(status, 201, "{created}");
    assert!(created.get("webhook_secret").is_none());
    let jwks_url = created["webhook"]["signing"]["jwks_url"]
        .as_str()
        .ok_or("jwks_url")?;
    let jwks = reqwest::get(jwks_url).await?;
    assert_eq!(
        jwks.headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("")),
        Some("application/jwk-set+json")
    );
    let jwks = jwks.text().await?;

    // A stream created later, two segments deep: linked by `**` at its start.
    api.stream("events/a/b", r#"{"n":1}"#).await?;
    let got = rx.wait_for(1).await?;
    assert!(node_verifies(&jwks, &got.signature, &got.body)?);
    assert!(!node_verifies(
        &jwks,
        &got.signature,
        &got.body.replace("events", "evil")
    )?);
    let body: Value = serde_json::from_str(&got.body)?;
    assert_eq!(body["subscription_id"], "hook");
    assert_eq!(
        body["callback_url"],
        format!("{}__ds/subscriptions/hook/callback", server.base)
    );
    let tail = api.tail("events/a/b").await?;
    api.wait_sub("hook", |v| acked(v, "events/a/b").as_deref() == Some(&tail))
        .await?;
    // The keys are owner-only.
    for f in ["webhook-ed25519.key", "token-hmac.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("keys").join(f))?
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_delivery_delivers_again_after_restart() -> R {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::start(dir.path(), port, &["--webhook-timeout-ms", "60000"]).await?;
    let api = Api::new(&server.base);
    let rx = Receiver::start(Mode::Hang).await?;
    api.put(
        "__ds/subscriptions/d",
        &json!({"type": "webhook", "streams": ["jobs/1"], "webhook": {"url": rx.url}}),
    )
    .await?;
    api.stream("jobs/1", "[]").await?;
    let tail = api.append("jobs/1", r#"{"job":1}"#).await?;
    let first = rx.wait_for(1).await?;
    server.kill()?;

    *rx.mode.lock().await = Mode::Answer(r#"{"done":true}"#);
    let server = Brook::start(dir.path(), port, &["--webhook-timeout-ms", "60000"]).await?;
    let again = rx.wait_for(2).await?;
    let (a, b): (Value, Value) = (
        serde_json::from_str(&first.body)?,
        serde_json::from_str(&again.body)?,
    );
    assert_eq!(
        a["streams"][0]["tail_offset"],
        b["streams"][0]["tail_offset"]
    );
    let v = api
        .wait_sub("d", |v| acked(v, "jobs/1").as_deref() == Some(&tail))
        .await?;
    assert_eq!(v["status"], "active");
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_lease_keeps_acks_lease_and_tokens() -> R {
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let server = Brook::start(dir.path(), port, &[]).await?;
    let api = Api::new(&server.base);
    api.stream("wake/pool", "[]").await?;
    api.stream("work/a", "[]").await?;
    let (status, _) = api
        .put(
            "__ds/subscriptions/p",
            &json!({"type": "pull-wake", "pattern": "work/*", "wake_stream": "wake/pool",
                    "lease_ttl_ms": 60000}),
        )
        .await?;
    assert_eq!(status, 201);
    let first = api.append("work/a", "[1]").await?;
    let tail = api.append("work/a", "[2]").await?;
    let (status, claim) = api
        .post("__ds/subscriptions/p/claim", None, &json!({"worker": "w1"}))
        .await?;
    assert_eq!(status, 200, "{claim}");
    let token = claim["token"].as_str().ok_or("token")?.to_owned();
    let fence = json!({"wake_id": claim["wake_id"], "generation": claim["generation"]});
    let mut partial = fence.clone();
    partial["acks"] = json!([{"stream": "work/a", "offset": first}]);
    let (status, _) = api
        .post("__ds/subscriptions/p/ack", Some(&token), &partial)
        .await?;
    assert_eq!(status, 200);
    server.kill()?;

    let server = Brook::start(dir.path(), port, &[]).await?;
    let (_, v) = api.get("__ds/subscriptions/p").await?;
    assert_eq!(acked(&v, "work/a").as_deref(), Some(first.as_str()));
    let (status, busy) = api
        .post("__ds/subscriptions/p/claim", None, &json!({"worker": "w2"}))
        .await?;
    assert_eq!(status, 409);
    assert_eq!(busy["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(busy["error"]["current_holder"], "w1");
    // The token from before the crash still verifies (the secret is on disk).
    let mut done = fence.clone();
    done["acks"] = json!([{"stream": "work/a", "offset": tail}]);
    done["done"] = json!(true);
    let (status, ok) = api
        .post("__ds/subscriptions/p/ack", Some(&token), &done)
        .await?;
    assert_eq!((status, ok), (200, json!({"ok": true, "next_wake": false})));
    let (status, stale) = api
        .post("__ds/subscriptions/p/ack", Some(&token), &done)
        .await?;
    assert_eq!((status, &stale["error"]["code"]), (409, &json!("FENCED")));
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_that_never_answers_fails_and_is_retried_without_blocking_appends() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &["--webhook-timeout-ms", "300"]).await?;
    let api = Api::new(&server.base);
    let rx = Receiver::start(Mode::Hang).await?;
    api.put(
        "__ds/subscriptions/slow",
        &json!({"type": "webhook", "streams": ["q/1"], "webhook": {"url": rx.url}}),
    )
    .await?;
    api.stream("q/1", "[]").await?;
    api.append("q/1", "[1]").await?;
    api.wait_sub("slow", |v| v["status"] == "failed").await?;
    // Retried (1 s ± 20% after the first failure), with the same wake.
    let second = rx.wait_for(2).await?;
    let b: Value = serde_json::from_str(&second.body)?;
    assert_eq!(b["streams"][0]["has_pending"], true);
    // Appends go on while deliveries hang.
    let mut tail = String::new();
    for i in 0..20 {
        tail = api.append("q/1", &format!("[{i}]")).await?;
    }
    *rx.mode.lock().await = Mode::Answer(r#"{"done":true}"#);
    let v = api
        .wait_sub("slow", |v| {
            v["status"] == "active" && acked(v, "q/1").as_deref() == Some(tail.as_str())
        })
        .await?;
    assert_eq!(v["status"], "active");
    // Deleting stops delivery at once: no request after the delete.
    let (status, _) = api
        .call(
            reqwest::Method::DELETE,
            "__ds/subscriptions/slow",
            None,
            None,
        )
        .await?;
    assert_eq!(status, 204);
    let before = rx.count().await;
    api.append("q/1", "[99]").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.count().await, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_expiry_fences_the_stale_worker_and_bad_tokens_are_refused() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &[]).await?;
    let api = Api::new(&server.base);
    api.stream("wake/w", "[]").await?;
    api.stream("t/1", "[]").await?;
    api.put(
        "__ds/subscriptions/f",
        &json!({"type": "pull-wake", "streams": ["t/1"], "wake_stream": "wake/w",
                "lease_ttl_ms": 1000}),
    )
    .await?;
    let tail = api.append("t/1", "[1]").await?;
    let (_, old) = api
        .post(
            "__ds/subscriptions/f/claim",
            None,
            &json!({"worker": "slow"}),
        )
        .await?;
    let old_token = old["token"].as_str().ok_or("token")?.to_owned();
    tokio::time::sleep(Duration::from_millis(1400)).await;
    let (status, new) = api
        .post(
            "__ds/subscriptions/f/claim",
            None,
            &json!({"worker": "fast"}),
        )
        .await?;
    assert_eq!(status, 200, "{new}");
    assert!(new["generation"].as_u64() > old["generation"].as_u64());
    let stale = json!({"wake_id": old["wake_id"], "generation": old["generation"],
                       "acks": [{"stream": "t/1", "offset": tail}], "done": true});
    let (status, v) = api
        .post("__ds/subscriptions/f/ack", Some(&old_token), &stale)
        .await?;
    assert_eq!((status, &v["error"]["code"]), (409, &json!("FENCED")));
    let (status, v) = api
        .post("__ds/subscriptions/f/release", Some(&old_token), &stale)
        .await?;
    assert_eq!((status, &v["error"]["code"]), (409, &json!("FENCED")));
    // The old token with the new wake's numbers: the token names another wake.
    let mixed = json!({"wake_id": new["wake_id"], "generation": new["generation"]});
    let (status, v) = api
        .post("__ds/subscriptions/f/release", Some(&old_token), &mixed)
        .await?;
    assert_eq!((status, &v["error"]["code"]), (409, &json!("FENCED")));
    let (status, v) = api
        .post("__ds/subscriptions/f/release", Some("abc.def"), &mixed)
        .await?;
    assert_eq!(
        (status, &v["error"]["code"]),
        (401, &json!("TOKEN_INVALID"))
    );
    let (status, _) = api
        .post("__ds/subscriptions/f/release", None, &mixed)
        .await?;
    assert_eq!(status, 401);
    // Offsets: -1, past the tail, an unlinked stream.
    let new_token = new["token"].as_str().ok_or("token")?;
    for (stream, offset) in [
        ("t/1", "-1"),
        ("t/1", "0000000000000009_0000000000000999"),
        ("t/none", tail.as_str()),
    ] {
        let mut body = mixed.clone();
        body["acks"] = json!([{"stream": stream, "offset": offset}]);
        let (status, v) = api
            .post("__ds/subscriptions/f/ack", Some(new_token), &body)
            .await?;
        assert_eq!(
            (status, &v["error"]["code"]),
            (409, &json!("INVALID_OFFSET")),
            "{stream} {offset}"
        );
    }
    let (status, _) = api
        .post("__ds/subscriptions/f/release", Some(new_token), &mixed)
        .await?;
    assert_eq!(status, 204);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unsafe_urls_conflicts_and_roots() -> R {
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &[]).await?;
    let api = Api::new(&server.base);
    for url in [
        "http://10.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "http://example.com/hook",
        "https://192.168.0.1/hook",
    ] {
        let (status, v) = api
            .put(
                "__ds/subscriptions/u",
                &json!({"type": "webhook", "pattern": "a/*", "webhook": {"url": url}}),
            )
            .await?;
        assert_eq!(
            (status, &v["error"]["code"]),
            (400, &json!("WEBHOOK_URL_REJECTED")),
            "{url}"
        );
    }
    api.stream("wake/r", "[]").await?;
    let cfg = json!({"type": "pull-wake", "pattern": "a/*", "wake_stream": "wake/r"});
    assert_eq!(api.put("__ds/subscriptions/c", &cfg).await?.0, 201);
    assert_eq!(api.put("__ds/subscriptions/c", &cfg).await?.0, 200);
    let mut other = cfg.clone();
    other["pattern"] = json!("b/*");
    let (status, v) = api.put("__ds/subscriptions/c", &other).await?;
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("SUBSCRIPTION_ALREADY_EXISTS"))
    );
    let (status, _) = api.get("__ds/subscriptions/nope").await?;
    assert_eq!(status, 404);
    // Under another root the subscription does not exist, and stream paths are relative.
    let root2 = Api::new(&server.base.replace("/v1/stream/", "/v2/"));
    assert_eq!(root2.get("__ds/subscriptions/c").await?.0, 404);
    api.stream("a/x", "[1]").await?;
    let v = api.wait_sub("c", |v| acked(v, "a/x").is_some()).await?;
    assert_eq!(v["wake_stream"], "wake/r");
    // A stream name may not hold the reserved segment.
    let res = reqwest::Client::new()
        .put(format!(
            "{}x/__ds/y",
            server.base.replace("/v1/stream/", "/")
        ))
        .send()
        .await?;
    assert_ne!(res.status().as_u16(), 201);
    Ok(())
}

#[cfg(feature = "client")]
#[tokio::test(flavor = "multi_thread")]
async fn the_client_verifies_webhooks_and_runs_a_pull_worker() -> R {
    use brook::client::{Client, Position, SubscriptionSpec, verify_webhook};
    let dir = tempfile::tempdir()?;
    let server = Brook::start(dir.path(), free_port()?, &[]).await?;
    let client = Client::new(server.base.trim_end_matches('/'))?;
    let api = Api::new(&server.base);
    let rx = Receiver::start(Mode::Answer("{}")).await?;
    let hook = client.subscription("hook");
    assert!(
        hook.create(&SubscriptionSpec::webhook(&rx.url).stream("c/1"))
            .await?
            .0
    );
    api.stream("c/1", "[]").await?;
    let tail = api.append("c/1", "[1]").await?;
    let got = rx.wait_for(1).await?;
    let jwks = client.webhook_jwks().await?;
    verify_webhook(
        &jwks,
        &got.signature,
        got.body.as_bytes(),
        Duration::from_mins(5),
    )?;
    // A body the signature is not over.
    assert!(matches!(
        verify_webhook(&jwks, &got.signature, b"{}", Duration::from_mins(5)),
        Err(brook::client::Error::InvalidArgument(m)) if m.contains("does not verify")
    ));
    // The receiver answered without done: it acks through the callback with its token.
    let wake = brook::client::Claim::from_json(&serde_json::from_str(&got.body)?)?;
    let next = hook
        .callback(&wake, &[("c/1", &Position::new(tail.clone()))], true)
        .await?;
    assert!(!next);
    assert_eq!(
        acked(&hook.get().await?, "c/1").as_deref(),
        Some(tail.as_str())
    );

    api.stream("w", "[]").await?;
    let pull = client.subscription("pull");
    pull.create(&SubscriptionSpec::pull_wake("w").pattern("p/*"))
        .await?;
    api.stream("p/1", "[]").await?;
    let end = api.append("p/1", "[1,2]").await?;
    let wakes = pull
        .run_worker(
            "w1",
            Duration::from_millis(50),
            Some(1),
            |claim| async move {
                let acks = claim
                    .streams
                    .iter()
                    .map(|s| (s.path.clone(), s.tail.clone()))
                    .collect();
                Ok((claim, acks))
            },
        )
        .await?;
    assert_eq!(wakes, 1);
    assert_eq!(
        acked(&pull.get().await?, "p/1").as_deref(),
        Some(end.as_str())
    );
    Ok(())
}
