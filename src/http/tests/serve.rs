//! `serve` over a real socket: requests, live readers, shutdown.

use super::*;

/// Reads from `conn` until `needle` shows up (or EOF), returning everything read.
async fn read_until(conn: &mut tokio::net::TcpStream, needle: &str) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&seen).contains(needle) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

/// `serve` answers over a socket, and its shutdown ends a waiting long-poll and an SSE reader at once.
#[tokio::test]
async fn serve_over_a_socket_and_shut_down_with_live_readers() -> TestResult {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), Options::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::http::serve(
        listener,
        store.clone(),
        ServerConfig::default(),
        async move {
            let _ = stopped.await;
        },
    ));

    let mut put = tokio::net::TcpStream::connect(addr).await?;
    put.write_all(b"PUT /s/live HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi").await?;
    let head = read_until(&mut put, "\r\n\r\n").await?;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("location: http://t/s/live"),
        "{head}"
    );

    let mut sse = tokio::net::TcpStream::connect(addr).await?;
    sse.write_all(b"GET /s/live?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;
    let seen = read_until(&mut sse, "upToDate").await?;
    assert!(
        seen.contains("text/event-stream") && seen.contains("data:hi"),
        "{seen}"
    );
    let mut poll = tokio::net::TcpStream::connect(addr).await?;
    poll.write_all(b"GET /s/live?offset=now&live=long-poll HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;

    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let _ = stop.send(());
    let polled =
        tokio::time::timeout(Duration::from_secs(5), read_until(&mut poll, "\r\n\r\n")).await??;
    assert!(
        polled.starts_with("HTTP/1.1 204"),
        "a waiting long-poll answers at shutdown: {polled}"
    );
    tokio::time::timeout(Duration::from_secs(5), read_until(&mut sse, "\u{0}")).await??;
    drop((put, poll));
    tokio::time::timeout(Duration::from_secs(5), server).await???;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    store.shutdown()?;
    Ok(())
}
