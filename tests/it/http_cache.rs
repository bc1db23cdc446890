//! Reads through a real shared cache: Debian's nginx with `proxy_cache`, configured by the
//! shipped `docs/nginx.conf`, in front of a brook server. Readers replaying a stream reach brook
//! once per chunk (the open tail's included) and get every byte right; long-pollers waiting at
//! one offset reach it once per wake; `offset=now`, long-poll timeouts, SSE and HEAD reach brook
//! on every request.
//!
//! nginx is `/usr/sbin/nginx` or `$NGINX` (scripts/test installs Debian's package when it is
//! missing); `SKIP_NGINX=1` skips these tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::http_support::{R, Server};
use super::util::Rng;

/// Readers replaying the stream at once.
const READERS: usize = 8;

/// nginx serving `docs/nginx.conf` from a temporary directory; killed when dropped.
struct Nginx {
    /// `http://127.0.0.1:{port}`.
    base: String,
    /// The access log (`log_format brook`).
    access_log: PathBuf,
    /// The nginx process (`master_process off`: this is the only one).
    child: Child,
    /// Config, cache, temporary files and logs.
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx binary, or `None` when the tests are to be skipped.
fn nginx_binary() -> R<Option<PathBuf>> {
    if std::env::var_os("SKIP_NGINX").is_some() {
        eprintln!("http_cache: skipped (SKIP_NGINX is set)");
        return Ok(None);
    }
    let bin =
        std::env::var_os("NGINX").map_or_else(|| PathBuf::from("/usr/sbin/nginx"), PathBuf::from);
    if !bin.exists() {
        crate::util::missing_prerequisite(
            "http_cache",
            &format!(
                "no nginx at {} (apt-get install nginx, or set NGINX; scripts/test installs it)",
                bin.display()
            ),
        )?;
        return Ok(None);
    }
    Ok(Some(bin))
}

/// `docs/nginx.conf` with brook at `upstream`, nginx on `port`, and its files under `dir`.
fn config(upstream: &str, port: u16, dir: &Path) -> R<String> {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/nginx.conf"))?;
    let files = dir.join("files");
    let replaced = shipped
        .replace("server 127.0.0.1:4437;", &format!("server {upstream};"))
        .replace(
            "listen 127.0.0.1:8080;",
            &format!("listen 127.0.0.1:{port};"),
        )
        .replace("/var/cache/nginx/brook", &files.display().to_string())
        .replace(
            "/var/log/nginx/brook-access.log",
            &dir.join("access.log").display().to_string(),
        )
        .replace("worker_processes auto;", "worker_processes 1;");
    for (from, what) in [
        ("server 127.0.0.1:4437;", "the upstream"),
        ("listen 127.0.0.1:8080;", "the listen address"),
        ("/var/cache/nginx/brook/cache", "the cache path"),
        ("/var/log/nginx/brook-access.log", "the access log"),
    ] {
        assert!(
            shipped.contains(from),
            "docs/nginx.conf no longer names {what} as {from}"
        );
    }
    Ok(replaced)
}

impl Nginx {
    /// Starts nginx in front of the brook at `upstream` (`127.0.0.1:port`), on a free port of
    /// 127.0.0.1, as the current user.
    async fn start(bin: &Path, upstream: &str) -> R<Nginx> {
        let dir = tempfile::tempdir()?;
        // nginx creates the cache's own directory, not its parents.
        std::fs::create_dir(dir.path().join("files"))?;
        let access_log = dir.path().join("access.log");
        // The port is picked by binding and released for nginx: another process may take it in
        // between, so a failed start is tried again on a fresh port.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let conf = dir.path().join("nginx.conf");
            std::fs::write(&conf, config(upstream, port, dir.path())?)?;
            let error_log = dir.path().join("error.log");
            let mut child = Command::new(bin)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(&error_log)
                .arg("-g")
                .arg(format!(
                    "daemon off; master_process off; pid {};",
                    dir.path().join("nginx.pid").display()
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let base = format!("http://127.0.0.1:{port}");
            for _ in 0..100 {
                if let Some(status) = child.try_wait()? {
                    let log = std::fs::read_to_string(&error_log).unwrap_or_default();
                    if log.contains("Address already in use") {
                        break;
                    }
                    return Err(format!("nginx exited with {status}: {log}").into());
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    return Ok(Nginx {
                        base,
                        access_log,
                        child,
                        _dir: dir,
                    });
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        Err("nginx did not start".into())
    }

    /// The access log's lines, once it has at least `at_least` (nginx writes a line after the
    /// response has gone out).
    async fn log_lines(&self, at_least: usize) -> R<Vec<LogLine>> {
        for _ in 0..100 {
            let text = std::fs::read_to_string(&self.access_log).unwrap_or_default();
            let lines: Vec<LogLine> = text.lines().filter_map(LogLine::parse).collect();
            if lines.len() >= at_least {
                return Ok(lines);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("the access log has fewer than {at_least} lines").into())
    }
}

/// One access log line of `log_format brook`.
#[derive(Debug)]
struct LogLine {
    /// `GET`, `HEAD`, ...
    method: String,
    /// Path and query.
    uri: String,
    /// Whether the request reached brook (`up=` names an address).
    upstream: bool,
    /// `$upstream_cache_status` (`HIT`, `MISS`, `-`, ...).
    cache: String,
}

impl LogLine {
    fn parse(line: &str) -> Option<LogLine> {
        let request = line.split('"').nth(1)?;
        let mut words = request.split(' ');
        let method = words.next()?.to_owned();
        let uri = words.next()?.to_owned();
        let cache = line.split(" cache=").nth(1)?.split(' ').next()?.to_owned();
        let up = line.split(" up=").nth(1)?.trim();
        Some(LogLine {
            method,
            uri,
            upstream: up != "-",
            cache,
        })
    }
}

/// One reader's replay from the start: the URLs it asked, in order, and the bytes.
async fn replay(client: &reqwest::Client, base: &str, path: &str) -> R<(Vec<String>, Vec<u8>)> {
    let mut offset = "0000000000000000_0000000000000000".to_owned();
    let mut uris = Vec::new();
    let mut bytes = Vec::new();
    loop {
        // Query parameters in lexicographic order, as PROTOCOL.md 10.1 asks of clients.
        let uri = format!("{path}?max_bytes=4096&offset={offset}");
        let res = client.get(format!("{base}{uri}")).send().await?;
        if res.status() != 200 {
            return Err(format!("{uri}: {}", res.status()).into());
        }
        let h = res.headers();
        let next = h["stream-next-offset"].to_str()?.to_owned();
        let closed = h.get("stream-closed").is_some();
        uris.push(uri);
        bytes.extend_from_slice(&res.bytes().await?);
        if closed {
            return Ok((uris, bytes));
        }
        offset = next;
    }
}

/// Requests per URI that reached brook, over `lines`.
fn upstream_counts(lines: &[LogLine], method: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for l in lines.iter().filter(|l| l.method == method) {
        *counts.entry(l.uri.clone()).or_insert(0) += usize::from(l.upstream);
    }
    counts
}

/// N readers replaying one closed multi-chunk stream through nginx at once: brook serves each
/// chunk (and the final empty read) exactly once, the others are cache hits, every reader gets
/// every byte and the same chunk boundaries, and a revalidation is answered 304 from the cache.
#[tokio::test]
async fn nginx_serves_each_catch_up_chunk_from_brook_once() -> R {
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let s = Server::start().await?;
    s.create("/cache/replay", "application/octet-stream")
        .await?;
    let mut rng = Rng::from_env("http_cache");
    let mut expected = Vec::new();
    for _ in 0..24 {
        let len = 1000 + rng.below(3000) as usize;
        let body: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        expected.extend_from_slice(&body);
        let r = s
            .send(
                "POST",
                "/cache/replay",
                &[("content-type", b"application/octet-stream")],
                body,
            )
            .await?;
        assert!((200..300).contains(&r.status), "append: {}", r.status);
    }
    let r = s
        .post("/cache/replay", &[("stream-closed", "true")], "")
        .await?;
    assert!((200..300).contains(&r.status), "close: {}", r.status);
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;

    let client = reqwest::Client::new();
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let client = client.clone();
            let base = nginx.base.clone();
            tokio::spawn(async move { replay(&client, &base, "/cache/replay").await })
        })
        .collect();
    let mut replays = Vec::new();
    for r in readers {
        replays.push(r.await.map_err(|e| e.to_string())??);
    }
    let (uris, _) = &replays[0];
    assert!(
        uris.len() > 10,
        "a multi-chunk stream: {} chunks",
        uris.len()
    );
    for (reader_uris, bytes) in &replays {
        assert_eq!(
            reader_uris, uris,
            "every reader sees the same chunk boundaries"
        );
        assert!(bytes == &expected, "every byte through the cache is right");
    }

    let lines = nginx.log_lines(READERS * uris.len()).await?;
    let counts = upstream_counts(&lines, "GET");
    assert_eq!(counts.len(), uris.len(), "{counts:?}");
    for uri in uris {
        assert_eq!(
            counts.get(uri),
            Some(&1),
            "{uri} reached brook once: {counts:?}"
        );
    }
    let hits = lines.iter().filter(|l| l.cache == "HIT").count();
    eprintln!(
        "http_cache: {READERS} readers x {} chunks through nginx: {} requests reached brook, {hits} cache hits",
        uris.len(),
        counts.values().sum::<usize>()
    );
    assert_eq!(
        hits,
        (READERS - 1) * uris.len(),
        "the other reads are cache hits"
    );

    // A reader revalidating a chunk it holds gets 304 from nginx, without reaching brook.
    let first = client
        .get(format!("{}{}", nginx.base, uris[0]))
        .send()
        .await?;
    let etag = first.headers()["etag"].to_str()?.to_owned();
    assert!(
        first.headers()["cache-control"]
            .to_str()?
            .contains("immutable")
    );
    let again = client
        .get(format!("{}{}", nginx.base, uris[0]))
        .header("if-none-match", &etag)
        .send()
        .await?;
    assert_eq!(again.status(), 304);
    let lines = nginx.log_lines(READERS * uris.len() + 2).await?;
    assert_eq!(upstream_counts(&lines, "GET").get(&uris[0]), Some(&1));
    Ok(())
}

/// `Cache-Control` of a catch-up chunk or long-poll answer that is not final (PROTOCOL.md 10.1).
const PROTOCOL_CACHE: &str = "public, max-age=60, stale-while-revalidate=300";

/// `n` GETs of `uri` through nginx at once; the responses' status, headers and bodies.
async fn get_all(
    client: &reqwest::Client,
    base: &str,
    uri: &str,
    n: usize,
) -> R<Vec<(u16, reqwest::header::HeaderMap, Vec<u8>)>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let req = client.get(format!("{base}{uri}"));
            tokio::spawn(async move {
                let res = req.send().await?;
                let status = res.status().as_u16();
                let headers = res.headers().clone();
                let body = res.bytes().await?.to_vec();
                Ok::<_, reqwest::Error>((status, headers, body))
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

/// A stream smaller than one read, still open: N readers at its start (`offset=-1`, and the
/// explicit first offset) get its one chunk, the tail chunk, and reach brook once per URL; the
/// empty read at the open tail reaches brook every time, so a new append and the closure show
/// at once; a reader served the cached tail chunk after an append continues from its
/// `Stream-Next-Offset` and loses nothing.
#[tokio::test]
async fn nginx_serves_a_small_open_stream_from_brook_once() -> R {
    const N: usize = 20;
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let s = Server::start().await?;
    s.create("/cache/small", "text/plain").await?;
    s.post("/cache/small", &[("content-type", "text/plain")], "hello")
        .await?;
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;
    let client = reqwest::Client::new();
    let zero = "0000000000000000_0000000000000000";
    let starts = [
        "/cache/small?offset=-1".to_owned(),
        format!("/cache/small?offset={zero}"),
    ];
    let mut tail = String::new();
    let mut directives = Vec::new();
    for uri in &starts {
        for (status, h, body) in get_all(&client, &nginx.base, uri, N).await? {
            assert_eq!(
                (status, body.as_slice()),
                (200, b"hello".as_slice()),
                "{uri}"
            );
            assert_eq!(h["stream-up-to-date"], "true");
            directives.push(h["cache-control"].to_str()?.to_owned());
            tail = h["stream-next-offset"].to_str()?.to_owned();
        }
    }
    let empty = format!("/cache/small?offset={tail}");
    for _ in 0..3 {
        let r = client.get(format!("{}{empty}", nginx.base)).send().await?;
        assert_eq!(r.headers()["cache-control"], "no-cache");
        assert!(r.bytes().await?.is_empty());
    }
    let lines = nginx.log_lines(2 * N + 3).await?;
    let counts = upstream_counts(&lines, "GET");
    eprintln!(
        "http_cache: {N} readers of a small open stream at each of {starts:?} through nginx: \
         brook served {:?}",
        starts.iter().map(|u| counts.get(u)).collect::<Vec<_>>()
    );
    for uri in &starts {
        assert_eq!(counts.get(uri), Some(&1), "{uri} reached brook once");
    }
    assert_eq!(
        counts.get(&empty),
        Some(&3),
        "the empty open tail, every time"
    );
    assert!(
        directives.iter().all(|d| d == PROTOCOL_CACHE),
        "{directives:?}"
    );

    // An append: the cached tail chunk is still served (for up to its max-age), and a reader
    // continuing from its Stream-Next-Offset gets the new data from brook.
    s.post("/cache/small", &[("content-type", "text/plain")], " world")
        .await?;
    let cached = client
        .get(format!("{}{}", nginx.base, starts[1]))
        .send()
        .await?;
    assert_eq!(cached.headers()["x-cache-status"], "HIT");
    assert_eq!(cached.text().await?, "hello");
    let more = client.get(format!("{}{empty}", nginx.base)).send().await?;
    assert_eq!(more.headers()["cache-control"], PROTOCOL_CACHE);
    let end = more.headers()["stream-next-offset"].to_str()?.to_owned();
    assert_eq!(more.text().await?, " world");
    // The closure shows at the next offset at once (its empty read is never served stale).
    s.post("/cache/small", &[("stream-closed", "true")], "")
        .await?;
    let eof = client
        .get(format!("{}/cache/small?offset={end}", nginx.base))
        .send()
        .await?;
    assert_eq!(eof.headers()["stream-closed"], "true");
    Ok(())
}

/// One long-poller's walk: `wakes` long-polls, each from the offset and with the cursor the
/// previous answer gave it; sends the round on `asking` before each request. The URLs it asked,
/// the bytes it got and the answers' `Cache-Control`.
async fn long_poll_walk(
    client: reqwest::Client,
    base: String,
    path: &'static str,
    mut offset: String,
    wakes: usize,
    asking: tokio::sync::mpsc::UnboundedSender<usize>,
) -> R<(Vec<String>, Vec<u8>, Vec<String>)> {
    let mut cursor: Option<String> = None;
    let mut uris = Vec::new();
    let mut bytes = Vec::new();
    let mut directives = Vec::new();
    for round in 0..wakes {
        // Query parameters in lexicographic order, as PROTOCOL.md 10.1 asks of clients.
        let uri = match &cursor {
            Some(c) => format!("{path}?cursor={c}&live=long-poll&offset={offset}"),
            None => format!("{path}?live=long-poll&offset={offset}"),
        };
        asking.send(round)?;
        let res = client.get(format!("{base}{uri}")).send().await?;
        if res.status() != 200 {
            return Err(format!("{uri}: {}", res.status()).into());
        }
        let h = res.headers();
        directives.push(h["cache-control"].to_str()?.to_owned());
        offset = h["stream-next-offset"].to_str()?.to_owned();
        cursor = Some(h["stream-cursor"].to_str()?.to_owned());
        uris.push(uri);
        bytes.extend_from_slice(&res.bytes().await?);
    }
    Ok((uris, bytes, directives))
}

/// N long-pollers waiting at one offset of one stream through nginx: each append (a wake)
/// reaches brook as one long-poll, whose `200` nginx hands to the other waiters (its lock) and
/// to late ones (its cache), all with the same cursor, so the next round shares one URL again.
/// One wait outlasts nginx's default lock age (5 s), which the shipped configuration raises.
/// Every poller gets every byte, in order.
#[tokio::test]
async fn nginx_collapses_long_pollers_to_one_request_per_wake() -> R {
    const N: usize = 8;
    const WAKES: usize = 4;
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let config = brook::http::ServerConfig {
        long_poll_timeout: Duration::from_secs(25),
        ..super::http_support::config()
    };
    let s = Server::start_with(brook::Options::default(), config).await?;
    s.create("/cache/live", "application/octet-stream").await?;
    let first = s
        .head("/cache/live", &[])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;
    let client = reqwest::Client::new();
    let (asking, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let pollers: Vec<_> = (0..N)
        .map(|_| {
            tokio::spawn(long_poll_walk(
                client.clone(),
                nginx.base.clone(),
                "/cache/live",
                first.clone(),
                WAKES,
                asking.clone(),
            ))
        })
        .collect();
    drop(asking);
    let mut rng = Rng::from_env("http_cache_long_poll");
    let mut expected = Vec::new();
    for round in 0..WAKES {
        let mut ready = 0;
        while ready < N {
            let r = asked.recv().await.ok_or("a poller ended early")?;
            assert_eq!(r, round, "pollers move round by round");
            ready += 1;
        }
        // The long-polls are on their way: one reaches brook and waits, the others wait in
        // nginx's lock. Round 2 waits past nginx's default lock age.
        let wait = if round == 2 { 6000 } else { 300 };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let len = 100 + rng.below(2000) as usize;
        let body: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        expected.extend_from_slice(&body);
        let r = s
            .send(
                "POST",
                "/cache/live",
                &[("content-type", b"application/octet-stream")],
                body,
            )
            .await?;
        assert!((200..300).contains(&r.status), "append: {}", r.status);
    }
    let mut walks = Vec::new();
    for p in pollers {
        walks.push(p.await.map_err(|e| e.to_string())??);
    }
    for (_, bytes, _) in &walks {
        assert!(bytes == &expected, "every byte through the cache is right");
    }
    let lines = nginx.log_lines(N * WAKES).await?;
    let counts = upstream_counts(&lines, "GET");
    let upstream: usize = counts.values().sum();
    eprintln!(
        "http_cache: {N} long-pollers x {WAKES} wakes through nginx: {upstream} long-polls \
         reached brook ({} URLs)",
        counts.len()
    );
    assert_eq!(
        upstream, WAKES,
        "one long-poll per wake reached brook: {counts:?}"
    );
    let (uris, _, _) = &walks[0];
    for (walk_uris, _, directives) in &walks {
        assert_eq!(walk_uris, uris, "every poller asks the same URLs");
        assert!(
            directives.iter().all(|d| d == PROTOCOL_CACHE),
            "{directives:?}"
        );
    }
    for uri in uris {
        assert_eq!(counts.get(uri), Some(&1), "{uri} reached brook once");
    }
    Ok(())
}

/// `offset=now`, a long-poll that times out (`204`), SSE and HEAD reach brook on every request
/// through the same nginx, and each answers what brook would: a cache never holds them.
#[tokio::test]
async fn nginx_never_caches_now_timeouts_sse_or_head() -> R {
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let s = Server::start().await?;
    s.create("/cache/open", "text/plain").await?;
    s.post("/cache/open", &[("content-type", "text/plain")], "one")
        .await?;
    let end = s
        .head("/cache/open", &[])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;
    let client = reqwest::Client::new();
    let mut asked = Vec::new();
    for (uri, status, cache_control) in [
        ("/cache/open?offset=now".to_owned(), 200, "no-store"),
        (
            format!("/cache/open?live=long-poll&offset={end}"),
            204,
            "no-store",
        ),
        (
            format!("/cache/open?live=sse&offset={end}"),
            200,
            "no-cache",
        ),
    ] {
        for (got, h, _) in get_all(&client, &nginx.base, &uri, 3).await? {
            assert_eq!(got, status, "{uri}");
            if !uri.contains("live=sse") {
                assert_eq!(h["stream-next-offset"], end.as_str(), "{uri}");
            }
            assert!(
                h["cache-control"].to_str()?.starts_with(cache_control),
                "{uri}: {:?}",
                h["cache-control"]
            );
        }
        asked.push(("GET", uri, 3));
    }
    s.post("/cache/open", &[("content-type", "text/plain")], "two")
        .await?;
    let grown = s
        .head("/cache/open", &[])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    for _ in 0..3 {
        let r = client
            .head(format!("{}/cache/open", nginx.base))
            .send()
            .await?;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["stream-next-offset"].to_str()?,
            grown,
            "HEAD answers the tail"
        );
        assert_eq!(r.headers()["cache-control"].to_str()?, "no-store");
    }
    asked.push(("HEAD", "/cache/open".into(), 3));
    let total: usize = asked.iter().map(|(_, _, n)| n).sum();
    let lines = nginx.log_lines(total).await?;
    for (method, uri, n) in &asked {
        let counts = upstream_counts(&lines, method);
        assert_eq!(
            counts.get(uri),
            Some(n),
            "{method} {uri} reached brook every time"
        );
    }
    Ok(())
}

/// With `cache_revalidate_tail` (`--cache-revalidate-tail`), brook keeps caches off the open
/// tail as it did before PROTOCOL.md 10.1's caching: the tail chunk, `offset=-1` and long-polls
/// reach brook on every request, and a reader through the cache sees an append at once; chunks
/// that end before the tail are still served from the cache.
#[tokio::test]
async fn nginx_with_revalidate_tail_sends_every_tail_read_to_brook() -> R {
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let config = brook::http::ServerConfig {
        cache_revalidate_tail: true,
        ..super::http_support::config()
    };
    let s = Server::start_with(brook::Options::default(), config).await?;
    s.create("/cache/strict", "text/plain").await?;
    s.post("/cache/strict", &[("content-type", "text/plain")], "one")
        .await?;
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;
    let client = reqwest::Client::new();
    let get = |uri: String| {
        let client = client.clone();
        let url = format!("{}{uri}", nginx.base);
        async move { client.get(url).send().await }
    };
    let zero = "0000000000000000_0000000000000000";
    let tail_uri = format!("/cache/strict?offset={zero}");
    let tail = get(tail_uri.clone()).await?;
    assert_eq!(tail.headers()["cache-control"], "no-cache");
    let mid = tail.headers()["stream-next-offset"].to_str()?.to_owned();
    assert_eq!(tail.text().await?, "one");
    s.post("/cache/strict", &[("content-type", "text/plain")], "two")
        .await?;
    let grown = get(tail_uri.clone()).await?;
    assert_eq!(grown.text().await?, "onetwo", "the append shows at once");
    let mut asked = vec![(tail_uri, 2)];
    for uri in [
        "/cache/strict".to_owned(),
        "/cache/strict?offset=-1".to_owned(),
        format!("/cache/strict?live=long-poll&offset={mid}"),
    ] {
        for _ in 0..3 {
            let r = get(uri.clone()).await?;
            assert_eq!(r.status(), 200, "{uri}");
            let cc = r.headers()["cache-control"].to_str()?;
            assert!(cc == "no-cache" || cc == "no-store", "{uri}: {cc}");
        }
        asked.push((uri, 3));
    }
    let before = format!("/cache/strict?max_bytes=3&offset={zero}");
    for _ in 0..3 {
        assert_eq!(get(before.clone()).await?.text().await?, "one");
    }
    asked.push((before, 1));
    let total = asked.iter().map(|(_, n)| n).sum::<usize>() + 2;
    let counts = upstream_counts(&nginx.log_lines(total).await?, "GET");
    for (uri, n) in &asked {
        assert_eq!(counts.get(uri), Some(n), "{uri}: {counts:?}");
    }
    Ok(())
}

/// Long-pollers that timed out together (each `204` reached brook: no cache keeps one) keep
/// asking one URL: every `204` to the same offset and cursor carries the same next cursor, so
/// the next append reaches brook through nginx as one long-poll, not one per poller.
#[tokio::test]
async fn nginx_collapses_long_pollers_again_after_timeouts() -> R {
    const N: usize = 6;
    let Some(bin) = nginx_binary()? else {
        return Ok(());
    };
    let config = brook::http::ServerConfig {
        long_poll_timeout: Duration::from_secs(2),
        ..super::http_support::config()
    };
    let s = Server::start_with(brook::Options::default(), config).await?;
    s.create("/cache/idle", "text/plain").await?;
    let at = s
        .head("/cache/idle", &[])
        .await?
        .need("stream-next-offset")?
        .to_owned();
    // A cursor past the current interval, as a poller's is once it has been jittered.
    let ahead = "/cache/idle?cursor=99999999&live=long-poll&offset=";
    let timeouts = get_all(&s.client, &s.base, &format!("{ahead}{at}"), N).await?;
    let mut next = Vec::new();
    for (status, h, _) in &timeouts {
        assert_eq!(*status, 204);
        assert_eq!(h["cache-control"], "no-store");
        next.push(h["stream-cursor"].to_str()?.to_owned());
    }
    next.sort();
    next.dedup();
    assert_eq!(next.len(), 1, "one next cursor for one URL: {next:?}");
    let nginx = Nginx::start(&bin, s.base.trim_start_matches("http://")).await?;
    let uri = format!("/cache/idle?cursor={}&live=long-poll&offset={at}", next[0]);
    let client = reqwest::Client::new();
    let pollers = {
        let (client, base, uri) = (client.clone(), nginx.base.clone(), uri.clone());
        tokio::spawn(async move { get_all(&client, &base, &uri, N).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.post("/cache/idle", &[("content-type", "text/plain")], "woken")
        .await?;
    for (status, _, body) in pollers.await.map_err(|e| e.to_string())?? {
        assert_eq!((status, body.as_slice()), (200, b"woken".as_slice()));
    }
    let counts = upstream_counts(&nginx.log_lines(N).await?, "GET");
    eprintln!(
        "http_cache: {N} long-pollers after a timeout through nginx: {:?} reached brook",
        counts.get(&uri)
    );
    assert_eq!(counts.get(&uri), Some(&1), "{counts:?}");
    Ok(())
}
