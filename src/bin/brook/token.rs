//! `brook token`: making access tokens and their token-file lines.

use brook::http::token_hash;
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
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

/// `brook token new` and `brook token hash`; the error is the message to print.
pub(crate) fn run_token(cmd: &TokenCommand) -> Result<(), String> {
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
