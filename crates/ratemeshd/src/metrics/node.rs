//! The node's counters and gauges, read at scrape time ([`NodeCollector`]).
//!
//! Every stats struct of [`NodeMetrics`] is destructured without `..`: a counter the library
//! adds does not compile here until it is exported (or set aside with `_` and a reason), so the
//! metrics never silently omit one. README.md's metrics table lists every series written here.

use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use ratemesh::durable::SnapshotMetrics;
use ratemesh::{GossipHealth, GossipStats, Node, NodeMetrics, TransportStats};
use ratemesh_core::{DeliveryStats, NodeStats, StoreStats};

/// Reads a node's counters and gauges at scrape time.
#[derive(Debug)]
pub(super) struct NodeCollector {
    pub(super) node: Node,
}

/// `(name, help, value)` of one unlabelled counter (`name` gets the `_total` suffix).
type CounterRow = (&'static str, &'static str, u64);

/// Writes one unlabelled counter (`name` gets the `_total` suffix).
pub(super) fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Writes one unlabelled gauge.
pub(super) fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Writes one unlabelled gauge of seconds.
fn gauge_seconds(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Duration,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value.as_secs_f64());
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Saturating conversion for gauges (counts of things in memory never come near `i64::MAX`).
fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// [`gauge_value`] of a count held in memory.
pub(super) fn gauge_len(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The protocol's counters (decisions by path, forwards, reports, grants, handoffs, replicas).
fn protocol_counters(stats: NodeStats) -> ([CounterRow; 15], DeliveryStats) {
    let NodeStats {
        owner_decisions,
        allowance_decisions,
        fallback_decisions,
        forwarded,
        forward_timeouts,
        forward_batches,
        reports_sent,
        grants_sent,
        handoffs_sent,
        handoffs_received,
        replicas_sent,
        replicas_received,
        items_refused,
        membership_changes,
        sync_rounds,
        delivery,
    } = stats;
    let rows = [
        ("ratemesh_owner_decisions", "Checks decided by this node as the key's owner", owner_decisions),
        ("ratemesh_allowance_decisions", "Checks decided locally from an allowance", allowance_decisions),
        (
            "ratemesh_fallback_decisions",
            "Checks decided by the fallback policy (owner unreachable, no grant, forward timed out)",
            fallback_decisions,
        ),
        ("ratemesh_forwarded", "Checks forwarded to the key's owner", forwarded),
        ("ratemesh_forward_timeouts", "Forwarded checks that timed out", forward_timeouts),
        (
            "ratemesh_forward_batches",
            "Forward batches sent; ratemesh_forwarded_total / ratemesh_forward_batches_total is the mean batch length",
            forward_batches,
        ),
        ("ratemesh_reports_sent", "Usage report items sent to owners", reports_sent),
        ("ratemesh_grants_sent", "Allowance grant items sent", grants_sent),
        ("ratemesh_handoffs_sent", "Keys handed over to a new owner", handoffs_sent),
        ("ratemesh_handoffs_received", "Keys received from a previous owner", handoffs_received),
        ("ratemesh_replicas_sent", "Key states sent to ring successors", replicas_sent),
        ("ratemesh_replicas_received", "Key states received as replicas", replicas_received),
        ("ratemesh_items_refused", "Items from peers refused as invalid", items_refused),
        ("ratemesh_membership_changes", "Membership views applied", membership_changes),
        ("ratemesh_sync_rounds", "Sync rounds run", sync_rounds),
    ];
    (rows, delivery)
}

/// Per-peer delivery: frames, bytes, retransmissions, duplicates.
fn delivery_counters(stats: DeliveryStats) -> [CounterRow; 9] {
    let DeliveryStats {
        frames_sent,
        bytes_sent,
        frames_received,
        bytes_received,
        retransmits,
        duplicates,
        malformed,
        overflowed,
        unencodable,
    } = stats;
    [
        ("ratemesh_frames_sent", "Protocol frames sent", frames_sent),
        ("ratemesh_frames_sent_bytes", "Bytes of protocol frames sent, retransmissions included", bytes_sent),
        ("ratemesh_frames_received", "Protocol frames received and accepted", frames_received),
        ("ratemesh_frames_received_bytes", "Bytes of protocol frames received", bytes_received),
        ("ratemesh_retransmits", "Protocol frames retransmitted", retransmits),
        ("ratemesh_duplicate_frames", "Protocol frames received twice", duplicates),
        ("ratemesh_malformed_frames", "Protocol frames that did not decode", malformed),
        ("ratemesh_overflowed_frames", "Frames dropped because a retransmission buffer was full", overflowed),
        (
            "ratemesh_unencodable_frames",
            "Items dropped because no frame of frame_len_max bytes holds them, even coarsened",
            unencodable,
        ),
    ]
}

/// The QUIC peer transport.
fn transport_counters(stats: TransportStats) -> [CounterRow; 12] {
    let TransportStats {
        sent_frames,
        sent_bytes,
        send_dropped_frames,
        received_frames,
        received_bytes,
        receive_dropped_frames,
        receive_oversize_frames,
        connections_opened,
        connect_failures,
        connections_accepted,
        handshake_rejections,
        connections_refused,
    } = stats;
    [
        ("ratemesh_transport_sent_frames", "Frames written to peers' streams", sent_frames),
        ("ratemesh_transport_sent_bytes", "Bytes written to peers", sent_bytes),
        ("ratemesh_transport_send_dropped_frames", "Frames dropped on the send side", send_dropped_frames),
        ("ratemesh_transport_received_frames", "Frames received from peers", received_frames),
        ("ratemesh_transport_received_bytes", "Bytes received from peers", received_bytes),
        ("ratemesh_transport_receive_dropped_frames", "Incoming streams dropped", receive_dropped_frames),
        (
            "ratemesh_transport_receive_oversize_frames",
            "Incoming streams dropped for being longer than the frame bound",
            receive_oversize_frames,
        ),
        (
            "ratemesh_transport_connections_opened",
            "Outbound peer connections established",
            connections_opened,
        ),
        ("ratemesh_transport_connect_failures", "Outbound peer connects that failed", connect_failures),
        (
            "ratemesh_transport_connections_accepted",
            "Inbound peer connections authenticated",
            connections_accepted,
        ),
        (
            "ratemesh_transport_handshake_rejections",
            "Inbound peer handshakes that failed (no or foreign certificate)",
            handshake_rejections,
        ),
        (
            "ratemesh_transport_connections_refused",
            "Inbound peer connections refused because the transport's inbound bound was reached",
            connections_refused,
        ),
    ]
}

/// The key table's counters, and its log bytes (a gauge).
fn store_counters(stats: StoreStats) -> ([CounterRow; 4], u64) {
    let StoreStats { inserted, expired, evicted, log_bytes, logs_coarsened } = stats;
    let rows = [
        ("ratemesh_store_inserted", "Keys inserted in the key table", inserted),
        ("ratemesh_store_expired", "Keys dropped from the key table once fresh again", expired),
        ("ratemesh_evictions", "Keys evicted from the full key table", evicted),
        (
            "ratemesh_logs_coarsened",
            "Times a sliding window log was coarsened to stay within the node's log byte bound",
            logs_coarsened,
        ),
    ];
    (rows, log_bytes)
}

/// Gossip: datagrams, sends, restarts, and the refusals by reason (a labelled counter).
fn gossip_counters(stats: GossipStats) -> ([CounterRow; 5], [(&'static str, u64); 5]) {
    let GossipStats {
        datagrams_received,
        datagrams_sent,
        rejected_unauthenticated,
        rejected_unknown_key,
        rejected_replayed,
        rejected_malformed,
        rejected_over_bound,
        send_failures,
        restarts,
        malformed_regions,
    } = stats;
    let rows = [
        ("ratemesh_gossip_datagrams_received", "Datagrams received on the gossip port", datagrams_received),
        ("ratemesh_gossip_datagrams_sent", "Sealed gossip datagrams sent", datagrams_sent),
        ("ratemesh_gossip_send_failures", "Gossip messages that could not be sent", send_failures),
        (
            "ratemesh_gossip_restarts",
            "Times gossip ended while the node ran and was restarted (see the log for why)",
            restarts,
        ),
        (
            "ratemesh_gossip_malformed_regions",
            "Gossip entries (a member's generation) advertising a malformed region, taken as none",
            malformed_regions,
        ),
    ];
    let rejected = [
        ("unauthenticated", rejected_unauthenticated),
        ("unknown_key", rejected_unknown_key),
        ("replayed", rejected_replayed),
        ("malformed", rejected_malformed),
        ("over_bound", rejected_over_bound),
    ];
    (rows, rejected)
}

impl prometheus_client::collector::Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let NodeMetrics {
            protocol,
            store,
            transport,
            gossip,
            keys,
            members_live,
            members_dead,
            members_unverified,
            members_counted,
            checks_waiting,
            sync_lag,
            peer_round_trips,
            snapshots,
        } = self.node.metrics();
        let e = &mut encoder;
        let (protocol, delivery) = protocol_counters(protocol);
        let (store, log_bytes) = store_counters(store);
        let (gossip, rejected) = gossip_counters(gossip);
        let counters = protocol
            .into_iter()
            .chain(delivery_counters(delivery))
            .chain(transport_counters(transport))
            .chain(store)
            .chain(gossip);
        for (name, help, value) in counters {
            counter(e, name, help, value)?;
        }
        gauge(e, "ratemesh_keys", "Keys tracked by this node (owned and followed)", gauge_len(keys))?;
        gauge(
            e,
            "ratemesh_log_bytes",
            "Bytes the sliding window logs' entries take on this node (bounded by limits.log_bytes_max)",
            gauge_value(log_bytes),
        )?;
        gauge(
            e,
            "ratemesh_checks_waiting",
            "Checks waiting for their owner's answer",
            gauge_len(checks_waiting),
        )?;
        gauge_seconds(
            e,
            "ratemesh_sync_lag_seconds",
            "How late the node ran its last due timers (sync rounds, retransmissions) after their deadline",
            sync_lag,
        )?;
        let rtt = ConstGauge::new(0.0_f64);
        let mut rtt_family = e.encode_descriptor(
            "ratemesh_peer_rtt_seconds",
            "Smoothed round-trip time to each peer (label: its node id; bounded by the cluster's size)",
            None,
            rtt.metric_type(),
        )?;
        for (peer, round_trip) in &peer_round_trips {
            let labels = [("peer", peer.0.to_string())];
            ConstGauge::new(round_trip.as_secs_f64()).encode(rtt_family.encode_family(&labels)?)?;
        }
        let rejected_metric = ConstCounter::new(0_u64);
        let mut rejected_family = e.encode_descriptor(
            "ratemesh_gossip_rejected",
            "Gossip datagrams dropped unanswered, by reason: unauthenticated (not sealed, or forged), \
             unknown_key (another secret), replayed, malformed or over_bound (authentic: an insider's)",
            None,
            rejected_metric.metric_type(),
        )?;
        for (reason, count) in rejected {
            ConstCounter::new(count).encode(rejected_family.encode_family(&[("reason", reason)])?)?;
        }
        let running = matches!(self.node.gossip_health(), GossipHealth::Running);
        gauge(
            e,
            "ratemesh_gossip_running",
            "1 while gossip runs, 0 while it is being restarted",
            i64::from(running),
        )?;
        let members = ConstGauge::new(0_i64);
        let mut family = e.encode_descriptor(
            "ratemesh_members",
            "Cluster members as this node sees them, by status",
            None,
            members.metric_type(),
        )?;
        for (status, count) in
            [("live", members_live), ("dead", members_dead), ("unverified", members_unverified)]
        {
            let labels = [("status", status)];
            ConstGauge::new(gauge_len(count)).encode(family.encode_family(&labels)?)?;
        }
        gauge(
            e,
            "ratemesh_members_counted",
            "Members whose shares this node's owned keys count (itself and the members reachable for two \
             retransmission timeouts): below the live members, owners enforce the reachable part of every limit",
            gauge_len(members_counted),
        )?;
        encode_snapshots(e, snapshots)
    }
}

/// The durable quotas' metrics, `ratemesh_snapshot_*`.
fn encode_snapshots(e: &mut DescriptorEncoder, snapshots: SnapshotMetrics) -> Result<(), std::fmt::Error> {
    let SnapshotMetrics {
        // Shown by `ratemesh_snapshot_load{result="disabled"}`.
        enabled: _,
        writes,
        write_failures,
        last_keys,
        last_bytes,
        last_export,
        last_duration,
        last_written_unix_nanos,
        load_result,
        loaded_keys,
    } = snapshots;
    counter(e, "ratemesh_snapshot_writes", "Snapshots of durable quotas written", writes)?;
    counter(
        e,
        "ratemesh_snapshot_write_failures",
        "Snapshots that could not be written (the previous one stays)",
        write_failures,
    )?;
    gauge(e, "ratemesh_snapshot_keys", "Keys in the last snapshot written", gauge_value(last_keys))?;
    gauge(e, "ratemesh_snapshot_bytes", "Bytes of the last snapshot written", gauge_value(last_bytes))?;
    gauge_seconds(
        e,
        "ratemesh_snapshot_duration_seconds",
        "How long the last snapshot took: export, encoding and the atomic write",
        last_duration,
    )?;
    gauge_seconds(
        e,
        "ratemesh_snapshot_export_seconds",
        "How long the last snapshot held the node's lock (checks wait meanwhile)",
        last_export,
    )?;
    if let Some(written) = last_written_unix_nanos {
        let now = ratemesh::durable::unix_nanos_now();
        let age = Duration::from_nanos(now.saturating_sub(written));
        gauge_seconds(e, "ratemesh_snapshot_age_seconds", "Time since the last snapshot was written", age)?;
    }
    gauge(
        e,
        "ratemesh_snapshot_loaded_keys",
        "Keys taken back from the snapshot at start",
        gauge_value(loaded_keys),
    )?;
    let result = ConstGauge::new(1_i64);
    let mut family = e.encode_descriptor(
        "ratemesh_snapshot_load",
        "What the start made of the stored snapshot: 1 for the result (disabled, none, loaded, refused_corrupt, \
         refused_version, refused_foreign, error)",
        None,
        result.metric_type(),
    )?;
    result.encode(family.encode_family(&[("result", load_result)])?)
}
