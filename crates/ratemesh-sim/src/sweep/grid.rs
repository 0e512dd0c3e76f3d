//! Expanding a sweep's grid into points: the product of each block's axes, each point the base
//! scenario with the axis values applied (and the strategies that cannot run it left out).

use super::{GridBlock, LimitsValue, SweepFile};
use crate::error::SimError;
use crate::scenario::{
    DelayConfig, DemandConfig, FaultConfig, LimitConfig, NodeTarget, RegionsConfig, Scenario, ZonesConfig,
};
use crate::strategy::StrategyKind;

/// One point of a grid: its axis values, as text, and the scenario.
#[derive(Clone, Debug)]
pub struct Point {
    /// `block:index`, for `--point`.
    pub id: String,
    /// Index of the block.
    pub block: usize,
    /// `axis=value` pairs that differ from the base.
    pub params: Vec<(String, String)>,
    /// The scenario at overload.
    pub scenario: Scenario,
}

impl SweepFile {
    /// Every point of every block, validated.
    pub fn points(&self) -> Result<Vec<Point>, SimError> {
        let mut points = Vec::new();
        for (block_index, block) in self.grid.iter().enumerate() {
            for (index, params) in product(&axes(block)).into_iter().enumerate() {
                let mut scenario = self.base.clone();
                if let Some(d) = block.duration_s.or(self.duration_s) {
                    scenario.duration_s = d;
                }
                if !block.strategies.is_empty() {
                    scenario.strategies.clone_from(&block.strategies);
                }
                scenario.expect.clear();
                apply_all(&mut scenario, &params).map_err(|message| self.invalid(message))?;
                drop_unfit_strategies(&mut scenario);
                let id = format!("{block_index}:{index}");
                scenario.name = format!("{}-{}", self.name, id.replace(':', "-"));
                scenario.validate()?;
                points.push(Point { id, block: block_index, params, scenario });
            }
        }
        Ok(points)
    }

    fn invalid(&self, message: String) -> SimError {
        SimError::Invalid { name: self.name.clone(), message }
    }

    /// Seeds of block `block`'s points.
    pub fn block_seeds(&self, block: usize) -> u64 {
        self.grid.get(block).and_then(|b| b.seeds).unwrap_or(self.seeds)
    }

    /// The scenario of `point` below the limit (for false rejects), if the sweep asks for one.
    pub fn below(&self, point: &Point) -> Option<Scenario> {
        let rate = self.below_rate_x_limit?;
        if point.scenario.workload.rate_per_s.is_some() || self.grid[point.block].below == Some(false) {
            return None;
        }
        let mut scenario = point.scenario.clone();
        scenario.workload.rate_x_limit = rate;
        Some(scenario)
    }
}

/// The axes of a block, as `(name, values as text)`, in application order (limits before bursts,
/// workload before rates).
fn axes(block: &GridBlock) -> Vec<(&'static str, Vec<String>)> {
    let text = |v: &[f64]| v.iter().map(f64::to_string).collect::<Vec<_>>();
    let limits = block
        .limits
        .iter()
        .map(|l| match l {
            LimitsValue::One(one) => one.clone(),
            LimitsValue::Mixed(many) => many.join("+"),
        })
        .collect();
    let all: Vec<(&'static str, Vec<String>)> = vec![
        ("nodes", block.nodes.iter().map(u32::to_string).collect()),
        ("algorithm", block.algorithm.clone()),
        ("limits", limits),
        ("burst_x_limit", text(&block.burst_x_limit)),
        ("burst", block.burst.iter().map(u64::to_string).collect()),
        ("keys", block.keys.iter().map(u32::to_string).collect()),
        ("net", block.net.clone()),
        ("regions", block.regions.clone()),
        ("nodes_per_region", block.nodes_per_region.iter().map(u32::to_string).collect()),
        ("region_fallback", block.region_fallback.clone()),
        ("sync_ms", block.sync_ms.iter().map(u64::to_string).collect()),
        ("workload", block.workload.clone()),
        ("rate_x_limit", text(&block.rate_x_limit)),
        ("demand", block.demand.clone()),
        ("faults", block.faults.clone()),
    ];
    all.into_iter().filter(|(_, values)| !values.is_empty()).collect()
}

fn product(axes: &[(&'static str, Vec<String>)]) -> Vec<Vec<(String, String)>> {
    let mut points = vec![Vec::new()];
    for (name, values) in axes {
        points = points
            .into_iter()
            .flat_map(|p: Vec<(String, String)>| {
                values.iter().map(move |v| {
                    let mut next = p.clone();
                    next.push(((*name).to_owned(), v.clone()));
                    next
                })
            })
            .collect();
    }
    points
}

fn apply_all(scenario: &mut Scenario, params: &[(String, String)]) -> Result<(), String> {
    params.iter().try_for_each(|(axis, value)| apply(scenario, axis, value))?;
    apply_faults(scenario, params.iter().find(|(a, _)| a == "faults").map_or("none", |(_, v)| v.as_str()))
}

fn number<T: std::str::FromStr>(axis: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("{axis}: {value:?} is not a number"))
}

fn apply(s: &mut Scenario, axis: &str, value: &str) -> Result<(), String> {
    match axis {
        "nodes" => s.nodes = number(axis, value)?,
        "algorithm" => {
            for p in policies_mut(s) {
                p.algorithm = value.to_owned();
            }
        }
        "limits" => {
            let algorithm = s.policy_configs().first().map_or("token_bucket".into(), |p| p.algorithm.clone());
            let policies = value
                .split('+')
                .map(|one| parse_limit(one, &algorithm))
                .collect::<Result<Vec<LimitConfig>, String>>()?;
            if policies.len() == 1 {
                s.limit = policies.into_iter().next();
                s.policies.clear();
            } else {
                s.limit = None;
                s.policies = policies;
            }
        }
        "burst_x_limit" => {
            let x: f64 = number(axis, value)?;
            for p in policies_mut(s) {
                p.burst = Some(((p.limit as f64 * x).round() as u64).max(1));
            }
        }
        "burst" => {
            let burst: u64 = number(axis, value)?;
            for p in policies_mut(s) {
                p.burst = Some(burst);
            }
        }
        "keys" => {
            s.workload.keys = number(axis, value)?;
            s.workload.hot_keys = s.workload.hot_keys.min(s.workload.keys);
        }
        "net" => apply_net(s, value)?,
        "regions" => apply_regions(s, value)?,
        "nodes_per_region" => {
            let per_region: u32 = number(axis, value)?;
            s.nodes = per_region * s.network.regions.as_ref().map_or(1, |r| r.count);
        }
        "region_fallback" => s.node.region_fallback = Some(value.to_owned()),
        "sync_ms" => s.sync_interval_ms = number(axis, value)?,
        "rate_x_limit" => s.workload.rate_x_limit = number(axis, value)?,
        "workload" => apply_workload(s, value)?,
        "demand" => s.workload.demand = demand(s, value)?,
        "faults" => {}
        other => return Err(format!("unknown axis {other}")),
    }
    Ok(())
}

fn policies_mut(s: &mut Scenario) -> impl Iterator<Item = &mut LimitConfig> {
    s.limit.iter_mut().chain(s.policies.iter_mut())
}

/// `"10/s"`, `"5/min"`, `"100/h"`, `"100/day"`, `"250/500ms"`.
pub fn parse_limit(text: &str, algorithm: &str) -> Result<LimitConfig, String> {
    let (count, per) = text.split_once('/').ok_or_else(|| format!("limit {text:?} is not N/unit"))?;
    let period_ms = match per {
        "s" => 1000,
        "min" => 60_000,
        "h" => 3_600_000,
        "day" => 86_400_000,
        ms => ms
            .strip_suffix("ms")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("limit {text:?}: unknown unit"))?,
    };
    Ok(LimitConfig {
        algorithm: algorithm.to_owned(),
        limit: number("limits", count)?,
        period_ms,
        burst: None,
        mode: None,
        home_region: None,
        region_fallback: None,
    })
}

fn apply_net(s: &mut Scenario, value: &str) -> Result<(), String> {
    let one_way = |rtt_ms: f64| DelayConfig::Uniform { min_ms: rtt_ms * 0.4, max_ms: rtt_ms * 0.6 };
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["rtt", rtt] => {
            s.network.delay = one_way(number("net", rtt)?);
            s.network.zones = None;
        }
        ["zones", count, inside, between] => {
            s.network.delay = one_way(number("net", inside)?);
            s.network.zones =
                Some(ZonesConfig { count: number("net", count)?, between: one_way(number("net", between)?) });
        }
        _ => return Err(format!("net {value:?} is not rtt:MS or zones:COUNT:INSIDE_MS:BETWEEN_MS")),
    }
    Ok(())
}

fn demand(s: &Scenario, value: &str) -> Result<DemandConfig, String> {
    let count = s.network.regions.as_ref().map_or(0, |r| r.count as usize);
    let shares = |hot: f64| {
        let rest = (1.0 - hot) / count.saturating_sub(1).max(1) as f64;
        (0..count).map(|r| if r == 0 { hot } else { rest }).collect::<Vec<f64>>()
    };
    let regions = |shares, moves_every_ms| Ok(DemandConfig::Regions { shares, moves_every_ms });
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["uniform"] => Ok(DemandConfig::Uniform),
        ["skewed", node, share] => {
            Ok(DemandConfig::Skewed { node: number("demand", node)?, share: number("demand", share)? })
        }
        ["regions", "even"] => regions(vec![1.0; count], None),
        ["regions", "hot", hot] => regions(shares(number("demand", hot)?), None),
        ["regions", "moving", every_ms] => regions(shares(1.0), Some(number("demand", every_ms)?)),
        ["regions", list] => {
            regions(list.split(',').map(|w| number("demand", w)).collect::<Result<_, _>>()?, None)
        }
        _ => Err(format!(
            "demand {value:?} is not uniform, skewed:NODE:SHARE, regions:even, regions:hot:SHARE, \
             regions:moving:MS or regions:W,W,…"
        )),
    }
}

/// `"regions:COUNT:RTT"` (every pair) or `"regions:COUNT:RTT,RTT,…"` (the upper triangle, row by
/// row).
fn apply_regions(s: &mut Scenario, value: &str) -> Result<(), String> {
    let ["regions", count, rtts] = value.split(':').collect::<Vec<_>>()[..] else {
        return Err(format!(
            "regions {value:?} is not regions:COUNT:RTT_MS or regions:COUNT:RTT_MS,RTT_MS,…"
        ));
    };
    let count: usize = number("regions", count)?;
    let rtts: Vec<f64> = rtts.split(',').map(|r| number("regions", r)).collect::<Result<_, _>>()?;
    let pairs = count * count.saturating_sub(1) / 2;
    if rtts.len() != 1 && rtts.len() != pairs {
        return Err(format!("regions {value:?}: give one round trip or {pairs} (the upper triangle)"));
    }
    let mut rtt_ms = vec![vec![0.0; count]; count];
    let upper = (0..count).flat_map(|a| (a + 1..count).map(move |b| (a, b)));
    for (i, (a, b)) in upper.enumerate() {
        let rtt = if rtts.len() == 1 { rtts[0] } else { rtts[i] };
        rtt_ms[a][b] = rtt;
        rtt_ms[b][a] = rtt;
    }
    let jitter = s.network.regions.as_ref().map_or(0.1, |r| r.jitter);
    let loss = s.network.regions.as_ref().and_then(|r| r.loss);
    s.network.zones = None;
    s.network.regions = Some(RegionsConfig { count: count as u32, rtt_ms, jitter, loss });
    Ok(())
}

fn apply_workload(s: &mut Scenario, value: &str) -> Result<(), String> {
    let w = &mut s.workload;
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["base"] => {}
        ["per_key"] => {
            w.per_key = true;
            w.rate_per_s = None;
        }
        ["hot"] => {
            w.per_key = false;
            w.hot_keys = 1;
            w.hot_share = if w.keys > 1 { 0.95 } else { 1.0 };
        }
        ["rate", rate] => {
            w.per_key = false;
            w.rate_per_s = Some(number("workload", rate)?);
            w.hot_keys = w.keys;
            w.hot_share = 1.0;
        }
        _ => return Err(format!("workload {value:?} is not base, per_key, hot or rate:N")),
    }
    Ok(())
}

fn apply_faults(s: &mut Scenario, value: &str) -> Result<(), String> {
    let d = s.duration_s * 1000;
    let every = (d / 8).max(2000);
    s.faults.clear();
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["none"] => {}
        ["loss", p] => s.network.loss = number("faults", p)?,
        ["crash_churn"] => s.faults.push(FaultConfig::CrashChurn {
            start_ms: d / 4,
            end_ms: d * 3 / 4,
            every_ms: every,
            down_ms: every / 2,
            nodes: Vec::new(),
        }),
        ["churn"] => s.faults.push(FaultConfig::Churn {
            start_ms: d / 4,
            end_ms: d * 3 / 4,
            every_ms: every,
            down_ms: every / 2,
            nodes: Vec::new(),
        }),
        ["partition"] => {
            let cut = (s.nodes * 7).div_ceil(10).clamp(1, s.nodes.saturating_sub(1).max(1));
            s.faults.push(FaultConfig::Partition {
                start_ms: d / 3,
                end_ms: d * 2 / 3,
                groups: vec![(0..cut).collect(), (cut..s.nodes).collect()],
            });
        }
        ["region_partition"] => s.faults.push(region_partition(d, 0)),
        ["region_partition", region] => s.faults.push(region_partition(d, number("faults", region)?)),
        ["owner_crash"] => s.faults.push(FaultConfig::Crash {
            at_ms: d / 3,
            node: NodeTarget::Named("hot_owner".into()),
            restart_after_ms: Some(d / 3),
        }),
        _ => {
            return Err(format!(
                "faults {value:?} is not none, loss:P, crash_churn, churn, partition, owner_crash, \
                 region_partition or region_partition:REGION"
            ));
        }
    }
    Ok(())
}

/// `region` cut off from the other regions in the middle third of a run of `d` ms.
fn region_partition(d: u64, region: u32) -> FaultConfig {
    FaultConfig::RegionPartition {
        start_ms: d / 3,
        end_ms: d * 2 / 3,
        regions: vec![region],
        groups: Vec::new(),
    }
}

/// Baselines that need a token-bucket-family limit are left out of points without one.
fn drop_unfit_strategies(s: &mut Scenario) {
    let tat = ["token_bucket", "gcra", "leaky_bucket"];
    let all_tat = s.policy_configs().iter().all(|p| tat.contains(&p.algorithm.as_str()));
    if !all_tat {
        s.strategies.retain(|name| StrategyKind::from_name(name).is_ok_and(|k| !k.needs_tat_limit()));
    }
}
