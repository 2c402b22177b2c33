//! Live checks `iota setup` runs before it writes anything: the orchestrator answers, the
//! storage accepts a write, a read and a delete, the orchestrator's certificate loads and
//! serves a verified TLS handshake, and which compute devices are usable.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;

use crate::api::client::ApiClient;
use crate::model::backend::DeviceKind;
use crate::orchestrator::{ServerTls, TlsFiles, TlsListener};
use crate::storage::trust::{CertificateProblem, certificate_problem, client_builder};
use crate::storage::{ObjectKey, RetryPolicy, Storage, StorageConfig};

/// How long one live check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Asks the orchestrator at `url` for its run; returns a one-line description.
///
/// # Errors
/// Unreachable, or not an iota orchestrator.
pub fn check_orchestrator(url: &str) -> anyhow::Result<String> {
    let policy = RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(300),
        max_backoff: Duration::from_millis(300),
    };
    let info = runtime()?.block_on(async {
        tokio::time::timeout(CHECK_TIMEOUT, async {
            let client = ApiClient::new(url, None, String::new(), policy)?;
            client.run_info().await
        })
        .await
    });
    let info = match info {
        Ok(result) => result.with_context(|| format!("reaching the orchestrator at {url}"))?,
        Err(_) => bail!("the orchestrator at {url} did not answer within {CHECK_TIMEOUT:?}"),
    };
    Ok(format!(
        "run {:?}, {} sections, epoch {}, phase {:?}",
        info.run,
        info.model.n_sections(),
        info.epoch,
        info.phase
    ))
}

/// Writes, reads back and deletes a probe object in the storage `config` describes.
///
/// # Errors
/// The storage cannot be opened, or any of the three operations fails (the message names it).
pub fn check_storage(config: &StorageConfig) -> anyhow::Result<()> {
    let storage = Storage::open(config).context("opening the storage")?;
    let key = ObjectKey::parse(&format!("setup-check/probe-{}", std::process::id()))
        .context("building the probe key")?;
    let probe = Bytes::from_static(b"iota setup connectivity check");
    let outcome = runtime()?.block_on(async {
        tokio::time::timeout(CHECK_TIMEOUT, async {
            storage
                .put(&key, probe.clone())
                .await
                .context("writing a probe object")?;
            let back = storage.get(&key).await.context("reading it back")?;
            if back != probe {
                bail!("the object read back differs from the one written");
            }
            storage.delete(&key).await.context("deleting it")?;
            Ok(())
        })
        .await
    });
    match outcome {
        Ok(result) => result.with_context(|| format!("storage {}", config.url)),
        Err(_) => bail!(
            "storage {}: no answer within {CHECK_TIMEOUT:?} (check the endpoint)",
            config.url
        ),
    }
}

/// Loads the certificate and key of `files`, serves them on a loopback port, and connects to
/// that port as a miner would reach `public_url` (its host name resolved to loopback), verifying
/// the certificate against this machine's roots and the CA file in force. Returns a one-line
/// description. A certificate signed by an authority the roots do not hold is accepted with a
/// note (a private run: miners need `--ca-file`); for a `public_url` whose host is an IP
/// address only the handshake is checked.
///
/// # Errors
/// The files do not load (missing, not PEM, key not the certificate's); the certificate has
/// expired, is not valid yet, or is not issued for `public_url`'s host.
pub fn check_tls(files: &TlsFiles, public_url: &str) -> anyhow::Result<String> {
    let tls = ServerTls::load(files)?;
    let chain = tls.served_chain();
    let url = url::Url::parse(public_url).with_context(|| format!("parsing {public_url}"))?;
    let host = url
        .host_str()
        .with_context(|| format!("{public_url} names no host"))?
        .to_string();
    let by_name = matches!(url.host(), Some(url::Host::Domain(_)));
    let outcome = runtime()?.block_on(async {
        let tcp = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding a loopback port for the check")?;
        let addr = tcp.local_addr().context("reading the check's address")?;
        let listener = TlsListener::new(tcp, tls).context("starting TLS")?;
        let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let builder = client_builder().timeout(CHECK_TIMEOUT);
        let (client, target) = if by_name {
            (
                builder.resolve(&host, addr),
                format!("https://{host}:{}/health", addr.port()),
            )
        } else {
            (
                builder.tls_danger_accept_invalid_certs(true),
                format!("https://{addr}/health"),
            )
        };
        let client = client.build().context("building the check's client")?;
        let answer = client.get(&target).send().await;
        server.abort();
        anyhow::Ok(answer)
    })?;
    let trusted_by = match crate::storage::trust::ca_file() {
        Some(ca) => format!("this machine's roots and {}", ca.display()),
        None => "this machine's roots".to_string(),
    };
    match outcome {
        Ok(r) if r.status().is_success() && by_name => Ok(format!(
            "certificate for {host} served over TLS and trusted by {trusted_by}"
        )),
        Ok(r) if r.status().is_success() => Ok(
            "certificate served over TLS (the public URL names an IP address, so its name and issuer were not checked: use a host name for a public run)".to_string(),
        ),
        Ok(r) => bail!("the TLS check's server answered HTTP {}", r.status()),
        Err(e) => match certificate_problem(&e) {
            Some(CertificateProblem::UnknownIssuer) => {
                // The chain stops the verifier before the name: check the name by itself.
                if by_name && !issued_for(&chain, &host) {
                    bail!(
                        "the certificate {} does not verify for {host}: {}",
                        files.cert.display(),
                        CertificateProblem::WrongName.describe()
                    );
                }
                Ok(format!(
                    "certificate for {host} served over TLS, signed by an authority {trusted_by} do not hold: fine for a private run, whose miners and validators need the CA certificate (--ca-file; give it to setup too, and the chain and dates are checked as well)"
                ))
            }
            Some(problem) => bail!(
                "the certificate {} does not verify for {host}: {}",
                files.cert.display(),
                problem.describe()
            ),
            None => {
                Err(anyhow::Error::new(e).context("the TLS handshake with the certificate failed"))
            }
        },
    }
}

/// Whether the leaf of `chain` names `host` (DNS or IP subject alternative names).
fn issued_for(chain: &[rustls::pki_types::CertificateDer<'static>], host: &str) -> bool {
    let (Some(leaf), Ok(name)) = (
        chain.first(),
        rustls::pki_types::ServerName::try_from(host.to_string()),
    ) else {
        return false;
    };
    rustls::server::ParsedCertificate::try_from(leaf)
        .and_then(|parsed| rustls::client::verify_server_name(&parsed, &name))
        .is_ok()
}

/// A device the user may pick, with what was detected about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    /// The device.
    pub kind: DeviceKind,
    /// A description: what was found.
    pub label: String,
}

/// Whether an NVIDIA driver is loaded on this machine.
fn nvidia_present() -> bool {
    Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidiactl").exists()
}

/// The devices this binary can use here, best first, and a note about any GPU it cannot.
pub fn device_choices() -> (Vec<DeviceChoice>, Option<String>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpu = nvidia_present();
    let mut choices = Vec::new();
    if DeviceKind::Cuda.compiled_in() {
        let found = if gpu {
            "NVIDIA driver found"
        } else {
            "no NVIDIA driver seen"
        };
        choices.push(DeviceChoice {
            kind: DeviceKind::Cuda,
            label: format!("cuda ({found})"),
        });
    }
    if DeviceKind::Wgpu.compiled_in() {
        choices.push(DeviceChoice {
            kind: DeviceKind::Wgpu,
            label: "wgpu (Vulkan / Metal / DX12)".into(),
        });
    }
    let cpu = DeviceChoice {
        kind: DeviceKind::Cpu,
        label: format!("cpu ({cores} cores)"),
    };
    // A CUDA build on a machine without a driver should not default to CUDA.
    if gpu || choices.is_empty() {
        choices.push(cpu);
    } else {
        choices.insert(0, cpu);
    }
    let note = (gpu && !DeviceKind::Cuda.compiled_in()).then(|| {
        "an NVIDIA GPU is present but this iota was built without CUDA: reinstall with `sh install.sh --from-source --features cuda`".to_string()
    });
    (choices, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_offered_and_a_local_store_passes_the_check() {
        let (choices, _) = device_choices();
        assert!(choices.iter().any(|c| c.kind == DeviceKind::Cpu));
        let dir = tempfile::tempdir().unwrap();
        check_storage(&StorageConfig::local(dir.path().display().to_string())).unwrap();
        // The probe is removed again.
        let probe = dir
            .path()
            .join(format!("setup-check/probe-{}", std::process::id()));
        assert!(!probe.exists());
        let err = check_storage(&StorageConfig::local("ftp://nowhere")).unwrap_err();
        assert!(format!("{err:#}").contains("unsupported scheme"), "{err:#}");
    }

    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    /// A fresh CA: its certificate's PEM and the issuer that signs with it.
    fn test_ca() -> (String, Issuer<'static, KeyPair>) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = ca.self_signed(&key).unwrap().pem();
        (pem, Issuer::new(ca, key))
    }

    /// A certificate for `name` signed by `issuer`, written to `dir`; `expired` dates it in
    /// 2020.
    fn signed_pair(
        dir: &Path,
        issuer: &Issuer<'static, KeyPair>,
        name: &str,
        expired: bool,
    ) -> TlsFiles {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 6, 1);
        }
        let cert = params.signed_by(&key, issuer).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}-{expired}.pem")),
            key: dir.join(format!("{name}-{expired}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn the_tls_check_serves_the_pair_and_verifies_it_as_a_miner_would() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, issuer) = test_ca();
        // A private CA: served and accepted, with the note that miners need the CA file.
        let private = signed_pair(dir.path(), &issuer, "orchestrator.test", false);
        let line = check_tls(&private, "https://orchestrator.test:8700").unwrap();
        assert!(line.contains("--ca-file"), "{line}");
        // Issued for another name: refused, saying why, even before the CA is known.
        let err = check_tls(&private, "https://elsewhere.test").unwrap_err();
        assert!(format!("{err:#}").contains("another host name"), "{err:#}");
        // A public URL naming an IP address: the handshake alone.
        let by_ip = signed_pair(dir.path(), &issuer, "127.0.0.1", false);
        assert!(check_tls(&by_ip, "https://127.0.0.1:8700").is_ok());
        // Files that do not load never reach the handshake.
        let expired = signed_pair(dir.path(), &issuer, "orchestrator.test", true);
        let crossed = TlsFiles {
            cert: private.cert.clone(),
            key: expired.key.clone(),
        };
        let err = check_tls(&crossed, "https://orchestrator.test").unwrap_err();
        assert!(format!("{err:#}").contains("does not belong"), "{err:#}");
        // With the CA trusted (as `--ca-file` does) the chain verifies and dates are checked.
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        crate::storage::trust::trust_ca_file(&ca_file).unwrap();
        let line = check_tls(&private, "https://orchestrator.test").unwrap();
        assert!(
            line.contains("trusted by this machine's roots and"),
            "{line}"
        );
        let err = check_tls(&expired, "https://orchestrator.test").unwrap_err();
        assert!(format!("{err:#}").contains("has expired"), "{err:#}");
    }

    #[test]
    fn an_unreachable_orchestrator_is_a_clear_error() {
        // Port 9 (discard) on loopback: nothing listens in the test environment.
        let err = check_orchestrator("http://127.0.0.1:9").unwrap_err();
        assert!(
            format!("{err:#}").contains("reaching the orchestrator at http://127.0.0.1:9"),
            "{err:#}"
        );
    }
}
