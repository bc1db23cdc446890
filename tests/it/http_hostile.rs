//! A stranger's load (issue 32): requests refused from their heads before a body byte is read,
//! one memory budget with its 503 `MEMORY_BUDGET`, uploads that must keep a minimum rate, SSE
//! readers that never read, over-long targets, and the probes that stay reachable on a full
//! server. Every test talks to a real server over a real socket.

use std::time::{Duration, Instant};

use brook::Options;
use brook::http::{AccessControl, ServerConfig, token_hash};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http_support::{ChildServer, R, Server, config, read_until_cut_off};

/// The `host:port` of `s`.
fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_owned()
}

/// What the server answered on `c` within 5 s, up to the end of its first response's head and
/// whatever came with it (the connection may stay open).
async fn answer(c: &mut TcpStream) -> R<String> {
    answer_any(c).await
}

/// [`answer`] on any readable half.
async fn answer_any<S: AsyncReadExt + Unpin>(c: &mut S) -> R<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let until = Instant::now() + Duration::from_secs(5);
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout_at(until.into(), c.read(&mut buf)).await??;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    // The problem+json body follows its head in the same write.
    if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await {
        out.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A metric's value in a Prometheus text scrape (the first sample whose line starts with
/// `series`).
async fn metric(s: &Server, series: &str) -> R<f64> {
    let text = s.get("/__brook/metrics", &[]).await?.text();
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .ok_or_else(|| format!("no {series} in the scrape"))?;
    Ok(line.rsplit(' ').next().ok_or("no value")?.parse()?)
}

/// With access control on, a request without a token is answered 401 from its head alone:
/// the server does not wait for (or read) its body, and closes the connection after the
/// answer. So does a token's 403, before a large body; an admitted upload still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_head_is_answered_before_its_body_is_read() -> R {
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "{} read,write,admin own/\n{} read own/\n",
            token_hash("writer"),
            token_hash("reader")
        ),
    )?;
    let cfg = ServerConfig {
        access: Some(std::sync::Arc::new(
            AccessControl::new().with_token_file(&tokens)?,
        )),
        ..config()
    };
    let s = Server::start_with(Options::default(), cfg).await?;
    let auth = [("Authorization", "Bearer writer")];
    assert_eq!(
        s.put("/own/s", &[("Content-Type", "text/plain"), auth[0]], "")
            .await?
            .status,
        201
    );
    for (who, expect) in [("", "401"), ("Authorization: Bearer reader\r\n", "403")] {
        let mut c = TcpStream::connect(addr(&s)).await?;
        // 200 KB announced (brook's own loop reads bodies this size whole), none of it sent.
        let head = format!(
            "POST /own/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n{who}\
             Content-Length: 200000\r\n\r\n"
        );
        c.write_all(head.as_bytes()).await?;
        let text = answer(&mut c).await?;
        assert!(text.starts_with(&format!("HTTP/1.1 {expect}")), "{text}");
        assert!(text.contains("connection: close"), "{text}");
    }
    // Admitted, the same body is read and appended.
    let body = "x".repeat(200_000);
    let res = s
        .post("/own/s", &[("Content-Type", "text/plain"), auth[0]], &body)
        .await?;
    assert_eq!(res.status, 204, "{}", res.text());
    Ok(())
}

/// An upload that keeps sending, but too slowly, is refused with 408 `BODY_TOO_SLOW` once its
/// grace period is over, on brook's loop (a small `Content-Length` body) and on hyper's (a
/// chunked one) alike, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_upload_is_refused_with_408() -> R {
    let cfg = ServerConfig {
        body_min_rate: 1000,
        body_min_rate_grace: Duration::from_millis(800),
        body_read_timeout: Duration::from_secs(30),
        ..config()
    };
    let s = Server::start_with(Options::default(), cfg).await?;
    s.create("/slow/loris", "text/plain").await?;
    let tail = s.tail("/slow/loris").await?;
    for framing in [
        "Content-Length: 100000\r\n\r\n",
        "Transfer-Encoding: chunked\r\n\r\n",
    ] {
        let mut c = TcpStream::connect(addr(&s)).await?;
        let head = format!(
            "POST /slow/loris HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n{framing}"
        );
        c.write_all(head.as_bytes()).await?;
        let chunked = framing.contains("chunked");
        let started = Instant::now();
        // One byte every 200 ms (5 B/s, far under 1000 B/s) until the server answers.
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while started.elapsed() < Duration::from_secs(10) {
            let byte: &[u8] = if chunked { b"1\r\nx\r\n" } else { b"x" };
            if c.write_all(byte).await.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(n)) => {
                    out.extend_from_slice(&buf[..n]);
                    break;
                }
                Err(_) => {}
            }
        }
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408"), "{framing}: {text:?}");
        assert!(text.contains("BODY_TOO_SLOW"), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused only after {:?}",
            started.elapsed()
        );
    }
    assert_eq!(s.tail("/slow/loris").await?, tail, "a refused upload wrote");
    Ok(())
}

/// Request bodies draw on one memory budget as their bytes arrive: while one upload holds most
/// of it, another is refused 503 `MEMORY_BUDGET` with `Retry-After` once its bytes need more
/// than the budget can spare (before all of it is read, and nothing is written), counted in
/// the metrics; once the first is done, the second goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_past_the_memory_budget_are_refused_with_503() -> R {
    let cfg = ServerConfig {
        max_memory: 4 << 20,
        ..config()
    };
    let options = Options::default().with_max_append_bytes(4 << 20);
    let s = Server::start_with(options, cfg).await?;
    s.create("/mem/s", "application/octet-stream").await?;
    let big = 1_600_000usize;
    let head = format!(
        "POST /mem/s HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {big}\r\n\r\n"
    );
    // The first upload sends all but a few bytes and holds its lease (1.6 MB of 3.5 MiB
    // outside the reserve).
    let mut first = TcpStream::connect(addr(&s)).await?;
    first.write_all(head.as_bytes()).await?;
    first.write_all(&vec![b'a'; big - 10]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = metric(&s, "brook_memory_held_bytes{use=\"request_bodies\"}").await?;
    assert!(held >= (big - 10) as f64, "held {held}");
    // The second is refused as its body grows past what is left (its growth to 1.6 MB needs
    // the 800 KB before it too while the bytes move).
    let second = TcpStream::connect(addr(&s)).await?;
    let (mut r, mut w) = second.into_split();
    w.write_all(head.as_bytes()).await?;
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&vec![b'b'; big]).await;
        w
    });
    let text = answer_any(&mut r).await?;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("MEMORY_BUDGET"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: "),
        "{text}"
    );
    assert!(metric(&s, "brook_memory_refused_total{use=\"request_bodies\"}").await? >= 1.0);
    drop((r, writer));
    // The first completes; the budget is free again.
    first.write_all(&[b'a'; 10]).await?;
    let text = answer(&mut first).await?;
    assert!(text.starts_with("HTTP/1.1 204"), "{text}");
    drop(first);
    let res = s
        .post(
            "/mem/s",
            &[("Content-Type", "application/octet-stream")],
            &"b".repeat(big),
        )
        .await?;
    assert_eq!(res.status, 204, "{}", res.text());
    assert_eq!(s.read_all("/mem/s").await?.len(), 2 * big);
    Ok(())
}

/// SSE readers that never read cost what they have taken, not what they owe: twenty of them on
/// a 16 MiB stream grow the server's heap by far less than one copy of the stream each, and
/// every one is cut off at `--sse-max-duration-ms` though its socket is full.
#[test]
fn sse_readers_that_never_read_are_bounded_and_cut_off() -> R {
    let server = ChildServer::start(&["--sse-max-duration-ms", "2500"])?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let c = &server.client;
        let res = c
            .put(server.url("/hostile/sse"))
            .header("Content-Type", "application/octet-stream")
            .send()
            .await?;
        assert_eq!(res.status(), 201);
        let piece = vec![0x5au8; 1 << 20];
        for _ in 0..16 {
            let res = c
                .post(server.url("/hostile/sse"))
                .header("Content-Type", "application/octet-stream")
                .body(piece.clone())
                .send()
                .await?;
            assert!(res.status().is_success());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle = server.rss_anon()?;
        let host = server.base.trim_start_matches("http://").to_owned();
        let mut readers = Vec::new();
        for _ in 0..20 {
            let sock = tokio::net::TcpSocket::new_v4()?;
            // A small receive window: the server's writes block almost at once.
            sock.set_recv_buffer_size(4096)?;
            let mut conn = sock.connect(host.parse()?).await?;
            conn.write_all(b"GET /hostile/sse?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n")
                .await?;
            readers.push(conn);
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let grown = server.rss_anon()?.saturating_sub(idle);
        // One copy of the stream per reader (base64: 21 MiB) would be over 400 MiB.
        assert!(
            grown < 48 << 20,
            "20 stalled SSE readers grew the heap by {} MiB",
            grown >> 20
        );
        // By the connections' end (2.5 s) plus a little, the server has let go of every one:
        // reading what the kernel holds ends in the end of the stream.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for mut conn in readers {
            let (_, took) = read_until_cut_off(&mut conn).await?;
            assert!(
                took < Duration::from_secs(5),
                "a stalled reader stayed {took:?}"
            );
        }
        Ok(())
    })
}

/// A request target longer than 65,534 bytes is answered 414 `URI_TOO_LONG` (problem+json),
/// as hyper answers it, whether its request line fits in the head limit or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlong_target_is_414() -> R {
    let s = Server::start().await?;
    for len in [70_000usize, 100_000] {
        let mut c = TcpStream::connect(addr(&s)).await?;
        let path = format!("/{}", "a".repeat(len));
        let head = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        // The server may answer and close before taking all of a 100 KB line.
        let _ = c.write_all(head.as_bytes()).await;
        let text = answer(&mut c).await?;
        assert!(text.starts_with("HTTP/1.1 414"), "{len}: {text}");
        assert!(text.contains("URI_TOO_LONG"), "{text}");
    }
    Ok(())
}

/// With every connection slot taken, liveness and readiness are still answered on the main
/// port (an orchestrator keeps telling a full server from a dead one), while any other request
/// gets 503 `TOO_MANY_CONNECTIONS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_with_the_connection_cap_full() -> R {
    let cfg = ServerConfig {
        max_connections: 2,
        ..config()
    };
    let s = Server::start_with(Options::default(), cfg).await?;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr(&s)).await?;
        c.write_all(b"GET /__brook/live HTTP/1.1\r\nHost: t\r\n\r\n")
            .await?;
        assert!(answer(&mut c).await?.starts_with("HTTP/1.1 200"));
        held.push(c);
    }
    for (path, expect) in [
        ("/__brook/ready", "HTTP/1.1 200"),
        ("/__brook/live", "HTTP/1.1 200"),
        ("/some/stream", "HTTP/1.1 503"),
    ] {
        let mut c = TcpStream::connect(addr(&s)).await?;
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await?;
        let text = answer(&mut c).await?;
        assert!(text.starts_with(expect), "{path}: {text}");
        if expect.ends_with("503") {
            assert!(text.contains("TOO_MANY_CONNECTIONS"), "{text}");
        }
    }
    drop(held);
    Ok(())
}

/// A connection holds a read buffer only while a request is arriving on it: keep-alive
/// connections between requests and SSE subscribers hold none of the memory budget's
/// `connection_buffers`, nor do connections that have sent nothing yet, so ten thousand idle
/// clients cost no buffers; one whose head is half sent holds one until its request is read
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_connections_reading_a_request_hold_a_read_buffer() -> R {
    let s = Server::start().await?;
    s.create("/buf/s", "text/plain").await?;
    let buffers = "brook_memory_held_bytes{use=\"connection_buffers\"}";
    let append = "POST /buf/s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n\
                  Content-Length: 5\r\n\r\nhello";
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut c = TcpStream::connect(addr(&s)).await?;
        c.write_all(append.as_bytes()).await?;
        assert!(answer(&mut c).await?.starts_with("HTTP/1.1 204"));
        idle.push(c);
    }
    let mut tails = Vec::new();
    for _ in 0..10 {
        let mut c = TcpStream::connect(addr(&s)).await?;
        c.write_all(b"GET /buf/s?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n")
            .await?;
        assert!(answer(&mut c).await?.starts_with("HTTP/1.1 200"));
        tails.push(c);
    }
    // Connections that have sent nothing yet hold none either (a new socket is reported
    // readable before its first bytes arrive).
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(addr(&s)).await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = metric(&s, buffers).await?;
    assert!(
        held < 1.0,
        "{held} bytes held: idle, SSE and silent connections"
    );
    // Heads half sent: each of these connections holds a buffer until its request is whole.
    let (head, rest) = append.split_at(30);
    let mut partial = Vec::new();
    for _ in 0..10 {
        let mut c = TcpStream::connect(addr(&s)).await?;
        c.write_all(head.as_bytes()).await?;
        partial.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = metric(&s, buffers).await?;
    assert!(
        held >= 10.0 * 4096.0,
        "ten requests arriving hold {held} bytes"
    );
    for c in &mut partial {
        c.write_all(rest.as_bytes()).await?;
        assert!(answer(c).await?.starts_with("HTTP/1.1 204"));
    }
    // Every connection still open, all of them between requests: no buffer held.
    let held = metric(&s, buffers).await?;
    assert!(
        held < 1.0,
        "{held} bytes held: after the partial heads were completed"
    );
    // The idle ones still serve their next request.
    for c in idle.iter_mut().take(5) {
        c.write_all(append.as_bytes()).await?;
        assert!(answer(c).await?.starts_with("HTTP/1.1 204"));
    }
    assert_eq!(s.read_all("/buf/s").await?.len(), 5 * 35);
    Ok(())
}
