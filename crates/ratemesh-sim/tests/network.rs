//! The network, clock and membership models.

use ratemesh_core::Instant;
use ratemesh_sim::clock::{CLOCK_BASE_NANOS, NodeClock};
use ratemesh_sim::membership::{Membership, Status};
use ratemesh_sim::network::{Network, one_way_links, partition_links};
use ratemesh_sim::scenario::{DelayConfig, MembershipConfig, NetworkConfig, RegionsConfig, region_sides};

fn network(loss: f64, duplicate: f64, delay: DelayConfig, nodes: u32) -> Network {
    Network::new(
        &NetworkConfig { delay, loss, duplicate, links: Vec::new(), zones: None, regions: None },
        nodes,
        42,
    )
}

const UNIFORM_1_20: DelayConfig = DelayConfig::Uniform { min_ms: 1.0, max_ms: 20.0 };
const SENDS: u32 = 200_000;

#[test]
fn loss_rate_is_within_tolerance() {
    let mut net = network(0.05, 0.0, UNIFORM_1_20, 2);
    let delivered: u32 = (0..SENDS).map(|_| net.send(0, 1, 10).deliveries().count() as u32).sum();
    let loss = 1.0 - f64::from(delivered) / f64::from(SENDS);
    // σ of the estimate is about 0.0005: 0.004 is eight of them.
    assert!((loss - 0.05).abs() < 0.004, "{loss}");
    assert_eq!(net.stats().lost, u64::from(SENDS - delivered));
    assert_eq!(net.traffic()[0].sent_msgs, u64::from(SENDS));
    assert_eq!(net.traffic()[0].sent_bytes, 10 * u64::from(SENDS));
}

#[test]
fn duplication_rate_is_within_tolerance() {
    let mut net = network(0.0, 0.1, UNIFORM_1_20, 2);
    let copies: u32 = (0..SENDS).map(|_| net.send(0, 1, 10).deliveries().count() as u32).sum();
    let duplicated = f64::from(copies - SENDS) / f64::from(SENDS);
    assert!((duplicated - 0.1).abs() < 0.005, "{duplicated}");
}

#[test]
fn uniform_delays_stay_in_range_and_reorder() {
    let mut net = network(0.0, 0.0, UNIFORM_1_20, 2);
    let delays: Vec<u64> =
        (0..10_000).flat_map(|_| net.send(0, 1, 1).deliveries().collect::<Vec<_>>()).collect();
    assert!(delays.iter().all(|d| (1_000_000..=20_000_000).contains(d)));
    let mean = delays.iter().sum::<u64>() as f64 / delays.len() as f64;
    assert!((mean - 10.5e6).abs() < 0.2e6, "{mean}");
    // Sent 1 ms apart, a later message overtakes an earlier one whenever its delay is 1 ms shorter.
    let overtakes = delays.windows(2).filter(|w| w[1] + 1_000_000 < w[0]).count();
    assert!(overtakes > 1000, "{overtakes}");
}

#[test]
fn lognormal_delays_have_their_median_and_cap() {
    let delay = DelayConfig::Lognormal { median_ms: 5.0, sigma: 1.0, max_ms: 50.0 };
    let mut net = network(0.0, 0.0, delay, 2);
    let mut delays: Vec<u64> =
        (0..20_001).flat_map(|_| net.send(1, 0, 1).deliveries().collect::<Vec<_>>()).collect();
    delays.sort_unstable();
    let median = delays[delays.len() / 2] as f64;
    assert!((median - 5e6).abs() < 0.25e6, "{median}");
    assert_eq!(*delays.last().expect("some delays"), 50_000_000);
}

#[test]
fn a_partition_drops_exactly_the_links_between_groups() {
    let mut net = network(0.0, 0.0, UNIFORM_1_20, 5);
    let groups = [vec![0, 1], vec![2, 3]];
    net.add_cut(1, partition_links(&groups));
    for from in 0..5u32 {
        for to in 0..5u32 {
            let across = groups
                .iter()
                .position(|g| g.contains(&from))
                .zip(groups.iter().position(|g| g.contains(&to)));
            let expected = matches!(across, Some((a, b)) if a != b);
            assert_eq!(net.is_cut(from, to), expected, "{from}->{to}");
            let fate = net.send(from, to, 1);
            assert_eq!(fate.cut, expected);
            assert_eq!(fate.deliveries().count(), usize::from(!expected));
        }
    }
    net.remove_cut(1);
    assert!((0..5).all(|from| (0..5).all(|to| !net.is_cut(from, to))));
}

#[test]
fn a_one_way_partition_drops_one_direction_only() {
    let mut net = network(0.0, 0.0, UNIFORM_1_20, 3);
    net.add_cut(1, one_way_links(&[0], &[1, 2]));
    assert!(net.send(0, 1, 1).cut && net.send(0, 2, 1).cut);
    assert!(!net.send(1, 0, 1).cut && !net.send(2, 0, 1).cut && !net.send(1, 2, 1).cut);
}

#[test]
fn overlapping_cuts_heal_independently() {
    let mut net = network(0.0, 0.0, UNIFORM_1_20, 3);
    net.add_cut(1, one_way_links(&[0], &[1]));
    net.add_cut(2, partition_links(&[vec![0], vec![1, 2]]));
    net.remove_cut(2);
    assert!(net.is_cut(0, 1) && !net.is_cut(1, 0) && !net.is_cut(0, 2));
    net.remove_cut(1);
    assert!(!net.is_cut(0, 1));
}

/// Three regions (node n in region n % 3) with round trips of 40 (0–1), 100 (0–2) and 300 ms (1–2),
/// 1–2 ms inside a region, no jitter.
fn regions_network(nodes: u32) -> (RegionsConfig, Network) {
    let regions = RegionsConfig {
        count: 3,
        rtt_ms: vec![vec![0.0, 40.0, 100.0], vec![40.0, 0.0, 300.0], vec![100.0, 300.0, 0.0]],
        jitter: 0.0,
        loss: None,
    };
    let config = NetworkConfig {
        delay: DelayConfig::Uniform { min_ms: 1.0, max_ms: 2.0 },
        regions: Some(regions.clone()),
        ..NetworkConfig::default()
    };
    (regions, Network::new(&config, nodes, 42))
}

#[test]
fn the_rtt_matrix_gives_half_a_round_trip_between_regions() {
    let (regions, mut net) = regions_network(6);
    for from in 0..6u32 {
        for to in 0..6u32 {
            let (a, b) = (regions.region_of(from), regions.region_of(to));
            let delay = net.send(from, to, 1).deliveries().next().expect("no loss");
            if a == b {
                assert!((1_000_000..=2_000_000).contains(&delay), "{from}->{to}: {delay}");
            } else {
                let half_nanos = (regions.rtt_ms[a as usize][b as usize] / 2.0 * 1e6) as u64;
                assert_eq!(delay, half_nanos, "{from}->{to}");
            }
        }
    }
    // Node 4 is in region 1, node 5 in region 2: 300 ms round trips.
    assert_eq!(net.delay(4, 5), &DelayConfig::Uniform { min_ms: 150.0, max_ms: 150.0 });
}

#[test]
fn jitter_spreads_delays_around_half_the_round_trip() {
    let config = RegionsConfig { jitter: 0.2, ..regions_network(2).0 };
    let network = NetworkConfig { regions: Some(config), ..NetworkConfig::default() };
    let mut net = Network::new(&network, 2, 7);
    let delays: Vec<u64> =
        (0..2000).flat_map(|_| net.send(0, 1, 1).deliveries().collect::<Vec<_>>()).collect();
    assert!(delays.iter().all(|d| (16_000_000..=24_000_000).contains(d)));
    assert!(delays.iter().any(|d| *d < 17_000_000) && delays.iter().any(|d| *d > 23_000_000));
}

#[test]
fn a_region_partition_cuts_exactly_the_links_between_the_named_regions() {
    let (regions, mut net) = regions_network(9);
    let groups = regions.node_groups(&region_sides(&[2], &[], 3), 9);
    assert_eq!(groups, vec![vec![2, 5, 8], vec![0, 1, 3, 4, 6, 7]]);
    net.add_cut(1, partition_links(&groups));
    for from in 0..9u32 {
        for to in 0..9u32 {
            let across = (regions.region_of(from) == 2) != (regions.region_of(to) == 2);
            assert_eq!(net.is_cut(from, to), across, "{from}->{to}");
        }
    }
    // Groups of regions: 0 | 1, region 2 on no side keeps every link.
    let sides = region_sides(&[], &[vec![0], vec![1]], 3);
    net.remove_cut(1);
    net.add_cut(2, partition_links(&regions.node_groups(&sides, 9)));
    for from in 0..9u32 {
        for to in 0..9u32 {
            let pair = (regions.region_of(from), regions.region_of(to));
            assert_eq!(net.is_cut(from, to), pair == (0, 1) || pair == (1, 0), "{from}->{to}");
        }
    }
}

#[test]
fn a_lossy_spell_adds_loss_to_its_links_only_while_it_lasts() {
    let (regions, mut net) = regions_network(3);
    let links = partition_links(&regions.node_groups(&region_sides(&[0], &[], 3), 3));
    net.add_spell(7, links, 0.5);
    assert_eq!((net.loss(0, 1), net.loss(1, 0), net.loss(1, 2)), (0.5, 0.5, 0.0));
    let delivered = (0..4000).filter(|_| net.send(0, 1, 1).deliveries().count() == 1).count();
    assert!((1800..2200).contains(&delivered), "{delivered}");
    net.remove_spell(7);
    assert_eq!(net.loss(0, 1), 0.0);
}

#[test]
fn traffic_is_counted_per_pair_of_regions() {
    let (_, mut net) = regions_network(3);
    net.send(0, 1, 10);
    net.send(0, 1, 10);
    net.send(2, 2, 5);
    let traffic = net.region_traffic();
    let of = |pair| traffic.iter().find(|(p, _)| *p == pair).map(|(_, t)| (t.sent_msgs, t.sent_bytes));
    assert_eq!(of((0, 1)), Some((2, 20)));
    assert_eq!(of((2, 2)), Some((1, 5)));
    assert_eq!(of((1, 0)), Some((0, 0)));
}

#[test]
fn clock_offset_and_drift_follow_the_formula() {
    let second = 1_000_000_000u64;
    let fast = NodeClock::new(-(second as i64), 500);
    assert_eq!(fast.local(0), Instant::from_nanos(CLOCK_BASE_NANOS - second));
    // 60 s at +500 ppm gain 30 ms.
    assert_eq!(
        fast.local(60 * second),
        Instant::from_nanos(CLOCK_BASE_NANOS - second + 60 * second + 30_000_000)
    );
    let slow = NodeClock::new(second as i64, -500);
    assert_eq!(
        slow.local(60 * second),
        Instant::from_nanos(CLOCK_BASE_NANOS + second + 60 * second - 30_000_000)
    );
    for clock in [fast, slow] {
        let mut last = clock.local(0);
        for v in (0..2_000_000u64).step_by(997) {
            let now = clock.local(v);
            assert!(now >= last, "monotone");
            last = now;
            let back = clock.virtual_at(now).expect("in range");
            assert!(back <= v && clock.local(back) == now);
        }
    }
    assert_eq!(NodeClock::perfect().virtual_at(Instant::MAX), None);
}

fn membership() -> Membership {
    let config = MembershipConfig {
        detection_delay_ms: 2000,
        dead_forget_ms: None,
        join_delay_ms: 500,
        leave_delay_ms: 100,
        leave_linger_ms: 0,
    };
    Membership::new(4, config)
}

#[test]
fn a_crash_reaches_every_other_view_after_the_detection_delay() {
    let net = network(0.0, 0.0, UNIFORM_1_20, 4);
    let mut m = membership();
    m.set_up(3, false);
    let pending = m.reality_changed(&net);
    assert_eq!(pending.iter().map(|p| p.observer).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(pending.iter().all(|p| p.delay_nanos == 2_000_000_000 && p.changes[0].status == Status::Dead));
    assert_eq!(m.view(0).live, vec![0, 1, 2, 3], "not yet detected");
    assert!(m.apply(0, &pending[0].changes));
    assert_eq!((m.view(0).live, m.view(0).dead), (vec![0, 1, 2], vec![3]));
}

#[test]
fn a_quick_restart_supersedes_the_crash_on_its_way() {
    let net = network(0.0, 0.0, UNIFORM_1_20, 4);
    let mut m = membership();
    m.set_up(3, false);
    let crash = m.reality_changed(&net);
    m.set_up(3, true);
    let restart = m.reality_changed(&net);
    assert!(restart.iter().all(|p| p.delay_nanos == 500_000_000 && p.changes[0].status == Status::Live));
    assert!(!m.apply(0, &crash[0].changes), "superseded: never seen dead");
    assert!(!m.apply(0, &restart[0].changes), "already believed live");
    assert!(m.is_truthful(0, &net));
}

#[test]
fn each_side_of_a_partition_sees_the_other_as_dead() {
    let mut net = network(0.0, 0.0, UNIFORM_1_20, 4);
    let mut m = membership();
    net.add_cut(1, partition_links(&[vec![0, 1], vec![2, 3]]));
    for pending in m.reality_changed(&net) {
        m.apply(pending.observer, &pending.changes);
    }
    assert_eq!((m.view(0).live, m.view(0).dead), (vec![0, 1], vec![2, 3]));
    assert_eq!((m.view(3).live, m.view(3).dead), (vec![2, 3], vec![0, 1]));
}

#[test]
fn a_leave_removes_the_node_from_every_view() {
    let net = network(0.0, 0.0, UNIFORM_1_20, 4);
    let mut m = membership();
    m.set_joined(2, false);
    m.reset_observer(2, &net);
    assert_eq!(m.view(2).live, vec![0, 1, 3], "the leaving node knows at once");
    for pending in m.reality_changed(&net) {
        assert_eq!(pending.delay_nanos, 100_000_000);
        m.apply(pending.observer, &pending.changes);
    }
    assert_eq!((m.view(0).live, m.view(0).dead), (vec![0, 1, 3], vec![]));
}
