//! The network model: what happens to one message between two nodes.
//!
//! Each directed link has a delay distribution, a loss and a duplication probability, and its own
//! random stream (so one link's traffic never moves another link's draws). With regions, a link
//! between two regions has half their round trip as its delay. Cuts (partitions and one-way
//! partitions) drop every message on the links they cover, without drawing; lossy spells (loss
//! between regions for a while) add a loss probability to the links they cover, without changing
//! the number of draws. Reordering
//! falls out of independent random delays. The model only decides fates; the engine schedules
//! the deliveries.

use crate::rng::{SimRng, chance, standard_normal, substream, unit};
use crate::scenario::{DelayConfig, NetworkConfig};

/// The parameters of one directed link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkModel {
    delay: DelayConfig,
    loss: f64,
    duplicate: f64,
}

impl LinkModel {
    /// Draws one delay in nanoseconds.
    fn delay_nanos(&self, rng: &mut SimRng) -> u64 {
        let ms = match self.delay {
            DelayConfig::Uniform { min_ms, max_ms } => min_ms + (max_ms - min_ms) * unit(rng),
            DelayConfig::Lognormal { median_ms, sigma, max_ms } => {
                (median_ms * (sigma * standard_normal(rng)).exp()).min(max_ms)
            }
        };
        (ms * 1e6).max(0.0) as u64
    }
}

/// What became of one message: at most two copies, each delivered after its delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fate {
    /// Delays of the delivered copies, in nanoseconds (`None`: that copy was lost or not sent).
    pub copies: [Option<u64>; 2],
    /// The link was cut: nothing was drawn, nothing is delivered.
    pub cut: bool,
}

impl Fate {
    /// The delays of the copies that are delivered.
    pub fn deliveries(&self) -> impl Iterator<Item = u64> + '_ {
        self.copies.iter().flatten().copied()
    }
}

/// Traffic counters of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeTraffic {
    /// Messages sent.
    pub sent_msgs: u64,
    /// Bytes sent.
    pub sent_bytes: u64,
}

/// Counters of the whole network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Messages offered to the network.
    pub sent: u64,
    /// Copies lost to random loss.
    pub lost: u64,
    /// Messages dropped by a cut link.
    pub cut: u64,
    /// Messages duplicated.
    pub duplicated: u64,
}

/// A lossy spell: its id, the directed links it covers, and the loss it adds.
type Spell = (u64, Vec<(u32, u32)>, f64);

/// The network of `nodes` nodes. See the module documentation.
#[derive(Clone, Debug)]
pub struct Network {
    nodes: usize,
    links: Vec<LinkModel>,
    rngs: Vec<SimRng>,
    /// How many active cuts cover each directed link (`from * nodes + to`).
    cut_count: Vec<u32>,
    cuts: Vec<(u64, Vec<(u32, u32)>)>,
    /// Loss added by active lossy spells to each directed link (0: none).
    spell_loss: Vec<f64>,
    spells: Vec<Spell>,
    traffic: Vec<NodeTraffic>,
    /// Regions (0 without).
    regions: usize,
    /// The region of each node (empty without regions).
    region_of: Vec<u32>,
    /// Traffic from region `a` to region `b`, `a * regions + b` (empty without regions).
    region_traffic: Vec<NodeTraffic>,
    stats: NetworkStats,
}

impl Network {
    /// The network of `config` between `nodes` nodes, drawing from sub-streams of `seed`.
    pub fn new(config: &NetworkConfig, nodes: u32, seed: u64) -> Network {
        let n = nodes as usize;
        let regions = config.regions.as_ref().map_or(0, |r| r.count as usize);
        let mut links = Vec::with_capacity(n * n);
        let mut rngs = Vec::with_capacity(n * n);
        for from in 0..nodes {
            for to in 0..nodes {
                links.push(link_model(config, from, to));
                rngs.push(substream(seed, "network.link", u64::from(from) << 32 | u64::from(to)));
            }
        }
        Network {
            nodes: n,
            links,
            rngs,
            cut_count: vec![0; n * n],
            cuts: Vec::new(),
            spell_loss: vec![0.0; n * n],
            spells: Vec::new(),
            traffic: vec![NodeTraffic::default(); n],
            regions,
            region_of: config
                .regions
                .as_ref()
                .map_or(Vec::new(), |r| (0..nodes).map(|n| r.region_of(n)).collect()),
            region_traffic: vec![NodeTraffic::default(); regions * regions],
            stats: NetworkStats::default(),
        }
    }

    /// Decides the fate of a message of `len` bytes from `from` to `to`, and counts it.
    pub fn send(&mut self, from: u32, to: u32, len: usize) -> Fate {
        let link = self.index(from, to);
        let traffic = &mut self.traffic[from as usize];
        traffic.sent_msgs += 1;
        traffic.sent_bytes += len as u64;
        self.count_region_traffic(from, to, len);
        self.stats.sent += 1;
        if self.cut_count[link] > 0 {
            self.stats.cut += 1;
            return Fate { copies: [None, None], cut: true };
        }
        let model = &self.links[link];
        let rng = &mut self.rngs[link];
        // Without a spell the link's own probability, bit for bit (runs without spells keep
        // their digests).
        let spell = self.spell_loss[link];
        let loss = if spell > 0.0 { 1.0 - (1.0 - model.loss) * (1.0 - spell) } else { model.loss };
        let twice = chance(rng, model.duplicate);
        let mut fate = Fate::default();
        for (copy, slot) in fate.copies.iter_mut().enumerate() {
            let lost = chance(rng, loss);
            let delay = model.delay_nanos(rng);
            let sent = copy == 0 || twice;
            if sent && lost {
                self.stats.lost += 1;
            }
            if sent && !lost {
                *slot = Some(delay);
            }
        }
        self.stats.duplicated += u64::from(twice);
        fate
    }

    /// Cuts every link in `links` (directed `(from, to)` pairs) until [`Network::remove_cut`] with
    /// the same `id`.
    pub fn add_cut(&mut self, id: u64, links: Vec<(u32, u32)>) {
        for &(from, to) in &links {
            let link = self.index(from, to);
            self.cut_count[link] += 1;
        }
        self.cuts.push((id, links));
    }

    /// Heals the cut `id` (links also covered by another cut stay cut).
    pub fn remove_cut(&mut self, id: u64) {
        let Some(position) = self.cuts.iter().position(|(cut, _)| *cut == id) else { return };
        let (_, links) = self.cuts.remove(position);
        for (from, to) in links {
            let link = self.index(from, to);
            self.cut_count[link] -= 1;
        }
    }

    /// Adds `loss` to every link in `links` (directed pairs) until [`Network::remove_spell`] with
    /// the same `id` (spells on one link combine as independent losses).
    pub fn add_spell(&mut self, id: u64, links: Vec<(u32, u32)>, loss: f64) {
        self.spells.push((id, links, loss));
        self.recompute_spell_loss();
    }

    /// Ends the lossy spell `id`.
    pub fn remove_spell(&mut self, id: u64) {
        self.spells.retain(|(spell, _, _)| *spell != id);
        self.recompute_spell_loss();
    }

    fn recompute_spell_loss(&mut self) {
        let mut kept = vec![1.0; self.spell_loss.len()];
        for (_, links, loss) in &self.spells {
            for &(from, to) in links {
                kept[self.index(from, to)] *= 1.0 - loss;
            }
        }
        self.spell_loss = kept.into_iter().map(|k| 1.0 - k).collect();
    }

    /// The loss probability of the link from `from` to `to` now (its own and its spells').
    pub fn loss(&self, from: u32, to: u32) -> f64 {
        let link = self.index(from, to);
        let spell = self.spell_loss[link];
        1.0 - (1.0 - self.links[link].loss) * (1.0 - spell)
    }

    /// The delay distribution of the link from `from` to `to`.
    pub fn delay(&self, from: u32, to: u32) -> &DelayConfig {
        &self.links[self.index(from, to)].delay
    }

    /// Traffic from region `a` to region `b`, by `(a, b)`, in region order (empty without
    /// regions).
    pub fn region_traffic(&self) -> Vec<((u32, u32), NodeTraffic)> {
        let regions = self.regions as u32;
        let pairs = (0..regions).flat_map(|a| (0..regions).map(move |b| (a, b)));
        pairs.zip(self.region_traffic.iter().copied()).collect()
    }

    fn count_region_traffic(&mut self, from: u32, to: u32, len: usize) {
        let (Some(&a), Some(&b)) = (self.region_of.get(from as usize), self.region_of.get(to as usize))
        else {
            return;
        };
        if let Some(t) = self.region_traffic.get_mut(a as usize * self.regions + b as usize) {
            t.sent_msgs += 1;
            t.sent_bytes += len as u64;
        }
    }

    /// Whether messages from `from` to `to` are dropped by a cut.
    pub fn is_cut(&self, from: u32, to: u32) -> bool {
        self.cut_count[self.index(from, to)] > 0
    }

    /// Traffic sent by each node.
    pub fn traffic(&self) -> &[NodeTraffic] {
        &self.traffic
    }

    /// Counters of the whole network.
    pub fn stats(&self) -> NetworkStats {
        self.stats
    }

    fn index(&self, from: u32, to: u32) -> usize {
        from as usize * self.nodes + to as usize
    }
}

/// The directed links cut by a symmetric partition into `groups` (nodes in no group keep all
/// their links).
pub fn partition_links(groups: &[Vec<u32>]) -> Vec<(u32, u32)> {
    let mut links = Vec::new();
    for (i, a) in groups.iter().enumerate() {
        for (j, b) in groups.iter().enumerate() {
            if i != j {
                links.extend(a.iter().flat_map(|&x| b.iter().map(move |&y| (x, y))));
            }
        }
    }
    links.retain(|(x, y)| x != y);
    links.sort_unstable();
    links.dedup();
    links
}

/// The directed links cut by a one-way partition: every `from` → `to` pair.
pub fn one_way_links(from: &[u32], to: &[u32]) -> Vec<(u32, u32)> {
    let mut links: Vec<(u32, u32)> =
        from.iter().flat_map(|&x| to.iter().map(move |&y| (x, y))).filter(|(x, y)| x != y).collect();
    links.sort_unstable();
    links.dedup();
    links
}

fn link_model(config: &NetworkConfig, from: u32, to: u32) -> LinkModel {
    let delay = match &config.zones {
        Some(zones) if from % zones.count.max(1) != to % zones.count.max(1) => zones.between.clone(),
        _ => config.delay.clone(),
    };
    let default = match &config.regions {
        Some(regions) => {
            let between = regions.delay_between(regions.region_of(from), regions.region_of(to));
            let loss = between.as_ref().and(regions.loss).unwrap_or(config.loss);
            LinkModel { delay: between.unwrap_or(delay), loss, duplicate: config.duplicate }
        }
        None => LinkModel { delay, loss: config.loss, duplicate: config.duplicate },
    };
    let found = config.links.iter().find(|o| o.from.contains(&from) && o.to.contains(&to));
    let Some(o) = found else { return default };
    LinkModel {
        delay: o.delay.clone().unwrap_or(default.delay),
        loss: o.loss.unwrap_or(default.loss),
        duplicate: o.duplicate.unwrap_or(default.duplicate),
    }
}
