//! Listed tokens: a file of `sha256:<hex> <rights> <prefix>...` lines (format in docs/http.md),
//! holding each token's SHA-256, never the token, and reloaded when it changes.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use super::{Grant, Right, normalize_prefix};

/// The SHA-256 of a token, as a token file stores it: `sha256:<64 lowercase hex>`.
pub fn token_hash(token: &str) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(token.as_bytes());
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Checks one token-file line as the server would read it; the error says what is wrong.
pub fn check_token_line(line: &str) -> Result<(), String> {
    parse_token_file(line).map(drop)
}

/// The parsed lines of a token file: SHA-256 of each token to its grants.
pub(super) type TokenTable = HashMap<[u8; 32], Vec<Grant>>;

/// Parses a token file (format in docs/http.md): `sha256:<hex> <rights> <prefix>...` per line,
/// `#` comments and blank lines ignored. The first bad line fails the whole file.
fn parse_token_file(text: &str) -> Result<TokenTable, String> {
    let mut table = TokenTable::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}", n + 1);
        let mut words = line.split_whitespace();
        let hash = words.next().unwrap_or("");
        let hex = hash
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("a token is `sha256:<64 hex digits>` (see `brook token hash`)"))?;
        let digest = decode_hex32(hex).ok_or_else(|| bad("the hash is not 64 hex digits"))?;
        let rights = parse_rights(words.next().unwrap_or(""))
            .ok_or_else(|| bad("rights are a comma-separated list of read, write, admin"))?;
        let prefixes: Vec<&str> = words.collect();
        if prefixes.is_empty() {
            return Err(bad("no stream-name prefix (`/` for every stream)"));
        }
        let grants = table.entry(digest).or_default();
        for p in prefixes {
            grants.push(Grant {
                prefix: normalize_prefix(p),
                rights,
            });
        }
    }
    Ok(table)
}

/// A comma-separated list of rights as a mask; `None` when empty or with an unknown name.
fn parse_rights(s: &str) -> Option<u8> {
    let mut mask = 0;
    for name in s.split(',') {
        mask |= Right::parse(name.trim())? as u8;
    }
    (mask != 0).then_some(mask)
}

/// 64 hex digits as 32 bytes.
fn decode_hex32(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A token file and the table last read from it.
pub(super) struct TokenFile {
    /// The file.
    pub(super) path: PathBuf,
    /// Its parsed content.
    pub(super) table: RwLock<TokenTable>,
    /// Its modification time and length when last read.
    pub(super) seen: Mutex<Option<(SystemTime, u64)>>,
}

/// A file's modification time and length.
pub(super) fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Reads and parses a token file.
pub(super) fn read_token_file(path: &Path) -> io::Result<TokenTable> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    parse_token_file(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token-file lines parse into grants; every malformed line is refused with its number.
    #[test]
    fn token_files_parse_and_bad_lines_are_refused() {
        let h = token_hash("secret");
        let text = format!("# comment\n\n{h} read,write chat/ /logs/  # trailing\n");
        let table = parse_token_file(&text).expect("valid");
        let digest = decode_hex32(h.strip_prefix("sha256:").expect("prefix")).expect("hex");
        let grants = &table[&digest];
        assert_eq!(grants.len(), 2);
        assert_eq!(grants[1].prefix, "logs/");
        assert_eq!(grants[0].rights, Right::Read as u8 | Right::Write as u8);
        for bad in [
            "md5:00 read /".to_owned(),
            "sha256:abcd read /".to_owned(),
            format!("{h} delete /"),
            format!("{h} read"),
        ] {
            let err = parse_token_file(&format!("\n{bad}")).expect_err(&bad);
            assert!(err.starts_with("line 2:"), "{err}");
        }
    }
}
