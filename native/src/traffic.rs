//! The traffic counters every connection of a proxy shares (connection/traffic.py's `Traffic`, whose Python class
//! stays the fallback without this module): frames and bytes each way and the upstream round trips, per API key,
//! in plain native arrays. The relay's book (book.rs) counts a frame here with no Python object touched; the
//! general path counts through `count_in` / `count_out`; the shell reads the arrays as lists when /metrics is read.

use pyo3::prelude::*;

/// API keys below this are counted per key (Kafka 4.x uses < 100); the rest share the last slot.
pub const KEYS: usize = 128;

/// The slot a key is counted in.
#[inline]
pub fn slot_of(key: i64) -> usize {
    usize::try_from(key).ok().filter(|&k| k < KEYS - 1).unwrap_or(KEYS - 1)
}

#[pyclass(module = "txnguard._native")]
pub struct Traffic {
    bounds: Vec<f64>, // the round trip buckets' upper bounds, seconds (connection/traffic.py's RTT_BUCKETS)
    // *_in: client to broker; *_out: broker to client; by slot. Read as lists (copies) at scrape time.
    #[pyo3(get)]
    frames_in: Vec<u64>,
    #[pyo3(get)]
    bytes_in: Vec<u64>,
    #[pyo3(get)]
    frames_out: Vec<u64>,
    #[pyo3(get)]
    bytes_out: Vec<u64>,
    // per slot: counts per bucket (the last is +Inf), not cumulative; None: none yet
    #[pyo3(get)]
    rtt_buckets: Vec<Option<Vec<u64>>>,
    #[pyo3(get)]
    rtt_sum: Vec<f64>,
}

impl Traffic {
    #[inline]
    pub fn count_in_slot(&mut self, slot: usize, bytes: u64) {
        self.frames_in[slot] += 1;
        self.bytes_in[slot] += bytes;
    }

    #[inline]
    pub fn count_out_slot(&mut self, slot: usize, bytes: u64, seconds: f64) {
        self.frames_out[slot] += 1;
        self.bytes_out[slot] += bytes;
        let bucket = self.bounds.partition_point(|&b| b < seconds); // bisect_left
        let buckets = self.rtt_buckets[slot].get_or_insert_with(|| vec![0; self.bounds.len() + 1]);
        buckets[bucket] += 1;
        self.rtt_sum[slot] += seconds;
    }
}

#[pymethods]
impl Traffic {
    #[new]
    fn new(bounds: Vec<f64>) -> Self {
        Traffic {
            bounds, frames_in: vec![0; KEYS], bytes_in: vec![0; KEYS], frames_out: vec![0; KEYS],
            bytes_out: vec![0; KEYS], rtt_buckets: vec![None; KEYS], rtt_sum: vec![0.0; KEYS],
        }
    }

    /// A request of `key` of `bytes` (length prefix included) went to the broker.
    fn count_in(&mut self, key: i64, bytes: u64) {
        self.count_in_slot(slot_of(key), bytes);
    }

    /// A response of `key` of `bytes` came back after `seconds`.
    fn count_out(&mut self, key: i64, bytes: u64, seconds: f64) {
        self.count_out_slot(slot_of(key), bytes, seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_lands_in_the_first_bucket_not_below_it() {
        let mut t = Traffic::new(vec![0.001, 0.01]);
        t.count_out_slot(3, 10, 0.001); // on a bound: that bucket (bisect_left)
        t.count_out_slot(3, 10, 0.5); // above all: +Inf
        assert_eq!(t.rtt_buckets[3], Some(vec![1, 0, 1]));
        assert_eq!((t.frames_out[3], t.bytes_out[3]), (2, 20));
        assert_eq!(slot_of(-1), KEYS - 1);
        assert_eq!(slot_of(200), KEYS - 1);
        assert_eq!(slot_of(126), 126);
    }
}
