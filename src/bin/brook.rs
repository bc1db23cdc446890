//! `brook`: the command line. `brook serve` runs the Durable Streams server over a data
//! directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use brook::http::{AccessControl, JwtAlgorithm, JwtKey, ServerConfig, Tls, serve, token_hash};
use brook::{Durability, Error, Options, Store};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "brook",
    version,
    about = "Durable, append-only, URL-addressed streams"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing would only obscure the match"
)]
enum Command {
    /// Serve the Durable Streams protocol (with Ursula's snapshot, retention and bootstrap routes).
    Serve(ServeArgs),
    /// Make access tokens for `brook serve --auth-tokens`.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a new random token: prints its token-file line on stdout (append it to the file)
    /// and the token itself on stderr (shown once; the file keeps only its hash).
    New {
        /// Comma-separated rights: read, write, admin.
        rights: String,
        /// Stream-name prefixes the rights apply to (`/` for every stream).
        #[arg(required = true)]
        prefixes: Vec<String>,
    },
    /// Print the `sha256:<hex>` hash of a token read from standard input, for a token-file line.
    Hash,
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// An acknowledged write is fsynced: it survives a power loss.
    Sync,
    /// An acknowledged write reached the OS: it survives a crash of brook, not of the machine.
    Buffered,
}

#[derive(clap::Args)]
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
    /// What an acknowledged write survives.
    #[arg(long, value_enum, default_value = "sync")]
    durability: DurabilityArg,
    /// Largest append (or create) body in bytes; larger bodies are refused with 413.
    #[arg(long, default_value_t = 64 << 20)]
    max_append_bytes: usize,
    /// Largest body one read returns, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_read_bytes: u64,
    /// Largest snapshot blob in bytes; larger ones are refused with 413.
    #[arg(long, default_value_t = 128 << 20)]
    max_snapshot_bytes: u64,
    /// Journal shards: files with their own sync thread, so several fsyncs run at once.
    #[arg(long, default_value_t = 2)]
    journal_shards: usize,
    /// Journal bytes per shard between checkpoints: bounds what recovery replays after a crash.
    #[arg(long, default_value_t = 64 << 20)]
    checkpoint_bytes: u64,
    /// Streams kept open (file handles and maps) at once.
    #[arg(long, default_value_t = 4096)]
    max_open_streams: usize,
    /// Mark cacheable reads `private` instead of `public` (for per-user data behind a CDN).
    #[arg(long)]
    private_cache: bool,
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
    /// With access control on, let anyone read the streams under this prefix without a token
    /// (repeatable).
    #[arg(long)]
    public_read: Vec<String>,
}

/// Parses the command line, starts the log, and runs the command; its failure is printed and
/// exits non-zero.
fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or a pipeline gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => run_serve(&args),
        Command::Token(cmd) => run_token(&cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("brook: {message}");
            ExitCode::FAILURE
        }
    }
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
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
    let durability = match args.durability {
        DurabilityArg::Sync => Durability::Sync,
        DurabilityArg::Buffered => Durability::Buffered,
    };
    let options = Options::default()
        .with_durability(durability)
        .with_max_append_bytes(args.max_append_bytes)
        .with_max_read_bytes(args.max_read_bytes)
        .with_max_snapshot_bytes(args.max_snapshot_bytes)
        .with_journal_shards(args.journal_shards)
        .with_checkpoint_bytes(args.checkpoint_bytes)
        .with_max_open_streams(args.max_open_streams);
    let store = Store::open(dir, options).map_err(|e| match e {
        Error::Locked(_) => format!(
            "the data directory {} is in use by another brook process (use another --data-dir)",
            dir.display()
        ),
        Error::InvalidArgument(d) => format!("invalid option: {}", flag_message(&d)),
        other => format!("cannot open the data directory {}: {other}", dir.display()),
    })?;
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
        max_live_readers: args.max_live_readers,
        max_live_readers_per_stream: args.max_live_readers_per_stream,
        tls: tls.clone(),
        header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        long_poll_timeout: Duration::from_millis(args.long_poll_timeout_ms),
        sse_max_duration: Duration::from_millis(args.sse_max_duration_ms),
        private_cache: args.private_cache,
        public_url: args.public_url.clone(),
        ..ServerConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local: SocketAddr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        if let Some(tls) = tls {
            tokio::spawn(reload_on_hangup(tls));
        }
        tracing::info!(
            "brook {} listening on {}://{local}, storing streams in {} (durability {})",
            env!("CARGO_PKG_VERSION"),
            if args.tls_cert.is_some() {
                "https"
            } else {
                "http"
            },
            dir.display(),
            match durability {
                Durability::Sync => "sync",
                Durability::Buffered => "buffered",
            }
        );
        serve(listener, store.clone(), config, shutdown_signal())
            .await
            .map_err(|e| format!("the server failed: {e}"))
    });
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

/// `brook token new` and `brook token hash`; the error is the message to print.
fn run_token(cmd: &TokenCommand) -> Result<(), String> {
    match cmd {
        TokenCommand::New { rights, prefixes } => {
            let mut random = [0u8; 32];
            std::io::Read::read_exact(
                &mut std::fs::File::open("/dev/urandom")
                    .map_err(|e| format!("cannot read /dev/urandom: {e}"))?,
                &mut random,
            )
            .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
            // 256 random bits in base64url: 47 bytes in all, so checking one costs a single
            // SHA-256 block.
            let token = format!(
                "brk_{}",
                base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, random)
            );
            let line = format!("{} {rights} {}", token_hash(&token), prefixes.join(" "));
            // The line must parse as the server will read it.
            brook::http::check_token_line(&line)?;
            println!("{line}");
            eprintln!("token: {token}");
            Ok(())
        }
        TokenCommand::Hash => {
            let mut token = String::new();
            std::io::stdin()
                .read_line(&mut token)
                .map_err(|e| format!("cannot read the token from standard input: {e}"))?;
            let token = token.trim();
            if token.is_empty() {
                return Err("no token on standard input".into());
            }
            println!("{}", token_hash(token));
            Ok(())
        }
    }
}

/// An `Options` validation message with the option's name replaced by its `brook serve` flag:
/// `checkpoint_bytes must be ...` becomes `--checkpoint-bytes must be ...`. Any other message is
/// kept as it is.
fn flag_message(message: &str) -> String {
    const FLAGS: [&str; 6] = [
        "journal_shards",
        "checkpoint_bytes",
        "max_open_streams",
        "max_append_bytes",
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

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
