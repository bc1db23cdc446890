//! A minimal blocking HTTP/1.1 client for the `--url` commands: one request per connection
//! (`Connection: close`), plain `http://` only, chunked bodies decoded.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A server given as `--url http://host:port[/base]`.
pub struct Server {
    /// `host:port`.
    authority: String,
    /// The path every stream path is under (no trailing `/`; empty for the root).
    base: String,
}

/// A response: status, headers (names lowercase) and body.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercase, in order.
    headers: Vec<(String, String)>,
    /// The whole body (empty for HEAD).
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The problem `code` and `detail` of a refusal, or the status alone.
    pub fn refusal(&self) -> String {
        let v: Option<serde_json::Value> = serde_json::from_slice(&self.body).ok();
        let field = |k: &str| {
            v.as_ref()
                .and_then(|v| v.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        match (field("code"), field("detail")) {
            (Some(c), Some(d)) => format!("{} {c}: {d}", self.status),
            _ => format!("status {}", self.status),
        }
    }
}

impl Server {
    /// Parses `url` (`http://host[:port][/base]`).
    pub fn parse(url: &str) -> Result<Server, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--url {url}: only http:// URLs are supported"))?;
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!("--url {url}: no host"));
        }
        let authority = if authority.contains(':') {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Server {
            authority,
            base: base.to_owned(),
        })
    }

    /// The path of stream `name` (percent-encoded), with `query` appended when not empty.
    pub fn stream_path(&self, name: &str, query: &str) -> String {
        let mut p = format!(
            "{}/{}",
            self.base,
            encode(name.trim_start_matches('/'), true)
        );
        if !query.is_empty() {
            p.push('?');
            p.push_str(query);
        }
        p
    }

    /// The path of an operations route `/__brook/{route}`.
    pub fn admin_path(&self, route: &str) -> String {
        format!("{}/__brook/{route}", self.base)
    }

    /// Sends one request for `path` (already encoded) and reads the whole response.
    pub fn request(&self, method: &str, path: &str, timeout: Duration) -> Result<Response, String> {
        let failed = |e: std::io::Error| format!("http://{}{path}: {e}", self.authority);
        let mut s = TcpStream::connect(&self.authority).map_err(failed)?;
        s.set_read_timeout(Some(timeout)).map_err(failed)?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            self.authority
        );
        s.write_all(req.as_bytes()).map_err(failed)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).map_err(failed)?;
        parse_response(&raw, method == "HEAD")
            .ok_or_else(|| format!("http://{}{path}: a malformed response", self.authority))
    }
}

/// Percent-encodes `s` for a path (keeping `/` when `path`) or a query value.
pub fn encode(s: &str, path: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (path && b == b'/') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Splits a raw response into status, headers and (dechunked) body.
fn parse_response(raw: &[u8], head: bool) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let text = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if head {
        body.clear();
    } else if chunked {
        body = dechunk(&body)?;
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// Decodes a chunked body.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&b[..eol]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        b = b.get(eol + 2..)?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}
