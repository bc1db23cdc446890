//! `brook`: the command line. `brook serve` runs the Durable Streams server over a data
//! directory; `ls`, `cat`, `tail` and `head` read streams from a data directory or a server;
//! `check` verifies a data directory.

#[path = "brook/mirror_cli.rs"]
mod mirror_cli;
#[path = "brook/ops.rs"]
mod ops;
#[path = "brook/reading.rs"]
mod reading;
#[path = "brook/token.rs"]
mod token;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use brook::http::{
    AccessControl, JwtAlgorithm, JwtKey, SendBuffer, ServerConfig, Tls, serve_starting,
    serve_with_admin,
};
use brook::{Durability, Error, Options, Store, TierOptions};
use clap::{Parser, Subcommand, ValueEnum};
use reading::{CatArgs, LsArgs, StreamArgs, read_command, target};
use token::{TokenCommand, run_token};

#[derive(Parser)]
#[command(
    name = "brook",
    version,
    about = "Durable, append-only, URL-addressed streams"
)]
struct Cli {
    /// How log lines are written: `text` for people, `json` (one object a line) for log
    /// pipelines. The level comes from `RUST_LOG` (default `info` for `serve`, which logs to
    /// standard output, and `warn` for the other commands, which log to standard error; `debug`
    /// adds a line per request).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The log's line format.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines (coloured only on a terminal).
    Text,
    /// One JSON object per line, with the event's fields.
    Json,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing would only obscure the match"
)]
enum Command {
    /// Serve the Durable Streams protocol (with Ursula's snapshot, retention and bootstrap routes).
    #[command(after_help = "Example:\n  brook serve --port 4437 --data-dir /var/lib/brook")]
    Serve(ServeArgs),
    /// Make access tokens for `brook serve --auth-tokens`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Copy streams to another Durable Streams server, exactly once and resumably.
    Mirror(mirror_cli::MirrorArgs),
    /// List streams whose names start with PREFIX (all when omitted), in name order.
    #[command(after_help = "Examples:\n  brook ls --data-dir ./data demo/\n  \
                            brook ls --long --url http://127.0.0.1:4437\n  \
                            brook ls --url https://brook.internal:4437 --ca-cert ca.pem")]
    Ls(LsArgs),
    /// Print a stream's data from OFFSET (the start by default) to its tail. A JSON stream
    /// prints one message a line.
    #[command(
        after_help = "Examples:\n  brook cat --data-dir ./data demo/orders\n  \
                            brook cat --url http://127.0.0.1:4437 demo/orders --from now"
    )]
    Cat(CatArgs),
    /// Print what is appended to a stream from now on (or from OFFSET), until it is closed or
    /// interrupted.
    #[command(
        after_help = "Examples:\n  brook tail --url http://127.0.0.1:4437 demo/orders\n  \
                            BROOK_URL=https://brook.internal:4437 BROOK_TOKEN=brk_... brook tail demo/orders"
    )]
    Tail(CatArgs),
    /// Print a stream's metadata: content type, tail, closure, incarnation, expiry, snapshot.
    #[command(after_help = "Example:\n  brook head --data-dir ./data demo/orders")]
    Head(StreamArgs),
    /// Verify a data directory: every message against its checksum, every index against its
    /// log, every sidecar and the journal; prints a report and exits 1 on damage. Repairs
    /// nothing (the open recovers after a crash, as `serve` would) unless `--repair` moves the
    /// damaged streams into `quarantine/`.
    #[command(
        after_help = "Examples:\n  brook check --data-dir /var/lib/brook\n  brook check --data-dir /var/lib/brook --repair"
    )]
    Check(CheckArgs),
    /// Write every live stream (data, state, snapshots, incarnations) to FILE (`-`: standard
    /// output) as a versioned archive (DESIGN.md 2.7), for backups and moves between versions.
    #[command(after_help = "Example:\n  brook export --data-dir /var/lib/brook backup.brook")]
    Export(ArchiveArgs),
    /// Read an archive written by `brook export` from FILE (`-`: standard input) into a data
    /// directory (created if missing; names it already has are refused).
    #[command(after_help = "Example:\n  brook import --data-dir /var/lib/brook-new backup.brook")]
    Import(ArchiveArgs),
}

#[derive(clap::Args)]
struct ArchiveArgs {
    /// The data directory (locked while the command runs).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// The archive file, or `-`.
    file: PathBuf,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The data directory to verify (locked while the check runs).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Move every damaged stream directory into `quarantine/` (its name then answers as no
    /// stream); the files are kept there, untouched.
    #[arg(long)]
    repair: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// An acknowledged write is fsynced: it survives a power loss.
    Sync,
    /// An acknowledged write reached the OS: it survives a crash of brook, not of the machine.
    Buffered,
}

#[derive(clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line switches, each its own flag"
)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (4437 is the protocol's port).
    #[arg(long, default_value_t = 4437)]
    port: u16,
    /// Directory holding the streams; created if missing. One process at a time.
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
    /// How long a long-poll read waits for data before answering 204, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    long_poll_timeout_ms: u64,
    /// How long an SSE connection stays open before the server closes it (the client reconnects
    /// from its last offset), in milliseconds.
    #[arg(long, alias = "sse-reconnect-ms", default_value_t = 60_000)]
    sse_max_duration_ms: u64,
    /// How long a request body may deliver nothing before the request is refused with 408.
    #[arg(long, default_value_t = 30_000)]
    body_read_timeout_ms: u64,
    /// The least rate a request body must keep, in bytes per second, over every window of
    /// `--body-min-rate-grace-ms` once that has passed (a body whose last window brought less is
    /// refused with 408 `BODY_TOO_SLOW`); 0 turns the check off.
    #[arg(long, default_value_t = 4096)]
    body_min_rate: u64,
    /// How long a request body may take before `--body-min-rate` applies, and the window it is
    /// measured over (at least 1 s), in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    body_min_rate_grace_ms: u64,
    /// The longest a request body may take in all, in milliseconds (408 `BODY_DEADLINE` past
    /// it); 0 for no limit. The default lets a 64 MiB append arrive at 1 Mbit/s.
    #[arg(long, default_value_t = 600_000)]
    body_deadline_ms: u64,
    /// The server's memory budget in bytes: request bodies being read, response bytes queued
    /// for slow readers and connection buffers together; work past it is refused with 503
    /// `MEMORY_BUDGET` (default: an eighth of the machine's memory, between 32 MiB and 192 MiB).
    #[arg(long)]
    max_memory: Option<u64>,
    /// Bytes of `--max-memory` only small work may take (bodies and buffers of at most 64 KiB):
    /// larger uploads are refused once only the reserve is left (default: an eighth).
    #[arg(long)]
    memory_reserve: Option<u64>,
    /// Bytes of `--max-memory` one peer address (an IPv6 /64) may hold in uploads past 64 KiB
    /// and hyper's connection buffers (default: a quarter of the budget, or one largest
    /// append's peak, 1.5 × `--max-append-bytes` + 1 MiB, if more).
    #[arg(long)]
    max_memory_per_peer: Option<u64>,
    /// The same for one bearer token, with access control on (default: as
    /// `--max-memory-per-peer`).
    #[arg(long)]
    max_memory_per_token: Option<u64>,
    /// How long a connection's writes may make no progress (its peer reads nothing) before it
    /// is closed.
    #[arg(long, default_value_t = 60_000)]
    write_stall_timeout_ms: u64,
    /// How long shutdown waits for open requests before dropping their connections.
    #[arg(long, default_value_t = 10_000)]
    shutdown_grace_ms: u64,
    /// How long a webhook receiver has to answer one delivery (subscriptions), in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    webhook_timeout_ms: u64,
    /// Let webhooks reach this address range, which the address policy refuses otherwise
    /// (loopback, private, link-local, ...): e.g. 127.0.0.0/8 for a receiver on this machine,
    /// 10.0.0.0/8 inside your network; a bare address is one host (repeatable, or
    /// comma-separated). Default: public addresses only.
    #[arg(long, value_name = "CIDR", value_delimiter = ',', value_parser = parse_cidr)]
    webhook_allow: Vec<ipnet::IpNet>,
    /// Subscriptions one root may hold (a root is the path before `__ds/`: a tenant's); a
    /// create past it is refused with 429 `SUBSCRIPTION_LIMIT`.
    #[arg(long, default_value_t = 1000)]
    max_subscriptions_per_root: usize,
    /// Streams one subscription may link; a create or a link past it is refused with 429
    /// `LINK_LIMIT`, and a pattern at it links no newly created streams.
    #[arg(long, default_value_t = 100_000)]
    max_links_per_subscription: usize,
    /// What an acknowledged write survives.
    #[arg(long, value_enum, default_value = "sync")]
    durability: DurabilityArg,
    /// Largest append (or create) body in bytes; larger bodies are refused with 413.
    #[arg(long, default_value_t = 64 << 20)]
    max_append_bytes: usize,
    /// Most messages one JSON append (or create) may carry; a longer array is refused with 413.
    #[arg(long, default_value_t = 100_000)]
    max_append_messages: usize,
    /// Largest body one read returns, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_read_bytes: u64,
    /// Largest snapshot blob in bytes; larger ones are refused with 413.
    #[arg(long, default_value_t = 128 << 20)]
    max_snapshot_bytes: u64,
    /// Most bytes of unused staged snapshot parts one tenant (the root of the grant that
    /// admitted them; without access control the stream name's first segment) may hold; more
    /// is refused with 429 `STAGED_PARTS_LIMIT` (default: 2 × `--max-snapshot-bytes`).
    #[arg(long)]
    max_staged_bytes_per_tenant: Option<u64>,
    /// Journal shards: files with their own sync thread, so several fsyncs run at once. Default:
    /// one per two CPUs this process may run on, 1 to 8. Fixed when the store is created.
    #[arg(long)]
    journal_shards: Option<usize>,
    /// Journal bytes per shard between checkpoints: bounds what recovery replays after a crash.
    #[arg(long, default_value_t = 64 << 20)]
    checkpoint_bytes: u64,
    /// Streams kept open at once (in memory, with the maps of their indexes): idle streams
    /// with nothing left to checkpoint beyond it are closed, least recently used first.
    #[arg(long, default_value_t = 16384)]
    max_open_streams: usize,
    /// Descriptors the open streams' segment files may hold (one per segment in use): idle
    /// streams beyond it are put at rest, their files closed until their next use. Default:
    /// what the open-file limit (raised to its hard limit) leaves after a reserve of 256 and
    /// the sockets open now (connections, and those being refused), rounded up to 256, plus
    /// 1024, at least 128, following the sockets as they open and close.
    #[arg(long)]
    max_stream_files: Option<usize>,
    /// Size at which a stream's segment is sealed and a new one started (4 KiB to 1 GiB): the
    /// unit of retention and of the cold tier.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    /// Retention for streams that set no `Stream-Retention-Max-Age`: drop a sealed segment once
    /// its newest message is older than this many seconds. Default: none.
    #[arg(long, value_name = "SECONDS")]
    retention_max_age: Option<u64>,
    /// Retention for streams that set no `Stream-Retention-Max-Bytes`: drop the oldest sealed
    /// segments while a stream retains more than this many bytes. Default: none.
    #[arg(long, value_name = "BYTES")]
    retention_max_bytes: Option<u64>,
    /// How often the retention enforcer looks at the streams, in milliseconds (10 to 3600000).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    retention_interval_ms: u64,
    /// A cold tier on object storage: `s3://bucket/prefix` (credentials, region and endpoint
    /// from the standard AWS_* environment variables) or `file:///dir`. Sealed segments, their
    /// indexes and snapshots are uploaded in the background and may then leave the local disk.
    #[arg(long, value_name = "URL")]
    tier_url: Option<String>,
    /// The S3 endpoint of an S3-compatible server (`http://127.0.0.1:9000`; plain http allowed).
    #[arg(long, value_name = "URL", requires = "tier_url")]
    tier_endpoint: Option<String>,
    /// Bytes of uploaded segment logs that may stay on the local disk (oldest leave first).
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 30, requires = "tier_url")]
    tier_local_budget: u64,
    /// Memory for the cache of cold blocks read back from the tier, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20, requires = "tier_url")]
    tier_cache: u64,
    /// The longest wait between retries of a failed tier pass (the object store down), in
    /// milliseconds; retries start at 200 ms and double up to it.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        requires = "tier_url"
    )]
    tier_retry_max_ms: u64,
    /// Mark cacheable reads `private` instead of `public` (for per-user data behind a CDN).
    #[arg(long)]
    private_cache: bool,
    /// How long a cache may keep an immutable catch-up chunk (an explicit offset before the
    /// tail), in seconds.
    #[arg(long, default_value_t = 365 * 24 * 3600)]
    immutable_max_age_secs: u64,
    /// How long a cache may serve the tail chunk, a read from -1 or a long-poll's 200 without
    /// asking brook again (their max-age), in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    cache_max_age_secs: u64,
    /// How long past that max-age a cache may still serve one while it asks brook again
    /// (stale-while-revalidate), in seconds; 0 leaves the directive out.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    cache_stale_while_revalidate_secs: u64,
    /// Keep caches off the open tail: reads reaching an open tail or starting at -1 are
    /// no-cache, long-polls no-store.
    #[arg(long)]
    cache_revalidate_tail: bool,
    /// Most bytes one catch-up read of a byte stream returns when the client sets no `max_bytes`
    /// (consecutive chunks of at most --max-read-bytes joined without copying); JSON streams
    /// get one chunk.
    #[arg(long, value_name = "N", default_value_t = 64 << 20)]
    catch_up_read_bytes: u64,
    /// Refuse stream names that could not move to a server with Ursula's rules
    /// (`bucket/stream`, the bucket 4-64 of [a-z0-9_-]) and forks.
    #[arg(long)]
    portable_names: bool,
    /// Treat `If-Match` on an append as a precondition on the stream's tail: 412 `TAIL_MOVED`
    /// when the tail moved (brook's extension; off: the header is ignored, as Ursula does).
    #[arg(long)]
    append_if_match: bool,
    /// The URL clients reach this server at, for absolute `Location` headers
    /// (default: http:// and the request's Host).
    #[arg(long)]
    public_url: Option<String>,
    /// Serve TLS (HTTP/2 and HTTP/1.1 by ALPN) with this PEM certificate chain, leaf first.
    /// Reloaded on SIGHUP and when the file changes. Needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a client may take to send a request's headers (or finish the TLS handshake)
    /// before its connection is closed, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    header_read_timeout_ms: u64,
    /// Turn access control on with the bearer tokens listed in FILE (lines of
    /// `sha256:<hex> <rights> <prefix>...`, made by `brook token new`); reloaded when it changes.
    #[arg(long)]
    auth_tokens: Option<PathBuf>,
    #[arg(
        long,
        requires = "auth_jwt_audience",
        help = "Turn access control on for JWTs verified with the key in FILE (the HS256 secret, \
                or the PEM public key for RS256 and EdDSA). Needs --auth-jwt-audience"
    )]
    auth_jwt_key: Option<PathBuf>,
    #[arg(
        long,
        default_value = "EdDSA",
        help = "The JWT signature algorithm: HS256, RS256 or EdDSA"
    )]
    auth_jwt_alg: String,
    /// The `aud` claim a JWT must carry.
    #[arg(long)]
    auth_jwt_audience: Option<String>,
    /// The `iss` claim a JWT must carry (not checked when absent).
    #[arg(long)]
    auth_jwt_issuer: Option<String>,
    /// Connections open at once; one more is answered 503 and closed (keep it below `ulimit -n`).
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// Live readers (SSE connections, long-polls waiting at the tail) at once, over all streams;
    /// one more is answered 503.
    #[arg(long, default_value_t = 10_000)]
    max_live_readers: usize,
    /// Live readers of one stream at once (default: no cap per stream); one more is answered 503.
    #[arg(long)]
    max_live_readers_per_stream: Option<usize>,
    /// Serve plain HTTP/1.1 with hyper's connection loop only, instead of brook's own (which
    /// hands hyper what it does not frame itself); for comparing the two.
    #[arg(long)]
    hyper_http1: bool,
    /// Write large catch-up bodies from the maps instead of sending them from the segment
    /// files with sendfile(2): for clients on the same machine (a proxy or cache in front on
    /// loopback), which then read somewhat faster, at more server CPU per byte.
    #[arg(long)]
    no_sendfile: bool,
    /// Each connection's kernel send buffer: `auto` (a fixed buffer of the bandwidth-delay
    /// product at 10 Gbit/s, at least 128 KiB, for peers a few milliseconds away or nearer; the
    /// kernel's own growth for the rest), `os` (the kernel's growth for every connection), or
    /// a size in bytes for every connection (at least 65536).
    #[arg(long, default_value = "auto", value_name = "auto|os|BYTES", value_parser = parse_send_buffer)]
    send_buffer: SendBuffer,
    /// With access control on, let anyone read the streams under this prefix without a token
    /// (repeatable).
    #[arg(long)]
    public_read: Vec<String>,
    /// Also serve the operations routes (/__brook/metrics, /__brook/live, /__brook/ready,
    /// /__brook/streams), and only those, on this address (e.g. 127.0.0.1:9437).
    #[arg(long, value_name = "HOST:PORT")]
    admin_addr: Option<String>,
}

/// Parses the command line, starts the log, and runs the command; its failure is printed and
/// exits non-zero.
fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server logs to standard output at info; the other commands print their results
    // there, so they log to standard error, warnings only unless RUST_LOG says otherwise.
    let serving = matches!(cli.command, Command::Serve(_));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if serving { "info" } else { "warn" })
    });
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(move || -> Box<dyn std::io::Write> {
            if serving {
                Box::new(std::io::stdout())
            } else {
                Box::new(std::io::stderr())
            }
        });
    match cli.log_format {
        LogFormat::Json => log.json().init(),
        // Colour only for a person at a terminal: a log file or a pipeline gets plain text.
        LogFormat::Text => log
            .with_ansi(if serving {
                std::io::IsTerminal::is_terminal(&std::io::stdout())
            } else {
                std::io::IsTerminal::is_terminal(&std::io::stderr())
            })
            .init(),
    }
    let result = match cli.command {
        Command::Serve(args) => run_serve(&args),
        Command::Token(cmd) => run_token(&cmd),
        Command::Mirror(args) => mirror_cli::run(args),
        Command::Ls(a) => target(&a.target)
            .and_then(|t| ops::ls(&t, &a.prefix, a.long, &mut std::io::stdout().lock())),
        Command::Cat(a) => read_command(&a, false),
        Command::Tail(a) => read_command(&a, true),
        Command::Head(a) => {
            target(&a.target).and_then(|t| ops::head(&t, &a.stream, &mut std::io::stdout().lock()))
        }
        Command::Export(a) => ops::open_store(&a.data_dir).and_then(|s| ops::export(&s, &a.file)),
        Command::Import(a) => ops::import(&a.data_dir, &a.file),
        Command::Check(a) => ops::open_store(&a.data_dir)
            .and_then(|store| ops::check(&store, a.repair, &mut std::io::stdout().lock()))
            .and_then(|clean| {
                if clean {
                    Ok(())
                } else {
                    Err("damage found (see the report above)".to_owned())
                }
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("brook: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The store's default retention policy from `--retention-max-age` and `--retention-max-bytes`.
fn retention_default(args: &ServeArgs) -> brook::RetentionPolicy {
    let mut p = brook::RetentionPolicy::new();
    if let Some(s) = args.retention_max_age {
        p = p.max_age(s);
    }
    if let Some(b) = args.retention_max_bytes {
        p = p.max_bytes(b);
    }
    p
}

/// `brook serve`: opens the store, serves until SIGINT or SIGTERM, then shuts the store down;
/// the error is the message to print.
fn run_serve(args: &ServeArgs) -> Result<(), String> {
    let dir = &args.data_dir;
    // The address first: a port already taken fails before anything touches the data directory.
    let addr = format!("{}:{}", args.host, args.port);
    let listener = std::net::TcpListener::bind(&addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            format!("cannot listen on {addr}: the port is already in use")
        }
        _ => format!("cannot listen on {addr}: {e}"),
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let admin = match &args.admin_addr {
        Some(a) => {
            let l = std::net::TcpListener::bind(a)
                .map_err(|e| format!("cannot listen on --admin-addr {a}: {e}"))?;
            l.set_nonblocking(true)
                .map_err(|e| format!("cannot listen on --admin-addr {a}: {e}"))?;
            Some(l)
        }
        None => None,
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
    let durability = match args.durability {
        DurabilityArg::Sync => Durability::Sync,
        DurabilityArg::Buffered => Durability::Buffered,
    };
    let options = Options::default();
    let shards = args.journal_shards.unwrap_or(options.journal_shards());
    let options = options
        .with_journal_shards(shards)
        .with_durability(durability)
        .with_max_append_bytes(args.max_append_bytes)
        .with_max_append_messages(args.max_append_messages)
        .with_max_read_bytes(args.max_read_bytes)
        .with_max_snapshot_bytes(args.max_snapshot_bytes)
        .with_checkpoint_bytes(args.checkpoint_bytes)
        .with_max_open_streams(args.max_open_streams)
        .with_max_stream_files(args.max_stream_files.unwrap_or_else(|| {
            brook::stream_files_for_descriptors(args.max_connections).unwrap_or(8192)
        }))
        .with_segment_bytes(args.segment_bytes)
        .with_retention_default(retention_default(args))
        .with_retention_interval(Duration::from_millis(args.retention_interval_ms))
        .with_max_subscriptions_per_root(args.max_subscriptions_per_root)
        .with_max_links_per_subscription(args.max_links_per_subscription);
    let options = match args.max_staged_bytes_per_tenant {
        Some(n) => options.with_max_staged_bytes_per_tenant(n),
        None => options,
    };
    let options = match &args.tier_url {
        Some(url) => {
            let mut t = TierOptions::new(url.clone())
                .with_local_budget(args.tier_local_budget)
                .with_cache_bytes(args.tier_cache)
                .with_retry(
                    Duration::from_millis(200).min(Duration::from_millis(args.tier_retry_max_ms)),
                    Duration::from_millis(args.tier_retry_max_ms),
                );
            if let Some(e) = &args.tier_endpoint {
                t = t.with_endpoint(e.clone());
            }
            options.with_tier(t)
        }
        None => options,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            Tls::from_pem_files(cert, key)
                .map_err(|e| format!("cannot load the TLS certificate: {e}"))?,
        ),
        _ => None,
    };
    let access = access_control(args)?;
    if access.is_some() {
        tracing::info!(
            tokens = ?args.auth_tokens,
            jwt_key = ?args.auth_jwt_key,
            public_read = ?args.public_read,
            "access control on"
        );
    }
    let config = ServerConfig {
        access: access.map(std::sync::Arc::new),
        max_connections: args.max_connections,
        lend_descriptors: args.max_stream_files.is_none(),
        max_live_readers: args.max_live_readers,
        max_live_readers_per_stream: args.max_live_readers_per_stream,
        hyper_http1: args.hyper_http1,
        sendfile: !args.no_sendfile,
        send_buffer: args.send_buffer,
        tls: tls.clone(),
        header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        long_poll_timeout: Duration::from_millis(args.long_poll_timeout_ms),
        sse_max_duration: Duration::from_millis(args.sse_max_duration_ms),
        body_read_timeout: Duration::from_millis(args.body_read_timeout_ms),
        body_min_rate: args.body_min_rate,
        body_min_rate_grace: Duration::from_millis(args.body_min_rate_grace_ms),
        body_deadline: Duration::from_millis(args.body_deadline_ms),
        max_memory: args
            .max_memory
            .unwrap_or_else(|| ServerConfig::default().max_memory),
        memory_reserve: args.memory_reserve,
        max_memory_per_peer: args.max_memory_per_peer,
        max_memory_per_token: args.max_memory_per_token,
        write_stall_timeout: Duration::from_millis(args.write_stall_timeout_ms),
        shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
        private_cache: args.private_cache,
        immutable_max_age: Duration::from_secs(args.immutable_max_age_secs),
        cache_max_age: Duration::from_secs(args.cache_max_age_secs),
        cache_stale_while_revalidate: Duration::from_secs(args.cache_stale_while_revalidate_secs),
        cache_revalidate_tail: args.cache_revalidate_tail,
        catch_up_read_bytes: args.catch_up_read_bytes,
        portable_names: args.portable_names,
        append_if_match: if args.append_if_match {
            brook::http::AppendIfMatch::TailPrecondition
        } else {
            brook::http::AppendIfMatch::Ignored
        },
        public_url: args.public_url.clone(),
        webhook_timeout: Duration::from_millis(args.webhook_timeout_ms),
        webhook_allow: args.webhook_allow.clone(),
        ..ServerConfig::default()
    };
    if !config.webhook_allow.is_empty() {
        tracing::info!(webhook_allow = ?config.webhook_allow, "webhooks may also reach these ranges");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let (store, served) = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let admin = admin
            .map(tokio::net::TcpListener::from_std)
            .transpose()
            .map_err(|e| format!("cannot listen on the admin address: {e}"))?;
        let local: SocketAddr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        if let Some(tls) = tls.clone() {
            tokio::spawn(reload_on_hangup(tls));
        }
        let scheme = if args.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(
            "brook {} bound {}://{local}; opening the store in {} (until it is open, requests \
             get 503 STARTING)",
            env!("CARGO_PKG_VERSION"),
            scheme,
            dir.display(),
        );
        if let Some(a) = admin.as_ref().and_then(|a| a.local_addr().ok()) {
            tracing::info!("operations routes (/__brook/...) also on http://{a}");
        }
        let shutdown = shutdown_signal();
        // While the store opens (recovery), the listener answers 503 STARTING (live: 200).
        let owned = dir.clone();
        let opening = tokio::task::spawn_blocking(move || open_store(&owned, options));
        let store = serve_starting(&listener, admin.as_ref(), tls.as_ref(), opening)
            .await
            .map_err(|e| format!("opening the store failed: {e}"))??;
        // The line scripts wait for: from here on streams are served.
        tracing::info!(
            "brook {} listening on {}://{local}, storing streams in {} (durability {})",
            env!("CARGO_PKG_VERSION"),
            scheme,
            dir.display(),
            match durability {
                Durability::Sync => "sync",
                Durability::Buffered => "buffered",
            }
        );
        let served = serve_with_admin(listener, admin, store.clone(), config, shutdown)
            .await
            .map_err(|e| format!("the server failed: {e}"));
        Ok::<_, String>((store, served))
    })?;
    // In-flight requests are done; drain pending writes and checkpoint so the next start
    // replays nothing.
    let closed = store
        .shutdown()
        .map_err(|e| format!("the store did not shut down cleanly: {e}"));
    runtime.shutdown_timeout(Duration::from_secs(5));
    served?;
    closed?;
    tracing::info!("brook stopped");
    Ok(())
}

/// The access control the flags ask for; `None` when none of them is given.
fn access_control(args: &ServeArgs) -> Result<Option<AccessControl>, String> {
    if args.auth_tokens.is_none() && args.auth_jwt_key.is_none() {
        if !args.public_read.is_empty() {
            return Err(
                "--public-read needs access control (--auth-tokens or --auth-jwt-key)".into(),
            );
        }
        return Ok(None);
    }
    let mut access = AccessControl::new();
    if let Some(path) = &args.auth_tokens {
        access = access
            .with_token_file(path)
            .map_err(|e| format!("cannot load the access tokens: {e}"))?;
    }
    if let Some(path) = &args.auth_jwt_key {
        let alg: JwtAlgorithm = args.auth_jwt_alg.parse()?;
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read the JWT key {}: {e}", path.display()))?;
        let audience = args.auth_jwt_audience.as_deref().unwrap_or_default();
        let mut key =
            JwtKey::new(alg, &bytes, audience).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(issuer) = &args.auth_jwt_issuer {
            key = key.with_issuer(issuer);
        }
        access = access.with_jwt(key);
    }
    for prefix in &args.public_read {
        access = access.with_public_read(prefix);
    }
    Ok(Some(access))
}

/// A `--send-buffer` value: `auto`, `os`, or at least [`SendBuffer::MIN`] bytes.
fn parse_send_buffer(s: &str) -> Result<SendBuffer, String> {
    match s {
        "auto" => Ok(SendBuffer::Auto),
        "os" => Ok(SendBuffer::Os),
        _ => match s.parse::<usize>() {
            Ok(bytes) if bytes >= SendBuffer::MIN => Ok(SendBuffer::Bytes(bytes)),
            Ok(_) => Err(format!(
                "a send buffer under {} bytes holds one loopback segment, and every send would \
                 wait for the peer's delayed acknowledgement",
                SendBuffer::MIN
            )),
            Err(_) => Err(format!("{s} is not auto, os or a size in bytes")),
        },
    }
}

/// A `--webhook-allow` value: a CIDR range, or one address.
fn parse_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s} is not a CIDR range (such as 127.0.0.0/8) or an IP address"))
}

/// Opens the store in `dir`; the error is the message to print. `BROOK_TEST_OPEN_DELAY_MS`
/// (a test hook) delays the open, so a test can watch the server while it is starting.
fn open_store(dir: &std::path::Path, options: Options) -> Result<Store, String> {
    if let Some(ms) = std::env::var("BROOK_TEST_OPEN_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
    Store::open(dir, options).map_err(|e| match e {
        Error::Locked(_) => format!(
            "the data directory {} is in use by another brook process (use another --data-dir)",
            dir.display()
        ),
        Error::InvalidArgument(d) => format!("invalid option: {}", flag_message(&d)),
        other => format!("cannot open the data directory {}: {other}", dir.display()),
    })
}

/// An `Options` validation message with the option's name replaced by its `brook serve` flag:
/// `checkpoint_bytes must be ...` becomes `--checkpoint-bytes must be ...`. Any other message is
/// kept as it is.
fn flag_message(message: &str) -> String {
    const FLAGS: [&str; 10] = [
        "max_subscriptions_per_root",
        "max_links_per_subscription",
        "journal_shards",
        "checkpoint_bytes",
        "max_open_streams",
        "max_stream_files",
        "max_append_bytes",
        "max_append_messages",
        "max_read_bytes",
        "max_snapshot_bytes",
    ];
    match message.split_once(' ') {
        Some((option, rest)) if FLAGS.contains(&option) => {
            format!("--{} {rest}", option.replace('_', "-"))
        }
        _ => message.to_owned(),
    }
}

/// Reloads the TLS certificate on every SIGHUP; a certificate that does not load keeps the one
/// in use, and the log says why.
async fn reload_on_hangup(tls: Tls) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!(
                "cannot watch SIGHUP: the certificate reloads only when its files change"
            );
            return;
        };
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                Err(e) => {
                    tracing::warn!(error = %e, "SIGHUP: TLS certificate not reloaded; keeping the one in use");
                }
            }
        }
    }
    #[cfg(not(unix))]
    drop(tls);
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed by this call, not when the future
/// is first polled: a signal that arrives while the store opens is kept, and the server shuts
/// down cleanly as soon as it serves.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (mut interrupt, mut terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let interrupt = async {
                match interrupt.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            let terminate = async {
                match terminate.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = interrupt => {}
                () = terminate => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutting down: finishing in-flight requests");
    }
}
