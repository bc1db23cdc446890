//! The limits facing the internet, over a real socket: a connection over `max_connections` is
//! answered 503 and closed, live readers over their caps are refused 503, a client that never
//! finishes its headers (slowloris) is disconnected, and catch-up reads are never refused.

use std::time::{Duration, Instant};

use brook::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http_support::{R, Server, config};

/// The server's `host:port`.
fn addr(server: &Server) -> &str {
    server.base.trim_start_matches("http://")
}

/// Everything the server sends on `tcp` until it closes it (or 5 s pass).
async fn read_until_closed(tcp: &mut TcpStream) -> R<String> {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got)).await??;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// With `max_connections` 2, a third connection gets 503 `TOO_MANY_CONNECTIONS` with
/// `Retry-After` and is closed; once one of the two closes, a new connection is served.
#[tokio::test]
async fn a_connection_over_the_cap_is_answered_503_and_closed() -> R {
    let mut cfg = config();
    cfg.max_connections = 2;
    let server = Server::start_with(Options::default(), cfg).await?;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(addr(&server)).await?;
        // A served request proves the connection was accepted and counted.
        tcp.write_all(b"HEAD /nothing HTTP/1.1\r\nhost: t\r\n\r\n")
            .await?;
        let mut buf = [0u8; 512];
        let n = tcp.read(&mut buf).await?;
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 404"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        held.push(tcp);
    }
    let mut third = TcpStream::connect(addr(&server)).await?;
    third
        .write_all(b"GET /nothing HTTP/1.1\r\nhost: t\r\n\r\n")
        .await?;
    let answer = read_until_closed(&mut third).await?;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 2"), "{answer}");
    assert!(
        answer.contains("\"code\":\"TOO_MANY_CONNECTIONS\""),
        "{answer}"
    );
    drop(held.pop());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = server.head("/nothing", &[]).await?;
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 503);
        assert!(
            Instant::now() < until,
            "the freed connection was never counted out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The refusal is counted in the metrics.
    let m = server.get("/__brook/metrics", &[]).await?;
    assert_eq!(m.status, 200, "{}", m.text());
    let refused = m
        .text()
        .lines()
        .find_map(|l| l.strip_prefix("brook_connections_refused_total "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(refused.is_some_and(|n| n >= 1), "{}", m.text());
    Ok(())
}

/// With two live readers per stream, a third SSE reader of the same stream is refused 503
/// `TOO_MANY_LIVE_READERS` (with `Retry-After`), a reader of another stream is not, a catch-up
/// read of the full stream is not, and the place frees when an SSE connection ends.
#[tokio::test]
async fn live_readers_over_the_per_stream_cap_are_refused() -> R {
    let mut cfg = config();
    cfg.max_live_readers_per_stream = Some(2);
    let server = Server::start_with(Options::default(), cfg).await?;
    server.create("/busy", "text/plain").await?;
    server.create("/quiet", "text/plain").await?;
    let sse = |path: &str| {
        server
            .client
            .get(server.url(&format!("{path}?offset=-1&live=sse")))
            .send()
    };
    let a = sse("/busy").await?;
    let b = sse("/busy").await?;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let refused = crate::http_support::Resp::read(sse("/busy").await?).await?;
    refused.refused(503, "TOO_MANY_LIVE_READERS");
    assert_eq!(refused.h("retry-after"), Some("2"));
    let other = sse("/quiet").await?;
    assert_eq!(other.status().as_u16(), 200);
    assert_eq!(server.get("/busy?offset=-1", &[]).await?.status, 200);
    // The test config ends SSE connections after 2 s: their places free.
    drop((a, b));
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = sse("/busy").await?;
        if r.status().as_u16() == 200 {
            break;
        }
        assert_eq!(r.status().as_u16(), 503);
        assert!(
            Instant::now() < until,
            "the SSE readers' places never freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// With one live reader in total, a long-poll waiting at the tail holds the place: a second
/// one is refused 503, while a long-poll that is answered at once (data is there) is not a live
/// reader and passes.
#[tokio::test]
async fn a_waiting_long_poll_holds_a_live_reader_place() -> R {
    let mut cfg = config();
    cfg.max_live_readers = 1;
    cfg.long_poll_timeout = Duration::from_secs(3);
    let server = Server::start_with(Options::default(), cfg).await?;
    server.create("/lp", "text/plain").await?;
    assert_eq!(
        server
            .post("/lp", &[("content-type", "text/plain")], "x")
            .await?
            .status,
        204
    );
    let tail = server.tail("/lp").await?;
    let at_tail = format!("/lp?offset={tail}&live=long-poll");
    let waiting = server.get(&at_tail, &[]);
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused = server
            .get(&format!("/lp?offset={tail}&live=long-poll"), &[])
            .await?;
        let at_once = server.get("/lp?offset=-1&live=long-poll", &[]).await?;
        R::Ok((refused, at_once))
    };
    let (waited, others) = tokio::join!(waiting, second);
    let (refused, at_once) = others?;
    refused.refused(503, "TOO_MANY_LIVE_READERS");
    assert_eq!((at_once.status, at_once.text().as_str()), (200, "x"));
    assert_eq!(waited?.status, 204);
    Ok(())
}

/// A client that sends half a request and stalls is disconnected once `header_read_timeout`
/// passes, long before any request timeout of its own.
#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() -> R {
    let mut cfg = config();
    cfg.header_read_timeout = Duration::from_millis(500);
    let server = Server::start_with(Options::default(), cfg).await?;
    let mut tcp = TcpStream::connect(addr(&server)).await?;
    tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: t\r\nx-slow: ")
        .await?;
    let started = Instant::now();
    let answer = read_until_closed(&mut tcp).await?;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "held for {:?}",
        started.elapsed()
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    Ok(())
}
