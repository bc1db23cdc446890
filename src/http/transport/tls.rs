//! TLS for [`serve`](crate::http::serve): a certificate chain and private key read from PEM files,
//! offered through a certificate resolver whose key pair is swapped in place when the files are
//! reloaded, so a renewed certificate takes effect for new handshakes without a restart and
//! without touching open connections.
//!
//! ALPN offers `h2` then `http/1.1`; `serve` runs HTTP/2 or HTTP/1.1 on the connection by what
//! was negotiated (a client without ALPN gets HTTP/1.1). A reload that fails (a missing file, a
//! malformed PEM, a key that does not match the certificate) keeps the certificate in use and
//! says why. The crypto provider is rustls' `ring`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The ALPN protocol id of HTTP/2.
pub(crate) const ALPN_H2: &[u8] = b"h2";

/// The ALPN protocol id of HTTP/1.1.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// A TLS identity for [`serve`](crate::http::serve): the certificate chain and private key of two
/// PEM files, reloadable with [`Tls::reload`] (the server also reloads them when either file
/// changes, checked every [`RELOAD_CHECK_EVERY`](crate::http::RELOAD_CHECK_EVERY); `brook serve` on
/// SIGHUP too). Clones share the identity.
#[derive(Clone)]
pub struct Tls {
    /// The files and the key pair in use.
    inner: Arc<Inner>,
    /// The TLS configuration every handshake uses (its resolver reads `inner.current`).
    config: Arc<rustls::ServerConfig>,
}

/// What every clone of a [`Tls`] shares.
struct Inner {
    /// The PEM file of the certificate chain, leaf first.
    cert_path: PathBuf,
    /// The PEM file of the private key (PKCS#8, PKCS#1 or SEC1).
    key_path: PathBuf,
    /// The key pair handshakes use now.
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times and lengths when they were last read.
    seen: Mutex<Stamp>,
}

/// What identifies a version of the two files without reading them.
type Stamp = [Option<(SystemTime, u64)>; 2];

impl fmt::Debug for Tls {
    /// The two paths.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("cert", &self.inner.cert_path)
            .field("key", &self.inner.key_path)
            .finish_non_exhaustive()
    }
}

/// The crypto provider of every TLS configuration here.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A file's modification time and length, if it can be read.
fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The key pair of the two files, checked to belong together.
fn load(cert_path: &Path, key_path: &Path) -> io::Result<CertifiedKey> {
    let bad = |what: &Path, e: &dyn fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", what.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| bad(cert_path, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert_path, &e))?;
    if certs.is_empty() {
        return Err(bad(cert_path, &"no CERTIFICATE block"));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| bad(key_path, &e))?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|e| bad(key_path, &e))
}

impl Tls {
    /// Reads the certificate chain (PEM, leaf first) and the private key (PEM) for serving TLS.
    /// Fails with the file and the reason when either cannot be read or parsed, or when the key
    /// does not match the certificate.
    pub fn from_pem_files(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> io::Result<Tls> {
        let cert_path = cert.into();
        let key_path = key.into();
        let seen = [stamp_of(&cert_path), stamp_of(&key_path)];
        let pair = load(&cert_path, &key_path)?;
        let inner = Arc::new(Inner {
            cert_path,
            key_path,
            current: RwLock::new(Arc::new(pair)),
            seen: Mutex::new(seen),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| io::Error::other(format!("TLS configuration: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(inner.clone())));
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Ok(Tls {
            inner,
            config: Arc::new(config),
        })
    }

    /// Reads both files again and, if they hold a valid key pair, serves it to new handshakes
    /// (open connections keep theirs). On failure the pair in use stays and the error says why.
    pub fn reload(&self) -> io::Result<()> {
        let seen = [
            stamp_of(&self.inner.cert_path),
            stamp_of(&self.inner.key_path),
        ];
        // Noted before reading: a file that changes again while it is read is read again later.
        *self.inner.seen.lock() = seen;
        let pair = load(&self.inner.cert_path, &self.inner.key_path)?;
        *self.inner.current.write() = Arc::new(pair);
        Ok(())
    }

    /// Whether either file's modification time or length changed since it was last read.
    pub(crate) fn changed_on_disk(&self) -> bool {
        let now = [
            stamp_of(&self.inner.cert_path),
            stamp_of(&self.inner.key_path),
        ];
        *self.inner.seen.lock() != now
    }

    /// The acceptor for incoming connections.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// The paths of the certificate and key files, for log lines.
    pub(crate) fn paths(&self) -> (&Path, &Path) {
        (&self.inner.cert_path, &self.inner.key_path)
    }
}

/// Hands every handshake the key pair in use.
struct Resolver(Arc<Inner>);

impl fmt::Debug for Resolver {
    /// The certificate's path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Resolver").field(&self.0.cert_path).finish()
    }
}

impl ResolvesServerCert for Resolver {
    /// The current key pair, whatever the client asked for (one identity per server).
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.read().clone())
    }
}

/// Reloads `tls` whenever one of its files changes on disk, checking every `every`, until the
/// server shuts down; a failed reload is logged and keeps the certificate in use.
pub(crate) async fn watch(tls: Tls, every: std::time::Duration, app: super::AppState) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = app.shutting_down() => return,
        }
        if tls.changed_on_disk() && !reload_logged(&tls) {
            app.edge
                .tls_reloads_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Reloads `tls` and logs the outcome; false when the reload failed.
fn reload_logged(tls: &Tls) -> bool {
    let (cert, key) = tls.paths();
    match tls.reload() {
        Ok(()) => {
            tracing::info!(cert = %cert.display(), key = %key.display(), "TLS certificate reloaded");
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the one in use");
            false
        }
    }
}
