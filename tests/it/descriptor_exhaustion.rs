//! Running out of file descriptors while opening a stream (`EMFILE`): a refusal of known
//! outcome, `503 TOO_MANY_OPEN_FILES` with `Retry-After`, that writes nothing and poisons
//! nothing, so the same requests succeed once descriptors free up.

use std::process::Command;
use std::time::Duration;

use crate::http_support::{R, Served, spawn_serve};

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
