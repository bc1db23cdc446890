//! TLS and HTTP/2 over a real socket: ALPN picks h2 or http/1.1, every read mode works on both,
//! and a renewed certificate reaches new connections (file change, SIGHUP) while a bad one is
//! refused and the old one kept.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brook::http::{Tls, serve};
use brook::{Options, Store};
use futures_util::StreamExt;
use reqwest::Version;
use tokio::sync::oneshot;

use crate::http_support::{R, config};

/// A certificate authority and a `localhost` leaf it signed, as PEM.
pub(crate) struct TestPki {
    /// The CA's certificate: what a client trusts.
    pub(crate) ca: String,
    /// The leaf's certificate chain.
    cert: String,
    /// The leaf's private key.
    key: String,
}

/// A fresh CA and a leaf for `localhost` and 127.0.0.1.
pub(crate) fn pki() -> R<TestPki> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "brook test CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let leaf_key = rcgen::KeyPair::generate()?;
    let leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;
    Ok(TestPki {
        ca: ca.pem(),
        cert: leaf.pem(),
        key: leaf_key.serialize_pem(),
    })
}

/// Writes `pki`'s leaf to `dir/cert.pem` and `dir/key.pem`; returns both paths.
pub(crate) fn write_pki(dir: &Path, pki: &TestPki) -> R<(PathBuf, PathBuf)> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, &pki.cert)?;
    std::fs::write(&key, &pki.key)?;
    Ok((cert, key))
}

/// A client that trusts only `ca` and reaches `localhost` at `addr`; HTTP/1.1 only when
/// `http1` (otherwise ALPN offers h2 first).
fn client(ca: &str, addr: SocketAddr, http1: bool) -> R<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?)
        .resolve("localhost", addr);
    if http1 {
        b = b.http1_only();
    }
    Ok(b.build()?)
}

/// A TLS server in this process over a fresh store, stopped when the sender drops.
struct TlsServer {
    /// Where it listens.
    addr: SocketAddr,
    /// `https://localhost:{port}`.
    base: String,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// Starts a server with `tls`.
async fn start(tls: Tls) -> R<TlsServer> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let mut cfg = config();
    cfg.tls = Some(tls);
    tokio::spawn(serve(listener, store, cfg, async move {
        let _ = stopped.await;
    }));
    Ok(TlsServer {
        addr,
        base: format!("https://localhost:{}", addr.port()),
        _stop: stop,
        _dir: dir,
    })
}

/// Every read mode on one client: the protocol version ALPN chose is `want` on every response.
async fn read_modes(c: &reqwest::Client, base: &str, name: &str, want: Version) -> R {
    let url = format!("{base}/{name}");
    let r = c
        .put(&url)
        .header("content-type", "text/plain")
        .send()
        .await?;
    assert_eq!((r.status().as_u16(), r.version()), (201, want));
    // The absolute URL is https, with the request's host (HTTP/2's :authority, no Host header).
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some(url.as_str())
    );
    let r = c
        .post(&url)
        .header("content-type", "text/plain")
        .body("hello ")
        .send()
        .await?;
    assert_eq!((r.status().as_u16(), r.version()), (204, want));
    // Catch-up.
    let r = c.get(format!("{url}?offset=-1")).send().await?;
    assert_eq!((r.status().as_u16(), r.version()), (200, want));
    let tail = r
        .headers()
        .get("stream-next-offset")
        .ok_or("no Stream-Next-Offset")?
        .to_str()?
        .to_owned();
    assert_eq!(r.text().await?, "hello ");
    // Long-poll at the tail, answered by an append made while it waits.
    let poll = c.get(format!("{url}?offset={tail}&live=long-poll")).send();
    let append = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.post(&url)
            .header("content-type", "text/plain")
            .body("world")
            .send()
            .await
    };
    let (r, a) = tokio::join!(poll, append);
    assert_eq!(a?.status().as_u16(), 204);
    let r = r?;
    assert_eq!((r.status().as_u16(), r.version()), (200, want));
    assert_eq!(r.text().await?, "world");
    // SSE from the start: both appends, then a live one.
    let r = c.get(format!("{url}?offset=-1&live=sse")).send().await?;
    assert_eq!((r.status().as_u16(), r.version()), (200, want));
    assert!(
        r.headers().get("connection").is_none(),
        "a Connection header on an SSE response"
    );
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    let mut appended = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("data:live!") {
        assert!(Instant::now() < deadline, "SSE never delivered: {seen}");
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
            .await?
            .ok_or_else(|| format!("the SSE body ended: {seen:?}"))??;
        seen.push_str(std::str::from_utf8(&chunk)?);
        if !appended && seen.contains("data:hello world") {
            appended = true;
            c.post(&url)
                .header("content-type", "text/plain")
                .body("live!")
                .send()
                .await?;
        }
    }
    Ok(())
}

/// ALPN negotiates h2 for a client that offers it and http/1.1 for one that does not, and
/// create, append, catch-up, long-poll and SSE all work over both.
#[tokio::test]
async fn alpn_picks_h2_or_http1_and_every_read_mode_works_on_both() -> R {
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let server = start(Tls::from_pem_files(cert, key)?).await?;
    let h2 = client(&pki.ca, server.addr, false)?;
    read_modes(&h2, &server.base, "over-h2", Version::HTTP_2).await?;
    let h1 = client(&pki.ca, server.addr, true)?;
    read_modes(&h1, &server.base, "over-h1", Version::HTTP_11).await?;
    Ok(())
}

/// Many live SSE tails share one HTTP/2 connection (what a browser page does), and each one
/// gets the events of its own stream.
#[tokio::test]
async fn twenty_sse_tails_on_one_h2_connection_each_get_their_events() -> R {
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let server = start(Tls::from_pem_files(cert, key)?).await?;
    let c = client(&pki.ca, server.addr, false)?;
    let mut tails = Vec::new();
    for i in 0..20 {
        let url = format!("{}/tail-{i}", server.base);
        let r = c
            .put(&url)
            .header("content-type", "text/plain")
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 201);
        let r = c.get(format!("{url}?offset=-1&live=sse")).send().await?;
        assert_eq!(r.version(), Version::HTTP_2);
        tails.push(r.bytes_stream());
    }
    for i in 0..20 {
        let url = format!("{}/tail-{i}", server.base);
        let r = c
            .post(&url)
            .header("content-type", "text/plain")
            .body(format!("event-{i}"))
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 204);
    }
    for (i, tail) in tails.iter_mut().enumerate() {
        let want = format!("data:event-{i}\n");
        let mut seen = String::new();
        while !seen.contains(&want) {
            let chunk = tokio::time::timeout(Duration::from_secs(5), tail.next())
                .await?
                .ok_or_else(|| format!("an SSE body ended: {seen:?}"))??;
            seen.push_str(std::str::from_utf8(&chunk)?);
        }
        assert_eq!(seen.matches("data:event-").count(), 1, "{seen}");
    }
    Ok(())
}

/// Over TLS too, a connection over `max_connections` is answered 503 `TOO_MANY_CONNECTIONS`
/// (after its handshake, over the protocol ALPN chose) and closed.
#[tokio::test]
async fn a_tls_connection_over_the_cap_is_answered_503() -> R {
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let store_dir = tempfile::tempdir()?;
    let store = Store::open(store_dir.path(), Options::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_stop, stopped) = oneshot::channel::<()>();
    let mut cfg = config();
    cfg.tls = Some(Tls::from_pem_files(cert, key)?);
    cfg.max_connections = 1;
    tokio::spawn(serve(listener, store, cfg, async move {
        let _ = stopped.await;
    }));
    let base = format!("https://localhost:{}", addr.port());
    // The first client keeps its HTTP/2 connection open in its pool.
    let first = client(&pki.ca, addr, false)?;
    let r = first.head(format!("{base}/nothing")).send().await?;
    assert_eq!(r.status().as_u16(), 404);
    for http1 in [false, true] {
        let other = client(&pki.ca, addr, http1)?;
        let r = other.get(format!("{base}/nothing")).send().await?;
        assert_eq!(r.status().as_u16(), 503, "http1 {http1}");
        assert_eq!(
            r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
            Some("2")
        );
        assert!(r.text().await?.contains("TOO_MANY_CONNECTIONS"));
    }
    let r = first.head(format!("{base}/nothing")).send().await?;
    assert_eq!(
        r.status().as_u16(),
        404,
        "the admitted connection keeps working"
    );
    Ok(())
}

/// Whether a fresh client trusting only `ca` completes a request.
async fn trusted(ca: &str, addr: SocketAddr, base: &str) -> bool {
    let Ok(c) = client(ca, addr, false) else {
        return false;
    };
    c.head(format!("{base}/nothing")).send().await.is_ok()
}

/// Polls until a fresh client trusting `ca` gets through (true) or `within` passes (false).
async fn becomes_trusted(ca: &str, addr: SocketAddr, base: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if trusted(ca, addr, base).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A certificate replaced on disk is served to new connections within a few seconds; one
/// replaced by garbage is refused, and the one in use stays.
#[tokio::test]
async fn a_changed_certificate_file_is_served_and_a_bad_one_ignored() -> R {
    let (first, second) = (pki()?, pki()?);
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &first)?;
    let server = start(Tls::from_pem_files(&cert, &key)?).await?;
    assert!(trusted(&first.ca, server.addr, &server.base).await);
    assert!(!trusted(&second.ca, server.addr, &server.base).await);
    write_pki(dir.path(), &second)?;
    assert!(
        becomes_trusted(
            &second.ca,
            server.addr,
            &server.base,
            Duration::from_secs(15)
        )
        .await,
        "the new certificate was never served"
    );
    assert!(!trusted(&first.ca, server.addr, &server.base).await);
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64\n")?;
    tokio::time::sleep(brook::http::RELOAD_CHECK_EVERY * 2).await;
    assert!(
        trusted(&second.ca, server.addr, &server.base).await,
        "a bad certificate file replaced the good one"
    );
    Ok(())
}

/// A key that does not belong to the certificate is refused at start, with the reason.
#[test]
fn a_mismatched_key_is_refused() -> R {
    let (a, b) = (pki()?, pki()?);
    let dir = tempfile::tempdir()?;
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, &a.cert)?;
    std::fs::write(&key, &b.key)?;
    let err = Tls::from_pem_files(&cert, &key).err().ok_or("accepted")?;
    assert!(err.to_string().contains("key.pem"), "{err}");
    Ok(())
}

/// `brook serve --tls-cert --tls-key` serves HTTPS, and SIGHUP reloads the certificate: the log
/// says so and new connections get the new one; a SIGHUP with a broken file keeps it.
#[tokio::test]
async fn sighup_reloads_the_certificate_of_brook_serve() -> R {
    let (first, second) = (pki()?, pki()?);
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &first)?;
    let server = TlsChild::spawn(dir.path(), &cert, &key, &[])?;
    let pid = server.child.id();
    let wait_for = |needle: &str| server.wait_for(needle);
    let result = async {
        let addr = TlsChild::address(&wait_for("listening on https://")?)?;
        let base = format!("https://localhost:{}", addr.port());
        let c = client(&first.ca, addr, false)?;
        let r = c.get(format!("{base}/missing")).send().await?;
        assert_eq!((r.status().as_u16(), r.version()), (404, Version::HTTP_2));
        write_pki(dir.path(), &second)?;
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()?;
        assert!(sent.success());
        wait_for("SIGHUP: TLS certificate reloaded")?;
        assert!(trusted(&second.ca, addr, &base).await);
        std::fs::write(&key, "garbage")?;
        std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()?;
        wait_for("not reloaded")?;
        assert!(trusted(&second.ca, addr, &base).await);
        R::Ok(())
    }
    .await;
    drop(server);
    result
}

/// While the store opens, a TLS server's port already speaks TLS: a client that trusts the
/// certificate gets 503 `STARTING` (over HTTP/2, as ALPN agreed), not a handshake error; once
/// the store is open the same client is served.
#[tokio::test]
async fn a_starting_tls_server_answers_starting_over_tls() -> R {
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let server = TlsChild::spawn(
        dir.path(),
        &cert,
        &key,
        &[("BROOK_TEST_OPEN_DELAY_MS", "2500")],
    )?;
    let result = async {
        let addr = TlsChild::address(&server.wait_for("bound https://")?)?;
        let base = format!("https://localhost:{}", addr.port());
        let c = client(&pki.ca, addr, false)?;
        let r = c.get(format!("{base}/__brook/ready")).send().await?;
        assert_eq!((r.status().as_u16(), r.version()), (503, Version::HTTP_2));
        assert!(r.text().await?.contains("\"code\":\"STARTING\""));
        server.wait_for("listening on https://")?;
        let c = client(&pki.ca, addr, true)?;
        let r = c.get(format!("{base}/__brook/ready")).send().await?;
        assert_eq!(r.status().as_u16(), 200);
        R::Ok(())
    }
    .await;
    drop(server);
    result
}

/// Over TLS too, an SSE reader that reads nothing is cut off once the server's writes made no
/// progress for the write stall limit (the guard is the same socket's as on plain HTTP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_reader_that_stops_reading_is_disconnected() -> R {
    use tokio::io::AsyncWriteExt;
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let data = tempfile::tempdir()?;
    let store = Store::open(data.path(), Options::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_stop, stopped) = oneshot::channel::<()>();
    let mut cfg = config();
    cfg.tls = Some(Tls::from_pem_files(&cert, &key)?);
    cfg.write_stall_timeout = Duration::from_millis(500);
    cfg.sse_max_duration = Duration::from_mins(2);
    tokio::spawn(serve(listener, store, cfg, async move {
        let _ = stopped.await;
    }));
    let base = format!("https://localhost:{}", addr.port());
    let c = client(&pki.ca, addr, true)?;
    let r = c
        .put(format!("{base}/slow/tls"))
        .header("content-type", "application/octet-stream")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 201);
    for _ in 0..24 {
        let r = c
            .post(format!("{base}/slow/tls"))
            .header("content-type", "application/octet-stream")
            .body(vec![b'x'; 1 << 20])
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 204);
    }
    // A TLS client that asks for the whole stream as SSE and then reads nothing.
    let mut t = raw_tls(&pki, addr).await?;
    t.write_all(b"GET /slow/tls?offset=-1&live=sse HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, took) = crate::http_support::read_until_cut_off(&mut t).await?;
    assert!(
        took < Duration::from_secs(20),
        "the stalled TLS reader was never cut off"
    );
    let whole_base64 = 24 * (1 << 20) * 4 / 3;
    assert!(got < whole_base64, "received {got} bytes: not cut off");
    Ok(())
}

/// A raw TLS connection to `addr` (HTTP/1.1: no ALPN) trusting `pki`'s CA.
async fn raw_tls(
    pki: &TestPki,
    addr: SocketAddr,
) -> R<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(pki.ca.as_bytes()) {
        roots.add(der?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    Ok(connector
        .connect(rustls::pki_types::ServerName::try_from("localhost")?, tcp)
        .await?)
}

/// HTTP/1.1 over TLS is served by brook's loop too: a pipelined pair of requests is answered in
/// order, and a malformed head gets a problem+json 400 naming `MALFORMED_REQUEST`.
#[tokio::test]
async fn http1_over_tls_is_framed_and_refused_like_plain() -> R {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let server = start(Tls::from_pem_files(cert, key)?).await?;
    let mut t = raw_tls(&pki, server.addr).await?;
    t.write_all(
        b"PUT /tls/h1 HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhiHEAD /tls/h1 HTTP/1.1\r\nHost: localhost\r\n\r\nGET /a b HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), t.read_to_end(&mut got)).await??;
    let text = String::from_utf8_lossy(&got);
    let statuses: Vec<&str> = text
        .split("\r\n")
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 201 Created",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 400 Bad Request"
        ],
        "{text}"
    );
    assert!(text.contains("\"code\":\"MALFORMED_REQUEST\""), "{text}");
    Ok(())
}

/// `brook serve --tls-cert --tls-key` on an ephemeral port of 127.0.0.1 over `dir/data`, with
/// extra environment `env`; its log lines arrive on a channel. Killed when dropped.
struct TlsChild {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl TlsChild {
    fn spawn(dir: &Path, cert: &Path, key: &Path, env: &[(&str, &str)]) -> R<TlsChild> {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brook"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(TlsChild { child, lines })
    }

    /// The next log line containing `needle` (within 20 s).
    fn wait_for(&self, needle: &str) -> R<String> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("no log line with {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    /// The address in a log line `... {scheme}://ADDR ...`.
    fn address(line: &str) -> R<SocketAddr> {
        let at = line.split("https://").nth(1).ok_or("no address")?;
        Ok(at
            .split([';', ',', ' '])
            .next()
            .ok_or("no address")?
            .parse()?)
    }
}

impl Drop for TlsChild {
    /// Kills the server.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Over HTTP/2 (hyper's loop, after TLS), uploads that announce a body and send none of it hold
/// none of the memory budget (issue 50): twelve of 6 MiB on an 8 MiB budget leave
/// `request_bodies` at zero, and honest appends on the same connection go through. The old
/// server leased each announced body whole from its head and refused the honest appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_uploads_without_their_bodies_hold_no_budget() -> R {
    let pki = pki()?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = write_pki(dir.path(), &pki)?;
    let store = Store::open(
        dir.path().join("data"),
        Options::default().with_max_append_bytes(8 << 20),
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_stop, stopped) = oneshot::channel::<()>();
    let mut cfg = config();
    cfg.tls = Some(Tls::from_pem_files(cert, key)?);
    cfg.max_memory = 8 << 20;
    tokio::spawn(serve(listener, store, cfg, async move {
        let _ = stopped.await;
    }));
    let base = format!("https://localhost:{}", addr.port());
    let c = client(&pki.ca, addr, false)?;
    let url = format!("{base}/h2/heads");
    let bytes = ("content-type", "application/octet-stream");
    let res = c.put(&url).header(bytes.0, bytes.1).send().await?;
    assert_eq!(res.status(), 201);
    assert_eq!(res.version(), Version::HTTP_2);
    let mut silent = Vec::new();
    for _ in 0..12 {
        let never = futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let req = c
            .post(&url)
            .header(bytes.0, bytes.1)
            .header("content-length", (6u64 << 20).to_string())
            .body(reqwest::Body::wrap_stream(never))
            .send();
        silent.push(tokio::spawn(req));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scrape = c.get(format!("{base}/__brook/metrics")).send().await?;
    let text = scrape.text().await?;
    let held: f64 =
        crate::http_support::metric(&text, "brook_memory_held_bytes{use=\"request_bodies\"}")
            .ok_or("no request_bodies in the scrape")?;
    assert!(held < 1.0, "{held} bytes held for bodies that never came");
    for _ in 0..10 {
        let res = c
            .post(&url)
            .header(bytes.0, bytes.1)
            .body(vec![b'h'; 1024])
            .send()
            .await?;
        assert_eq!(res.status(), 204, "{}", res.text().await?);
    }
    for s in silent {
        s.abort();
    }
    Ok(())
}
