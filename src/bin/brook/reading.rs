//! The reading commands' arguments (`ls`, `cat`, `tail`, `head`): a data directory or a
//! server (`--url`, default `BROOK_URL`), how a server's certificate is trusted, and the bearer
//! token sent to it (`--token`, default `BROOK_TOKEN`).

use std::path::PathBuf;

use crate::ops;

/// The environment variable that names the server when neither `--data-dir` nor `--url` is
/// given.
const URL_ENV: &str = "BROOK_URL";

/// Where a reading command finds its streams, how it trusts a server's certificate, and the
/// token it sends the server.
#[derive(clap::Args)]
pub(crate) struct TargetArgs {
    #[command(flatten)]
    pub(crate) at: TargetChoice,
    /// Verify an `https://` server's certificate against the CA certificates in this PEM file
    /// instead of the Mozilla roots (for a private CA); default: the file `SSL_CERT_FILE`
    /// names, if set. Only with a server.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Send `Authorization: Bearer TOKEN` on every request to the server, for one with access
    /// control (`brook serve --auth-tokens` or `--auth-jwt-key`); prefer the environment
    /// variable, which other users cannot read in the process list. Ignored with --data-dir.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "BROOK_TOKEN",
        hide_env_values = true
    )]
    pub(crate) token: Option<String>,
}

/// A data directory or a server: at most one of the two (neither: the server `BROOK_URL`
/// names).
#[derive(clap::Args)]
#[group(multiple = false)]
pub(crate) struct TargetChoice {
    /// A data directory (it is locked while the command runs: not one a server is using).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// A running server: `http://HOST:PORT` or `https://HOST:PORT` (with a path, for a
    /// server behind a prefix); default: the `BROOK_URL` environment variable, when
    /// --data-dir is not given.
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,
}

#[derive(clap::Args)]
pub(crate) struct LsArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Also print each stream's tail, content type and closure (tab-separated).
    #[arg(long, short)]
    pub(crate) long: bool,
    /// Only names starting with this.
    #[arg(default_value = "")]
    pub(crate) prefix: String,
}

#[derive(clap::Args)]
pub(crate) struct CatArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// The stream's name.
    pub(crate) stream: String,
    /// Where to start: an offset, `-1` (the start) or `now` (the tail).
    #[arg(long, value_name = "OFFSET", allow_hyphen_values = true)]
    pub(crate) from: Option<String>,
}

#[derive(clap::Args)]
pub(crate) struct StreamArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// The stream's name.
    pub(crate) stream: String,
}

/// The server a reading command names: `--url`, else (without `--data-dir`) `BROOK_URL`.
fn server_url(at: &TargetChoice) -> Result<Option<String>, String> {
    if at.data_dir.is_some() {
        return Ok(None);
    }
    if let Some(url) = &at.url {
        return Ok(Some(url.clone()));
    }
    match std::env::var_os(URL_ENV) {
        Some(v) if !v.is_empty() => v
            .into_string()
            .map(Some)
            .map_err(|_| format!("{URL_ENV} is not valid UTF-8")),
        _ => Ok(None),
    }
}

/// The data directory or server a reading command names; a server's certificate is checked
/// against `--ca-cert`, else the file `SSL_CERT_FILE` names (as OpenSSL and curl read it),
/// else the Mozilla roots; the server is sent `--token` (or `BROOK_TOKEN`) when given.
pub(crate) fn target(t: &TargetArgs) -> Result<ops::Target, String> {
    let url = server_url(&t.at)?;
    if t.at.data_dir.is_none() && url.is_none() {
        return Err(format!(
            "give --data-dir DIR or --url URL (or set {URL_ENV} to the server's URL)"
        ));
    }
    if url.is_none() && t.ca_cert.is_some() {
        return Err("--ca-cert is for a server (--url URL), not a data directory".to_owned());
    }
    let ca_cert = match (&t.ca_cert, &url) {
        (Some(file), _) => Some(file.clone()),
        (None, Some(_)) => std::env::var_os("SSL_CERT_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        (None, None) => None,
    };
    // An empty `BROOK_TOKEN=` is no token.
    let token = t.token.as_deref().filter(|v| !v.is_empty());
    ops::Target::open(
        t.at.data_dir.as_deref(),
        url.as_deref(),
        ca_cert.as_deref(),
        token,
    )
}

/// `brook cat` (`follow` false) or `brook tail` (`follow` true, starting at the tail unless
/// `--from` says otherwise).
pub(crate) fn read_command(a: &CatArgs, follow: bool) -> Result<(), String> {
    let from = match a.from.as_deref() {
        Some(f) => f
            .parse::<brook::ReadFrom>()
            .map_err(|e| format!("--from {f}: {e}"))?,
        None if follow => brook::ReadFrom::Tail,
        None => brook::ReadFrom::Start,
    };
    let t = target(&a.target)?;
    ops::cat(&t, &a.stream, from, follow, &mut std::io::stdout().lock())
}
