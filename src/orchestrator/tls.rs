//! HTTPS for the orchestrator: the certificate chain and private key named in the run config's
//! `tls` block (PEM files), served with rustls.
//!
//! - [`load_certified_key`] reads and checks the pair: both files readable, PEM that parses, a
//!   key that belongs to the certificate. Each failure is one [`TlsError`] naming the file.
//! - [`ServerTls`] holds the pair behind a resolver that re-reads the files when they change
//!   ([`ServerTls::reload_if_changed`], polled every [`RELOAD_EVERY`] by the listener), so a
//!   renewal (certbot, an ACME client, a hand-copied file) needs no restart. A pair that fails
//!   to load keeps the previous one in service and logs why.
//! - [`TlsListener`] is an [`axum::serve::Listener`]: it accepts TCP connections and completes
//!   each handshake in its own task (bounded by [`HANDSHAKE_TIMEOUT`]), so a slow or hostile
//!   client never holds up the accept loop; connections whose handshake fails are dropped.
//!
//! The crypto provider is aws-lc-rs, the one reqwest already links.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How often the listener looks for a renewed certificate or key.
pub const RELOAD_EVERY: Duration = Duration::from_secs(30);
/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 128;

/// The `tls` block of a run config: PEM files of the certificate chain (leaf first, then any
/// intermediates) and of its private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The certificate chain, e.g. certbot's `fullchain.pem`.
    pub cert: PathBuf,
    /// The private key, e.g. certbot's `privkey.pem`.
    pub key: PathBuf,
}

/// Why a certificate and key could not be served.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the TLS {what} {}: {source}", path.display())]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not PEM, or holds no item of the kind expected.
    #[error("{} holds no usable PEM {what} ({reason})", path.display())]
    Pem {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error("the key {} does not belong to the certificate {}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The key parses but rustls cannot sign with it (an unsupported algorithm).
    #[error("the key {} cannot be used: {reason}", key.display())]
    UnusableKey {
        /// The key file.
        key: PathBuf,
        /// rustls's complaint.
        reason: String,
    },
    /// rustls refused the server configuration.
    #[error("TLS setup: {0}")]
    Setup(String),
}

impl TlsError {
    /// What the operator should do, in one sentence.
    pub fn advice(&self) -> &'static str {
        match self {
            Self::Read { .. } => {
                "check the paths under `tls:` in the run config and that the orchestrator's user may read them"
            }
            Self::Pem { .. } | Self::UnusableKey { .. } => {
                "give `tls.cert` the PEM certificate chain (-----BEGIN CERTIFICATE-----) and `tls.key` its PEM private key (-----BEGIN PRIVATE KEY-----)"
            }
            Self::Mismatch { .. } => {
                "point `tls.key` at the key the certificate was issued for (certbot: privkey.pem beside fullchain.pem)"
            }
            Self::Setup(_) => "see docs/operators-tls.md",
        }
    }
}

/// The crypto provider of every TLS server and check in iota.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the certificate chain and key of `files` and checks that the key is the
/// certificate's.
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::Pem`], [`TlsError::Mismatch`] or
/// [`TlsError::UnusableKey`], naming the file.
pub fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read("certificate", &files.cert)?;
    let key_pem = read("key", &files.key)?;
    let pem_error = |what, path: &Path, reason: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("certificate", &files.cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem_error(
            "certificate",
            &files.cert,
            "no -----BEGIN CERTIFICATE----- block".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        let reason = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no -----BEGIN PRIVATE KEY----- block".to_string()
            }
            other => other.to_string(),
        };
        pem_error("private key", &files.key, reason)
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
        },
        rustls::Error::InvalidCertificate(_) | rustls::Error::InvalidMessage(_) => {
            pem_error("certificate", &files.cert, e.to_string())
        }
        other => TlsError::UnusableKey {
            key: files.key.clone(),
            reason: other.to_string(),
        },
    })
}

/// Modification times of the two files (`None` when either cannot be read).
fn stamps(files: &TlsFiles) -> Option<(SystemTime, SystemTime)> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((modified(&files.cert)?, modified(&files.key)?))
}

/// The served certificate, re-read from its files when they change.
struct Reloading {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when `current` was loaded (or last tried).
    loaded: Mutex<Option<(SystemTime, SystemTime)>>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock still holds a complete key: a writer only swaps the Arc.
        Some(match self.current.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        })
    }
}

/// The orchestrator's TLS server configuration over a certificate that follows its files.
#[derive(Debug, Clone)]
pub struct ServerTls {
    cert: Arc<Reloading>,
    config: Arc<ServerConfig>,
}

impl ServerTls {
    /// Loads `files` and builds the server configuration (TLS 1.2 and 1.3, HTTP/1.1).
    ///
    /// # Errors
    /// As [`load_certified_key`]; [`TlsError::Setup`] if rustls refuses the configuration.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let stamp = stamps(files);
        let key = load_certified_key(files)?;
        let cert = Arc::new(Reloading {
            files: files.clone(),
            current: RwLock::new(Arc::new(key)),
            loaded: Mutex::new(stamp),
        });
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(cert.clone());
        // axum serves HTTP/1.1 only (its `http2` feature is off).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            cert,
            config: Arc::new(config),
        })
    }

    /// The rustls configuration, for a [`TlsAcceptor`].
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }

    /// The certificate chain now served.
    pub fn served_chain(&self) -> Vec<CertificateDer<'static>> {
        match self.cert.current.read() {
            Ok(k) => k.cert.clone(),
            Err(poisoned) => poisoned.into_inner().cert.clone(),
        }
    }

    /// Re-reads the files if their modification time changed since the last load; returns
    /// whether a new certificate is now served. A pair that does not load (a renewal caught
    /// half-written, a mismatched key) leaves the current one in service; it is tried again
    /// at the next change.
    pub fn reload_if_changed(&self) -> bool {
        let files = &self.cert.files;
        let now = stamps(files);
        {
            let mut loaded = match self.cert.loaded.lock() {
                Ok(l) => l,
                Err(poisoned) => poisoned.into_inner(),
            };
            if now.is_none() || *loaded == now {
                return false;
            }
            *loaded = now;
        }
        match load_certified_key(files) {
            Ok(key) => {
                let mut current = match self.cert.current.write() {
                    Ok(c) => c,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *current = Arc::new(key);
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the changed TLS files do not load; still serving the previous certificate"
                );
                false
            }
        }
    }
}

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A TCP listener whose connections arrive with their TLS handshake done. The accept loop and
/// the certificate watcher run as tasks owned by the listener (stopped when it is dropped).
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    _accepting: AbortOnDrop,
    _watching: AbortOnDrop,
}

impl TlsListener {
    /// Serves TLS with `tls` on `tcp`. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn new(tcp: TcpListener, tls: ServerTls) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(ACCEPT_QUEUE);
        let acceptor = TlsAcceptor::from(tls.config());
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        let watching = tokio::spawn(async move {
            let mut every = tokio::time::interval(RELOAD_EVERY);
            every.tick().await;
            loop {
                every.tick().await;
                tls.reload_if_changed();
            }
        });
        Ok(Self {
            local,
            ready,
            _accepting: AbortOnDrop(accepting),
            _watching: AbortOnDrop(watching),
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task is gone (only when the runtime shuts down): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name` written to `dir/{stem}.crt` and `dir/{stem}.key`.
    fn self_signed(dir: &Path, stem: &str, name: &str) -> TlsFiles {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.cert.pem()).unwrap();
        std::fs::write(&files.key, cert.signing_key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn a_matching_pair_loads() {
        let dir = tempfile::tempdir().unwrap();
        let files = self_signed(dir.path(), "a", "localhost");
        let key = load_certified_key(&files).unwrap();
        assert_eq!(key.cert.len(), 1);
        ServerTls::load(&files).unwrap();
    }

    #[test]
    fn bad_files_are_one_clear_error_each() {
        let dir = tempfile::tempdir().unwrap();
        let a = self_signed(dir.path(), "a", "localhost");
        let b = self_signed(dir.path(), "b", "localhost");
        let line = |files: &TlsFiles| {
            let e = load_certified_key(files).unwrap_err();
            let text = e.to_string();
            assert_eq!(text.lines().count(), 1, "{text}");
            (e, text)
        };
        // A missing file names the file.
        let missing = TlsFiles {
            cert: dir.path().join("nope.crt"),
            ..a.clone()
        };
        let (e, text) = line(&missing);
        assert!(matches!(e, TlsError::Read { .. }), "{text}");
        assert!(
            text.contains("certificate") && text.contains("nope.crt"),
            "{text}"
        );
        // A key that is not the certificate's.
        let crossed = TlsFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let (e, text) = line(&crossed);
        assert!(matches!(e, TlsError::Mismatch { .. }), "{text}");
        assert!(text.contains("b.key") && text.contains("a.crt"), "{text}");
        // Garbage where PEM belongs, in either file.
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "this is not PEM\n").unwrap();
        let (e, text) = line(&TlsFiles {
            cert: garbage.clone(),
            ..a.clone()
        });
        assert!(matches!(e, TlsError::Pem { .. }), "{text}");
        assert!(
            text.contains("garbage.pem") && text.contains("certificate"),
            "{text}"
        );
        let (e, text) = line(&TlsFiles {
            key: garbage.clone(),
            ..a.clone()
        });
        assert!(matches!(e, TlsError::Pem { .. }), "{text}");
        assert!(text.contains("private key"), "{text}");
        // A certificate given as the key, and a PEM block whose body is corrupt.
        let (e, _) = line(&TlsFiles {
            key: a.cert.clone(),
            ..a.clone()
        });
        assert!(matches!(e, TlsError::Pem { .. }));
        let corrupt = dir.path().join("corrupt.pem");
        std::fs::write(
            &corrupt,
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let (e, text) = line(&TlsFiles {
            cert: corrupt,
            ..a.clone()
        });
        assert!(
            matches!(e, TlsError::Pem { .. } | TlsError::UnusableKey { .. }),
            "{text}"
        );
        // The files were only read.
        assert!(load_certified_key(&a).is_ok() && load_certified_key(&b).is_ok());
    }

    #[test]
    fn a_renewed_certificate_is_served_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let files = self_signed(dir.path(), "live", "localhost");
        let tls = ServerTls::load(&files).unwrap();
        let first = tls.served_chain();
        assert!(!tls.reload_if_changed(), "nothing changed yet");
        let set_mtime = |path: &Path, secs: u64| {
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
                .unwrap();
        };
        // A half-written renewal (a key that does not match yet) keeps the old pair.
        let renewed = self_signed(dir.path(), "renewed", "localhost");
        std::fs::copy(&renewed.cert, &files.cert).unwrap();
        set_mtime(&files.cert, 1_000);
        assert!(!tls.reload_if_changed());
        assert_eq!(tls.served_chain(), first);
        // Once both files are in place, the new certificate is served.
        std::fs::copy(&renewed.key, &files.key).unwrap();
        set_mtime(&files.key, 2_000);
        assert!(tls.reload_if_changed());
        assert_ne!(tls.served_chain(), first);
        assert!(!tls.reload_if_changed());
    }
}
