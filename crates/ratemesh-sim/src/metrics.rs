//! What a run measures: admitted hits against the oracle's, per 100 ms bin.

/// Width of one plot bin.
pub const BIN_NANOS: u64 = 100_000_000;
/// Bins per metrics window (windows are 1 s, tumbling, aligned to virtual time 0).
pub const BINS_PER_WINDOW: usize = 10;
/// The most keys whose admitted hits are also kept per key (the hot keys, for rates against L).
pub const TRACKED_KEYS_MAX: u32 = 16;

/// Counts of one run, filled request by request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorder {
    /// Hits the cluster admitted, per bin of arrival time.
    pub admitted_bins: Vec<u64>,
    /// Hits the oracle admitted, per bin of arrival time.
    pub ideal_bins: Vec<u64>,
    /// Hits the cluster admitted per bin, for each of the first tracked keys (the hot keys).
    pub key_bins: Vec<Vec<u64>>,
    /// Hits the oracle admitted per bin, for each tracked key.
    pub key_ideal_bins: Vec<Vec<u64>>,
    /// Requests that arrived.
    pub requests: u64,
    /// Requests the oracle admitted and the cluster refused.
    pub false_rejects: u64,
    /// Requests the cluster admitted and the oracle refused.
    pub false_admits: u64,
}

impl Recorder {
    /// A recorder for a run of `duration_nanos` that also tracks keys `0..tracked_keys` (at most
    /// [`TRACKED_KEYS_MAX`]) one by one.
    pub fn new(duration_nanos: u64, tracked_keys: u32) -> Recorder {
        let bins = duration_nanos.div_ceil(BIN_NANOS) as usize;
        let tracked = tracked_keys.min(TRACKED_KEYS_MAX) as usize;
        Recorder {
            admitted_bins: vec![0; bins],
            ideal_bins: vec![0; bins],
            key_bins: vec![vec![0; bins]; tracked],
            key_ideal_bins: vec![vec![0; bins]; tracked],
            ..Recorder::default()
        }
    }

    /// Records one request for `key` that arrived at `at_nanos`, with both decisions.
    pub fn record(&mut self, at_nanos: u64, key: u32, cost: u64, ideal: bool, admitted: bool) {
        let bin = ((at_nanos / BIN_NANOS) as usize).min(self.admitted_bins.len().saturating_sub(1));
        self.requests += 1;
        if ideal {
            self.ideal_bins[bin] += cost;
            if let Some(bins) = self.key_ideal_bins.get_mut(key as usize) {
                bins[bin] += cost;
            }
        }
        if admitted {
            self.admitted_bins[bin] += cost;
            if let Some(bins) = self.key_bins.get_mut(key as usize) {
                bins[bin] += cost;
            }
        }
        self.false_rejects += u64::from(ideal && !admitted);
        self.false_admits += u64::from(admitted && !ideal);
    }

    /// Hits admitted by the cluster.
    pub fn admitted(&self) -> u64 {
        self.admitted_bins.iter().sum()
    }

    /// Hits admitted by the oracle.
    pub fn ideal(&self) -> u64 {
        self.ideal_bins.iter().sum()
    }

    /// `(admitted, ideal)` hits per 1-second window.
    pub fn windows(&self) -> Vec<(u64, u64)> {
        windows(&self.admitted_bins).into_iter().zip(windows(&self.ideal_bins)).collect()
    }

    /// `(admitted, ideal)` hits per 1-second window, for each tracked key.
    pub fn key_windows(&self) -> Vec<Vec<(u64, u64)>> {
        let pairs = self.key_bins.iter().zip(&self.key_ideal_bins);
        pairs.map(|(a, i)| windows(a).into_iter().zip(windows(i)).collect()).collect()
    }
}

/// Sums of `bins` per 1-second window.
pub fn windows(bins: &[u64]) -> Vec<u64> {
    bins.chunks(BINS_PER_WINDOW).map(|c| c.iter().sum()).collect()
}

/// Over-admission over a whole run: `(admitted − ideal) / ideal` (negative when the cluster
/// admitted less); 0 when the oracle admitted nothing.
pub fn over_admission(admitted: u64, ideal: u64) -> f64 {
    if ideal == 0 {
        return 0.0;
    }
    (admitted as f64 - ideal as f64) / ideal as f64
}

/// The worst window's over-admission, `max(0, admitted − ideal) / ideal`, skipping windows where
/// the oracle admitted nothing; with the window's index.
pub fn worst_window(windows: &[(u64, u64)]) -> (f64, Option<usize>) {
    let mut worst = (0.0, None);
    for (index, &(admitted, ideal)) in windows.iter().enumerate().filter(|(_, w)| w.1 > 0) {
        let over = admitted.saturating_sub(ideal) as f64 / ideal as f64;
        if worst.1.is_none() || over > worst.0 {
            worst = (over, Some(index));
        }
    }
    worst
}

/// The largest admitted hits of one key in one of the windows `selected` accepts, as a multiple of
/// `limit_per_s`; `None` when it accepts none.
pub fn peak_rate(
    key_windows: &[Vec<(u64, u64)>],
    limit_per_s: f64,
    selected: impl Fn(usize) -> bool,
) -> Option<f64> {
    let admitted = key_windows.iter().flat_map(|w| w.iter().enumerate()).filter(|(i, _)| selected(*i));
    let rates = admitted.map(|(_, (hits, _))| *hits as f64 / limit_per_s);
    rates.fold(None, |max: Option<f64>, r| Some(max.map_or(r, |m| m.max(r))))
}
