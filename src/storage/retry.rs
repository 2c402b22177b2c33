//! When and how long to wait before retrying an HTTP transfer.

use std::time::Duration;

/// Retry policy for transfers to and from presigned URLs.
///
/// # Policy
/// - What is retried: transport errors (connection refused or reset, DNS, timeouts, a body cut
///   off mid-transfer) and the statuses that say "try again later": every 5xx, 429 Too Many
///   Requests and 408 Request Timeout. Any other 4xx is final at once: a bad or expired
///   signature (403), a missing object (404) or a bad range (416) will not fix itself.
/// - How often: at most `max_attempts` attempts in all (the first try included).
/// - How long between: before retry `n` (1-based) the base delay is
///   `min(initial_backoff * 2^(n-1), max_backoff)`; the actual sleep is drawn uniformly from
///   `[base/2, base]` ("equal jitter"), so that many miners failing at once do not retry in
///   lockstep. A `Retry-After: <seconds>` header on a 429 or 503 replaces the base delay,
///   still capped at `max_backoff`.
///
/// The defaults (5 attempts, 250 ms doubling to at most 8 s) ride out a restart of the
/// storage server of about 10 seconds and give up well within a training step's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included; 1 means "never retry". 0 is treated as 1.
    pub max_attempts: u32,
    /// Base delay before the first retry.
    pub initial_backoff: Duration,
    /// Upper bound of any delay, also of a server's `Retry-After`.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries (for tests, and for callers that retry at a higher level).
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Whether attempt number `attempt` (1-based) failing may be followed by another.
    pub fn may_retry(&self, attempt: u32) -> bool {
        attempt < self.max_attempts.max(1)
    }

    /// The base delay before retry number `retry` (1-based), before jitter:
    /// `min(initial_backoff * 2^(retry-1), max_backoff)`.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.initial_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }

    /// The delay to sleep before retry number `retry` (1-based): a server's `retry_after` if
    /// it sent one, capped at `max_backoff`, else the base delay with equal jitter, in
    /// `[base/2, base]`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_backoff);
        }
        let base = self.base_delay(retry);
        let half = base / 2;
        let spread = u64::try_from((base - half).as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(rand::random_range(0..=spread))
    }
}

/// Whether an HTTP status is worth retrying: 5xx, 429 and 408 (see [`RetryPolicy`]).
pub fn is_transient_status(status: u16) -> bool {
    status >= 500 || status == 429 || status == 408
}

/// Whether a transport error is worth retrying: connection, timeout and body errors, i.e.
/// anything but a request we could not even build or a redirect loop.
pub fn is_transient_error(err: &reqwest::Error) -> bool {
    !(err.is_builder() || err.is_redirect() || err.is_status())
        && (err.is_connect() || err.is_timeout() || err.is_request() || err.is_body())
        // A refused certificate stays refused: fail at once with its advice.
        && super::trust::certificate_problem(err).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_delay_doubles_then_caps() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
        };
        let delays: Vec<u64> = (1..=6)
            .map(|n| policy.base_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        // Far-out retries neither overflow nor exceed the cap.
        assert_eq!(policy.base_delay(u32::MAX), Duration::from_millis(1000));
    }

    #[test]
    fn jittered_delay_stays_within_half_and_full_base() {
        let policy = RetryPolicy::default();
        for retry in 1..=6 {
            let base = policy.base_delay(retry);
            for _ in 0..50 {
                let d = policy.delay(retry, None);
                assert!(
                    d >= base / 2 && d <= base,
                    "retry {retry}: {d:?} vs base {base:?}"
                );
            }
        }
    }

    #[test]
    fn retry_after_is_honoured_but_capped() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(8)
        );
    }

    #[test]
    fn attempts_are_counted_including_the_first() {
        let policy = RetryPolicy::default();
        assert!(policy.may_retry(1));
        assert!(policy.may_retry(4));
        assert!(!policy.may_retry(5));
        assert!(!RetryPolicy::none().may_retry(1));
        let zero = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert!(!zero.may_retry(1));
    }

    #[test]
    fn only_server_side_and_throttling_statuses_are_transient() {
        for status in [500, 502, 503, 504, 429, 408] {
            assert!(is_transient_status(status), "{status}");
        }
        for status in [200, 400, 401, 403, 404, 409, 416] {
            assert!(!is_transient_status(status), "{status}");
        }
    }
}
