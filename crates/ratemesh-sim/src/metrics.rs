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
    /// `(admitted, ideal)` hits per key per 1-second window, `key * windows + window`: the worst
    /// window over every key.
    pub key_windows_all: Vec<(u32, u32)>,
    /// 1-second windows per key in `key_windows_all`.
    pub windows_per_key: usize,
    /// Nodes requests arrive at.
    pub nodes: usize,
    /// `(admitted, ideal)` hits per tracked key per node the request arrived at,
    /// `key * nodes + node`: fairness.
    pub node_hits: Vec<(u64, u64)>,
    /// The region of each node (empty without regions).
    pub region_of: Vec<u32>,
    /// Hits the cluster admitted per bin, for each region the requests arrived in.
    pub region_bins: Vec<Vec<u64>>,
    /// Hits the oracle admitted per bin, for each region the requests arrived in.
    pub region_ideal_bins: Vec<Vec<u64>>,
}

impl Recorder {
    /// A recorder for a run of `duration_nanos` that also tracks keys `0..tracked_keys` (at most
    /// [`TRACKED_KEYS_MAX`]) one by one.
    /// One window per key over every one of `keys` keys, and per node (of `nodes`) for the tracked
    /// ones (fairness).
    pub fn new(duration_nanos: u64, tracked_keys: u32, keys: u32, nodes: u32) -> Recorder {
        let bins = duration_nanos.div_ceil(BIN_NANOS) as usize;
        let tracked = tracked_keys.min(TRACKED_KEYS_MAX) as usize;
        let windows_per_key = bins.div_ceil(BINS_PER_WINDOW).max(1);
        Recorder {
            admitted_bins: vec![0; bins],
            ideal_bins: vec![0; bins],
            key_bins: vec![vec![0; bins]; tracked],
            key_ideal_bins: vec![vec![0; bins]; tracked],
            key_windows_all: vec![(0, 0); windows_per_key * keys as usize],
            windows_per_key,
            nodes: nodes as usize,
            node_hits: vec![(0, 0); tracked * nodes as usize],
            ..Recorder::default()
        }
    }

    /// The same recorder, also counting hits per region: node `n` is in region `region_of[n]`, of
    /// `regions`.
    pub fn with_regions(mut self, region_of: Vec<u32>, regions: u32) -> Recorder {
        let bins = self.admitted_bins.len();
        self.region_bins = vec![vec![0; bins]; regions as usize];
        self.region_ideal_bins = vec![vec![0; bins]; regions as usize];
        self.region_of = region_of;
        self
    }

    /// Records one request for `key` that arrived at `at_nanos` at `node`, with both decisions.
    pub fn record(&mut self, at_nanos: u64, key: u32, node: u32, cost: u64, ideal: bool, admitted: bool) {
        let bin = ((at_nanos / BIN_NANOS) as usize).min(self.admitted_bins.len().saturating_sub(1));
        let window = (bin / BINS_PER_WINDOW).min(self.windows_per_key - 1);
        let hits = u32::try_from(cost).unwrap_or(u32::MAX);
        if let Some(w) = self.key_windows_all.get_mut(key as usize * self.windows_per_key + window) {
            w.0 = w.0.saturating_add(if admitted { hits } else { 0 });
            w.1 = w.1.saturating_add(if ideal { hits } else { 0 });
        }
        if (key as usize) < self.key_bins.len()
            && let Some(n) = self.node_hits.get_mut(key as usize * self.nodes + node as usize)
        {
            n.0 += if admitted { cost } else { 0 };
            n.1 += if ideal { cost } else { 0 };
        }
        self.requests += 1;
        if let Some(&region) = self.region_of.get(node as usize) {
            self.region_bins[region as usize][bin] += if admitted { cost } else { 0 };
            self.region_ideal_bins[region as usize][bin] += if ideal { cost } else { 0 };
        }
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

impl Recorder {
    /// The worst 1-second window of any single key: `(over-admission, key, window)`, as
    /// [`worst_window`] judges one key's windows.
    pub fn worst_key_window(&self) -> (f64, Option<(u32, usize)>) {
        let mut worst = (0.0, None);
        for (key, windows) in self.key_windows_all.chunks(self.windows_per_key.max(1)).enumerate() {
            for (index, &(admitted, ideal)) in windows.iter().enumerate().filter(|(_, w)| w.1 > 0) {
                let over = admitted.saturating_sub(ideal) as f64 / f64::from(ideal);
                if worst.1.is_none() || over > worst.0 {
                    worst = (over, Some((key as u32, index)));
                }
            }
        }
        worst
    }

    /// Fairness: over the tracked keys the ideal admitted something of, the worst node's
    /// `|admitted from it − ideal admitted from it|` over the key's ideal admitted hits; with the
    /// key and node. `None` when no tracked key had an ideal admission.
    pub fn fairness(&self) -> Option<(f64, u32, u32)> {
        let mut worst: Option<(f64, u32, u32)> = None;
        for (key, nodes) in self.node_hits.chunks(self.nodes.max(1)).enumerate() {
            let ideal: u64 = nodes.iter().map(|n| n.1).sum();
            if ideal == 0 {
                continue;
            }
            for (node, &(admitted, node_ideal)) in nodes.iter().enumerate() {
                let gap = admitted.abs_diff(node_ideal) as f64 / ideal as f64;
                if worst.is_none_or(|w| gap > w.0) {
                    worst = Some((gap, key as u32, node as u32));
                }
            }
        }
        worst
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
/// that key's limit per second (`limit_per_s(key)`); `None` when it accepts none.
pub fn peak_rate(
    key_windows: &[Vec<(u64, u64)>],
    limit_per_s: impl Fn(usize) -> f64,
    selected: impl Fn(usize) -> bool,
) -> Option<f64> {
    let admitted = key_windows
        .iter()
        .enumerate()
        .flat_map(|(key, w)| w.iter().enumerate().map(move |(i, hits)| (key, i, hits)))
        .filter(|(_, i, _)| selected(*i));
    let rates = admitted.map(|(key, _, (hits, _))| *hits as f64 / limit_per_s(key));
    rates.fold(None, |max: Option<f64>, r| Some(max.map_or(r, |m| m.max(r))))
}

/// After a change at bin `from`, the bins until the first step `b` (before `until`) at which the
/// next second's admitted hits, bins `b..b + BINS_PER_WINDOW`, are at least `fraction` of the
/// ideal's (skipping steps where the ideal admitted nothing); `None` when no step before `until`
/// reaches it.
pub fn bins_to_reach(
    admitted: &[u64],
    ideal: &[u64],
    from: usize,
    until: usize,
    fraction: f64,
) -> Option<usize> {
    let last = until.min(admitted.len()).saturating_sub(BINS_PER_WINDOW);
    (from..=last)
        .find(|&b| {
            let window = b..b + BINS_PER_WINDOW;
            let got: u64 = admitted[window.clone()].iter().sum();
            let wanted: u64 = ideal[window].iter().sum();
            wanted > 0 && got as f64 >= fraction * wanted as f64
        })
        .map(|b| b - from)
}
