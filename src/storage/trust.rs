//! Which certificates this process's HTTPS clients trust, and what to say when a server's
//! certificate is refused.
//!
//! Every reqwest client of iota (the orchestrator API client, the presigned-URL transfers) is
//! built by [`client_builder`]. It verifies servers against the system's roots: reqwest's
//! `rustls` feature uses rustls-platform-verifier, which on Linux reads the distribution's CA
//! bundle (Debian: `ca-certificates`) and on macOS and Windows asks the OS. For a private run
//! the operator hands out the certificate of the run's own CA. A miner, validator or CLI names
//! it with `--ca-file FILE`, `IOTA_CA_FILE` or `ca_file:` in its settings, and
//! [`trust_ca_file`] adds it to the system's roots for the whole process. S3 presigned URLs
//! therefore keep working, and it must be set before the first client is built.
//!
//! A refused certificate is not retried: [`certificate_problem`] recognises it in a reqwest
//! error, and [`UntrustedCertificate`] says in one line what to do.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustls::CertificateError;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use thiserror::Error;

/// The CA file in force and its certificates (set at most once per process).
struct Trusted {
    path: PathBuf,
    certs: Vec<reqwest::Certificate>,
}

static TRUSTED: OnceLock<Trusted> = OnceLock::new();

/// Why a CA file cannot be used.
#[derive(Debug, Error)]
pub enum CaFileError {
    /// The file could not be read.
    #[error("cannot read the CA file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file holds no PEM certificate, or a malformed one.
    #[error("the CA file {} holds no usable PEM certificate ({reason})", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another CA file is already in force in this process.
    #[error("a CA file is already in use ({}); cannot also trust {}", current.display(), path.display())]
    AlreadySet {
        /// The file in force.
        current: PathBuf,
        /// The file refused.
        path: PathBuf,
    },
}

/// Reads the PEM certificates of `path` (one or more `-----BEGIN CERTIFICATE-----` blocks).
///
/// # Errors
/// [`CaFileError::Read`] or [`CaFileError::Pem`].
pub fn read_ca_file(path: &Path) -> Result<Vec<reqwest::Certificate>, CaFileError> {
    let bytes = std::fs::read(path).map_err(|source| CaFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let pem = |reason: String| CaFileError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let ders = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if ders.is_empty() {
        return Err(pem("no -----BEGIN CERTIFICATE----- block".into()));
    }
    ders.iter()
        .map(|der| reqwest::Certificate::from_der(der).map_err(|e| pem(e.to_string())))
        .collect()
}

/// Trusts the CA certificates in `path`, beside the system's roots, in every HTTPS client this
/// process builds from now on. Calling it again with the same file does nothing.
///
/// # Errors
/// As [`read_ca_file`]; [`CaFileError::AlreadySet`] when another file is in force.
pub fn trust_ca_file(path: &Path) -> Result<(), CaFileError> {
    if let Some(current) = TRUSTED.get() {
        return if current.path == path {
            Ok(())
        } else {
            Err(CaFileError::AlreadySet {
                current: current.path.clone(),
                path: path.to_path_buf(),
            })
        };
    }
    let certs = read_ca_file(path)?;
    let trusted = Trusted {
        path: path.to_path_buf(),
        certs,
    };
    match TRUSTED.set(trusted) {
        Ok(()) => Ok(()),
        // Another thread won the race; it is only a problem if it set another file.
        Err(_) => trust_ca_file(path),
    }
}

/// The CA file in force, if any.
pub fn ca_file() -> Option<&'static Path> {
    TRUSTED.get().map(|t| t.path.as_path())
}

/// A reqwest client builder that verifies servers against the system's roots and the CA file
/// in force ([`trust_ca_file`]).
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match TRUSTED.get() {
        Some(trusted) => builder.tls_certs_merge(trusted.certs.iter().cloned()),
        None => builder,
    }
}

/// Why a server's certificate was refused, in words for the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateProblem {
    /// Signed by an authority this machine does not trust (a private CA, or self-signed).
    UnknownIssuer,
    /// Past its end date.
    Expired,
    /// Before its start date.
    NotValidYet,
    /// Issued for another host name.
    WrongName,
    /// Anything else the verifier refused (revoked, bad signature, ...).
    Other,
}

impl CertificateProblem {
    fn from_rustls(e: &CertificateError) -> Self {
        match e {
            CertificateError::UnknownIssuer => Self::UnknownIssuer,
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => Self::Expired,
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                Self::NotValidYet
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Self::WrongName
            }
            _ => Self::Other,
        }
    }

    /// What is wrong, as a clause.
    pub fn describe(self) -> &'static str {
        match self {
            Self::UnknownIssuer => "it is signed by an authority this machine does not trust",
            Self::Expired => "it has expired",
            Self::NotValidYet => "it is not valid yet",
            Self::WrongName => "it was issued for another host name",
            Self::Other => "the verifier refused it",
        }
    }
}

/// The certificate problem behind `err` (a reqwest error, or anything whose source chain holds
/// rustls's verdict), if a server's certificate was refused.
pub fn certificate_problem(err: &(dyn StdError + 'static)) -> Option<CertificateProblem> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(rustls::Error::InvalidCertificate(c)) = e.downcast_ref::<rustls::Error>() {
            return Some(CertificateProblem::from_rustls(c));
        }
        // `io::Error::source` skips the error it wraps (tokio-rustls wraps rustls's verdict in
        // one, and the connector that one in another): step into it instead.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

/// A server's certificate was refused; the message and [`Self::advice`] say what to do.
#[derive(Debug, Clone, Error)]
#[error("the certificate of {url} is not trusted: {}", problem.describe())]
pub struct UntrustedCertificate {
    /// The server, as the client was told to reach it.
    pub url: String,
    /// Why.
    pub problem: CertificateProblem,
}

impl UntrustedCertificate {
    /// What the user should do, in one sentence.
    pub fn advice(&self) -> String {
        match self.problem {
            CertificateProblem::UnknownIssuer => match ca_file() {
                Some(path) => format!(
                    "the CA file in use ({}) did not sign it: ask the operator for the run's CA certificate and pass it with --ca-file FILE",
                    path.display()
                ),
                None => "for a private run, get the run's CA certificate from the operator and pass --ca-file FILE (or set IOTA_CA_FILE, or `ca_file:` in the settings); a public orchestrator needs a certificate from a public CA".into(),
            },
            CertificateProblem::Expired | CertificateProblem::NotValidYet => {
                "check this machine's clock (`timedatectl`); if it is right, the operator must renew the orchestrator's certificate".into()
            }
            CertificateProblem::WrongName => {
                "use the host name the certificate was issued for in the orchestrator URL (ask the operator for the public URL)".into()
            }
            CertificateProblem::Other => {
                "ask the operator to check the orchestrator's certificate (docs/operators-tls.md)".into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_pem_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = read_ca_file(&missing).unwrap_err();
        assert!(matches!(err, CaFileError::Read { .. }), "{err}");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let err = read_ca_file(&garbage).unwrap_err().to_string();
        assert!(
            err.contains("garbage.pem") && err.contains("no usable PEM"),
            "{err}"
        );
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        assert_eq!(read_ca_file(&good).unwrap().len(), 1);
    }

    #[test]
    fn a_refused_certificate_is_found_through_io_errors() {
        let verdict = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            verdict,
        ));
        assert_eq!(
            certificate_problem(&io),
            Some(CertificateProblem::UnknownIssuer)
        );
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert_eq!(
            certificate_problem(&expired),
            Some(CertificateProblem::Expired)
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(certificate_problem(&refused), None);
        let line = UntrustedCertificate {
            url: "https://o.example".into(),
            problem: CertificateProblem::UnknownIssuer,
        };
        assert!(line.to_string().contains("https://o.example"));
        assert!(line.advice().contains("--ca-file"));
    }
}
