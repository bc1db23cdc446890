//! Requests at the protocol's edges over a real socket (issue 13): repeated single-valued
//! headers, malformed `Host`, offsets whose halves disagree. Raw HTTP/1.1 bytes where a client
//! library would not send the request as written.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http_support::{R, Server};

const TEXT: (&str, &str) = ("content-type", "text/plain");

/// Sends `head` (a request head without its final blank line) and `body` on a fresh connection
/// and returns the status and the raw response.
async fn raw(s: &Server, head: &str, body: &str) -> R<(u16, String)> {
    let addr = s.base.trim_start_matches("http://");
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    Ok((status, text))
}

/// A repeated Stream-Seq, Producer-Id, Stream-TTL, Content-Type or Host is a 400 naming the
/// header, and the append or create it came with changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_single_valued_headers_are_refused_and_change_nothing() -> R {
    let s = Server::start().await?;
    s.create("/edges/dup", "text/plain").await?;
    let tail = s.tail("/edges/dup").await?;
    for (repeat, what) in [
        ("Stream-Seq: a\r\nStream-Seq: b", "stream-seq"),
        (
            "Producer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: 0\r\nProducer-Id: q",
            "producer-id",
        ),
        (
            "Content-Type: text/plain\r\nContent-Type: text/plain",
            "content-type",
        ),
        ("Host: a.test\r\nHost: b.test", "host"),
    ] {
        let host = if what == "host" {
            ""
        } else {
            "Host: brook.test\r\n"
        };
        let ct = if what == "content-type" {
            ""
        } else {
            "Content-Type: text/plain\r\n"
        };
        let head = format!("POST /edges/dup HTTP/1.1\r\n{host}{ct}{repeat}");
        let (status, text) = raw(&s, &head, "x").await?;
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains("application/problem+json"), "{text}");
        assert!(
            text.contains("INVALID_ARGUMENT") && text.contains(what),
            "{text}"
        );
    }
    assert_eq!(s.tail("/edges/dup").await?, tail, "a refused append wrote");
    let head = "PUT /edges/dup-ttl HTTP/1.1\r\nHost: brook.test\r\nStream-TTL: 60\r\nStream-TTL: 5";
    let (status, text) = raw(&s, head, "").await?;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("stream-ttl"), "{text}");
    assert_eq!(s.head("/edges/dup-ttl", &[]).await?.status, 404);
    // The same headers once each are fine.
    let head =
        "POST /edges/dup HTTP/1.1\r\nHost: brook.test\r\nContent-Type: text/plain\r\nStream-Seq: a";
    assert_eq!(raw(&s, head, "x").await?.0, 204);
    Ok(())
}

/// `Host` must be a host name or address with an optional port: it is echoed into `Location`.
/// HTTP/1.1 without one is a 400; HTTP/1.0 may omit it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_is_validated_before_it_is_echoed() -> R {
    let s = Server::start().await?;
    for bad in [
        "evil.test/x?",
        "a b",
        "a.test:99999",
        "a.test:",
        "[::1",
        "[zz]:80",
        "a.test:80:80",
        "\"a\"",
    ] {
        let head = format!("PUT /edges/host HTTP/1.1\r\nHost: {bad}");
        let (status, text) = raw(&s, &head, "").await?;
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("INVALID_ARGUMENT"), "{bad}: {text}");
    }
    assert_eq!(
        s.head("/edges/host", &[]).await?.status,
        404,
        "a refused create created"
    );
    let (status, text) = raw(&s, "PUT /edges/host HTTP/1.1", "").await?;
    assert_eq!(status, 400, "no Host: {text}");
    for good in [
        "brook.test",
        "brook.test:8080",
        "127.0.0.1:1",
        "[::1]:443",
        "[::1]",
    ] {
        let head = format!("GET /edges/none HTTP/1.1\r\nHost: {good}");
        assert_eq!(raw(&s, &head, "").await?.0, 404, "{good}");
    }
    let (status, text) = raw(&s, "PUT /edges/host HTTP/1.1\r\nHost: b.test:81", "").await?;
    assert_eq!(status, 201, "{text}");
    assert!(text.contains("http://b.test:81/edges/host"), "{text}");
    assert_eq!(raw(&s, "GET /edges/host HTTP/1.0", "").await?.0, 200);
    Ok(())
}

/// An offset is one position: a message count that disagrees with its byte position is a 400
/// `INVALID_OFFSET` for reads, snapshots and retention, never a read from the byte position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_whose_halves_disagree_are_refused() -> R {
    let s = Server::start().await?;
    let p = "/edges/halves";
    s.create(p, "text/plain").await?;
    let mut after = Vec::new();
    for body in ["ab", "cd", "ef"] {
        let r = s.post(p, &[TEXT], body).await?;
        after.push(r.need("stream-next-offset")?.to_owned());
    }
    assert_eq!(after[0], "0000000000000001_0000000000000002");
    // Offsets brook issued read as before.
    let r = s.get(&format!("{p}?offset={}", after[0]), &[]).await?;
    assert_eq!((r.status, r.text().as_str()), (200, "cdef"));
    for bad in [
        "0000000000000009_0000000000000002",
        "0000000000000000_0000000000000002",
        "0000000000000002_0000000000000002",
    ] {
        let r = s.get(&format!("{p}?offset={bad}"), &[]).await?;
        r.refused(400, "INVALID_OFFSET");
        let r = s
            .put(
                &format!("{p}/snapshot/{bad}"),
                &[("content-type", "application/x-s")],
                "S",
            )
            .await?;
        r.refused(400, "INVALID_OFFSET");
    }
    // A snapshot published at a true offset is found only at that offset.
    let at = &after[1];
    let r = s
        .put(
            &format!("{p}/snapshot/{at}"),
            &[("content-type", "application/x-s")],
            "S",
        )
        .await?;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.h("stream-snapshot-offset"), Some(at.as_str()));
    let wrong = format!("0000000000000009_{}", &at[17..]);
    assert_eq!(
        s.get(&format!("{p}/snapshot/{wrong}"), &[]).await?.status,
        404
    );
    assert_eq!(s.get(&format!("{p}/snapshot/{at}"), &[]).await?.status, 200);
    let r = s.put(&format!("{p}/retention/{wrong}"), &[], "").await?;
    r.refused(400, "INVALID_OFFSET");
    Ok(())
}

/// Requests over brook's header-bytes and target limits get problem+json refusals (431, 414),
/// not hyper's bare ones, up to where hyper itself stops parsing (100 header lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_get_problem_json_refusals() -> R {
    let s = Server::start().await?;
    // Past 100 header lines: 431 problem+json too.
    let many = (0..150).fold(String::new(), |mut h, i| {
        let _ = write!(h, "\r\nX-Filler-{i}: v");
        h
    });
    let (status, text) = raw(
        &s,
        &format!("GET /edges/x HTTP/1.1\r\nHost: b.test{many}"),
        "",
    )
    .await?;
    assert_eq!(status, 431);
    assert!(text.contains("REQUEST_HEADER_FIELDS_TOO_LARGE") && text.contains("problem+json"));
    let big = format!("\r\nX-Big: {}", "v".repeat(70 << 10));
    let (status, text) = raw(
        &s,
        &format!("GET /edges/x HTTP/1.1\r\nHost: b.test{big}"),
        "",
    )
    .await?;
    assert_eq!(status, 431, "{}", &text[..text.len().min(300)]);
    assert!(text.contains("REQUEST_HEADER_FIELDS_TOO_LARGE"));
    let long = format!("/edges/{}", "a".repeat(20 << 10));
    let (status, text) = raw(&s, &format!("GET {long} HTTP/1.1\r\nHost: b.test"), "").await?;
    assert_eq!(status, 414, "{}", &text[..text.len().min(300)]);
    assert!(text.contains("URI_TOO_LONG") && text.contains("problem+json"));
    // Within the limits: an ordinary 404.
    let (status, _) = raw(&s, "GET /edges/x HTTP/1.1\r\nHost: b.test\r\nX-A: 1", "").await?;
    assert_eq!(status, 404);
    Ok(())
}
