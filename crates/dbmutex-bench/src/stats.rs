//! Latency samples and their percentiles.
//!
//! A sorted `Vec<u32>` of microseconds: a few million samples at most, so
//! exact percentiles cost less than a histogram dependency.

use std::time::{Duration, Instant};

/// Latencies in whole microseconds, one per operation.
#[derive(Debug, Default)]
pub struct Latencies(Vec<u32>);

impl Latencies {
    /// Adds one sample (saturating at `u32::MAX` µs, over an hour).
    pub fn record(&mut self, d: Duration) {
        self.0.push(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    /// Adds another set of samples (from another client).
    pub fn merge(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// The number of samples.
    /// Every latency recorded, in µs, in recording order.
    pub fn micros(&self) -> &[u32] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The 50th and 99th percentiles, `None` without samples.
    pub fn p50_p99(&mut self) -> Option<(u32, u32)> {
        self.0.sort_unstable();
        Some((percentile(&self.0, 0.50)?, percentile(&self.0, 0.99)?))
    }
}

/// Nearest-rank percentile of sorted samples: the smallest sample with at
/// least `q` of all samples at or below it.
fn percentile(sorted: &[u32], q: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// What one client measured.
#[derive(Debug, Default)]
pub struct Sample {
    /// One latency per operation.
    pub lat: Latencies,
    /// From the client's start to the end of its last operation.
    pub seconds: f64,
}

/// Times the operations of one client for a duration:
/// `while t.start() { op; t.stop(); }`.
#[derive(Debug)]
pub struct Timer {
    created: Instant,
    end: Instant,
    began: Instant,
    lat: Latencies,
}

impl Timer {
    /// A timer that lets operations start during `run` from now.
    pub fn run_for(run: Duration) -> Self {
        let now = Instant::now();
        Timer {
            created: now,
            end: now + run,
            began: now,
            lat: Latencies::default(),
        }
    }

    /// Starts timing an operation; false once the deadline has passed.
    pub fn start(&mut self) -> bool {
        self.began = Instant::now();
        self.began < self.end
    }

    /// Records the operation started last.
    pub fn stop(&mut self) {
        self.lat.record(self.began.elapsed());
    }

    /// The samples, and the time from creation to now.
    pub fn finish(self) -> Sample {
        Sample {
            seconds: self.created.elapsed().as_secs_f64(),
            lat: self.lat,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
        let mut l = Latencies::default();
        for us in [30, 10, 20] {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.p50_p99(), Some((20, 30)));
    }
}
