//! Running out of file descriptors while opening a stream (`EMFILE`): a refusal of known
//! outcome, `503 TOO_MANY_OPEN_FILES` with `Retry-After`, that writes nothing and poisons
//! nothing, so the same requests succeed once descriptors free up.

use std::process::Command;
use std::time::Duration;

use crate::http_support::{R, Served, metric, spawn_serve};

/// `brook serve` on `dir` under a hard and soft open-file limit of `nofile`.
fn serve_limited(nofile: u32, dir: &std::path::Path) -> R<Served> {
    let script = format!(
        "ulimit -n {nofile} && exec \"$0\" serve --host 127.0.0.1 --port 0 --max-connections 5000 --data-dir \"$1\"",
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, env!("CARGO_BIN_EXE_brook")])
        .arg(dir);
    spawn_serve(cmd)
}

/// Streams written, the server restarted (so every stream is closed), then its descriptors
/// taken up by idle connections: opening a closed stream, to read or to append, answers 503
/// `TOO_MANY_OPEN_FILES` with `Retry-After`. Once the connections go, the same reads and
/// appends succeed and every acknowledged byte is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_is_a_retryable_refusal_that_poisons_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let mut served = serve_limited(200, dir.path())?;
    let base = format!("http://{}", served.addr);
    for i in 0..10 {
        let url = format!("{base}/emfile/{i}");
        let put = client
            .put(&url)
            .header("content-type", "text/plain")
            .body(format!("a{i},"))
            .send()
            .await?;
        assert_eq!(put.status().as_u16(), 201);
    }
    // Two restarts: the first replays the journal (opening the streams it names) and
    // checkpoints it, so the second starts with every stream closed.
    for _ in 0..2 {
        let _ = served.child.kill();
        let _ = served.child.wait();
        served = serve_limited(200, dir.path())?;
    }
    let _ = served.child.kill();
    let _ = served.child.wait();

    let mut served = serve_limited(200, dir.path())?;
    let base = format!("http://{}", served.addr);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    // The one connection the requests below reuse, open before the descriptors run out.
    let first = client.get(format!("{base}/emfile/0")).send().await?;
    assert_eq!(first.status().as_u16(), 200);
    first.bytes().await?;
    // Idle connections until the server has no descriptor left: it accepts each (one
    // descriptor apiece) until `accept` fails, and the rest wait in the listen backlog.
    let addr: std::net::SocketAddr = served.addr.parse()?;
    let mut hogs = Vec::new();
    let fds = format!("/proc/{}/fd", served.child.id());
    while std::fs::read_dir(&fds)?.count() < 200 && hogs.len() < 400 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => hogs.push(s),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    // A few more wait in the backlog: a descriptor the server frees (it puts idle streams at
    // rest when an accept fails for want of one) goes to the next of them, so the server
    // stays out of descriptors.
    for _ in 0..20 {
        if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            hogs.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = client.get(format!("{base}/emfile/1")).send().await?;
    let read_status = read.status().as_u16();
    let read_retry = read.headers().get("retry-after").is_some();
    let read_body = read.text().await?;
    let append = client
        .post(format!("{base}/emfile/2"))
        .header("content-type", "text/plain")
        .body("refused,")
        .send()
        .await?;
    let append_status = append.status().as_u16();
    let append_body = append.text().await?;
    drop(hogs);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut after = Vec::new();
    for i in 0..10 {
        let url = format!("{base}/emfile/{i}");
        let post = client
            .post(&url)
            .header("content-type", "text/plain")
            .body(format!("b{i},"))
            .send()
            .await?;
        let post_status = post.status().as_u16();
        let why = post.text().await?;
        let got = client.get(&url).send().await?;
        after.push((
            i,
            post_status,
            why,
            got.status().as_u16(),
            got.text().await?,
        ));
    }
    let _ = served.child.kill();
    let _ = served.child.wait();

    assert_eq!(read_status, 503, "a read past the descriptors: {read_body}");
    assert!(read_body.contains("TOO_MANY_OPEN_FILES"), "{read_body}");
    assert!(read_retry, "no Retry-After on the refused read");
    assert_eq!(
        append_status, 503,
        "an append past the descriptors: {append_body}"
    );
    assert!(append_body.contains("TOO_MANY_OPEN_FILES"), "{append_body}");
    for (i, post, why, get, body) in after {
        assert_eq!(
            post, 204,
            "emfile/{i} append after the descriptors freed: {why}"
        );
        assert_eq!((get, body), (200, format!("a{i},b{i},")), "emfile/{i}");
    }
    Ok(())
}

/// `brook serve` on `dir` keeping 16 streams open (and up to 32 more while in use or written).
fn serve_small_cache(dir: &std::path::Path) -> R<Served> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(["--max-open-streams", "16", "--data-dir"])
        .arg(dir);
    spawn_serve(cmd)
}

/// Appends at random over far more closed streams than the cache holds, from many clients at
/// once, faster than checkpoints make written streams closable: the open streams (and so the
/// descriptors) stay bounded by `max_open_streams` and a half, an append past it is refused
/// `503 TOO_MANY_OPEN_STREAMS` with `Retry-After`, and every acknowledged append is there.
/// (The registry once grew without bound here, until the process ran out of descriptors.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_over_many_closed_streams_keep_open_streams_bounded() -> R {
    const STREAMS: usize = 2000;
    let dir = tempfile::tempdir()?;
    let client = reqwest::Client::new();
    let mut served = serve_small_cache(dir.path())?;
    let base = format!("http://{}", served.addr);
    for i in 0..STREAMS {
        let put = client
            .put(format!("{base}/many/{i}"))
            .header("content-type", "text/plain")
            .send()
            .await?;
        assert_eq!(put.status().as_u16(), 201, "many/{i}");
    }
    let _ = served.child.kill();
    let _ = served.child.wait();
    let mut served = serve_small_cache(dir.path())?;
    let base = format!("http://{}", served.addr);
    let fds = format!("/proc/{}/fd", served.child.id());

    let writers: Vec<_> = (0..48u64)
        .map(|w| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut refused = Vec::new();
                let mut x = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for n in 0..80u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = usize::try_from(x % STREAMS as u64).expect("a small index");
                    let body = format!("w{w}n{n},");
                    let r = client
                        .post(format!("{base}/many/{i}"))
                        .header("content-type", "text/plain")
                        .body(body.clone())
                        .send()
                        .await
                        .expect("the server answers");
                    let status = r.status().as_u16();
                    let retry = r.headers().get("retry-after").is_some();
                    let text = r.text().await.expect("a body");
                    match status {
                        204 => acked.push((i, body)),
                        _ => refused.push((status, retry, text)),
                    }
                }
                (acked, refused)
            })
        })
        .collect();
    let mut most_fds = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        most_fds = most_fds.max(std::fs::read_dir(&fds)?.count());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut acked = Vec::new();
    for w in writers {
        let (a, refused) = w.await?;
        acked.extend(a);
        for (status, retry, text) in refused {
            assert_eq!(status, 503, "an append past the cache: {text}");
            assert!(text.contains("TOO_MANY_OPEN_STREAMS"), "{text}");
            assert!(retry, "no Retry-After on {text}");
        }
    }
    // 48 open streams at two descriptors each, a stream being loaded per connection (two
    // more each, closed again when the registry has no room), the 48 connections, the journal
    // and the runtime: under 360. Unbounded, this run reaches about a thousand.
    assert!(
        most_fds < 360,
        "{most_fds} descriptors open at once with a cache of 16 streams"
    );
    assert!(!acked.is_empty(), "no append was acknowledged");
    for (i, body) in &acked {
        let got = client.get(format!("{base}/many/{i}")).send().await?;
        let text = got.text().await?;
        assert!(text.contains(body.as_str()), "many/{i} lost {body}: {text}");
    }
    let _ = served.child.kill();
    let _ = served.child.wait();
    Ok(())
}

/// `brook serve` on `dir` keeping the segment files of at most 16 streams open, however many
/// streams the registry holds.
fn serve_few_files(dir: &std::path::Path) -> R<Served> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(["--max-stream-files", "16", "--data-dir"])
        .arg(dir);
    spawn_serve(cmd)
}

/// Appends and reads at random over far more streams than may keep their files open, from
/// many clients at once, with the registry free to hold every stream: the descriptors stay
/// bounded by `--max-stream-files` (streams at rest close their files and reopen them on
/// their next use), nothing is refused, every acknowledged append reads back, and is there
/// again after a `kill -9` (appends to a stream at rest since the last checkpoint are in the
/// journal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_at_rest_keep_descriptors_bounded_and_lose_nothing() -> R {
    const STREAMS: usize = 2000;
    let dir = tempfile::tempdir()?;
    let client = reqwest::Client::new();
    let mut served = serve_few_files(dir.path())?;
    let base = format!("http://{}", served.addr);
    for i in 0..STREAMS {
        let put = client
            .put(format!("{base}/rest/{i}"))
            .header("content-type", "text/plain")
            .body(format!("p{i},"))
            .send()
            .await?;
        assert_eq!(put.status().as_u16(), 201, "rest/{i}");
    }
    let fds = format!("/proc/{}/fd", served.child.id());
    let after_creates = std::fs::read_dir(&fds)?.count();
    assert!(
        after_creates < 120,
        "{after_creates} descriptors open after {STREAMS} creates with files for 16 streams"
    );
    // Two restarts: the first replays the journal (opening the streams it names) and
    // checkpoints it, so the second starts with every stream closed, and each request below
    // loads its stream from its files.
    for _ in 0..2 {
        let _ = served.child.kill();
        let _ = served.child.wait();
        served = serve_few_files(dir.path())?;
    }
    let base = format!("http://{}", served.addr);
    let fds = format!("/proc/{}/fd", served.child.id());

    let clients: Vec<_> = (0..48u64)
        .map(|w| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut failed = Vec::new();
                let mut x = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for n in 0..80u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = usize::try_from(x % STREAMS as u64).expect("a small index");
                    let url = format!("{base}/rest/{i}");
                    let r = if w % 3 == 0 {
                        client.get(&url).send().await
                    } else {
                        let body = format!("w{w}n{n},");
                        let r = client
                            .post(&url)
                            .header("content-type", "text/plain")
                            .body(body.clone())
                            .send()
                            .await;
                        if r.as_ref().is_ok_and(|r| r.status().as_u16() == 204) {
                            acked.push((i, body));
                        }
                        r
                    };
                    let r = r.expect("the server answers");
                    let status = r.status().as_u16();
                    let text = r.text().await.expect("a body");
                    if !(200..300).contains(&status)
                        || (w % 3 == 0 && !text.starts_with(&format!("p{i},")))
                    {
                        failed.push((i, status, text));
                    }
                }
                (acked, failed)
            })
        })
        .collect();
    let mut most_fds = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        most_fds = most_fds.max(std::fs::read_dir(&fds)?.count());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut acked = Vec::new();
    for c in clients {
        let (a, failed) = c.await?;
        acked.extend(a);
        assert!(failed.is_empty(), "requests failed: {failed:?}");
    }
    // Sixteen streams' files, a stream woken per request in flight (a descriptor each, until
    // the next lookup puts the least recently used to rest), the 48 connections, the journal
    // and the runtime. Without rest, every stream touched keeps its log open: about 2,000.
    assert!(
        most_fds < 360,
        "{most_fds} descriptors open at once with files for 16 streams"
    );
    assert!(acked.len() > 2000, "{} appends acknowledged", acked.len());
    let metrics = client
        .get(format!("{base}/__brook/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let held: f64 = metric(&metrics, "brook_stream_files").expect("brook_stream_files is exported");
    assert!(held <= 16.0 + 4.0, "{held} stream files held at rest");
    let open = metric(&metrics, "brook_open_streams").unwrap_or(f64::NAN);
    assert!(
        open > 16.0,
        "the registry holds more streams than have files: {open}"
    );
    for (i, body) in &acked {
        let text = client
            .get(format!("{base}/rest/{i}"))
            .send()
            .await?
            .text()
            .await?;
        assert!(text.contains(body.as_str()), "rest/{i} lost {body}: {text}");
    }
    // kill -9 with appends at rest and not yet checkpointed.
    let _ = served.child.kill();
    let _ = served.child.wait();
    let mut served = serve_few_files(dir.path())?;
    let base = format!("http://{}", served.addr);
    let mut want: std::collections::HashMap<usize, String> = std::collections::HashMap::new();
    for (i, body) in &acked {
        want.entry(*i)
            .or_insert_with(|| format!("p{i},"))
            .push_str(body);
    }
    for (i, body) in &want {
        let got = client
            .get(format!("{base}/rest/{i}"))
            .send()
            .await?
            .text()
            .await?;
        // Appends to one stream from different clients interleave; each client's are in order.
        let mut parts: Vec<&str> = got.split_terminator(',').collect();
        let mut expect: Vec<&str> = body.split_terminator(',').collect();
        parts.sort_unstable();
        expect.sort_unstable();
        assert_eq!(parts, expect, "rest/{i} after kill -9");
    }
    let _ = served.child.kill();
    let _ = served.child.wait();
    Ok(())
}

/// `brook serve` on `dir` under an open-file limit of `nofile`, with the stream files' budget
/// given (so the server lends the streams no descriptors: only a failed `accept` sheds them).
fn serve_fixed_files(nofile: u32, files: u32, dir: &std::path::Path) -> R<Served> {
    let script = format!(
        "ulimit -n {nofile} && exec \"$0\" serve --host 127.0.0.1 --port 0 --max-connections 5000 \
         --max-stream-files {files} --data-dir \"$1\"",
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, env!("CARGO_BIN_EXE_brook")])
        .arg(dir);
    spawn_serve(cmd)
}

/// How many sockets the process `pid` holds.
fn sockets(pid: u32) -> R<usize> {
    let mut n = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Ok(target) = std::fs::read_link(fd?.path())
            && target.to_string_lossy().starts_with("socket:")
        {
            n += 1;
        }
    }
    Ok(n)
}

/// A surge of connections that runs the server out of descriptors while idle streams hold
/// theirs: the accept that fails puts idle streams at rest (their segment files closed), so the
/// server goes on accepting connections past what fit beside the open files, and the streams
/// lose nothing (each reopens its files at its next read). The streams were just written, so
/// each has index entries to write as it rests: it writes them with the descriptor its log
/// gives back (before, resting needed a descriptor first, and out of descriptors no stream
/// could rest: 168 sockets here, and every stream's files still open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_of_connections_puts_idle_streams_at_rest() -> R {
    const NOFILE: usize = 300;
    const STREAMS: usize = 120;
    let dir = tempfile::tempdir()?;
    let mut served = serve_fixed_files(NOFILE as u32, 250, dir.path())?;
    let base = format!("http://{}", served.addr);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    for i in 0..STREAMS {
        let put = client
            .put(format!("{base}/surge/{i}"))
            .header("content-type", "text/plain")
            .body(format!("s{i},"))
            .send()
            .await?;
        assert_eq!(put.status().as_u16(), 201);
    }
    let files = |text: &str| metric::<f64>(text, "brook_stream_files").unwrap_or(f64::NAN);
    let metrics = format!("{base}/__brook/metrics");
    let before = files(&client.get(&metrics).send().await?.text().await?);
    assert!(
        before >= STREAMS as f64,
        "{before} stream files open before the surge"
    );
    // More connections than the server has descriptors: those it cannot accept wait in the
    // listen backlog, and each failed accept sheds stream files to take more of them.
    let addr: std::net::SocketAddr = served.addr.parse()?;
    let pid = served.child.id();
    let mut hogs = Vec::new();
    for _ in 0..NOFILE + 100 {
        if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            hogs.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = sockets(pid)?;
    drop(hogs);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = files(&client.get(&metrics).send().await?.text().await?);
    let mut lost = Vec::new();
    for i in 0..STREAMS {
        let got = client.get(format!("{base}/surge/{i}")).send().await?;
        let (status, body) = (got.status().as_u16(), got.text().await?);
        if (status, body.as_str()) != (200, format!("s{i},").as_str()) {
            lost.push((i, status, body));
        }
    }
    let _ = served.child.kill();
    let _ = served.child.wait();
    assert!(
        held > NOFILE - STREAMS,
        "{held} sockets held with {STREAMS} streams' files open under {NOFILE} descriptors"
    );
    assert!(
        after < before / 2.0,
        "stream files {before} before the surge, {after} after"
    );
    assert!(lost.is_empty(), "{lost:?}");
    Ok(())
}
