//! The cold tier against a real S3-compatible server: moto's server mode (`moto_server`, from
//! the Python package index; `scripts/s3-server` installs it under `~/.cache/brook-bench/`),
//! started by each test as a child process on its own port, with `brook serve --tier-url
//! s3://...` as another child.
//!
//! `SKIP_S3=1` skips these tests. moto keeps its objects in memory: a test that stops it and starts it again gets an empty
//! server (the outage test accounts for that).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http_support::{R, Served, spawn_serve};

const BUCKET: &str = "brook-tier-test";

/// Whether the S3 tests are skipped (said on stderr): `SKIP_S3` asks so, or no working moto is
/// installed where that may pass (see `missing_prerequisite`). A `moto_server` that does not
/// run (moto installed without its `[server]` extra) counts as missing: it would otherwise
/// only show as moto never answering.
fn skipped() -> R<bool> {
    if std::env::var_os("SKIP_S3").is_some() {
        eprintln!("tier_s3: skipped (SKIP_S3 is set)");
        return Ok(true);
    }
    let missing = match moto_binary() {
        Err(e) => Some(e.to_string()),
        Ok(bin) => match Command::new(&bin).arg("--help").output() {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "{} does not run ({}; moto without its [server] extra?): scripts/s3-server \
                 installs a working one",
                bin.display(),
                out.status
            )),
            Err(e) => Some(format!("{}: {e}", bin.display())),
        },
    };
    if let Some(what) = missing {
        crate::util::missing_prerequisite("tier_s3", &what)?;
        return Ok(true);
    }
    Ok(false)
}

/// The `moto_server` to run: `BROOK_MOTO_SERVER`, else the one `scripts/s3-server` installs,
/// else the one on `PATH`.
fn moto_binary() -> R<PathBuf> {
    if let Ok(p) = std::env::var("BROOK_MOTO_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cached = Path::new(&home).join(".cache/brook-bench/bin/moto_server");
    if cached.exists() {
        return Ok(cached);
    }
    let on_path = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join("moto_server"))
        .find(|p| p.exists());
    on_path.ok_or_else(|| {
        "moto_server not found: run scripts/s3-server --install (or set BROOK_MOTO_SERVER)".into()
    })
}

/// A moto server on 127.0.0.1:`port`, killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts moto on `port` (0: a free one) and creates the test bucket.
    async fn start(port: u16) -> R<Moto> {
        let port = if port == 0 {
            std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        } else {
            port
        };
        let child = Command::new(moto_binary()?)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut moto = Moto { child, port };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = moto.child.try_wait()? {
                return Err(format!("moto_server exited with {status} before serving").into());
            }
            if let Ok(r) = http.put(moto.url(BUCKET)).send().await
                && r.status().is_success()
            {
                return Ok(moto);
            }
            if Instant::now() > deadline {
                return Err("moto did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.endpoint())
    }

    /// Every object under `prefix` in the bucket, with its size.
    async fn list(&self, prefix: &str) -> R<Vec<(String, u64)>> {
        let http = reqwest::Client::new();
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut q = vec![("list-type", "2".to_owned()), ("prefix", prefix.to_owned())];
            if let Some(t) = &token {
                q.push(("continuation-token", t.clone()));
            }
            let body = http
                .get(self.url(BUCKET))
                .query(&q)
                .send()
                .await?
                .text()
                .await?;
            for item in body.split("<Contents>").skip(1) {
                let key = between(item, "<Key>", "</Key>").ok_or("no Key")?;
                let size = between(item, "<Size>", "</Size>")
                    .ok_or("no Size")?
                    .parse()?;
                out.push((key.to_owned(), size));
            }
            match between(&body, "<NextContinuationToken>", "</NextContinuationToken>") {
                Some(t) => token = Some(t.to_owned()),
                None => return Ok(out),
            }
        }
    }

    /// An object's bytes.
    async fn get(&self, key: &str) -> R<Vec<u8>> {
        // moto refuses anonymous reads; any credentials do (it checks no signatures).
        let r = reqwest::Client::new()
            .get(self.url(&format!("{BUCKET}/{key}")))
            .header("Authorization", "AWS test:test")
            .send()
            .await?;
        if !r.status().is_success() {
            return Err(format!("GET {key}: {}", r.status()).into());
        }
        Ok(r.bytes().await?.to_vec())
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn between<'a>(s: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let i = s.find(a)? + a.len();
    let j = s[i..].find(b)? + i;
    Some(&s[i..j])
}

/// `brook serve` on `data` with a cold tier at moto's `s3://BUCKET/{prefix}`.
fn serve(data: &Path, moto: &Moto, prefix: &str, budget: u64) -> R<Served> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--durability",
        "buffered",
    ])
    .arg("--data-dir")
    .arg(data)
    .args(["--segment-bytes", "4096", "--checkpoint-bytes", "65536"])
    .arg("--tier-url")
    .arg(format!("s3://{BUCKET}/{prefix}"))
    .arg("--tier-endpoint")
    .arg(moto.endpoint())
    .arg("--tier-local-budget")
    .arg(budget.to_string())
    .args(["--tier-retry-max-ms", "300"])
    .env("AWS_ACCESS_KEY_ID", "test")
    .env("AWS_SECRET_ACCESS_KEY", "test")
    .env("AWS_DEFAULT_REGION", "us-east-1")
    .env_remove("AWS_ENDPOINT_URL")
    .env("RUST_LOG", "info");
    spawn_serve(cmd)
}

/// Stops a server with SIGTERM (a clean shutdown: its last checkpoint) and waits for it.
fn stop(mut s: Served) -> R {
    Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()?;
    s.child.wait()?;
    Ok(())
}

/// Kills a server with SIGKILL (a crash) and waits for it.
fn crash(mut s: Served) -> R {
    s.child.kill()?;
    s.child.wait()?;
    Ok(())
}

/// The value of metric `name` in `/__brook/metrics`.
async fn metric(s: &Served, name: &str) -> R<f64> {
    let text = reqwest::get(format!("http://{}/__brook/metrics", s.addr))
        .await?
        .text()
        .await?;
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .ok_or_else(|| format!("no metric {name}"))?;
    Ok(line.split_whitespace().nth(1).ok_or("no value")?.parse()?)
}

/// Waits until `ok` holds, polling for at most 60 s.
async fn until<F, Fut>(what: &str, mut ok: F) -> R
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = R<bool>>,
{
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        if ok().await.unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Appends messages `from..to` (about 100 bytes each, distinct) to `stream`; every one must be
/// acknowledged. Returns their bytes.
async fn append(s: &Served, stream: &str, from: usize, to: usize) -> R<Vec<u8>> {
    let acked = std::sync::Mutex::new(Vec::new());
    append_to(&s.addr, stream, from..to, &acked).await?;
    Ok(acked.into_inner().map_err(|_| "poisoned")?)
}

/// The message `i` of the tests' streams.
fn message(i: usize) -> String {
    format!("message {i:06} {}\n", "y".repeat(80 + i % 13))
}

/// Appends messages `range` to `stream` at `addr`, one request each, adding each acknowledged
/// one to `acked`; stops at the first that is not acknowledged.
async fn append_to(
    addr: &str,
    stream: &str,
    range: std::ops::Range<usize>,
    acked: &std::sync::Mutex<Vec<u8>>,
) -> R {
    let http = reqwest::Client::new();
    for i in range {
        let m = message(i);
        let r = http
            .post(format!("http://{addr}/{stream}"))
            .header("Content-Type", "application/octet-stream")
            .body(m.clone())
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            return Err(format!("append {i}: {}", r.status()).into());
        }
        acked
            .lock()
            .map_err(|_| "poisoned")?
            .extend_from_slice(m.as_bytes());
    }
    Ok(())
}

/// Creates a byte stream.
async fn create(s: &Served, stream: &str) -> R {
    let r = reqwest::Client::new()
        .put(format!("http://{}/{stream}", s.addr))
        .header("Content-Type", "application/octet-stream")
        .send()
        .await?;
    if r.status().as_u16() != 201 {
        return Err(format!("create {stream}: {}", r.status()).into());
    }
    Ok(())
}

/// The whole stream, read in chunks of at most `chunk` bytes from the start.
async fn read_all(s: &Served, stream: &str, chunk: Option<u64>) -> R<Vec<u8>> {
    let http = reqwest::Client::new();
    let mut out = Vec::new();
    let mut offset = "-1".to_owned();
    loop {
        let mut url = format!("http://{}/{stream}?offset={offset}", s.addr);
        if let Some(c) = chunk {
            url = format!("{url}&max_bytes={c}");
        }
        let r = http.get(&url).send().await?;
        if r.status().as_u16() != 200 {
            let status = r.status();
            let body = r.text().await?;
            return Err(format!("read at {offset}: {status}: {body}\n{}", s.log_text()).into());
        }
        let next = r
            .headers()
            .get("stream-next-offset")
            .and_then(|v| v.to_str().ok())
            .ok_or("no Stream-Next-Offset")?
            .to_owned();
        let done = r.headers().contains_key("stream-up-to-date");
        out.extend_from_slice(&r.bytes().await?);
        if done {
            return Ok(out);
        }
        offset = next;
    }
}

/// The segment files (`.log`, `.idx`) under `data`.
fn segment_files(data: &Path) -> R<Vec<PathBuf>> {
    Ok(crate::util::files_under(data)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "log" || x == "idx"))
        .collect())
}

fn file_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Upload, eviction under a zero budget, reads across local and cold segments (in many chunk
/// sizes), a restart, recovery with every tiered local file removed, and a delete that removes
/// the stream's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_upload_evict_read_recover_delete() -> R {
    if skipped()? {
        return Ok(());
    }
    let moto = Moto::start(0).await?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let s = serve(&data, &moto, "a", 0)?;
    create(&s, "logs/one").await?;
    create(&s, "logs/two").await?;
    let one = append(&s, "logs/one", 0, 900).await?;
    let two = append(&s, "logs/two", 0, 100).await?;
    until("evictions", || async {
        Ok(metric(&s, "brook_tier_evictions_total").await? >= 5.0)
    })
    .await?;
    for chunk in [None, Some(777), Some(4096), Some(10_000)] {
        assert_eq!(
            read_all(&s, "logs/one", chunk).await?,
            one,
            "chunk {chunk:?}"
        );
    }
    assert!(metric(&s, "brook_tier_cache_misses_total").await? > 0.0);
    assert!(metric(&s, "brook_tier_fetch_bytes_total").await? > 0.0);
    // Restarted: every sealed segment is uploaded (the open's checkpoint), cold ones read back.
    stop(s)?;
    let s = serve(&data, &moto, "a", 0)?;
    assert_eq!(read_all(&s, "logs/one", Some(5000)).await?, one);
    until("uploads after the restart", || async {
        Ok(metric(&s, "brook_tier_pending_streams").await? == 0.0
            && metric(&s, "brook_tier_local_bytes").await? == 0.0)
    })
    .await?;
    stop(s)?;
    // The local disk loses every file the tier holds: the server restores the indexes and reads
    // the logs from the tier.
    let objects = moto.list("a/").await?;
    // Objects are `{prefix}/{stream key}/{incarnation}/{file}`; stream directories end in the key.
    let tiered: Vec<(String, &str)> = objects
        .iter()
        .map(|(k, _)| {
            (
                k.split('/').nth(1).unwrap_or_default().to_owned(),
                file_name(k),
            )
        })
        .collect();
    let mut removed = 0;
    for p in segment_files(&data)? {
        let f = p.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        let key = p
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|k| k.to_str())
            .unwrap_or_default();
        if tiered.iter().any(|(k, n)| k == key && *n == f) {
            std::fs::remove_file(&p)?;
            removed += 1;
        }
    }
    assert!(removed >= 5, "{removed} files removed");
    let s = serve(&data, &moto, "a", 0)?;
    assert_eq!(read_all(&s, "logs/one", None).await?, one);
    assert_eq!(read_all(&s, "logs/two", Some(1000)).await?, two);
    // A delete removes the stream's objects (in the background), not the other's.
    let key_of = |k: &str| k.split('/').nth(1).unwrap_or_default().to_owned();
    let keys: std::collections::BTreeSet<String> = objects.iter().map(|(k, _)| key_of(k)).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let r = reqwest::Client::new()
        .delete(format!("http://{}/logs/one", s.addr))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 204);
    until("the deleted stream's objects to go", || async {
        let left = moto.list("a/").await?;
        let keys: std::collections::BTreeSet<String> =
            left.iter().map(|(k, _)| key_of(k)).collect();
        Ok(keys.len() == 1 && !left.is_empty())
    })
    .await?;
    assert!(metric(&s, "brook_tier_deletes_total").await? > 0.0);
    assert_eq!(read_all(&s, "logs/two", None).await?, two);
    stop(s)?;
    Ok(())
}

/// `kill -9` while uploads are under way: the restarted server resumes them; afterwards every
/// sealed segment is in the bucket, each object equal to the local bytes (nothing counted as
/// uploaded that is not there, whole), and nothing was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_upload_interrupted_by_kill_resumes() -> R {
    if skipped()? {
        return Ok(());
    }
    let moto = Moto::start(0).await?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let s = serve(&data, &moto, "k", u64::MAX)?;
    create(&s, "big").await?;
    // A writer goes on appending while the first uploads happen; the server is killed then.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (addr, log) = (s.addr.clone(), acked.clone());
    let writer = tokio::spawn(async move { append_to(&addr, "big", 0..20_000, &log).await });
    let seen = acked.clone();
    // Enough acknowledged bytes for a dozen 4 KiB segments, so at least ten are sealed
    // whatever the timing of the first checkpoint.
    until("the first uploads", || async {
        let written = seen.lock().map_err(|_| "poisoned")?.len();
        Ok(written >= 12 * 4096 && metric(&s, "brook_tier_uploads_total").await? >= 2.0)
    })
    .await?;
    assert!(!writer.is_finished(), "the writer is still appending");
    crash(s)?;
    // The append in flight when the server died fails as a transport error, not a refusal.
    let cut = writer
        .await?
        .expect_err("the writer's last append was cut off");
    assert!(cut.downcast_ref::<reqwest::Error>().is_some(), "{cut}");
    let acked = acked.lock().map_err(|_| "poisoned")?.clone();
    let at_crash = moto.list("k/").await?.len();
    let s = serve(&data, &moto, "k", u64::MAX)?;
    // Nothing acknowledged is lost (the append in flight may or may not have landed).
    let all = read_all(&s, "big", None).await?;
    assert!(
        all.starts_with(&acked),
        "acknowledged appends survive the crash"
    );
    // Past them, at most the one append in flight: the next message, whole.
    // Each message ends with the only newline in it: the pieces after splitting are the
    // acknowledged messages and an empty last one.
    let next = acked.split(|&b| b == b'\n').count() - 1;
    let extra = &all[acked.len()..];
    assert!(
        extra.is_empty() || extra == message(next).as_bytes(),
        "past the acknowledged appends only the one in flight: {} extra bytes",
        extra.len()
    );
    // Every local log but the open segment's must reach the bucket, each byte-equal.
    let mut logs: Vec<PathBuf> = segment_files(&data)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    logs.pop();
    assert!(logs.len() >= 10, "{} sealed segments", logs.len());
    let want: Vec<String> = logs
        .iter()
        .filter_map(|p| p.file_name().and_then(|f| f.to_str()).map(str::to_owned))
        .collect();
    until("every sealed segment in the bucket", || async {
        let have = moto.list("k/").await?;
        Ok(want
            .iter()
            .all(|w| have.iter().any(|(k, _)| file_name(k) == w)))
    })
    .await?;
    let have = moto.list("k/").await?;
    assert!(
        at_crash < have.len(),
        "the crash cut the uploads short ({at_crash} objects then)"
    );
    for (i, p) in logs.iter().enumerate() {
        let key = &have
            .iter()
            .find(|(k, _)| file_name(k) == want[i])
            .ok_or("object missing")?
            .0;
        // The last sealed segment ends where the open one starts.
        let next = match logs.get(i + 1) {
            Some(n) => n.clone(),
            None => segment_files(&data)?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .max()
                .ok_or("no open segment")?,
        };
        let next_base: u64 = next
            .file_stem()
            .and_then(|f| f.to_str())
            .ok_or("name")?
            .parse()?;
        let base: u64 = p
            .file_stem()
            .and_then(|f| f.to_str())
            .ok_or("name")?
            .parse()?;
        let local = std::fs::read(p)?;
        let object = moto.get(key).await?;
        assert_eq!(object.len() as u64, next_base - base, "{key}");
        assert_eq!(object, local[..object.len()], "{key}");
    }
    stop(s)?;
    Ok(())
}

/// The object store down for a while: appends go on being acknowledged, failures show in the
/// metrics, and uploads resume once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_outage_never_blocks_appends() -> R {
    if skipped()? {
        return Ok(());
    }
    let moto = Moto::start(0).await?;
    let port = moto.port;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let s = serve(&data, &moto, "o", u64::MAX)?;
    create(&s, "busy").await?;
    let mut all = append(&s, "busy", 0, 800).await?;
    until("uploads", || async {
        Ok(metric(&s, "brook_tier_uploads_total").await? >= 2.0)
    })
    .await?;
    drop(moto);
    // Down: every append is still acknowledged, and the tier's failures count up.
    all.extend(append(&s, "busy", 800, 2000).await?);
    until("failures", || async {
        Ok(metric(&s, "brook_tier_failures_total").await? >= 1.0)
    })
    .await?;
    assert_eq!(read_all(&s, "busy", None).await?, all);
    let before = metric(&s, "brook_tier_uploads_total").await?;
    // Back (moto starts empty: the segments uploaded before the outage are not in it any more;
    // what matters here is that the ones sealed during the outage get there).
    let moto = Moto::start(port).await?;
    until("uploads to resume", || async {
        Ok(metric(&s, "brook_tier_uploads_total").await? > before + 4.0)
    })
    .await?;
    assert!(!moto.list("o/").await?.is_empty());
    all.extend(append(&s, "busy", 2000, 2100).await?);
    assert_eq!(read_all(&s, "busy", Some(3000)).await?, all);
    stop(s)?;
    Ok(())
}

/// A fork whose inherited range is cold reads it byte-exactly from the tier; retention up to a
/// snapshot deletes the source's objects below it only once the fork is gone (forks read the
/// retained range).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_fork_across_tiers_and_retention() -> R {
    if skipped()? {
        return Ok(());
    }
    let moto = Moto::start(0).await?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let s = serve(&data, &moto, "f", 0)?;
    let http = reqwest::Client::new();
    create(&s, "src").await?;
    let inherited = append(&s, "src", 0, 700).await?;
    let r = http
        .put(format!("http://{}/fork", s.addr))
        .header("Content-Type", "application/octet-stream")
        .header("Stream-Forked-From", "/src")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await?);
    let own = append(&s, "fork", 700, 800).await?;
    until("evictions", || async {
        Ok(metric(&s, "brook_tier_evictions_total").await? >= 3.0)
    })
    .await?;
    let mut expect = inherited.clone();
    expect.extend_from_slice(&own);
    assert_eq!(read_all(&s, "fork", Some(3000)).await?, expect);
    assert!(metric(&s, "brook_tier_cache_misses_total").await? > 0.0);
    // Retention of the source to a snapshot at its middle: nothing leaves while the fork lives.
    let half = http
        .get(format!(
            "http://{}/src?offset=-1&max_bytes={}",
            s.addr,
            inherited.len() / 2
        ))
        .send()
        .await?;
    let cut = half
        .headers()
        .get("stream-next-offset")
        .and_then(|v| v.to_str().ok())
        .ok_or("no next offset")?
        .to_owned();
    let r = http
        .put(format!("http://{}/src/snapshot/{cut}", s.addr))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await?;
    assert!(r.status().is_success(), "snapshot: {}", r.status());
    let r = http
        .put(format!("http://{}/src/retention/{cut}", s.addr))
        .send()
        .await?;
    assert!(r.status().is_success(), "retention: {}", r.status());
    let src_logs = |objs: &[(String, u64)], key: &str| {
        objs.iter()
            .filter(|(k, _)| {
                k.split('/').nth(1) == Some(key)
                    && Path::new(k).extension().is_some_and(|x| x == "log")
            })
            .count()
    };
    // The source's objects are those of the stream with the most segments.
    let objects = moto.list("f/").await?;
    let src_key = objects
        .iter()
        .filter_map(|(k, _)| k.split('/').nth(1))
        .max_by_key(|k| src_logs(&objects, k))
        .ok_or("no objects")?
        .to_owned();
    let before = moto.list("f/").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // (Uploads may still add some; none goes.)
    let during = src_logs(&moto.list("f/").await?, &src_key);
    assert!(
        during >= src_logs(&before, &src_key),
        "nothing reclaimed while the fork lives"
    );
    let before = moto.list("f/").await?;
    // The fork goes: the tier reclaims the source's segments below the cut.
    let r = http
        .delete(format!("http://{}/fork", s.addr))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 204);
    // The next pass over the source (here: the restart's) deletes what retention left behind.
    stop(s)?;
    let s = serve(&data, &moto, "f", 0)?;
    until("the source's retained objects to go", || async {
        let now = src_logs(&moto.list("f/").await?, &src_key);
        Ok(now < src_logs(&before, &src_key) && now > 0)
    })
    .await?;
    let tail = read_all(&s, "src", None).await;
    assert!(
        matches!(&tail, Err(e) if e.to_string().contains("410 Gone")),
        "offset=-1 after retention answers 410: {:?}",
        tail.map(|b| b.len())
    );
    let r = http
        .get(format!("http://{}/src?offset={cut}", s.addr))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    stop(s)?;
    Ok(())
}
