//! A graceful stop for long foreground jobs: the first Ctrl-C (SIGINT) or SIGTERM asks the job
//! to stop at its next safe point; a second one ends the process at once.
//!
//! `iota train` checks [`StopRequest::requested`] between steps, then evaluates, saves its
//! checkpoint and reports as if the run had been that long, so that `--resume` continues it
//! and a time-boxed run (`timeout -s TERM ...`) keeps what it learned.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

/// Set once a stop was asked for; shared with the thread that waits for the signals.
#[derive(Debug, Clone, Default)]
pub struct StopRequest {
    flag: Arc<AtomicBool>,
}

impl StopRequest {
    /// Starts a thread that waits for SIGINT and SIGTERM. The handlers are in place when this
    /// returns.
    ///
    /// # Errors
    /// When the signal handlers or the thread cannot be set up.
    pub fn on_signals(what: &'static str) -> anyhow::Result<Self> {
        let stop = Self::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .context("starting the signal thread's runtime")?;
        let (mut interrupt, mut terminate) = runtime
            .block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                Ok::<_, std::io::Error>((
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::terminate())?,
                ))
            })
            .context("installing the SIGINT and SIGTERM handlers")?;
        let flag = stop.flag.clone();
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = interrupt.recv() => {},
                            _ = terminate.recv() => {},
                        }
                        if flag.swap(true, Ordering::SeqCst) {
                            eprintln!("stopped at once (second signal): {what} not finished");
                            std::process::exit(130);
                        }
                        eprintln!(
                            "stop asked for: {what} after the current step (signal again to quit at once)"
                        );
                    }
                });
            })
            .context("starting the signal thread")?;
        Ok(stop)
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Asks for a stop, as a signal would.
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_by_every_clone() {
        let stop = StopRequest::default();
        let seen_by = stop.clone();
        assert!(!seen_by.requested());
        stop.request();
        assert!(seen_by.requested());
    }
}
