//! Hot reload: which settings a running daemon can take from a changed file, and which only a
//! restart applies. The classification is [`restart_only_changes`], which destructures every
//! section without `..`: a field added to the configuration does not compile there until it is
//! classified.
//!
//! - reloadable (applied at once): [`RELOADABLE`];
//! - restart only: `[node]`, `[cluster]`, `[listen]`, `[log] format`, `[limits] keys_max`,
//!   `log_bytes_max`, `http_in_flight_max` and `connections_max` (sockets, the node's identity,
//!   its key table and the servers' bounds are made once).

use super::model::{AuthSection, Bounds, ClusterSection, Config, ListenSection, LogSection, NodeSection};

/// What a reload applies without a restart, as the operator names it (for messages).
pub const RELOADABLE: &str = "policies, rlqs, log.level, auth, rls, limits.http_body_bytes_max, \
                              limits.batch_len_max, limits.key_bytes_max, limits.rlqs_streams_max, \
                              limits.rlqs_buckets_per_stream_max";

/// The fields that differ between `running` and `new` and that only a restart can apply.
///
/// Every section is destructured without `..`: a field added to the configuration does not
/// compile here until it is classified, restart-only (compared) or reloadable (`_`).
pub fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let mut fields = Vec::new();
    let mut differs = |field, changed: bool| {
        if changed {
            fields.push(field);
        }
    };
    // [rls] and [[rlqs]] are reloadable: nothing to compare.
    let Config { node, cluster, listen, limits, log, auth, rls: _, policies: _, rlqs: _ } = running;

    let NodeSection { id, id_from, incarnation, data_dir, snapshot_interval, snapshot_period_min } = node;
    let b = &new.node;
    differs("node.id", *id != b.id);
    differs("node.id_from", *id_from != b.id_from);
    differs("node.incarnation", *incarnation != b.incarnation);
    differs("node.data_dir", *data_dir != b.data_dir);
    differs("node.snapshot_interval_ms", *snapshot_interval != b.snapshot_interval);
    differs("node.snapshot_period_min_ms", *snapshot_period_min != b.snapshot_period_min);

    let ClusterSection {
        cluster_id,
        seeds,
        auth: cluster_auth,
        gossip_interval,
        sync_interval,
        dead_member_forget,
        seed_resolve_interval,
        leave_linger,
    } = cluster;
    let b = &new.cluster;
    differs("cluster.cluster_id", *cluster_id != b.cluster_id);
    differs("cluster.seeds", *seeds != b.seeds);
    differs("cluster.secret/certificates", *cluster_auth != b.auth);
    differs("cluster.gossip_interval_ms", *gossip_interval != b.gossip_interval);
    differs("cluster.sync_interval_ms", *sync_interval != b.sync_interval);
    differs("cluster.dead_member_forget_ms", *dead_member_forget != b.dead_member_forget);
    differs("cluster.seed_resolve_interval_ms", *seed_resolve_interval != b.seed_resolve_interval);
    differs("cluster.leave_linger_ms", *leave_linger != b.leave_linger);

    let ListenSection {
        http,
        grpc,
        resp,
        rlqs,
        gossip,
        quic,
        advertise_gossip,
        advertise_quic,
        advertise_ip_from,
        grpc_tls,
    } = listen;
    let b = &new.listen;
    differs("listen.http", *http != b.http);
    differs("listen.grpc", *grpc != b.grpc);
    differs("listen.resp", *resp != b.resp);
    differs("listen.rlqs", *rlqs != b.rlqs);
    differs("listen.gossip", *gossip != b.gossip);
    differs("listen.quic", *quic != b.quic);
    differs("listen.advertise_gossip", *advertise_gossip != b.advertise_gossip);
    differs("listen.advertise_quic", *advertise_quic != b.advertise_quic);
    differs("listen.advertise_ip_from", *advertise_ip_from != b.advertise_ip_from);
    differs("listen.grpc_tls_*", *grpc_tls != b.grpc_tls);

    // The per-request bounds are read by each request: reloadable.
    let Bounds {
        keys_max,
        http_body_bytes_max: _,
        http_in_flight_max,
        connections_max,
        batch_len_max: _,
        key_bytes_max: _,
        log_bytes_max,
        rlqs_streams_max: _,
        rlqs_buckets_per_stream_max: _,
    } = limits;
    let b = &new.limits;
    differs("limits.keys_max", *keys_max != b.keys_max);
    differs("limits.log_bytes_max", *log_bytes_max != b.log_bytes_max);
    differs("limits.http_in_flight_max", *http_in_flight_max != b.http_in_flight_max);
    differs("limits.connections_max", *connections_max != b.connections_max);

    // The level is followed by the subscriber; the format is how it was built.
    let LogSection { format, level: _ } = log;
    differs("log.format", *format != new.log.format);

    // Read by each auth request: reloadable.
    let AuthSection { policy_header: _, key_header: _, admin_token: _ } = auth;
    fields
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::config::{LogFormat, LogLevel};

    #[test]
    fn restart_only_fields_are_named_and_reloadable_ones_are_not() {
        let running = Config::default();
        let mut new = Config::default();
        new.limits.connections_max += 1;
        new.limits.keys_max += 1;
        new.log.format = LogFormat::Json;
        new.listen.resp = Some(SocketAddr::from(([127, 0, 0, 1], 6380)));
        new.cluster.seeds.push(SocketAddr::from(([10, 0, 0, 1], 7946)).into());
        assert_eq!(
            restart_only_changes(&running, &new),
            ["cluster.seeds", "listen.resp", "limits.keys_max", "limits.connections_max", "log.format"]
        );
        let mut reloadable = Config::default();
        reloadable.limits.batch_len_max += 1;
        reloadable.limits.http_body_bytes_max += 1;
        reloadable.limits.key_bytes_max += 1;
        reloadable.log.level = LogLevel::Debug;
        reloadable.auth.key_header = "x-user".to_owned();
        assert!(restart_only_changes(&running, &reloadable).is_empty());
    }
}
