//! What a miner's operator should do about each [`MinerError`], in one sentence.

use super::worker::MinerError;

/// Advice for a device that ran out of memory.
pub const OUT_OF_MEMORY: &str = "the device ran out of memory: lower --max-in-flight (fewer cached inputs), stop other jobs on the GPU, or mine on a device with more memory";

/// Whether an error or panic message reads like an allocation failure of a device.
pub fn is_out_of_memory(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "out of memory",
        "outofmemory",
        "out_of_memory",
        "memory allocation of",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

impl MinerError {
    /// What to do about it, when there is something to do.
    pub fn advice(&self) -> Option<String> {
        if is_out_of_memory(&self.to_string()) {
            return Some(OUT_OF_MEMORY.into());
        }
        match self {
            Self::Client(e) => e.advice(),
            Self::Upload(e) => e.advice().map(str::to_string),
            Self::Runtime(message) if message.contains("--features") => Some(
                "pick a device this binary has (`--device cpu`), or reinstall with the backend: `sh install.sh --from-source --features cuda`".into(),
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::client::ClientError;

    #[test]
    fn each_common_failure_has_advice() {
        let unreachable = MinerError::Client(ClientError::Unreachable {
            endpoint: "/api/work".into(),
            attempts: 30,
            reason: "connection refused".into(),
        });
        assert!(unreachable.advice().unwrap().contains("iota status"));
        let unregistered = MinerError::Client(ClientError::Api {
            endpoint: "/api/work".into(),
            status: 403,
            code: "not_registered".into(),
            message: "unknown hotkey".into(),
        });
        assert!(unregistered.advice().unwrap().contains("iota register"));
        let version = MinerError::Client(ClientError::Version {
            server_api: 2,
            server_version: "0.2.0".into(),
        });
        assert!(version.advice().unwrap().contains("IOTA_VERSION=0.2.0"));
        let expired = MinerError::Upload(crate::storage::StorageError::HttpStatus {
            url: "http://s3/x".into(),
            status: 403,
            attempts: 1,
        });
        assert!(expired.advice().unwrap().contains("clock"));
        let oom = MinerError::Weights("CUDA_ERROR_OUT_OF_MEMORY while loading".into());
        assert_eq!(oom.advice().as_deref(), Some(OUT_OF_MEMORY));
        let malformed = MinerError::Malformed {
            id: 1,
            reason: "no output URL".into(),
        };
        assert!(malformed.advice().is_none());
    }
}
