//! Hot reload: which settings a running daemon can take from a changed file, and which only a
//! restart applies. Each field of a section of single values is classified where it is declared
//! (the section tables of `model.rs`: `Reload` or `Restart`), so an unclassified field does not
//! compile; `[[policies]]`, `[[rlqs]]` and `[rls]` are reloadable as a whole.
//!
//! - reloadable (applied at once): [`RELOADABLE`];
//! - restart only: `[node]`, `[cluster]`, `[listen]`, `[log] format`, `[limits] keys_max`,
//!   `log_bytes_max`, `http_in_flight_max` and `connections_max` (sockets, the node's identity,
//!   its key table and the servers' bounds are made once).

use std::sync::LazyLock;

use super::model::{
    AuthSection, Bounds, Class, ClusterSection, Config, ListenSection, LogSection, NodeSection,
};

/// What a reload applies without a restart, as the operator names it (for messages): whole
/// sections, then each reloadable field of the others (a section whose every field is reloadable
/// by its name), from the classification of `model.rs`.
pub static RELOADABLE: LazyLock<String> = LazyLock::new(|| {
    let mut names = vec!["policies", "rlqs"];
    // In the order the message has always had.
    let sections = [
        ("log", LogSection::FIELDS),
        ("auth", AuthSection::FIELDS),
        ("rls", &[("rls", Class::Reload)][..]),
        ("limits", Bounds::FIELDS),
        ("node", NodeSection::FIELDS),
        ("cluster", ClusterSection::FIELDS),
        ("listen", ListenSection::FIELDS),
    ];
    for (section, fields) in sections {
        if fields.iter().all(|(_, class)| *class == Class::Reload) {
            names.push(section);
        } else {
            names.extend(fields.iter().filter(|(_, class)| *class == Class::Reload).map(|(name, _)| *name));
        }
    }
    names.join(", ")
});

/// The fields that differ between `running` and `new` and that only a restart can apply, in the
/// order of the sections and of their fields.
pub fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let mut fields = Vec::new();
    // [rls], [[policies]] and [[rlqs]] are reloadable: nothing to compare. No `..`: a section
    // added to the configuration does not compile here until it is classified.
    let Config { node, cluster, listen, limits, log, auth, rls: _, policies: _, rlqs: _ } = running;
    node.restart_only_changes(&new.node, &mut fields);
    cluster.restart_only_changes(&new.cluster, &mut fields);
    listen.restart_only_changes(&new.listen, &mut fields);
    limits.restart_only_changes(&new.limits, &mut fields);
    log.restart_only_changes(&new.log, &mut fields);
    auth.restart_only_changes(&new.auth, &mut fields);
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

    #[test]
    fn reloadable_names_every_reloadable_field() {
        assert_eq!(
            *RELOADABLE,
            "policies, rlqs, log.level, auth, rls, limits.http_body_bytes_max, limits.batch_len_max, \
             limits.key_bytes_max, limits.rlqs_streams_max, limits.rlqs_buckets_per_stream_max"
        );
    }
}
