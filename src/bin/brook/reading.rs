//! The reading commands' arguments (`ls`, `cat`, `tail`, `head`): a data directory or a
//! server, and how a server's certificate is trusted.

use std::path::PathBuf;

use crate::ops;

/// Where a reading command finds its streams, and how it trusts a server's certificate.
#[derive(clap::Args)]
pub(crate) struct TargetArgs {
    #[command(flatten)]
    pub(crate) at: TargetChoice,
    /// Verify an `https://` server's certificate against the CA certificates in this PEM file
    /// instead of the Mozilla roots (for a private CA); default: the file `SSL_CERT_FILE`
    /// names, if set.
    #[arg(long, value_name = "FILE", requires = "url")]
    pub(crate) ca_cert: Option<PathBuf>,
}

/// A data directory or a server: exactly one of the two.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct TargetChoice {
    /// A data directory (it is locked while the command runs: not one a server is using).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// A running server: `http://HOST:PORT` or `https://HOST:PORT` (with a path, for a
    /// server behind a prefix).
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

/// The data directory or server a reading command names; a server's certificate is checked
/// against `--ca-cert`, else the file `SSL_CERT_FILE` names (as OpenSSL and curl read it),
/// else the Mozilla roots.
pub(crate) fn target(t: &TargetArgs) -> Result<ops::Target, String> {
    let ca_cert = match (&t.ca_cert, &t.at.url) {
        (Some(file), _) => Some(file.clone()),
        (None, Some(_)) => std::env::var_os("SSL_CERT_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        (None, None) => None,
    };
    ops::Target::open(
        t.at.data_dir.as_deref(),
        t.at.url.as_deref(),
        ca_cert.as_deref(),
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
