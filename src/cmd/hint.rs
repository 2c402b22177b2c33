//! One-line errors that say what to do: `main` prints `iota: <error>. What to do: <advice>`
//! when some error in the chain knows a remedy ([`crate::api::client::ClientError::advice`],
//! [`crate::storage::StorageError::advice`], [`crate::miner::MinerError::advice`]), and a
//! panic that reads like a device out of memory gets the same treatment.

use crate::api::client::ClientError;
use crate::miner::MinerError;
use crate::miner::advice::{OUT_OF_MEMORY, is_out_of_memory};
use crate::orchestrator::TlsError;
use crate::storage::StorageError;
use crate::storage::trust::{UntrustedCertificate, certificate_problem};

/// The advice of the first error in the chain that has one; a refused TLS certificate
/// anywhere in the chain (a presigned-URL transfer, say) wins, since it is the root cause.
pub fn advice(err: &anyhow::Error) -> Option<String> {
    let refused = err.chain().find_map(|cause| {
        certificate_problem(cause).map(|problem| {
            UntrustedCertificate {
                url: String::new(),
                problem,
            }
            .advice()
        })
    });
    if refused.is_some() {
        return refused;
    }
    err.chain().find_map(|cause| {
        if let Some(e) = cause.downcast_ref::<MinerError>() {
            e.advice()
        } else if let Some(e) = cause.downcast_ref::<ClientError>() {
            e.advice()
        } else if let Some(e) = cause.downcast_ref::<StorageError>() {
            e.advice().map(str::to_string)
        } else if let Some(e) = cause.downcast_ref::<TlsError>() {
            Some(e.advice().to_string())
        } else if is_out_of_memory(&cause.to_string()) {
            Some(OUT_OF_MEMORY.to_string())
        } else {
            None
        }
    })
}

/// The line `main` prints for `err`: the whole chain on one line, then the advice.
pub fn error_line(err: &anyhow::Error) -> String {
    let text = format!("{err:#}").replace('\n', " ");
    match advice(err) {
        Some(advice) => format!("iota: {text}. What to do: {advice}"),
        None => format!("iota: {text}"),
    }
}

/// Makes a panic that reads like a device allocation failure print one line with the
/// advice (other panics keep the default report).
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_out_of_memory(message) {
            eprintln!("iota: {message}. What to do: {OUT_OF_MEMORY}");
        } else {
            default(info);
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advice_of_a_wrapped_error_reaches_the_line() {
        let err = anyhow::Error::new(ClientError::Unreachable {
            endpoint: "/api/run".into(),
            attempts: 3,
            reason: "connection refused".into(),
        })
        .context("reaching the orchestrator at http://x:1");
        let line = error_line(&err);
        assert!(line.starts_with("iota: reaching the orchestrator at http://x:1: /api/run"));
        assert!(
            line.contains(". What to do: check the orchestrator URL"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        let plain = anyhow::anyhow!("bad\ninput");
        assert_eq!(error_line(&plain), "iota: bad input");
        let oom = anyhow::anyhow!("CUDA out of memory (tried to allocate 2 GiB)");
        assert!(error_line(&oom).contains("lower --max-in-flight"));
    }
}
