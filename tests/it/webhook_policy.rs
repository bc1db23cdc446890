//! The webhook address policy over real sockets: a receiver on 127.0.0.1 is never contacted
//! through a name or an IPv6 form that reaches loopback unless the operator allows loopback
//! (`webhook_allow`, `--webhook-allow`), neither at creation nor at delivery (a subscription
//! stored while loopback was allowed is refused on connect once it is not). Only loopback
//! addresses and names that resolve to loopback from `/etc/hosts` are used: every refusal here
//! is decided before anything is sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use brook::Options;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::http_support::{R, Server, config, read_request, spawn_serve};

/// A webhook receiver on 127.0.0.1 that counts the connections it accepts and answers each
/// request `200 {"done": true}`.
struct Receiver {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start() -> R<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if read_request(&mut sock).await.is_some() {
                        let body = r#"{"done":true}"#;
                        let res = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = sock.write_all(res.as_bytes()).await;
                    }
                });
            }
        });
        Ok(Receiver { port, accepted })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// This machine's host name, if `/etc/hosts` maps it to loopback only (so resolving it asks
/// no DNS server and connecting to it stays on this machine).
fn loopback_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_owned();
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    let mut found = false;
    for line in hosts.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_whitespace();
        let Some(addr) = fields.next() else { continue };
        if fields.any(|f| f.eq_ignore_ascii_case(&name)) {
            let ip: std::net::IpAddr = addr.parse().ok()?;
            if !ip.is_loopback() {
                return None;
            }
            found = true;
        }
    }
    found.then_some(name)
}

async fn put_webhook(server: &Server, id: &str, url: &str) -> R<(u16, Value)> {
    let body = json!({"type": "webhook", "pattern": "jobs/*", "webhook": {"url": url}});
    let res = server
        .put(
            &format!("/__ds/subscriptions/{id}"),
            &[("content-type", "application/json")],
            &body.to_string(),
        )
        .await?;
    let v = serde_json::from_slice(&res.body).unwrap_or(Value::Null);
    Ok((res.status, v))
}

/// With the default policy, names and IPv6 forms that reach loopback (and the cloud metadata
/// address) are refused at creation with `WEBHOOK_URL_REJECTED` "refused by policy", and the
/// receiver they point at is never contacted.
#[tokio::test(flavor = "multi_thread")]
async fn loopback_in_any_form_is_refused_without_connecting() -> R {
    let rx = Receiver::start().await?;
    let server = Server::start().await?;
    let p = rx.port;
    let mut urls = vec![
        format!("https://localhost.:{p}/hook"),
        format!("https://localhost:{p}/hook"),
        format!("http://localhost:{p}/hook"),
        format!("http://127.0.0.1:{p}/hook"),
        format!("https://[::ffff:127.0.0.1]:{p}/hook"),
        format!("https://[::7f00:1]:{p}/hook"),
        format!("https://[64:ff9b::7f00:1]:{p}/hook"),
        format!("https://[2002:7f00:1::1]:{p}/hook"),
        "https://[::a9fe:a9fe]/latest/meta-data".to_owned(),
        "https://[64:ff9b::a9fe:a9fe]/latest/meta-data".to_owned(),
        "https://[2002:a9fe:a9fe::1]/latest/meta-data".to_owned(),
    ];
    match loopback_hostname() {
        Some(host) => urls.push(format!("https://{host}:{p}/hook")),
        None => eprintln!("this machine's host name is not loopback in /etc/hosts: not tried"),
    }
    for (i, url) in urls.iter().enumerate() {
        let (status, v) = put_webhook(&server, &format!("s{i}"), url).await?;
        assert_eq!(
            (status, &v["code"]),
            (400, &json!("WEBHOOK_URL_REJECTED")),
            "{url}: {v}"
        );
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("refused by policy"), "{url}: {detail}");
    }
    // Streams the refused subscriptions would have followed: still nothing connects.
    server.create("/jobs/1", "application/json").await?;
    assert_eq!(rx.accepted(), 0);
    Ok(())
}

/// With `webhook_allow` 127.0.0.0/8 the same names reach the same receiver.
#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_range_is_reached_through_names() -> R {
    let rx = Receiver::start().await?;
    let mut cfg = config();
    cfg.webhook_allow = vec!["127.0.0.0/8".parse()?];
    let server = Server::start_with(Options::default(), cfg).await?;
    let p = rx.port;
    let mut urls = vec![format!("http://localhost:{p}/hook")];
    if let Some(host) = loopback_hostname() {
        urls.push(format!("https://{host}:{p}/hook"));
    }
    for (i, url) in urls.iter().enumerate() {
        let (status, v) = put_webhook(&server, &format!("ok{i}"), url).await?;
        assert_eq!(status, 201, "{url}: {v}");
    }
    server.create("/jobs/1", "application/json").await?;
    server
        .post(
            "/jobs/1",
            &[("content-type", "application/json")],
            r#"{"n":1}"#,
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while rx.accepted() < urls.len() {
        assert!(Instant::now() < deadline, "the receiver was not contacted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A `brook serve` child, killed (SIGKILL) when dropped.
struct Brook(crate::http_support::Served);

impl Drop for Brook {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// `brook serve` in a child process on `data`, with `extra` flags.
fn brook(data: &std::path::Path, extra: &[&str]) -> R<Brook> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(data)
        .args(["--webhook-timeout-ms", "5000"])
        .args(extra)
        .env("RUST_LOG", "info");
    Ok(Brook(spawn_serve(cmd)?))
}

/// Polls the subscription `id` at `base` until its `status` is `status` (15 s at most).
async fn wait_status(base: &str, id: &str, status: &str) -> R {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let res = client
            .get(format!("{base}/__ds/subscriptions/{id}"))
            .send()
            .await?;
        let v: Value = serde_json::from_slice(&res.bytes().await?)?;
        if v["status"] == status {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("subscription {id} never became {status}: {v}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The policy holds at delivery, on every connect: subscriptions created while loopback was
/// allowed are refused once the server runs without `--webhook-allow` (their status turns
/// `failed`, the log says "refused by policy", the receiver sees no connection), and reach it
/// again when it is allowed once more.
#[tokio::test(flavor = "multi_thread")]
async fn deliveries_check_the_policy_on_every_connect() -> R {
    let rx = Receiver::start().await?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let client = reqwest::Client::new();
    let p = rx.port;
    let subs = [
        ("named", "jobs/a", format!("http://localhost:{p}/hook")),
        ("literal", "jobs/b", format!("http://127.0.0.1:{p}/hook")),
    ];

    let served = brook(&data, &["--webhook-allow", "127.0.0.0/8"])?;
    let base = format!("http://{}", served.0.addr);
    for (id, stream, url) in &subs {
        let body = json!({"type": "webhook", "streams": [stream], "webhook": {"url": url}});
        let res = client
            .put(format!("{base}/__ds/subscriptions/{id}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        assert_eq!(res.status(), 201, "{url}");
    }
    drop(served);

    let served = brook(&data, &[])?;
    let base = format!("http://{}", served.0.addr);
    for (_, stream, _) in &subs {
        let url = format!("{base}/{stream}");
        let json = ("content-type", "application/json");
        let res = client
            .put(&url)
            .header(json.0, json.1)
            .body("[]")
            .send()
            .await?;
        assert_eq!(res.status(), 201);
        let res = client
            .post(&url)
            .header(json.0, json.1)
            .body(r#"{"n":1}"#)
            .send()
            .await?;
        assert!(res.status().is_success());
    }
    for (id, _, _) in &subs {
        wait_status(&base, id, "failed").await?;
    }
    assert_eq!(rx.accepted(), 0, "a refused delivery connected");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = served.0.log_text();
        let named = log.contains("refused by policy: localhost resolves to no address");
        let literal = log.contains("refused by policy: 127.0.0.1 is a loopback address");
        if named && literal {
            break;
        }
        assert!(Instant::now() < deadline, "no refusal logged: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(served);

    let _served = brook(&data, &["--webhook-allow", "127.0.0.0/8"])?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while rx.accepted() < subs.len() {
        assert!(
            Instant::now() < deadline,
            "the allowed receiver was not contacted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
