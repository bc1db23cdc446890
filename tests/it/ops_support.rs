//! Helpers for the operations tests: `brook` as a child process (its log read line by line on
//! a thread), and a minimal blocking HTTP/1.1 client over `std::net::TcpStream`.

use std::fmt::Write as _;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A `brook` child process and the lines of its log.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Proc {
    /// Starts `brook serve` on 127.0.0.1, a free port, over `data`, with `extra` arguments and
    /// `RUST_LOG` set to `log`.
    pub fn serve(data: &Path, extra: &[&str], log: &str) -> R<Proc> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_brook"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(data)
            .args(extra)
            .env("RUST_LOG", log);
        Proc::spawn(cmd)
    }

    /// Spawns `cmd` with its stdout read line by line.
    pub fn spawn(mut cmd: Command) -> R<Proc> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// Waits (up to 20 s) for a log line containing `needle` and returns it.
    pub fn wait_for(&mut self, needle: &str) -> R<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return Ok(l.clone());
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("no log line with {needle:?}; saw {:?}", self.seen))?;
            self.seen.push(line.clone());
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    /// The `host:port` the server bound, once it serves streams (its `listening on` line).
    pub fn addr(&mut self) -> R<String> {
        self.wait_for("listening on http://")?;
        self.bound()
    }

    /// The `host:port` the server bound, as soon as it logged it (`bound http://...`), before
    /// the store is open.
    pub fn bound(&mut self) -> R<String> {
        let line = self.wait_for(" http://127.0.0.1:")?;
        let at = line.find("http://").ok_or("no address")? + "http://".len();
        let rest = &line[at..];
        let end = rest.find([',', ' ', '"', ';']).unwrap_or(rest.len());
        Ok(rest[..end].to_owned())
    }

    /// Sends SIGTERM, waits for the process to exit and returns its whole log; fails if it
    /// exited unsuccessfully.
    pub fn stop(mut self) -> R<Vec<String>> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let status = self.child.wait()?;
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        if !status.success() {
            return Err(format!("brook exited with {status}; log {:?}", self.seen).into());
        }
        Ok(std::mem::take(&mut self.seen))
    }

    /// Kills the process (SIGKILL): a crash.
    pub fn crash(mut self) -> R {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, headers (lowercase names) and body.
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request on a new connection (`Connection: close`), read to its end.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> R<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        let _ = write!(req, "{k}: {v}\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .ok_or("no status line")?
        .parse()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body)?;
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// Decodes a chunked body.
fn dechunk(mut b: &[u8]) -> R<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol])?.trim(), 16)?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}
