//! The workload: Poisson arrivals over keys and nodes, with demand steps and on/off traffic.
//!
//! The total rate is piecewise constant (steps and on/off periods change it at known instants),
//! so arrivals are drawn exactly: an exponential gap at the current rate, restarted at the next
//! change when it would cross one (the exponential is memoryless). Arrival times, key choices and
//! node choices come from three separate streams, so changing the key mix does not move the
//! arrival times.

use crate::rng::{SimRng, below, exponential, substream, unit};
use crate::scenario::{DemandConfig, RegionsConfig, Scenario, WorkloadConfig};

/// One request arriving at the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Virtual time in nanoseconds.
    pub at_nanos: u64,
    /// The node the client sent it to.
    pub node: u32,
    /// The key's index (0 is the hottest).
    pub key: u32,
    /// Hits.
    pub cost: u64,
}

/// The arrival generator of one run. See the module documentation.
#[derive(Clone, Debug)]
pub struct Workload {
    config: WorkloadConfig,
    nodes: u32,
    /// The network's regions (for demand spread by region).
    regions: Option<RegionsConfig>,
    /// Arrivals per nanosecond at factor 1.
    base_rate: f64,
    duration_nanos: u64,
    now_nanos: u64,
    /// Cumulative weights of the tail keys (indices `hot_keys..keys`); with a per-key workload,
    /// of every key (its limit's rate).
    tail_cdf: Vec<f64>,
    time_rng: SimRng,
    key_rng: SimRng,
    node_rng: SimRng,
}

impl Workload {
    /// The workload of `scenario`, drawing from sub-streams of `seed`.
    pub fn new(scenario: &Scenario, seed: u64) -> Workload {
        let config = scenario.workload.clone();
        let (base_rate, tail_cdf) = if config.per_key {
            let mut total = 0.0;
            let cdf: Vec<f64> = (0..config.keys)
                .map(|key| {
                    total += scenario.key_limit_per_s(key);
                    total
                })
                .collect();
            (config.rate_x_limit * total / 1e9, cdf)
        } else {
            let rate_per_s = config.rate_per_s.unwrap_or(config.rate_x_limit * scenario.limit_per_s());
            (rate_per_s / 1e9, zipf_cdf(config.keys - config.hot_keys, config.tail_zipf))
        };
        Workload {
            config,
            nodes: scenario.nodes,
            regions: scenario.network.regions.clone(),
            base_rate,
            duration_nanos: scenario.duration_nanos(),
            now_nanos: 0,
            tail_cdf,
            time_rng: substream(seed, "workload.time", 0),
            key_rng: substream(seed, "workload.key", 0),
            node_rng: substream(seed, "workload.node", 0),
        }
    }

    /// The next arrival, or `None` once the run's duration is reached.
    pub fn next_arrival(&mut self) -> Option<Arrival> {
        let at_nanos = self.next_time()?;
        self.now_nanos = at_nanos;
        let key = self.pick_key();
        let node = self.pick_node();
        Some(Arrival { at_nanos, node, key, cost: self.config.cost })
    }

    /// The rate multiplier at `t` (steps times on/off).
    pub fn factor_at(&self, t_nanos: u64) -> f64 {
        let step = self.config.steps.iter().filter(|s| ms(s.at_ms) <= t_nanos).max_by_key(|s| s.at_ms);
        let factor = step.map_or(1.0, |s| s.factor);
        let on = match &self.config.on_off {
            Some(o) if t_nanos >= ms(o.start_ms) => {
                (t_nanos - ms(o.start_ms)) % ms(o.on_ms + o.off_ms).max(1) < ms(o.on_ms)
            }
            _ => true,
        };
        if on { factor } else { 0.0 }
    }

    fn next_time(&mut self) -> Option<u64> {
        let mut t = self.now_nanos;
        // Each pass either returns or moves t to the next rate change: bounded by their number.
        while t < self.duration_nanos {
            let rate = self.base_rate * self.factor_at(t);
            let change = self.next_change_after(t);
            if rate > 0.0 {
                let gap = exponential(&mut self.time_rng, rate);
                let at = t as f64 + gap;
                if at < change as f64 {
                    return Some((at as u64).max(t));
                }
            }
            t = change;
        }
        None
    }

    /// The first instant after `t` at which the rate may change (or the end of the run).
    fn next_change_after(&self, t: u64) -> u64 {
        let mut next = self.duration_nanos;
        for step in &self.config.steps {
            if ms(step.at_ms) > t {
                next = next.min(ms(step.at_ms));
            }
        }
        if let Some(o) = &self.config.on_off {
            let start = ms(o.start_ms);
            let cycle = ms(o.on_ms + o.off_ms).max(1);
            let boundary = if t < start {
                start
            } else {
                let into = (t - start) % cycle;
                let on = ms(o.on_ms);
                if into < on { t - into + on } else { t - into + cycle }
            };
            next = next.min(boundary.max(t + 1));
        }
        next
    }

    fn pick_key(&mut self) -> u32 {
        if self.config.per_key {
            let u = unit(&mut self.key_rng) * self.tail_cdf.last().copied().unwrap_or(1.0);
            return self.tail_cdf.partition_point(|c| *c <= u).min(self.tail_cdf.len() - 1) as u32;
        }
        let hot = self.tail_cdf.is_empty() || unit(&mut self.key_rng) < self.config.hot_share;
        if hot {
            return below(&mut self.key_rng, u64::from(self.config.hot_keys)) as u32;
        }
        let u = unit(&mut self.key_rng) * self.tail_cdf.last().copied().unwrap_or(1.0);
        let index = self.tail_cdf.partition_point(|c| *c <= u).min(self.tail_cdf.len() - 1);
        self.config.hot_keys + index as u32
    }

    fn pick_node(&mut self) -> u32 {
        match self.config.demand {
            DemandConfig::Uniform => below(&mut self.node_rng, u64::from(self.nodes)) as u32,
            DemandConfig::Skewed { node, share } => {
                if self.nodes == 1 || unit(&mut self.node_rng) < share {
                    return node;
                }
                let other = below(&mut self.node_rng, u64::from(self.nodes - 1)) as u32;
                if other >= node { other + 1 } else { other }
            }
            DemandConfig::Regions { .. } => self.pick_region_node(),
        }
    }

    /// A region drawn by its weight now, then one of its nodes, evenly.
    fn pick_region_node(&mut self) -> u32 {
        // Validation requires regions with a demand spread by region.
        let Some(count) = self.regions.as_ref().map(|r| r.count.max(1)) else { return 0 };
        let demand = &self.config.demand;
        let weights: Vec<f64> =
            (0..count).map(|r| demand.region_share(r, self.now_nanos).unwrap_or(0.0)).collect();
        let mut u = unit(&mut self.node_rng) * weights.iter().sum::<f64>();
        let mut region = weights.iter().rposition(|w| *w > 0.0).unwrap_or(0) as u32;
        for (r, w) in weights.iter().enumerate() {
            if u < *w {
                region = r as u32;
                break;
            }
            u -= w;
        }
        let members = (self.nodes - region).div_ceil(count);
        region + count * below(&mut self.node_rng, u64::from(members)) as u32
    }
}

fn ms(millis: u64) -> u64 {
    millis.saturating_mul(1_000_000)
}

/// Cumulative Zipf weights `1 / (rank + 1)^s` of `len` keys.
fn zipf_cdf(len: u32, exponent: f64) -> Vec<f64> {
    let mut total = 0.0;
    (0..len)
        .map(|rank| {
            total += 1.0 / f64::from(rank + 1).powf(exponent);
            total
        })
        .collect()
}
