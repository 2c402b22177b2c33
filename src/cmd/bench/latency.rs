//! Request latencies recorded by a load benchmark: per endpoint and per window of progress,
//! with exact quantiles (every request is kept).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// One finished request.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Endpoint name (e.g. `work`).
    pub endpoint: &'static str,
    /// Wall time from sending to the whole answer, in milliseconds.
    pub ms: f64,
    /// Which progress window the request started in.
    pub window: u64,
    /// Whether it succeeded (2xx and a parsable answer).
    pub ok: bool,
}

/// Every request of a run, appended by many tasks.
#[derive(Debug, Default)]
pub struct Recorder {
    records: Mutex<Vec<Record>>,
}

impl Recorder {
    /// Adds one request.
    pub fn add(&self, endpoint: &'static str, took: Duration, window: u64, ok: bool) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.push(Record {
            endpoint,
            ms: took.as_secs_f64() * 1000.0,
            window,
            ok,
        });
    }

    /// All requests so far.
    pub fn take(&self) -> Vec<Record> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Count, failures and latency quantiles of a set of requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Requests.
    pub count: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Median latency (ms).
    pub p50: f64,
    /// 99th percentile latency (ms).
    pub p99: f64,
    /// Slowest (ms).
    pub max: f64,
}

/// The `q` quantile (0..=1) of sorted values by the nearest-rank rule.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises the records `keep` selects.
pub fn summarise<'a>(
    records: impl IntoIterator<Item = &'a Record>,
    keep: impl Fn(&Record) -> bool,
) -> Summary {
    let mut ms = Vec::new();
    let mut failed = 0;
    for r in records.into_iter().filter(|r| keep(r)) {
        ms.push(r.ms);
        failed += usize::from(!r.ok);
    }
    ms.sort_by(f64::total_cmp);
    Summary {
        count: ms.len(),
        failed,
        p50: quantile(&ms, 0.5),
        p99: quantile(&ms, 0.99),
        max: ms.last().copied().unwrap_or(f64::NAN),
    }
}

/// Summaries by endpoint.
pub fn by_endpoint(records: &[Record]) -> BTreeMap<&'static str, Summary> {
    let mut names: Vec<&'static str> = records.iter().map(|r| r.endpoint).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| (name, summarise(records, |r| r.endpoint == name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn summaries_split_by_endpoint_and_count_failures() {
        let rec = Recorder::default();
        rec.add("work", Duration::from_millis(2), 0, true);
        rec.add("work", Duration::from_millis(4), 1, false);
        rec.add("submit", Duration::from_millis(8), 1, true);
        let all = rec.take();
        let by = by_endpoint(&all);
        assert_eq!(by["work"].count, 2);
        assert_eq!(by["work"].failed, 1);
        assert_eq!(by["submit"].p99, 8.0);
        let late = summarise(&all, |r| r.window == 1);
        assert_eq!((late.count, late.failed), (2, 1));
        assert!(rec.take().is_empty());
    }
}
