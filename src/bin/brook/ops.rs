//! The data-directory and server commands: `ls`, `cat`, `tail`, `head` (on `--data-dir DIR`, or
//! on a server at `--url URL`) and `check` (a data directory only). Each returns the message to
//! print on failure.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use brook::{Error, Guard, Options, ReadFrom, ReadRequest, Store, StreamName, is_json};

use super::http1::{Server, encode};

/// What a command reads from: a data directory (opened, taking its lock) or a server.
pub enum Target {
    /// A store opened in this process.
    Dir(Store),
    /// A server over HTTP.
    Url(Server),
}

impl Target {
    /// The target the flags name: `--data-dir` (which must hold a store) or `--url`.
    pub fn open(dir: Option<&Path>, url: Option<&str>) -> Result<Target, String> {
        match (dir, url) {
            (Some(dir), None) => open_store(dir).map(Target::Dir),
            (None, Some(url)) => Server::parse(url).map(Target::Url),
            _ => Err("give exactly one of --data-dir DIR and --url URL".to_owned()),
        }
    }
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
        let (entries, next) = match target {
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
            Target::Url(server) => ls_page(server, prefix, after.as_deref())?,
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

/// One page of `/__brook/streams` as (name, tail, content type, closed) and the next cursor.
type Page = (Vec<(String, String, String, bool)>, Option<String>);

/// Reads one page of the server's listing.
fn ls_page(server: &Server, prefix: &str, after: Option<&str>) -> Result<Page, String> {
    let mut query = format!("streams?limit=1000&prefix={}", encode(prefix, false));
    if let Some(a) = after {
        query.push_str("&after=");
        query.push_str(&encode(a, false));
    }
    let r = server.request("GET", &server.admin_path(&query), Duration::from_mins(1))?;
    if r.status != 200 {
        return Err(format!("listing failed: {}", r.refusal()));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).map_err(|e| format!("a malformed listing: {e}"))?;
    let entries = v["streams"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                    (
                        text("name"),
                        text("tail"),
                        text("contentType"),
                        s["closed"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((entries, v["next"].as_str().map(str::to_owned)))
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
        Target::Url(server) => cat_url(server, &name, from, follow, out),
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

/// The wire form of `from` for `offset=`.
fn offset_param(from: ReadFrom) -> String {
    match from {
        ReadFrom::Start => "-1".to_owned(),
        ReadFrom::Tail => "now".to_owned(),
        ReadFrom::At(o) => o.to_string(),
    }
}

/// [`cat`] over HTTP: catch-up reads, then (following) long-polls.
fn cat_url(
    server: &Server,
    name: &StreamName,
    from: ReadFrom,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let mut offset = offset_param(from);
    let mut caught_up = false;
    loop {
        let live = if caught_up { "&live=long-poll" } else { "" };
        let path = server.stream_path(name.as_str(), &format!("offset={offset}{live}"));
        let r = server.request("GET", &path, Duration::from_mins(2))?;
        if r.status != 200 && r.status != 204 {
            return Err(format!("{}: {}", name.as_str(), r.refusal()));
        }
        if r.status == 200 {
            let json = r.header("content-type").is_some_and(is_json);
            if json {
                let values: Vec<Box<serde_json::value::RawValue>> = serde_json::from_slice(&r.body)
                    .map_err(|e| format!("a malformed JSON read: {e}"))?;
                for v in values {
                    write_out(out, v.get().as_bytes())?;
                    write_out(out, b"\n")?;
                }
            } else {
                write_out(out, &r.body)?;
            }
            out.flush().map_err(|e| e.to_string())?;
        }
        if let Some(next) = r.header("stream-next-offset") {
            next.clone_into(&mut offset);
        }
        let up_to_date = r.status == 204 || r.header("stream-up-to-date") == Some("true");
        if up_to_date {
            if !follow || r.header("stream-closed") == Some("true") {
                return Ok(());
            }
            caught_up = true;
        }
    }
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
                let ms = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                lines.push(("expires-at-ms", ms.to_string()));
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
        Target::Url(server) => {
            let r = server.request(
                "HEAD",
                &server.stream_path(name.as_str(), ""),
                Duration::from_mins(1),
            )?;
            if r.status != 200 {
                return Err(format!("{}: status {}", name.as_str(), r.status));
            }
            lines.push(("name", name.as_str().to_owned()));
            for (field, header) in [
                ("content-type", "content-type"),
                ("tail", "stream-next-offset"),
                ("closed", "stream-closed"),
                ("incarnation", "stream-incarnation"),
                ("earliest", "stream-earliest-offset"),
                ("ttl-seconds", "stream-ttl"),
                ("expires-at", "stream-expires-at"),
                ("snapshot", "stream-snapshot-offset"),
                ("stream-seq", "stream-last-seq"),
            ] {
                if let Some(v) = r.header(header) {
                    lines.push((field, v.to_owned()));
                }
            }
            if !lines.iter().any(|(f, _)| *f == "closed") {
                lines.push(("closed", "false".to_owned()));
            }
        }
    }
    for (k, v) in lines {
        write_out(out, format!("{k}: {v}\n").as_bytes())?;
    }
    out.flush().map_err(|e| e.to_string())
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
