//! Environment overrides: `RATEMESH_<SECTION>_<FIELD>` replaces `<section>.<field>` of the file.
//!
//! Overrides are applied to the file as written, before validation, so that a bad value from the
//! environment is refused by the same checks as one from the file, and the error names the
//! variable instead of a line. The variables come in as an explicit list (the CLI passes the
//! process environment), so tests never touch the process's own environment.

use std::ffi::OsStr;

use super::raw::{At, RawConfig, Val};
use super::{ConfigError, Location};

/// The prefix of every variable this module reads. Any other variable with it is an error: a typo
/// in an override must not silently leave the file's value in force.
pub const ENV_PREFIX: &str = "RATEMESH_";

/// One variable being applied.
struct EnvValue<'a> {
    variable: &'a str,
    field: &'static str,
    text: &'a str,
}

impl EnvValue<'_> {
    fn string(&self) -> Val<String> {
        Val { value: self.text.to_owned(), at: At::Env(self.variable.to_owned()) }
    }

    fn number(&self) -> Result<Val<u64>, ConfigError> {
        let value = self.text.trim().parse::<u64>().map_err(|error| ConfigError::Invalid {
            location: Location::Env { variable: self.variable.to_owned() },
            field: self.field.to_owned(),
            message: format!("{:?} is not an unsigned integer ({error})", self.text),
        })?;
        Ok(Val { value, at: At::Env(self.variable.to_owned()) })
    }

    /// A comma-separated list; blanks around items are ignored, an empty string is an empty list.
    fn list(&self) -> Vec<Val<String>> {
        let at = At::Env(self.variable.to_owned());
        self.text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| Val { value: item.to_owned(), at: at.clone() })
            .collect()
    }
}

/// Where an override goes, by the type its text is parsed into.
enum Slot<'a> {
    Number(&'a mut Option<Val<u64>>),
    Text(&'a mut Option<Val<String>>),
    List(&'a mut Option<Vec<Val<String>>>),
}

type Locate = fn(&mut RawConfig) -> Slot<'_>;

/// Every overridable field, as `section.field`, with where it lives. The variable's name is
/// derived from the field's ([`variable_name`]), so the two cannot drift apart.
const OVERRIDES: [(&str, Locate); 49] = [
    ("node.id", |raw| Slot::Number(&mut raw.node.id)),
    ("node.id_from", |raw| Slot::Text(&mut raw.node.id_from)),
    ("node.incarnation", |raw| Slot::Number(&mut raw.node.incarnation)),
    ("node.data_dir", |raw| Slot::Text(&mut raw.node.data_dir)),
    ("node.snapshot_interval_ms", |raw| Slot::Number(&mut raw.node.snapshot_interval_ms)),
    ("node.snapshot_period_min_ms", |raw| Slot::Number(&mut raw.node.snapshot_period_min_ms)),
    ("cluster.cluster_id", |raw| Slot::Text(&mut raw.cluster.cluster_id)),
    ("cluster.seeds", |raw| Slot::List(&mut raw.cluster.seeds)),
    ("cluster.secret", |raw| Slot::Text(&mut raw.cluster.secret)),
    ("cluster.secret_accepted", |raw| Slot::Text(&mut raw.cluster.secret_accepted)),
    ("cluster.ca_cert_path", |raw| Slot::Text(&mut raw.cluster.ca_cert_path)),
    ("cluster.cert_path", |raw| Slot::Text(&mut raw.cluster.cert_path)),
    ("cluster.key_path", |raw| Slot::Text(&mut raw.cluster.key_path)),
    ("cluster.gossip_interval_ms", |raw| Slot::Number(&mut raw.cluster.gossip_interval_ms)),
    ("cluster.sync_interval_ms", |raw| Slot::Number(&mut raw.cluster.sync_interval_ms)),
    ("cluster.dead_member_forget_ms", |raw| Slot::Number(&mut raw.cluster.dead_member_forget_ms)),
    ("cluster.seed_resolve_interval_ms", |raw| Slot::Number(&mut raw.cluster.seed_resolve_interval_ms)),
    ("cluster.leave_linger_ms", |raw| Slot::Number(&mut raw.cluster.leave_linger_ms)),
    ("listen.http", |raw| Slot::Text(&mut raw.listen.http)),
    ("listen.grpc", |raw| Slot::Text(&mut raw.listen.grpc)),
    ("listen.resp", |raw| Slot::Text(&mut raw.listen.resp)),
    ("listen.rlqs", |raw| Slot::Text(&mut raw.listen.rlqs)),
    ("listen.gossip", |raw| Slot::Text(&mut raw.listen.gossip)),
    ("listen.quic", |raw| Slot::Text(&mut raw.listen.quic)),
    ("listen.advertise_gossip", |raw| Slot::Text(&mut raw.listen.advertise_gossip)),
    ("listen.advertise_quic", |raw| Slot::Text(&mut raw.listen.advertise_quic)),
    ("listen.advertise_ip_from", |raw| Slot::Text(&mut raw.listen.advertise_ip_from)),
    ("listen.grpc_tls_cert_path", |raw| Slot::Text(&mut raw.listen.grpc_tls_cert_path)),
    ("listen.grpc_tls_key_path", |raw| Slot::Text(&mut raw.listen.grpc_tls_key_path)),
    ("listen.grpc_tls_client_ca_path", |raw| Slot::Text(&mut raw.listen.grpc_tls_client_ca_path)),
    ("limits.keys_max", |raw| Slot::Number(&mut raw.limits.keys_max)),
    ("limits.log_bytes_max", |raw| Slot::Number(&mut raw.limits.log_bytes_max)),
    ("limits.http_body_bytes_max", |raw| Slot::Number(&mut raw.limits.http_body_bytes_max)),
    ("limits.http_in_flight_max", |raw| Slot::Number(&mut raw.limits.http_in_flight_max)),
    ("limits.connections_max", |raw| Slot::Number(&mut raw.limits.connections_max)),
    ("limits.batch_len_max", |raw| Slot::Number(&mut raw.limits.batch_len_max)),
    ("limits.key_bytes_max", |raw| Slot::Number(&mut raw.limits.key_bytes_max)),
    ("limits.rlqs_streams_max", |raw| Slot::Number(&mut raw.limits.rlqs_streams_max)),
    ("limits.rlqs_buckets_per_stream_max", |raw| Slot::Number(&mut raw.limits.rlqs_buckets_per_stream_max)),
    ("log.format", |raw| Slot::Text(&mut raw.log.format)),
    ("log.level", |raw| Slot::Text(&mut raw.log.level)),
    ("auth.policy_header", |raw| Slot::Text(&mut raw.auth.policy_header)),
    ("auth.key_header", |raw| Slot::Text(&mut raw.auth.key_header)),
    ("auth.admin_token", |raw| Slot::Text(&mut raw.auth.admin_token)),
    ("rls.all_or_nothing_domains", |raw| Slot::List(&mut raw.rls.all_or_nothing_domains)),
    ("rls.rlqs_unknown_domain", |raw| Slot::Text(&mut raw.rls.rlqs_unknown_domain)),
    ("rls.rlqs_report_period_ms", |raw| Slot::Number(&mut raw.rls.rlqs_report_period_ms)),
    ("rls.rlqs_abandon_after_periods", |raw| Slot::Number(&mut raw.rls.rlqs_abandon_after_periods)),
    ("rls.rlqs_sync_interval_ms", |raw| Slot::Number(&mut raw.rls.rlqs_sync_interval_ms)),
];

/// The variable that overrides `field` (`cluster.seeds` → `RATEMESH_CLUSTER_SEEDS`).
pub fn variable_name(field: &str) -> String {
    format!("{ENV_PREFIX}{}", field.replace('.', "_").to_ascii_uppercase())
}

/// Every variable that overrides a field, in the order of the file's sections.
pub fn variable_names() -> impl Iterator<Item = String> {
    OVERRIDES.iter().map(|(field, _)| variable_name(field))
}

/// Applies every `RATEMESH_` variable of `vars` to `raw`; other variables are ignored.
pub(super) fn apply<I, K, V>(raw: &mut RawConfig, vars: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    for (name, value) in vars {
        let name = name.as_ref().to_string_lossy();
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        let variable = name.as_ref();
        let Some((field, locate)) = OVERRIDES.iter().find(|(field, _)| variable_name(field) == variable)
        else {
            return Err(ConfigError::UnknownVariable { variable: variable.to_owned() });
        };
        let text = value.as_ref().to_str().ok_or_else(|| ConfigError::Invalid {
            location: Location::Env { variable: variable.to_owned() },
            field: (*field).to_owned(),
            message: "not valid UTF-8".to_owned(),
        })?;
        let value = EnvValue { variable, field, text };
        match locate(raw) {
            Slot::Number(slot) => *slot = Some(value.number()?),
            Slot::Text(slot) => *slot = Some(value.string()),
            Slot::List(slot) => *slot = Some(value.list()),
        }
    }
    Ok(())
}
