//! Live checks `iota setup` runs before it writes anything: the orchestrator answers, the
//! storage accepts a write, a read and a delete, and which compute devices are usable.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;

use crate::api::client::ApiClient;
use crate::model::backend::DeviceKind;
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
