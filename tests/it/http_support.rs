//! A real server for the HTTP tests: brook's router served on `127.0.0.1:0` in this process (or
//! the `brook` binary in a child process, when a test measures the server's memory), driven by a
//! real HTTP client over a real socket.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use brook::http::{ServerConfig, serve};
use brook::{Options, Store};
use bytes::Bytes;
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::oneshot;

pub type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A brook server on an ephemeral port of 127.0.0.1, with its own data directory.
pub struct Server {
    /// `http://127.0.0.1:{port}`.
    pub base: String,
    /// The store behind the server (for checkpoints in tests that measure the disk).
    pub store: Store,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
    /// Dropping the server sends this: it stops gracefully.
    stop: Option<oneshot::Sender<()>>,
}

/// Test defaults: a long-poll that gives up quickly.
pub fn config() -> ServerConfig {
    ServerConfig {
        long_poll_timeout: Duration::from_millis(300),
        sse_max_duration: Duration::from_secs(2),
        ..ServerConfig::default()
    }
}

impl Server {
    pub async fn start() -> R<Server> {
        Server::start_with(Options::default(), config()).await
    }

    pub async fn start_with(options: Options, config: ServerConfig) -> R<Server> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), options)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(listener, store.clone(), config, async move {
            let _ = stopped.await;
        }));
        Ok(Server {
            base,
            store,
            client: reqwest::Client::builder().build()?,
            dir,
            stop: Some(stop),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request with `headers` (raw bytes, so tests can send non-ASCII values) and `body`.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: impl Into<reqwest::Body>,
    ) -> R<Resp> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                HeaderName::from_bytes(k.as_bytes())?,
                HeaderValue::from_bytes(v)?,
            );
        }
        let res = self
            .client
            .request(Method::from_bytes(method.as_bytes())?, self.url(path))
            .headers(h)
            .body(body)
            .send()
            .await?;
        Resp::read(res).await
    }

    pub async fn put(&self, path: &str, headers: &[(&str, &str)], body: &str) -> R<Resp> {
        self.send("PUT", path, &bytes_headers(headers), body.to_owned())
            .await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> R<Resp> {
        self.send("POST", path, &bytes_headers(headers), body.to_owned())
            .await
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> R<Resp> {
        self.send("GET", path, &bytes_headers(headers), Vec::new())
            .await
    }

    pub async fn head(&self, path: &str, headers: &[(&str, &str)]) -> R<Resp> {
        self.send("HEAD", path, &bytes_headers(headers), Vec::new())
            .await
    }

    pub async fn delete(&self, path: &str, headers: &[(&str, &str)]) -> R<Resp> {
        self.send("DELETE", path, &bytes_headers(headers), Vec::new())
            .await
    }

    /// Creates a stream of `content_type` and returns its incarnation.
    pub async fn create(&self, path: &str, content_type: &str) -> R<String> {
        let r = self
            .put(path, &[("content-type", content_type)], "")
            .await?;
        assert_eq!(r.status, 201, "create {path}: {}", r.text());
        Ok(r.need("stream-incarnation")?.to_owned())
    }

    /// The whole stream from `offset=-1`, following `Stream-Next-Offset` to the tail.
    pub async fn read_all(&self, path: &str) -> R<Vec<u8>> {
        let mut out = Vec::new();
        let mut offset = "-1".to_owned();
        loop {
            let r = self.get(&format!("{path}?offset={offset}"), &[]).await?;
            assert_eq!(r.status, 200, "read {path}: {}", r.text());
            out.extend_from_slice(&r.body);
            r.need("stream-next-offset")?.clone_into(&mut offset);
            if r.h("stream-up-to-date") == Some("true") {
                return Ok(out);
            }
        }
    }

    /// The stream's tail, from a HEAD.
    pub async fn tail(&self, path: &str) -> R<String> {
        Ok(self
            .head(path, &[])
            .await?
            .need("stream-next-offset")?
            .to_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn bytes_headers<'a>(headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a [u8])> {
    headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect()
}

/// A response read whole.
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub async fn read(res: reqwest::Response) -> R<Resp> {
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.bytes().await?;
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    /// A header as text.
    pub fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header that must be there.
    pub fn need(&self, name: &str) -> R<&str> {
        Ok(self
            .h(name)
            .ok_or_else(|| format!("no {name} header (status {}): {}", self.status, self.text()))?)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `code` member of a problem+json body.
    pub fn code(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        v.get("code")?.as_str().map(str::to_owned)
    }

    /// Asserts a refusal: `status`, `code`, and a problem+json body.
    #[track_caller]
    pub fn refused(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code().as_deref()),
            (status, Some(code)),
            "body: {}",
            self.text()
        );
        assert_eq!(self.h("content-type"), Some("application/problem+json"));
    }
}

/// The size on disk (allocated blocks) of everything under `dir`.
pub fn disk_usage(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            total += disk_usage(&entry.path())?;
        } else {
            total += meta.blocks() * 512;
        }
    }
    Ok(total)
}

/// A `brook serve` child that is serving streams: the process, its `host:port`, and its log
/// (standard output), kept growing by a thread that drains it.
pub struct Served {
    pub child: std::process::Child,
    pub addr: String,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Served {
    /// The log so far, one line each.
    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// Spawns `cmd` (a `brook serve`, or a shell that execs one, on port 0) with its standard output
/// piped and colour off, and waits for its `listening on` line: from then on it serves streams.
pub fn spawn_serve(mut cmd: std::process::Command) -> R<Served> {
    let mut child = cmd
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let addr = loop {
        let line = lines.next().ok_or("brook exited before listening")??;
        let found = ["listening on http://", "listening on https://"]
            .iter()
            .find_map(|m| line.find(m).map(|i| i + m.len()));
        let at = found.map(|i| line[i..].split([',', ' ']).next().unwrap_or("").to_owned());
        log.lock().map_err(|_| "log")?.push(line);
        if let Some(addr) = at {
            break addr;
        }
    };
    // Keep draining the log so the child never blocks on a full pipe.
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
        }
    });
    Ok(Served { child, addr, log })
}

/// The `brook serve` binary in a child process on an ephemeral port, for tests that measure
/// the server process itself.
pub struct ChildServer {
    pub base: String,
    pub child: std::process::Child,
    pub client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl ChildServer {
    pub fn start(extra: &[&str]) -> R<ChildServer> {
        let dir = tempfile::tempdir()?;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brook"));
        cmd.args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--durability",
            "buffered",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .args(extra)
        .env("RUST_LOG", "info");
        let served = spawn_serve(cmd)?;
        Ok(ChildServer {
            base: format!("http://{}", served.addr),
            child: served.child,
            client: reqwest::Client::new(),
            _dir: dir,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The child's anonymous resident memory (heap and stacks; file-backed pages such as
    /// mapped segments and snapshots are not counted), in bytes.
    pub fn rss_anon(&self) -> R<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("RssAnon:"))
            .ok_or("no RssAnon")?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .ok_or("RssAnon value")?
            .parse()?;
        Ok(kb * 1024)
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `conn` until the server ends it (end of stream or an error), for at most 20 s; returns
/// the bytes read and how long it took. For tests of readers the server cuts off.
pub async fn read_until_cut_off<S: tokio::io::AsyncRead + Unpin>(
    conn: &mut S,
) -> R<(usize, Duration)> {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await? {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    Ok((got, started.elapsed()))
}

/// One block of an SSE body, by the WHATWG rules brook relies on: blocks end at a blank line;
/// `event`, `data`, `id` and `retry` fields (one optional space after the colon); comments and
/// other fields skipped.
pub struct SseBlock {
    /// The `event:` field, if the block had one.
    pub kind: Option<String>,
    /// The `data:` lines joined with LF; `None` if the block had none.
    pub data: Option<String>,
    /// The `id:` field, if the block had one.
    pub id: Option<String>,
    /// The `retry:` field, if the block had one (it must be digits).
    pub retry: Option<u64>,
}

/// Every block of an SSE body (see [`SseBlock`]).
pub fn sse_blocks(body: &str) -> Vec<SseBlock> {
    let mut blocks = Vec::new();
    for block in body.split("\n\n") {
        let (mut kind, mut data, mut id, mut retry) = (None, Vec::new(), None, None);
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => kind = Some(value.to_owned()),
                "data" => data.push(value),
                "id" => id = Some(value.to_owned()),
                "retry" => retry = Some(value.parse().expect("retry is digits")),
                _ => {}
            }
        }
        blocks.push(SseBlock {
            kind,
            data: (!data.is_empty()).then(|| data.join("\n")),
            id,
            retry,
        });
    }
    blocks
}

/// A token file in `dir` granting each `(name, grants)`: the token `{name}-token` with the
/// grants `grants` (the file format of docs/http.md).
pub fn token_file(dir: &Path, tokens: &[(&str, &str)]) -> R<std::path::PathBuf> {
    let path = dir.join("tokens");
    let mut text = String::from("# test tokens\n");
    for (name, grants) in tokens {
        text.push_str(&brook::http::token_hash(&format!("{name}-token")));
        text.push(' ');
        text.push_str(grants);
        text.push('\n');
    }
    std::fs::write(&path, text)?;
    Ok(path)
}

/// One HTTP/1.1 request read off `sock` as a webhook receiver sees it: its head (up to and
/// including the blank line, as text) and its `content-length` body. `None` when the peer
/// closes first or the framing is not that (a TLS handshake, no `content-length`).
pub async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head_value(&head, "content-length")?.parse().ok()?;
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.truncate(head_end + len);
    Some((head, buf.split_off(head_end)))
}

/// The value of header `name` (any case) in a request head, trimmed.
pub fn head_value(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// The value of the unlabelled metric `name` in a Prometheus text exposition, as `T`.
pub fn metric<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
