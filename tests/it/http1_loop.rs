//! brook's own HTTP/1.1 loop (src/http/h1.rs) over raw sockets: framing (pipelining, HEAD,
//! chunked responses, `100 Continue`), the hand-off to hyper for what it does not frame itself
//! (chunked uploads, HTTP/1.0, malformed heads) on the same connection, timeouts, and the same
//! answers as hyper's loop for the same requests.

use std::fmt::Write as _;
use std::time::Duration;

use brook::Options;
use brook::http::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http_support::{R, Server, config};

/// One response as it came off the wire.
#[derive(Debug)]
pub(crate) struct Wire {
    /// The status line's version (`HTTP/1.1`, `HTTP/1.0`).
    pub(crate) version: String,
    /// The status code.
    pub(crate) status: u16,
    /// Header lines, names lowercase, in order.
    pub(crate) headers: Vec<(String, String)>,
    /// The body (de-chunked when it was chunked).
    pub(crate) body: Vec<u8>,
    /// Whether the body was chunked.
    pub(crate) chunked: bool,
}

impl Wire {
    /// The first value of header `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A raw client connection that reads responses one by one from a buffer.
pub(crate) struct Conn {
    tcp: TcpStream,
    pub(crate) buf: Vec<u8>,
}

impl Conn {
    pub(crate) async fn open(s: &Server) -> R<Conn> {
        let addr = s.base.trim_start_matches("http://").to_owned();
        Ok(Conn {
            tcp: TcpStream::connect(addr).await?,
            buf: Vec::new(),
        })
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) -> R {
        self.tcp.write_all(bytes).await?;
        Ok(())
    }

    /// Reads more bytes; false at end of stream.
    pub(crate) async fn fill(&mut self) -> R<bool> {
        let mut chunk = vec![0u8; 16 << 10];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk)).await??;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// Reads until `buf` holds `n` bytes.
    async fn need(&mut self, n: usize) -> R {
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(
                    format!("connection closed with {} of {n} bytes", self.buf.len()).into(),
                );
            }
        }
        Ok(())
    }

    /// The position just past the next `\r\n`, reading as needed.
    async fn line_end(&mut self, from: usize) -> R<usize> {
        loop {
            if let Some(i) = self.buf[from..].windows(2).position(|w| w == b"\r\n") {
                return Ok(from + i + 2);
            }
            if !self.fill().await? {
                return Err("connection closed inside a line".into());
            }
        }
    }

    /// Reads one HTTP/1.1 response; `head_only` for a response to HEAD (no body whatever it
    /// says).
    pub(crate) async fn response(&mut self, head_only: bool) -> R<Wire> {
        let wire = self.any_response(head_only).await?;
        assert_eq!(wire.version, "HTTP/1.1", "status {}", wire.status);
        Ok(wire)
    }

    /// Reads one response of any version (hyper answers an HTTP/1.0 request in kind).
    pub(crate) async fn any_response(&mut self, head_only: bool) -> R<Wire> {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill().await? {
                return Err("connection closed before a response head".into());
            }
        };
        let head = String::from_utf8(self.buf[..head_end].to_vec())?;
        self.buf.drain(..head_end);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().ok_or("no status line")?;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .ok_or("no status code")?
            .parse()?;
        let version = status_line.split(' ').next().unwrap_or_default().to_owned();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').expect("a header line has a colon");
                (k.to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let mut wire = Wire {
            version,
            status,
            headers,
            body: Vec::new(),
            chunked: false,
        };
        if head_only || status == 204 || status == 304 || status < 200 {
            return Ok(wire);
        }
        if wire.header("transfer-encoding") == Some("chunked") {
            wire.chunked = true;
            loop {
                let end = self.line_end(0).await?;
                let size = usize::from_str_radix(std::str::from_utf8(&self.buf[..end - 2])?, 16)?;
                self.buf.drain(..end);
                self.need(size + 2).await?;
                wire.body.extend_from_slice(&self.buf[..size]);
                assert_eq!(&self.buf[size..size + 2], b"\r\n", "chunk not terminated");
                self.buf.drain(..size + 2);
                if size == 0 {
                    break;
                }
            }
        } else if let Some(len) = wire.header("content-length") {
            let len: usize = len.parse()?;
            self.need(len).await?;
            wire.body = self.buf.drain(..len).collect();
        }
        Ok(wire)
    }

    /// Whether the server closed the connection (reads end of stream within `within`).
    pub(crate) async fn closed_within(&mut self, within: Duration) -> R<bool> {
        let mut b = [0u8; 64];
        match tokio::time::timeout(within, self.tcp.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => Ok(true),
            Ok(Ok(n)) => Err(format!("unexpected bytes: {:?}", &b[..n]).into()),
            Err(_) => Ok(false),
        }
    }
}

/// A request with a body.
pub(crate) fn req(method: &str, path: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: t.test\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// Requests sent in one write come back in order, each framed right; a HEAD's response has no
/// body and the next response on the connection is intact.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() -> R {
    let s = Server::start().await?;
    let mut c = Conn::open(&s).await?;
    let mut all = req("PUT", "/p/one", "Content-Type: text/plain\r\n", b"");
    for i in 0..5 {
        all.extend(req(
            "POST",
            "/p/one",
            "Content-Type: text/plain\r\n",
            format!("m{i};").as_bytes(),
        ));
    }
    all.extend_from_slice(b"HEAD /p/one HTTP/1.1\r\nHost: t.test\r\n\r\n");
    all.extend_from_slice(b"GET /p/one?offset=-1 HTTP/1.1\r\nHost: t.test\r\n\r\n");
    c.send(&all).await?;
    assert_eq!(c.response(false).await?.status, 201);
    let mut offsets = Vec::new();
    for _ in 0..5 {
        let r = c.response(false).await?;
        assert_eq!(r.status, 204);
        offsets.push(
            r.header("stream-next-offset")
                .ok_or("no offset")?
                .to_owned(),
        );
    }
    let mut sorted = offsets.clone();
    sorted.sort();
    assert_eq!(offsets, sorted, "appends answered out of order");
    let head = c.response(true).await?;
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("stream-next-offset"),
        offsets.last().map(String::as_str)
    );
    let get = c.response(false).await?;
    assert_eq!(get.status, 200);
    assert_eq!(get.body, b"m0;m1;m2;m3;m4;");
    assert!(get.header("date").is_some(), "no Date header");
    Ok(())
}

/// `Expect: 100-continue`: the server asks for the body before the client sends it.
#[tokio::test]
async fn expect_continue_gets_a_100_before_the_body() -> R {
    let s = Server::start().await?;
    let mut c = Conn::open(&s).await?;
    c.send(&req("PUT", "/e/s", "Content-Type: text/plain\r\n", b""))
        .await?;
    assert_eq!(c.response(false).await?.status, 201);
    c.send(b"POST /e/s HTTP/1.1\r\nHost: t.test\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .await?;
    let interim = c.response(false).await?;
    assert_eq!(interim.status, 100);
    c.send(b"hello").await?;
    assert_eq!(c.response(false).await?.status, 204);
    let got = s
        .client
        .get(s.url("/e/s?offset=-1"))
        .send()
        .await?
        .bytes()
        .await?;
    assert_eq!(&got[..], b"hello");
    Ok(())
}

/// A chunked upload is handed to hyper with the connection, and that connection keeps working:
/// the bytes after the hand-off (a pipelined append) are served too.
#[tokio::test]
async fn a_chunked_upload_hands_the_connection_to_hyper() -> R {
    let s = Server::start().await?;
    let mut c = Conn::open(&s).await?;
    c.send(&req("PUT", "/h/s", "Content-Type: text/plain\r\n", b""))
        .await?;
    assert_eq!(c.response(false).await?.status, 201);
    let mut two = b"POST /h/s HTTP/1.1\r\nHost: t.test\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_vec();
    two.extend(req("POST", "/h/s", "Content-Type: text/plain\r\n", b"fg"));
    c.send(&two).await?;
    assert_eq!(c.response(false).await?.status, 204);
    assert_eq!(c.response(false).await?.status, 204);
    c.send(b"GET /h/s?offset=-1 HTTP/1.1\r\nHost: t.test\r\n\r\n")
        .await?;
    let get = c.response(false).await?;
    assert_eq!(get.status, 200);
    assert_eq!(get.body, b"abcdefg");
    Ok(())
}

/// HTTP/1.0 goes to hyper, which answers it as it always did; a malformed head, two
/// `Content-Length`s that disagree and too many header lines are refused by brook's loop with
/// problem+json bodies naming the code, and the connection closes.
#[tokio::test]
async fn http10_goes_to_hyper_and_bad_heads_get_problem_json() -> R {
    let s = Server::start().await?;
    let mut c = Conn::open(&s).await?;
    c.send(b"HEAD /nothing/here HTTP/1.0\r\nHost: t.test\r\n\r\n")
        .await?;
    let mut head = vec![];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if !c.fill().await? {
            break;
        }
        head = c.buf.clone();
    }
    let text = String::from_utf8_lossy(&head);
    assert!(
        text.starts_with("HTTP/1.0 404") || text.starts_with("HTTP/1.1 404"),
        "{text}"
    );

    let many = (0..150).fold(String::new(), |mut h, i| {
        let _ = write!(h, "X-Filler-{i}: v\r\n");
        h
    });
    // The last case may reach the handler's own 431 (when the whole head arrived in one read),
    // which keeps the connection: only the loop's refusals close it.
    for (request, status, code, closes) in [
        ("GET /a b c HTTP/1.1\r\nHost: t.test\r\n\r\n".to_owned(), 400, "MALFORMED_REQUEST", true),
        (
            "POST /x HTTP/1.1\r\nHost: t.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_owned(),
            400,
            "MALFORMED_REQUEST",
            true,
        ),
        (
            "GET /x HTTP/1.1\r\nHost: t.test\r\nBad Name: v\r\n\r\n".to_owned(),
            400,
            "MALFORMED_REQUEST",
            true,
        ),
        (
            format!("GET /x HTTP/1.1\r\nHost: t.test\r\n{many}\r\n"),
            431,
            "REQUEST_HEADER_FIELDS_TOO_LARGE",
            true,
        ),
        (
            format!("GET /x HTTP/1.1\r\nHost: t.test\r\nX-Big: {}\r\n\r\n", "v".repeat(90 << 10)),
            431,
            "REQUEST_HEADER_FIELDS_TOO_LARGE",
            false,
        ),
    ] {
        let mut c = Conn::open(&s).await?;
        c.send(request.as_bytes()).await?;
        let r = c.response(false).await?;
        assert_eq!(r.status, status, "{}", &request[..request.len().min(60)]);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(
            String::from_utf8_lossy(&r.body).contains(&format!("\"code\":\"{code}\"")),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        if closes {
            assert_eq!(r.header("connection"), Some("close"));
            assert!(c.closed_within(Duration::from_secs(5)).await?, "kept open after a bad head");
        }
    }
    Ok(())
}

/// A streaming response (SSE) is chunked and each event arrives while the connection stays
/// open; an append on another connection shows up as an event.
#[tokio::test]
async fn sse_is_chunked_and_delivered_as_it_comes() -> R {
    let s = Server::start().await?;
    s.client
        .put(s.url("/sse/s"))
        .header("content-type", "text/plain")
        .send()
        .await?;
    let mut c = Conn::open(&s).await?;
    c.send(b"GET /sse/s?offset=-1&live=sse HTTP/1.1\r\nHost: t.test\r\n\r\n")
        .await?;
    // The head arrives at once, before any event.
    let head_end = loop {
        if let Some(i) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        assert!(c.fill().await?, "closed before the SSE head");
    };
    let head = String::from_utf8(c.buf[..head_end].to_vec())?.to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    s.client
        .post(s.url("/sse/s"))
        .header("content-type", "text/plain")
        .body("ping-42")
        .send()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&c.buf).contains("ping-42") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "event not delivered"
        );
        assert!(c.fill().await?, "closed before the event");
    }
    Ok(())
}

/// An idle connection is closed after the header read timeout; one that sends half a body is
/// answered 408 after the body read timeout.
#[tokio::test]
async fn idle_connections_and_stalled_bodies_time_out() -> R {
    let s = Server::start_with(
        Options::default(),
        ServerConfig {
            header_read_timeout: Duration::from_millis(300),
            body_read_timeout: Duration::from_millis(300),
            ..config()
        },
    )
    .await?;
    let mut idle = Conn::open(&s).await?;
    assert!(
        idle.closed_within(Duration::from_secs(5)).await?,
        "idle connection kept open"
    );

    let mut c = Conn::open(&s).await?;
    c.send(&req("PUT", "/t/s", "Content-Type: text/plain\r\n", b""))
        .await?;
    assert_eq!(c.response(false).await?.status, 201);
    // Served requests keep the connection open past the timeout as long as each head is quick.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.send(b"HEAD /t/s HTTP/1.1\r\nHost: t.test\r\n\r\n")
            .await?;
        assert_eq!(c.response(true).await?.status, 200);
    }
    c.send(b"POST /t/s HTTP/1.1\r\nHost: t.test\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nabc")
        .await?;
    let r = c.response(false).await?;
    assert_eq!(r.status, 408);
    assert!(String::from_utf8_lossy(&r.body).contains("REQUEST_TIMEOUT"));
    assert_eq!(r.header("connection"), Some("close"));
    let head = s.client.head(s.url("/t/s")).send().await?;
    assert_eq!(
        head.headers()["stream-next-offset"],
        "0000000000000000_0000000000000000",
        "a timed-out body was appended"
    );
    Ok(())
}

/// The same requests get the same statuses, header names and bodies from brook's loop and
/// from hyper's (`ServerConfig::hyper_http1`): the loop frames what the handlers answer, it
/// decides nothing itself.
#[tokio::test]
async fn brook_and_hyper_loops_answer_alike() -> R {
    let script: Vec<(Vec<u8>, bool)> = vec![
        (req("PUT", "/same/s", "Content-Type: text/plain\r\n", b""), false),
        (req("POST", "/same/s", "Content-Type: text/plain\r\n", b"abc"), false),
        (
            req(
                "POST",
                "/same/s",
                "Content-Type: text/plain\r\nProducer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: 0\r\n",
                b"def",
            ),
            false,
        ),
        (req("POST", "/same/s", "Content-Type: application/json\r\n", b"x"), false),
        (req("POST", "/same/s", "Content-Type: text/plain\r\nOrigin: https://a.test\r\n", b"gh"), false),
        (req("PUT", "/same/s", "Content-Type: text/plain\r\n", b""), false),
        (req("PUT", "/same/t", "Content-Type: text/plain\r\nStream-TTL: 3600\r\n", b"t"), false),
        (b"HEAD /same/t HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), true),
        (b"GET /same/s?offset=-1 HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (b"GET /same/s?offset=-1 HTTP/1.1\r\nHost: t.test\r\nIf-None-Match: *\r\n\r\n".to_vec(), false),
        (b"GET /same/s?offset=0000000000000000_0000000000000000&max_bytes=2 HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (b"GET /same/s?offset=now HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (b"GET /same/s?offset=bad HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (b"HEAD /same/s HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), true),
        (b"GET /same/missing HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (b"PATCH /same/s HTTP/1.1\r\nHost: t.test\r\nContent-Length: 0\r\n\r\n".to_vec(), false),
        (
            b"OPTIONS /same/s HTTP/1.1\r\nHost: t.test\r\nOrigin: https://a.test\r\nAccess-Control-Request-Method: POST\r\n\r\n".to_vec(),
            false,
        ),
        (
            b"GET /same/s?offset=-1&live=long-poll HTTP/1.1\r\nHost: t.test\r\nOrigin: https://a.test\r\n\r\n".to_vec(),
            false,
        ),
        (req("POST", "/same/s", "Stream-Closed: true\r\n", b""), false),
        (b"GET /same/s?offset=now&live=long-poll HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
        (req("DELETE", "/same/s", "", b""), false),
        (b"GET /__brook/ready HTTP/1.1\r\nHost: t.test\r\n\r\n".to_vec(), false),
    ];
    let mut answers = Vec::new();
    for hyper in [false, true] {
        let s = Server::start_with(
            Options::default(),
            ServerConfig {
                hyper_http1: hyper,
                ..config()
            },
        )
        .await?;
        let mut c = Conn::open(&s).await?;
        let mut got = Vec::new();
        for (request, head_only) in &script {
            c.send(request).await?;
            let mut r = c.response(*head_only).await?;
            // Values that differ between two servers by design.
            for (k, v) in &mut r.headers {
                if matches!(
                    k.as_str(),
                    "date" | "stream-incarnation" | "etag" | "stream-cursor"
                ) {
                    v.clear();
                }
            }
            r.headers.sort();
            got.push((r.status, r.headers, r.body, r.chunked));
        }
        answers.push(got);
    }
    // The script reaches what it is meant to: appends (204, a producer's 200, a refusal),
    // creates (201, 200), HEAD with a TTL, catch-up reads (200, 304 for `If-None-Match: *`, an
    // immutable chunk, `offset=now`), long-polls (data, and 204 at a closed tail).
    let statuses: Vec<u16> = answers[0].iter().map(|a| a.0).collect();
    assert_eq!(
        statuses,
        [
            201, 204, 200, 409, 204, 200, 201, 200, 200, 304, 200, 200, 400, 200, 404, 405, 204,
            200, 204, 204, 204, 200
        ]
    );
    let header = |i: usize, name: &str| {
        let headers = &answers[0][i].1;
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header(7, "stream-ttl").as_deref(), Some("3600"));
    assert!(
        header(10, "cache-control").is_some_and(|v| v.ends_with("immutable")),
        "{:?}",
        header(10, "cache-control")
    );
    assert_eq!(header(19, "stream-closed").as_deref(), Some("true"));
    assert!(header(4, "access-control-allow-origin").is_some());
    for (i, (ours, theirs)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert_eq!(
            ours, theirs,
            "request {i} answered differently (brook's loop, then hyper's)"
        );
    }
    Ok(())
}

/// Shutdown closes an idle keep-alive connection at once and lets `serve` return.
#[tokio::test]
async fn shutdown_closes_idle_connections() -> R {
    let s = Server::start().await?;
    let mut c = Conn::open(&s).await?;
    c.send(b"HEAD /x/y HTTP/1.1\r\nHost: t.test\r\n\r\n")
        .await?;
    assert_eq!(c.response(true).await?.status, 404);
    drop(s);
    assert!(
        c.closed_within(Duration::from_secs(5)).await?,
        "idle connection kept open after shutdown"
    );
    Ok(())
}
