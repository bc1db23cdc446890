//! Slow and stalled clients (issue 13): an upload that stops sending, a reader that stops
//! reading, and shutdown with such clients still connected. Each costs the server bounded time
//! and memory and loses nothing.

use std::time::{Duration, Instant};

use brook::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http_support::{R, Server, config};

fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_owned()
}

/// An upload that sends part of its body and then nothing is refused with 408
/// `REQUEST_TIMEOUT` once it has been idle for the body read timeout, and writes nothing; so is
/// a chunked one, and a stalled snapshot upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_refused_with_408_and_writes_nothing() -> R {
    let cfg = brook::http::ServerConfig {
        body_read_timeout: Duration::from_millis(400),
        ..config()
    };
    let s = Server::start_with(Options::default(), cfg).await?;
    s.create("/slow/up", "text/plain").await?;
    let tail = s.tail("/slow/up").await?;
    for (framing, path) in [
        ("Content-Length: 1000\r\n\r\npartial", "/slow/up"),
        (
            "Transfer-Encoding: chunked\r\n\r\n7\r\npartial\r\n",
            "/slow/up",
        ),
        (
            "Content-Length: 1000\r\n\r\npartial",
            "/slow/up/snapshot/0000000000000000_0000000000000000",
        ),
    ] {
        let method = if path.contains("snapshot") {
            "PUT"
        } else {
            "POST"
        };
        let mut c = tokio::net::TcpStream::connect(addr(&s)).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: brook.test\r\nContent-Type: text/plain\r\n{framing}"
        );
        // The clock starts before the write: the server's idle timer starts when it reads these
        // bytes, which may be before this task runs again after the write.
        let started = Instant::now();
        c.write_all(head.as_bytes()).await?;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await??;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
        assert!(started.elapsed() >= Duration::from_millis(400));
    }
    assert_eq!(s.tail("/slow/up").await?, tail, "a stalled upload wrote");
    assert_eq!(s.get("/slow/up/snapshot", &[]).await?.status, 404);
    Ok(())
}

/// An SSE reader that reads nothing of a large stream is disconnected once the server's writes
/// have made no progress for the write stall limit: reading afterwards reaches the end of the
/// connection, short of the stream, well before the SSE lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_disconnected() -> R {
    let cfg = brook::http::ServerConfig {
        write_stall_timeout: Duration::from_millis(500),
        sse_max_duration: Duration::from_mins(2),
        ..config()
    };
    let s = Server::start_with(Options::default(), cfg).await?;
    s.create("/slow/sse", "application/octet-stream").await?;
    let piece = vec![b'x'; 1 << 20];
    for _ in 0..24 {
        let r = s
            .send(
                "POST",
                "/slow/sse",
                &[("content-type", b"application/octet-stream")],
                piece.clone(),
            )
            .await?;
        assert_eq!(r.status, 204);
    }
    let mut c = tokio::net::TcpStream::connect(addr(&s)).await?;
    c.write_all(b"GET /slow/sse?offset=-1&live=sse HTTP/1.1\r\nHost: brook.test\r\n\r\n")
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, took) = crate::http_support::read_until_cut_off(&mut c).await?;
    assert!(
        took < Duration::from_secs(20),
        "the stalled reader was never cut off"
    );
    let whole_base64 = 24 * (1 << 20) * 4 / 3;
    assert!(
        got < whole_base64,
        "received {got} bytes: the connection was not cut off"
    );
    Ok(())
}

/// SIGTERM with a stalled upload connected: `brook serve` stops within its shutdown grace
/// period instead of waiting for the client.
#[test]
fn shutdown_finishes_within_the_grace_period_whatever_clients_do() -> R {
    let dir = tempfile::tempdir()?;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brook"));
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--shutdown-grace-ms",
        "500",
    ])
    .args(["--body-read-timeout-ms", "600000", "--data-dir"])
    .arg(dir.path())
    .env("RUST_LOG", "info");
    let served = crate::http_support::spawn_serve(cmd)?;
    let (mut child, base) = (served.child, served.addr);
    let mut stalled = std::net::TcpStream::connect(&base)?;
    std::io::Write::write_all(
        &mut stalled,
        b"PUT /slow/grace HTTP/1.1\r\nHost: b.test\r\nContent-Length: 100\r\n\r\nabc",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let pid = i32::try_from(child.id())?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    assert!(status.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            assert!(status.success(), "brook serve exited with {status}");
            break;
        }
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            return Err("brook serve did not stop within 15 s of SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(stalled);
    Ok(())
}
