//! `brook mirror` (feature `mirror`): copies streams from one Durable Streams server to another
//! over the protocol, exactly once, resumably, and optionally following new appends until cut
//! over.
//!
//! | file | what it does |
//! |---|---|
//! | `mod.rs` | [`MirrorOptions`], [`run`]: finds the source streams and copies each |
//! | `copy.rs` | one stream: create, append batches with producer headers, snapshot, close |
//! | `state.rs` | the per-destination progress file and its write protocol |
//! | `names.rs` | [`NameMap`]: the destination name of a source stream (Ursula's buckets) |
//!
//! **Exactly once.** Every append to a destination stream carries `Producer-Id: brook-mirror`,
//! `Producer-Epoch: 0` and `Producer-Seq: n`, the number of appends the mirror made to that
//! stream before it. The sequence lives in the state directory (one file per destination
//! stream, see `state.rs`): a mirror killed at any point and started again resends at most the
//! append in flight, with the same sequence number, and the destination acknowledges it as a
//! duplicate without writing it again. The epoch never changes: a new epoch would reset the
//! destination's sequence and with it the duplicate check.
//!
//! **Message boundaries.** JSON streams are read as arrays and appended as arrays, so every
//! message stays a message. A byte stream's reads do not show where its messages end; brook
//! sources answer `boundary=message` (a read ends on a message boundary) and are copied one
//! message per append. Other sources are copied a chunk per append: every byte, in messages
//! as the source's reads cut them.
//!
//! **Access control.** [`MirrorOptions::source_token`] and [`MirrorOptions::dest_token`] are
//! sent as `Authorization: Bearer` to their own server only; a 401 from either ends the run with
//! [`MirrorError::Unauthorized`], which says which server refused.

mod copy;
mod names;
mod state;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{AUTHORIZATION, HeaderValue};

pub use names::{Mapped, NameMap};

/// What [`run`] copies, from where to where.
///
/// Its `Debug` output shows whether each token is set, never the token.
#[derive(Clone)]
pub struct MirrorOptions {
    /// The source server's base URL (stream `a/b` is `{source}/a/b`).
    pub source: String,
    /// The destination server's base URL.
    pub dest: String,
    /// A bearer token sent (`Authorization: Bearer <token>`) on every request to the source,
    /// for a source with access control: it needs `read` on the streams copied, and, when the
    /// names come from brook's listing, `admin` on `/`.
    pub source_token: Option<String>,
    /// A bearer token sent on every request to the destination: it needs `read`, `write` and
    /// `admin` on the destination streams. Never sent to the source, nor the source's to it.
    pub dest_token: Option<String>,
    /// Copy only streams whose names start with this (without a leading `/`).
    pub prefix: Option<String>,
    /// A file naming the streams to copy, one a line, instead of the source's
    /// `GET /__brook/streams` listing (for sources that do not have it).
    pub streams_file: Option<PathBuf>,
    /// Keep copying new appends (and streams that appear, when listed) until stopped.
    pub follow: bool,
    /// How destination names are made.
    pub names: NameMap,
    /// The directory of progress files (created if missing). Keep it for as long as the
    /// destination streams may be resumed.
    pub state_dir: PathBuf,
    /// How long a follow long-poll asks the source to wait, and how often a followed listing
    /// is read again.
    pub poll: Duration,
    /// Streams copied at once.
    pub jobs: usize,
}

impl std::fmt::Debug for MirrorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |t: &Option<String>| t.as_ref().map(|_| "<hidden>");
        f.debug_struct("MirrorOptions")
            .field("source", &self.source)
            .field("dest", &self.dest)
            .field("source_token", &hidden(&self.source_token))
            .field("dest_token", &hidden(&self.dest_token))
            .field("prefix", &self.prefix)
            .field("streams_file", &self.streams_file)
            .field("follow", &self.follow)
            .field("names", &self.names)
            .field("state_dir", &self.state_dir)
            .field("poll", &self.poll)
            .field("jobs", &self.jobs)
            .finish()
    }
}

/// One end of a mirror: the server copied from or the one copied to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The server streams are copied from.
    Source,
    /// The server streams are copied to.
    Destination,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Source => "source",
            Side::Destination => "destination",
        })
    }
}

/// What a [`run`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorReport {
    /// Streams whose copy is complete up to the source's tail at the time (or closed).
    pub streams: usize,
    /// Appends made to destination streams (duplicates resent after a restart included).
    pub appends: u64,
    /// Source bytes copied.
    pub bytes: u64,
    /// Snapshots copied.
    pub snapshots: usize,
    /// Streams that failed, with why.
    pub failed: Vec<(String, String)>,
}

/// Why the mirror stopped or skipped a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// A URL on the command line is not an http(s) URL.
    #[error("invalid URL {0:?}: {1}")]
    Url(String, String),
    /// A request failed on the way (connection refused, reset, timed out).
    #[error("{0}: {1}")]
    Transport(String, String),
    /// A server answered something the mirror cannot continue from.
    #[error("{what}: {status} {body}")]
    Refused {
        /// The request.
        what: String,
        /// The response status.
        status: u16,
        /// The response body, shortened.
        body: String,
    },
    /// A source stream has no destination name under the chosen mapping.
    #[error("the stream {name:?} cannot be mirrored under this name mapping: {why}")]
    Name {
        /// The source name.
        name: String,
        /// Why.
        why: String,
    },
    /// A destination stream exists that this mirror's state does not know: the mirror does not
    /// write into streams it did not create.
    #[error(
        "the destination {0} exists but this state directory has no progress for it (use a fresh destination, or the state directory that created it)"
    )]
    Foreign(String),
    /// The source stream was deleted and created again since the copy began.
    #[error(
        "the source stream {0} was created again since the mirror started copying it (mirror it to a fresh destination)"
    )]
    SourceRecreated(String),
    /// The state directory or a progress file cannot be used.
    #[error("the mirror state {0}: {1}")]
    State(PathBuf, String),
    /// The `--streams` file cannot be read.
    #[error("cannot read the stream list {0}: {1}")]
    StreamList(PathBuf, String),
    /// A token in the options cannot be sent (empty, or whitespace or control characters in
    /// it).
    #[error("the {0} token is empty or holds whitespace or control characters")]
    Token(Side),
    /// A server answered 401: no token, or one it does not accept (unknown, malformed,
    /// expired). It stops the whole run, since every other request to that server would be
    /// refused the same way.
    #[error("{what}: the {side} server answered 401{}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default(), detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Unauthorized {
        /// Which server refused.
        side: Side,
        /// The request.
        what: String,
        /// The problem+json `code` (`UNAUTHORIZED`, `INVALID_TOKEN`, `TOKEN_EXPIRED` from
        /// brook), if the body had one.
        code: Option<String>,
        /// The problem+json `detail`, if the body had one.
        detail: Option<String>,
    },
}

impl MirrorError {
    /// The 401 of `side` to `what`, with the problem+json `code` and `detail` of `body`.
    pub(crate) fn unauthorized(side: Side, what: &str, body: &[u8]) -> MirrorError {
        let problem: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let text = |k: &str| {
            problem
                .as_ref()
                .and_then(|p| p.get(k))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        MirrorError::Unauthorized {
            side,
            what: what.to_owned(),
            code: text("code"),
            detail: text("detail"),
        }
    }
}

/// The `Authorization` value for `token` (marked sensitive), checked.
fn bearer(side: Side, token: Option<&str>) -> Result<Option<HeaderValue>, MirrorError> {
    let Some(token) = token else {
        return Ok(None);
    };
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(MirrorError::Token(side));
    }
    let mut v =
        HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| MirrorError::Token(side))?;
    v.set_sensitive(true);
    Ok(Some(v))
}

/// A base URL, checked, without a trailing `/`.
fn base_url(s: &str) -> Result<Url, MirrorError> {
    let url = Url::parse(s).map_err(|e| MirrorError::Url(s.to_owned(), e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(MirrorError::Url(s.to_owned(), "not an http(s) URL".into()));
    }
    Ok(url)
}

/// `base` with the path segments of `path` (each percent-encoded as needed) appended.
pub(crate) fn join(base: &Url, path: &str) -> Url {
    let mut url = base.clone();
    url.path_segments_mut()
        .expect("checked by base_url: the URL can be a base")
        .pop_if_empty()
        .extend(path.split('/'));
    url
}

/// The names in a `--streams` file: one a line, a leading `/` dropped, blank lines and `#`
/// comments skipped.
fn read_stream_list(path: &Path) -> Result<Vec<String>, MirrorError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| MirrorError::StreamList(path.to_owned(), e.to_string()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/').to_owned())
        .collect())
}

/// The page size the mirror asks the listing route for (its largest).
const LIST_PAGE: usize = 1000;

/// Every stream whose name starts with `prefix`, from brook's `GET /__brook/streams` listing
/// (`{"streams":[{"name",...}],"next":cursor|null}`), page by page.
async fn list_source(
    http: &reqwest::Client,
    source: &Url,
    auth: Option<&HeaderValue>,
    prefix: &str,
) -> Result<Vec<String>, MirrorError> {
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = join(source, "__brook/streams");
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("prefix", prefix);
            q.append_pair("limit", &LIST_PAGE.to_string());
            if let Some(a) = &after {
                q.append_pair("after", a);
            }
        }
        let what = format!("GET {url}");
        let mut req = http.get(url);
        if let Some(a) = auth {
            req = req.header(AUTHORIZATION, a.clone());
        }
        let res = req
            .send()
            .await
            .map_err(|e| MirrorError::Transport(what.clone(), e.to_string()))?;
        let status = res.status().as_u16();
        let body = res
            .bytes()
            .await
            .map_err(|e| MirrorError::Transport(what.clone(), e.to_string()))?;
        if status == 401 {
            return Err(MirrorError::unauthorized(Side::Source, &what, &body));
        }
        if status == 403 {
            return Err(MirrorError::Refused {
                what: format!("{what} (the listing needs admin on /; or give --streams FILE)"),
                status,
                body: copy::shorten(&body),
            });
        }
        if status != 200 {
            return Err(MirrorError::Refused {
                what: format!("{what} (a source without brook's listing needs --streams FILE)"),
                status,
                body: copy::shorten(&body),
            });
        }
        let (page, next) = parse_listing(&body).map_err(|e| MirrorError::Refused {
            what: what.clone(),
            status,
            body: e,
        })?;
        names.extend(page);
        match next {
            Some(n) => after = Some(n),
            None => return Ok(names),
        }
    }
}

/// The names and the next cursor of one listing page.
fn parse_listing(body: &[u8]) -> Result<(Vec<String>, Option<String>), String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let streams = v
        .get("streams")
        .and_then(serde_json::Value::as_array)
        .ok_or("no 'streams' array")?;
    let mut names = Vec::with_capacity(streams.len());
    for s in streams {
        let name = s
            .get("name")
            .and_then(serde_json::Value::as_str)
            .ok_or("a stream without a 'name'")?;
        names.push(name.trim_start_matches('/').to_owned());
    }
    let next = v
        .get("next")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    Ok((names, next))
}

/// The streams to copy: the `--streams` file, or the source's listing; filtered by the prefix.
async fn discover(
    http: &reqwest::Client,
    source: &Url,
    auth: Option<&HeaderValue>,
    opts: &MirrorOptions,
) -> Result<Vec<String>, MirrorError> {
    let prefix = opts.prefix.as_deref().unwrap_or("").trim_start_matches('/');
    let names = match &opts.streams_file {
        Some(f) => read_stream_list(f)?,
        None => list_source(http, source, auth, prefix).await?,
    };
    Ok(names
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect())
}

/// Copies every stream the options name from the source to the destination, `jobs` at a
/// time, and returns what it did. Without `follow` it returns once every stream is copied up
/// to the tail it had when its copy began (or failed); with `follow` it keeps following until
/// the process is stopped, reading the listing again every `poll`.
///
/// A 401 from either server ([`MirrorError::Unauthorized`]) ends the run with that error: the
/// other streams' copies stop where they are (and resume from their progress files).
///
/// Durable when it returns: every append it reports was acknowledged by the destination; the
/// progress files name a lower bound of what the destination holds.
pub async fn run(opts: MirrorOptions) -> Result<MirrorReport, MirrorError> {
    let source = base_url(&opts.source)?;
    let dest = base_url(&opts.dest)?;
    let source_auth = bearer(Side::Source, opts.source_token.as_deref())?;
    let dest_auth = bearer(Side::Destination, opts.dest_token.as_deref())?;
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(|e| MirrorError::State(opts.state_dir.clone(), e.to_string()))?;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| MirrorError::Transport("an HTTP client".into(), e.to_string()))?;
    let ctx = Arc::new(copy::Context {
        http,
        source,
        dest,
        source_auth,
        dest_auth,
        opts,
        buckets: tokio::sync::Mutex::new(std::collections::HashSet::new()),
    });
    let mut report = MirrorReport::default();
    let mut started = std::collections::HashSet::new();
    let mut tasks = tokio::task::JoinSet::new();
    let jobs = Arc::new(tokio::sync::Semaphore::new(ctx.opts.jobs.max(1)));
    loop {
        let names = discover(&ctx.http, &ctx.source, ctx.source_auth.as_ref(), &ctx.opts).await?;
        for name in names {
            if !started.insert(name.clone()) {
                continue;
            }
            let ctx = ctx.clone();
            let jobs = jobs.clone();
            tasks.spawn(async move {
                let _permit = jobs.acquire_owned().await;
                let result = copy::mirror_stream(&ctx, &name).await;
                (name, result)
            });
        }
        if !ctx.opts.follow {
            break;
        }
        // Collect finished streams (closed ones end), then list again.
        let deadline = tokio::time::sleep(ctx.opts.poll);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => break,
                done = tasks.join_next(), if !tasks.is_empty() => {
                    if let Some(done) = done { tally(&mut report, done)?; }
                }
            }
        }
        if ctx.opts.streams_file.is_some() && tasks.is_empty() {
            break;
        }
    }
    while let Some(done) = tasks.join_next().await {
        tally(&mut report, done)?;
    }
    Ok(report)
}

/// Adds one stream's outcome to `report`; a 401 is returned instead, to end the run (the
/// `JoinSet` dropped with it aborts the other copies).
fn tally(
    report: &mut MirrorReport,
    done: Result<(String, Result<copy::Copied, MirrorError>), tokio::task::JoinError>,
) -> Result<(), MirrorError> {
    match done {
        Ok((_, Ok(c))) => {
            report.streams += 1;
            report.appends += c.appends;
            report.bytes += c.bytes;
            report.snapshots += c.snapshots;
        }
        Ok((_, Err(e @ MirrorError::Unauthorized { .. }))) => return Err(e),
        Ok((name, Err(e))) => {
            tracing::warn!("mirror: {name}: {e}");
            report.failed.push((name, e.to_string()));
        }
        Err(e) => report.failed.push(("?".into(), e.to_string())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_pages_and_urls() -> Result<(), Box<dyn std::error::Error>> {
        let body = br#"{"streams":[{"name":"a/b","contentType":"text/plain","tail":"0_0","closed":false}],"next":"a/b"}"#;
        assert_eq!(
            parse_listing(body)?,
            (vec!["a/b".to_owned()], Some("a/b".to_owned()))
        );
        assert_eq!(
            parse_listing(br#"{"streams":[],"next":null}"#)?,
            (vec![], None)
        );
        assert_eq!(parse_listing(b"[]"), Err("no 'streams' array".to_owned()));
        let base = base_url("http://h:1/v1/stream/")?;
        assert_eq!(
            join(&base, "a b/c?").as_str(),
            "http://h:1/v1/stream/a%20b/c%3F"
        );
        assert!(matches!(
            base_url("ftp://h"),
            Err(MirrorError::Url(u, why)) if u == "ftp://h" && why == "not an http(s) URL"
        ));
        Ok(())
    }
}
