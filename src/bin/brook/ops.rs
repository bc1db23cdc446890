//! The data-directory and server commands: `ls`, `cat`, `tail`, `head` (on `--data-dir DIR`, or
//! on a server at `--url URL`) and `check` (a data directory only). Each returns the message to
//! print on failure.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use brook::client::{self, Client, Position, Read};
use brook::{Error, Guard, Options, ReadFrom, ReadRequest, Store, StreamName, is_json};

/// What a command reads from: a data directory (opened, taking its lock) or a server.
pub enum Target {
    /// A store opened in this process.
    Dir(Store),
    /// A server over HTTP or HTTPS.
    Url(Remote),
}

/// A server a command reads through brook's own client, on a runtime of the command's own.
pub struct Remote {
    /// The client for the server's base URL (with the bearer token, when one was given).
    client: Client,
    /// Whether a bearer token is sent (what a 401 tells the user depends on it).
    token: bool,
    /// Runs the client's requests (one at a time: a command is sequential).
    runtime: tokio::runtime::Runtime,
}

impl Target {
    /// The target the flags name: `--data-dir` (which must hold a store) or `--url`, whose
    /// certificate is verified against `ca_cert` when given (else the Mozilla roots) and which
    /// is sent `token` as a bearer token when given.
    pub fn open(
        dir: Option<&Path>,
        url: Option<&str>,
        ca_cert: Option<&Path>,
        token: Option<&str>,
    ) -> Result<Target, String> {
        match (dir, url) {
            (Some(dir), None) => open_store(dir).map(Target::Dir),
            (None, Some(url)) => Remote::open(url, ca_cert, token).map(Target::Url),
            _ => Err("give exactly one of --data-dir DIR and --url URL".to_owned()),
        }
    }
}

impl Remote {
    /// A client for `url` (`http://` or `https://`), trusting only the CA certificates in the
    /// PEM file `ca_cert` when given, sending `token` as a bearer token when given.
    fn open(url: &str, ca_cert: Option<&Path>, token: Option<&str>) -> Result<Remote, String> {
        let client = match ca_cert {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    format!("cannot read the CA certificates {}: {e}", path.display())
                })?;
                Client::with_root_certificates(url, &pem)
                    .map_err(|e| format!("--ca-cert {}: {e}", path.display()))?
            }
            None => Client::new(url).map_err(|e| format!("--url {url}: {e}"))?,
        };
        let client = match token {
            Some(t) => client
                .with_bearer_token(t)
                .map_err(|e| format!("--token (or BROOK_TOKEN): {e}"))?,
            None => client,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        Ok(Remote {
            client,
            token: token.is_some(),
            runtime,
        })
    }

    /// A client error as one line for the user: a 401 says how to give a token (the server's
    /// own detail names the `Authorization` header, which the command line sets through
    /// `--token`); anything else as [`describe`] tells it.
    fn describe(&self, e: &client::Error) -> String {
        match e {
            client::Error::Http {
                status: 401,
                code,
                detail,
            } => {
                let code = code.as_deref();
                let tagged = code.map(|c| format!(" {c}")).unwrap_or_default();
                if !self.token {
                    format!(
                        "the server needs a bearer token (401{tagged}): give one with \
                         --token TOKEN or the BROOK_TOKEN environment variable"
                    )
                } else if code == Some("UNAUTHORIZED") {
                    "the server saw no token (401 UNAUTHORIZED) though --token or BROOK_TOKEN \
                     gave one: does a proxy in between drop the Authorization header?"
                        .to_owned()
                } else {
                    format!(
                        "the server did not accept the token (401{tagged}{}): check the token \
                         given with --token or BROOK_TOKEN",
                        detail
                            .as_deref()
                            .map(|d| format!(": {d}"))
                            .unwrap_or_default()
                    )
                }
            }
            _ => describe(e),
        }
    }
}

/// A client error with the errors under it (a TLS refusal sits a few sources down a transport
/// error), as one line.
fn describe(e: &client::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Opens an existing store in `dir` for a command: a missing store or a directory held by a
/// running server is a clear error, never a new store.
pub fn open_store(dir: &Path) -> Result<Store, String> {
    if !dir.join("STORE").exists() {
        return Err(format!(
            "{} holds no brook store (no STORE file)",
            dir.display()
        ));
    }
    Store::open(dir, Options::default()).map_err(|e| match e {
        Error::Locked(_) => format!(
            "the data directory {} is in use by another brook process (a running server?): stop \
             it first, or ask the server with --url http://HOST:PORT",
            dir.display()
        ),
        other => format!("cannot open the data directory {}: {other}", dir.display()),
    })
}

/// Writes to stdout; a closed pipe (`brook cat ... | head`) ends the command quietly.
fn write_out(out: &mut impl Write, bytes: &[u8]) -> Result<(), String> {
    match out.write_all(bytes) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(format!("cannot write the output: {e}")),
    }
}

/// The stream name a command was given.
fn stream_name(s: &str) -> Result<StreamName, String> {
    StreamName::new(s.trim_start_matches('/')).map_err(|e| format!("{s:?} is no stream name: {e}"))
}

/// `brook ls [PREFIX]`: the live streams whose names start with `prefix`, one a line (with
/// `long`: name, tail, content type and `closed` when closed, tab-separated).
pub fn ls(target: &Target, prefix: &str, long: bool, out: &mut impl Write) -> Result<(), String> {
    let mut after: Option<String> = None;
    loop {
        // (name, tail, content type, closed) of one page, and the next page's cursor.
        let (entries, next): (Vec<(String, String, String, bool)>, _) = match target {
            Target::Dir(store) => {
                let page = store
                    .list_page(prefix, after.as_deref(), 1000)
                    .map_err(|e| format!("listing failed: {e}"))?;
                let entries = page
                    .streams
                    .into_iter()
                    .map(|s| {
                        (
                            s.name.as_str().to_owned(),
                            s.tail.to_string(),
                            s.content_type,
                            s.closed,
                        )
                    })
                    .collect();
                (entries, page.next)
            }
            Target::Url(remote) => {
                let page = remote
                    .runtime
                    .block_on(remote.client.list_page(prefix, after.as_deref(), 1000))
                    .map_err(|e| format!("listing failed: {}", remote.describe(&e)))?;
                let entries = page
                    .streams
                    .into_iter()
                    .map(|s| (s.name, s.tail.to_string(), s.content_type, s.closed))
                    .collect();
                (entries, page.next)
            }
        };
        for (name, tail, ct, closed) in entries {
            let line = if long {
                format!(
                    "{name}\t{tail}\t{ct}{}\n",
                    if closed { "\tclosed" } else { "" }
                )
            } else {
                format!("{name}\n")
            };
            write_out(out, line.as_bytes())?;
        }
        match next {
            Some(n) => after = Some(n),
            None => return out.flush().map_err(|e| e.to_string()),
        }
    }
}

/// `brook cat` (`follow` false) and `brook tail` (`follow` true): the stream's data from `from`
/// to its tail (then, following, as it is appended until the stream is closed). A JSON stream
/// prints one message a line; any other stream its bytes as they are.
pub fn cat(
    target: &Target,
    stream: &str,
    from: ReadFrom,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let name = stream_name(stream)?;
    match target {
        Target::Dir(store) => cat_dir(store, &name, from, follow, out),
        Target::Url(remote) => cat_url(remote, &name, from, follow, out),
    }
}

/// [`cat`] on an open store.
fn cat_dir(
    store: &Store,
    name: &StreamName,
    from: ReadFrom,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let failed = |e: Error| format!("{}: {e}", name.as_str());
    let mut req = ReadRequest::from(from);
    loop {
        let (messages, chunk) = store.read_messages(name, &req).map_err(failed)?;
        let json = is_json(&chunk.content_type);
        for m in &messages {
            write_out(out, &m.data)?;
            if json {
                write_out(out, b"\n")?;
            }
        }
        out.flush().map_err(|e| e.to_string())?;
        req.from = ReadFrom::At(chunk.next);
        if chunk.up_to_date {
            if !follow || chunk.closed {
                return Ok(());
            }
            store
                .wait_blocking(name, chunk.next, Duration::from_secs(30))
                .map_err(failed)?;
        }
    }
}

/// Where a read over HTTP starts for `from`.
fn position(from: ReadFrom) -> Position {
    match from {
        ReadFrom::Start => Position::start(),
        ReadFrom::Tail => Position::now(),
        ReadFrom::At(o) => Position::from(o),
    }
}

/// [`cat`] over HTTP: catch-up reads to the tail, then (following) long-polls, each echoing
/// the last cursor, until the stream is closed.
fn cat_url(
    remote: &Remote,
    name: &StreamName,
    from: ReadFrom,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let stream = remote.client.stream(name.as_str());
    let failed = |e: client::Error| format!("{}: {}", name.as_str(), remote.describe(&e));
    remote.runtime.block_on(async {
        let mut req = Read::from(position(from));
        let mut cursor: Option<String> = None;
        let mut caught_up = false;
        loop {
            let chunk = if caught_up {
                stream.long_poll(&req, cursor.as_deref()).await
            } else {
                stream.read(&req).await
            }
            .map_err(failed)?;
            if chunk.is_json() {
                // Each message as the server sent it (a parsed value would reorder keys).
                if !chunk.data.iter().all(u8::is_ascii_whitespace) {
                    let values: Vec<Box<serde_json::value::RawValue>> =
                        serde_json::from_slice(&chunk.data)
                            .map_err(|e| format!("a malformed JSON read: {e}"))?;
                    for v in values {
                        write_out(out, v.get().as_bytes())?;
                        write_out(out, b"\n")?;
                    }
                }
            } else {
                write_out(out, &chunk.data)?;
            }
            out.flush().map_err(|e| e.to_string())?;
            if chunk.cursor.is_some() {
                cursor.clone_from(&chunk.cursor);
            }
            if chunk.up_to_date {
                if !follow || chunk.closed {
                    return Ok(());
                }
                caught_up = true;
            }
            req = Read::from(chunk.next);
        }
    })
}

/// `brook head STREAM`: the stream's metadata, one `field: value` a line.
pub fn head(target: &Target, stream: &str, out: &mut impl Write) -> Result<(), String> {
    let name = stream_name(stream)?;
    let mut lines: Vec<(&str, String)> = Vec::new();
    match target {
        Target::Dir(store) => {
            let i = store
                .head(&name, &Guard::default())
                .map_err(|e| format!("{}: {e}", name.as_str()))?;
            lines.push(("name", i.name.as_str().to_owned()));
            lines.push(("content-type", i.content_type.clone()));
            lines.push(("tail", i.tail.to_string()));
            lines.push(("closed", i.closed.to_string()));
            lines.push(("incarnation", i.incarnation.as_str().to_owned()));
            lines.push(("earliest", i.earliest.to_string()));
            if let Some(t) = i.ttl() {
                lines.push(("ttl-seconds", t.as_secs().to_string()));
            }
            if let Some(at) = i.expires_at {
                lines.push(("expires-at-ms", millis(at).to_string()));
            }
            if let Some(s) = &i.snapshot {
                lines.push(("snapshot", s.offset.to_string()));
            }
            if let Some((src, at)) = &i.fork {
                lines.push(("forked-from", format!("{} at {at}", src.as_str())));
            }
            if let Some(seq) = &i.stream_seq {
                lines.push(("stream-seq", seq.clone()));
            }
        }
        Target::Url(remote) => {
            let i = remote
                .runtime
                .block_on(remote.client.stream(name.as_str()).head())
                .map_err(|e| format!("{}: {}", name.as_str(), remote.describe(&e)))?;
            lines.push(("name", name.as_str().to_owned()));
            if let Some(ct) = i.content_type {
                lines.push(("content-type", ct));
            }
            lines.push(("tail", i.next.to_string()));
            lines.push(("closed", i.closed.to_string()));
            if let Some(inc) = i.incarnation {
                lines.push(("incarnation", inc.as_str().to_owned()));
            }
            if let Some(e) = i.earliest {
                lines.push(("earliest", e.to_string()));
            }
            if let Some(t) = i.ttl {
                lines.push(("ttl-seconds", t.to_string()));
            }
            if let Some(at) = i.expires_at {
                lines.push(("expires-at-ms", millis(at).to_string()));
            }
            if let Some(s) = i.snapshot {
                lines.push(("snapshot", s.to_string()));
            }
        }
    }
    for (k, v) in lines {
        write_out(out, format!("{k}: {v}\n").as_bytes())?;
    }
    out.flush().map_err(|e| e.to_string())
}

/// `at` in milliseconds since the Unix epoch (0 before it).
fn millis(at: std::time::SystemTime) -> u128 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// `brook check`: reads every stream of the store and reports damage; `Ok(false)` when some was
/// found (the command then exits non-zero).
pub fn check(store: &Store, repair: bool, out: &mut impl Write) -> Result<bool, String> {
    let bar = streams_progress("checking streams");
    let report = store
        .check(&mut |n| bar.set_position(n))
        .map_err(|e| format!("the check failed: {e}"))?;
    bar.finish_and_clear();
    let mut text = format!(
        "checked {} streams ({} skipped: soft-deleted or expired), {} messages, {} bytes\n",
        report.streams, report.skipped, report.messages, report.bytes
    );
    if report.damaged.is_empty() {
        text.push_str("no damage found\n");
    } else {
        let _ = writeln!(text, "{} problems:", report.damaged.len());
        for d in &report.damaged {
            let _ = writeln!(text, "  {d}");
        }
    }
    if repair {
        for dir in &report.damaged_dirs {
            let to = store
                .quarantine(dir)
                .map_err(|e| format!("cannot quarantine {}: {e}", dir.display()))?;
            let _ = writeln!(text, "quarantined {} -> {}", dir.display(), to.display());
        }
    }
    write_out(out, text.as_bytes())?;
    out.flush().map_err(|e| e.to_string())?;
    // Repaired: the store is sound again (the damage is set aside, not fixed).
    Ok(report.damaged.is_empty() || (repair && report.damaged.len() == report.damaged_dirs.len()))
}

/// A progress display counting streams on standard error when it is a terminal (hidden
/// otherwise), with `what` as its message.
fn streams_progress(what: &'static str) -> indicatif::ProgressBar {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_message(what);
        b
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// `brook export`: every live stream of `store` to `file` (`-`: standard output).
pub fn export(store: &Store, file: &Path) -> Result<(), String> {
    let bar = streams_progress("exporting streams");
    let mut tick = |n| bar.set_position(n);
    let written = if file == Path::new("-") {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        store.export(&mut out, &mut tick)
    } else {
        let f = std::fs::File::create(file)
            .map_err(|e| format!("cannot create {}: {e}", file.display()))?;
        let mut out = std::io::BufWriter::new(f);
        let n = store.export(&mut out, &mut tick);
        let synced = out
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)
            .and_then(|f| f.sync_all());
        n.and_then(|n| synced.map(|()| n).map_err(Error::from))
    }
    .map_err(|e| format!("the export failed: {e}"))?;
    bar.finish_and_clear();
    eprintln!("exported {written} streams");
    Ok(())
}

/// `brook import`: the archive `file` (`-`: standard input) into the store in `dir`, created
/// when missing.
pub fn import(dir: &Path, file: &Path) -> Result<(), String> {
    let store = if dir.join("STORE").exists() {
        open_store(dir)?
    } else {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        open_store_new(dir)?
    };
    let bar = streams_progress("importing streams");
    let mut tick = |n| bar.set_position(n);
    let read = if file == Path::new("-") {
        store.import(
            &mut std::io::BufReader::new(std::io::stdin().lock()),
            &mut tick,
        )
    } else {
        let f = std::fs::File::open(file)
            .map_err(|e| format!("cannot open {}: {e}", file.display()))?;
        store.import(&mut std::io::BufReader::new(f), &mut tick)
    }
    .map_err(|e| format!("the import failed: {e}"))?;
    bar.finish_and_clear();
    store
        .shutdown()
        .map_err(|e| format!("the store did not shut down cleanly: {e}"))?;
    eprintln!("imported {read} streams");
    Ok(())
}

/// Creates a store in the empty directory `dir`.
fn open_store_new(dir: &Path) -> Result<Store, String> {
    Store::open(dir, Options::default())
        .map_err(|e| format!("cannot create a store in {}: {e}", dir.display()))
}
