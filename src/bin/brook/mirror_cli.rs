//! `brook mirror SOURCE_URL DEST_URL`: the command line of [`brook::mirror`].

use std::path::PathBuf;
use std::time::Duration;

use brook::mirror::{MirrorError, MirrorOptions, NameMap, Side};

/// `brook mirror`'s arguments.
#[derive(clap::Args)]
pub(crate) struct MirrorArgs {
    /// The source server's base URL (stream `a/b` is `SOURCE_URL/a/b`).
    source: String,
    /// The destination server's base URL.
    dest: String,
    /// Send `Authorization: Bearer TOKEN` on every request to the destination (it needs read,
    /// write and admin on the streams written there); never sent to the source.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "BROOK_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Send `Authorization: Bearer TOKEN` on every request to the source (it needs read on the
    /// streams copied, and admin on `/` for brook's listing unless --streams is given); never
    /// sent to the destination.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "BROOK_SOURCE_TOKEN",
        hide_env_values = true
    )]
    source_token: Option<String>,
    /// Copy only streams whose names start with this.
    #[arg(long)]
    prefix: Option<String>,
    /// Read the stream names from this file (one a line) instead of the source's
    /// `/__brook/streams` listing.
    #[arg(long)]
    streams: Option<PathBuf>,
    /// Keep copying new appends and new streams until stopped (SIGINT/SIGTERM).
    #[arg(long)]
    follow: bool,
    /// Map names to Ursula's `/{bucket}/{stream}`: the first segment is the bucket, the rest
    /// one segment (`/` written `~`, `~` written `~~`); buckets are created first.
    #[arg(long)]
    ursula_names: bool,
    /// With --ursula-names: put every stream in this bucket, the whole name as the segment.
    #[arg(long, requires = "ursula_names")]
    bucket: Option<String>,
    /// Where progress is kept, one file per destination stream (created if missing). Keep it
    /// until the cut-over: it is what makes a restarted mirror write nothing twice.
    #[arg(long, default_value = "./brook-mirror-state")]
    state_dir: PathBuf,
    /// How long a followed long-poll may wait and how often the listing is read again, in
    /// milliseconds.
    #[arg(long, default_value_t = 5_000)]
    poll_ms: u64,
    /// Streams copied at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
}

/// Runs the mirror until it is done (or, with --follow, stopped); the error is the message to
/// print.
pub(crate) fn run(args: MirrorArgs) -> Result<(), String> {
    let names = match (args.ursula_names, args.bucket) {
        (false, _) => NameMap::Same,
        (true, None) => NameMap::Ursula,
        (true, Some(b)) => NameMap::UrsulaBucket(b),
    };
    // An empty `BROOK_TOKEN=` is no token.
    let token = |t: Option<String>| t.filter(|t| !t.is_empty());
    let opts = MirrorOptions {
        source: args.source,
        dest: args.dest,
        source_token: token(args.source_token),
        dest_token: token(args.token),
        prefix: args.prefix,
        streams_file: args.streams,
        follow: args.follow,
        names,
        state_dir: args.state_dir,
        poll: Duration::from_millis(args.poll_ms),
        jobs: args.jobs,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let report = runtime
        .block_on(async {
            tokio::select! {
                r = brook::mirror::run(opts) => r.map(Some),
                () = super::shutdown_signal() => Ok(None),
            }
        })
        .map_err(|e| explain(&e))?;
    let Some(report) = report else {
        tracing::info!("mirror stopped; run it again to continue");
        return Ok(());
    };
    tracing::info!(
        "mirror done: {} streams, {} appends, {} bytes, {} snapshots, {} failed",
        report.streams,
        report.appends,
        report.bytes,
        report.snapshots,
        report.failed.len()
    );
    if report.failed.is_empty() {
        Ok(())
    } else {
        let list: Vec<String> = report
            .failed
            .iter()
            .map(|(n, e)| format!("{n}: {e}"))
            .collect();
        Err(format!(
            "{} streams failed:\n{}",
            list.len(),
            list.join("\n")
        ))
    }
}

/// The message for a mirror error: a 401 names the flag and variable that give that server's
/// token (the server's own detail names the `Authorization` header).
fn explain(e: &MirrorError) -> String {
    let MirrorError::Unauthorized {
        side,
        what,
        code,
        detail,
    } = e
    else {
        return e.to_string();
    };
    let (flag, var) = match side {
        Side::Source => ("--source-token", "BROOK_SOURCE_TOKEN"),
        Side::Destination => ("--token", "BROOK_TOKEN"),
    };
    // brook's detail for a missing token names the header; the others say what is wrong.
    let why = match (code.as_deref(), detail.as_deref()) {
        (Some("UNAUTHORIZED") | None, _) | (_, None) => String::new(),
        (Some(_), Some(d)) => format!(": {d}"),
    };
    let code = code.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
    format!(
        "{what}: the {side} server answered 401{code}{why}: give it a valid token with {flag} \
         TOKEN or the {var} environment variable"
    )
}
