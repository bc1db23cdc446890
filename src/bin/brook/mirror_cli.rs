//! `brook mirror SOURCE_URL DEST_URL`: the command line of [`brook::mirror`].

use std::path::PathBuf;
use std::time::Duration;

use brook::mirror::{MirrorOptions, NameMap};

/// `brook mirror`'s arguments.
#[derive(clap::Args)]
pub(crate) struct MirrorArgs {
    /// The source server's base URL (stream `a/b` is `SOURCE_URL/a/b`).
    source: String,
    /// The destination server's base URL.
    dest: String,
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
    let opts = MirrorOptions {
        source: args.source,
        dest: args.dest,
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
        .map_err(|e| e.to_string())?;
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
