//! Validation: the raw file (with environment overrides applied) into a [`Config`], every
//! refusal naming the field and where its value came from.
//!
//! Over 600 lines because it is one method per section and per kind of value, each short;
//! `[[policies]]` are validated apart (`super::policies`).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ratemesh::security::CLUSTER_SECRET_LEN_MIN;
use ratemesh::{ClusterSecret, Region, Seed};
use ratemesh_core::{NodeId, PERIOD_NANOS_MAX};

use super::defaults::*;
use super::error::{ConfigError, Location};
use super::model::*;
use super::raw::{At, PolicyStarts, RawConfig, RawListen, Val};
use crate::rls::tls::TlsFiles;

/// The most seeds a node gossips with at start.
pub const SEEDS_MAX: usize = 256;
/// The most policies in one file.
pub const POLICIES_MAX: usize = 10_000;
/// The most entries in one policy's descriptor path.
pub const DESCRIPTOR_DEPTH_MAX: usize = 16;
/// The longest policy name, cluster id, domain, descriptor key or value, in bytes.
pub const NAME_BYTES_MAX: usize = 255;

/// Shortest and longest snapshot interval: more often than every 100 ms is a disk busy for
/// nothing; beyond an hour a crash of the whole cluster loses most of an hour's hits.
const SNAPSHOT_INTERVAL_MS_MIN: u64 = 100;
const SNAPSHOT_INTERVAL_MS_MAX: u64 = 3_600_000;

/// Longest gossip or sync interval: beyond a minute the cluster no longer reacts in useful time.
const INTERVAL_MS_MAX: u64 = 60_000;
/// Longest region lease: beyond ten minutes a region cut off keeps its share for too long.
const REGION_LEASE_MS_MAX: u64 = 600_000;
/// Shortest seed resolve interval: more often would only load the name server.
const SEED_RESOLVE_INTERVAL_MS_MIN: u64 = 100;
/// Longest leave linger: a shutdown must fit a pod's termination grace period.
const LEAVE_LINGER_MS_MAX: u64 = 60_000;
/// Longest time a dead member is remembered: a week.
const DEAD_MEMBER_FORGET_MS_MAX: u64 = 7 * 24 * 3600 * 1000;
/// Upper bounds of `[limits]`, far above any sane setting: they catch typos (an extra digit or
/// three), not tuning.
const KEYS_MAX_MAX: u64 = 1 << 32;
/// Shortest accepted `policies[].audit_window_ms` (the core's shortest audit window).
pub(super) const AUDIT_WINDOW_MS_MIN: u64 = 10;
/// Longest accepted `policies[].audit_window_ms`: a day (the core's longest).
pub(super) const AUDIT_WINDOW_MS_MAX: u64 = 86_400_000;
/// Largest accepted `node.audit_keys_max` (an audited key keeps its last minute of windows).
const AUDIT_KEYS_MAX_MAX: u64 = 1 << 24;
/// Largest accepted `limits.log_bytes_max` (64 GiB).
const LOG_BYTES_MAX_MAX: u64 = 64 << 30;
const HTTP_BODY_BYTES_MAX_MAX: u64 = 16 << 20;
const HTTP_IN_FLIGHT_MAX_MAX: u64 = 1 << 20;
const CONNECTIONS_MAX_MAX: u64 = 4 << 20;
const BATCH_LEN_MAX_MAX: u64 = 100_000;
const RLQS_STREAMS_MAX_MAX: u64 = 1 << 20;
const RLQS_BUCKETS_PER_STREAM_MAX_MAX: u64 = 1 << 20;
/// Shortest RLQS report period: Envoy reports every 5 s; shorter ones are for tests and
/// spec-literal clients (the proto's minimum reporting interval is 100 ms).
const RLQS_REPORT_PERIOD_MS_MIN: u64 = 100;
const RLQS_REPORT_PERIOD_MS_MAX: u64 = 3_600_000;
const RLQS_ABANDON_AFTER_PERIODS_MAX: u64 = 1_000;
const RLQS_SYNC_INTERVAL_MS_MIN: u64 = 10;
const RLQS_SYNC_INTERVAL_MS_MAX: u64 = 60_000;
/// The shortest accepted `[auth] admin_token`.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;
/// The most overrides, and the most tiers, of one policy in the file.
pub const VARIANTS_MAX: usize = 10_000;
/// Whether `name` is a plausible HTTP header name: 1 to [`NAME_BYTES_MAX`] ASCII letters,
/// digits, `-` and `_` (a subset of RFC 9110 tokens: every header a proxy sets in practice, and
/// no punctuation that would more likely be a typo).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
/// Whether `name` is a valid policy name or cluster id: 1 to [`NAME_BYTES_MAX`] bytes of ASCII
/// letters, digits, `_`, `-` and `.`.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The text being validated, for locating errors.
pub(super) struct Ctx<'a> {
    pub(super) text: &'a str,
    pub(super) origin: &'a str,
}

impl Ctx<'_> {
    /// The line and column (1-based, in characters) of byte `offset`.
    pub(super) fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = before.matches('\n').count() + 1;
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    pub(super) fn location(&self, at: &At) -> Location {
        match at {
            At::File(span) => {
                let (line, column) = self.position(span.start);
                Location::File { origin: self.origin.to_owned(), line, column }
            }
            At::Env(variable) => Location::Env { variable: variable.clone() },
        }
    }

    pub(super) fn invalid(
        &self,
        field: impl Into<String>,
        at: &At,
        message: impl fmt::Display,
    ) -> ConfigError {
        ConfigError::Invalid {
            location: self.location(at),
            field: field.into(),
            message: message.to_string(),
        }
    }

    /// An error where no value was given: the whole configuration.
    pub(super) fn invalid_whole(&self, field: impl Into<String>, message: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            location: Location::Whole { origin: self.origin.to_owned() },
            field: field.into(),
            message: message.to_string(),
        }
    }

    /// A TOML syntax or type error. The toml crate keeps the key path private but prints it when
    /// the error has no input attached ("in `a.b`"), so it is read back from there.
    pub(super) fn toml_error(&self, mut error: toml::de::Error) -> ConfigError {
        let location = match error.span() {
            Some(span) => self.location(&At::File(span)),
            None => Location::Whole { origin: self.origin.to_owned() },
        };
        let message = error.message().trim_end().to_owned();
        error.set_input(None);
        let rendered = error.to_string();
        let keys =
            rendered.lines().filter_map(|line| line.strip_prefix("in `")?.strip_suffix('`')).next_back();
        // An unknown field is reported at its key, with the enclosing table as the path.
        let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
        let field = match (keys, unknown) {
            (Some(keys), Some(name)) => format!("{keys}.{name}"),
            (None, Some(name)) => name.to_owned(),
            (Some(keys), None) => keys.to_owned(),
            (None, None) => return ConfigError::Syntax { location, message },
        };
        // The TOML is well-formed (only a type was wrong), so the lenient reading succeeds.
        let field = match (error.span(), toml::from_str::<PolicyStarts>(self.text)) {
            (Some(span), Ok(starts)) => starts.index_path(&field, span.start),
            _ => field,
        };
        ConfigError::Invalid { location, field, message }
    }

    pub(super) fn validate(&self, raw: &RawConfig) -> Result<Config, ConfigError> {
        let node = self.node(raw)?;
        let listen = self.listen(raw)?;
        let cluster = self.cluster(raw, &listen)?;
        let limits = self.bounds(raw)?;
        let log = self.log(raw)?;
        let auth = self.auth_section(raw)?;
        let policies = self.policies(&raw.policies)?;
        let rls = self.rls(raw, &policies)?;
        let rlqs = self.rlqs(raw, &policies)?;
        Ok(Config { node, cluster, listen, limits, log, auth, rls, policies, rlqs })
    }

    /// `[[rlqs]]` and `[rls] rlqs_*`: each domain once, naming a policy of the file.
    fn rlqs(&self, raw: &RawConfig, policies: &[PolicyConfig]) -> Result<RlqsSection, ConfigError> {
        let defaults = RlqsSection::default();
        let r = &raw.rls;
        let unknown_domain = match &r.rlqs_unknown_domain {
            None => defaults.unknown_domain,
            Some(v) => match v.value.as_str() {
                "allow_all" => UnknownDomain::AllowAll,
                "deny_all" => UnknownDomain::DenyAll,
                other => {
                    return Err(self.invalid(
                        "rls.rlqs_unknown_domain",
                        &v.at,
                        format!("unknown {other:?}: use allow_all or deny_all"),
                    ));
                }
            },
        };
        let report_period_ms = self.number(
            "rls.rlqs_report_period_ms",
            &r.rlqs_report_period_ms,
            duration_ms(defaults.report_period),
            RLQS_REPORT_PERIOD_MS_MIN,
            RLQS_REPORT_PERIOD_MS_MAX,
        )?;
        let abandon_after_periods = self.number(
            "rls.rlqs_abandon_after_periods",
            &r.rlqs_abandon_after_periods,
            u64::from(defaults.abandon_after_periods),
            1,
            RLQS_ABANDON_AFTER_PERIODS_MAX,
        )?;
        let sync_interval_ms = self.number(
            "rls.rlqs_sync_interval_ms",
            &r.rlqs_sync_interval_ms,
            duration_ms(defaults.sync_interval),
            RLQS_SYNC_INTERVAL_MS_MIN,
            RLQS_SYNC_INTERVAL_MS_MAX,
        )?;
        if raw.rlqs.len() > POLICIES_MAX {
            return Err(self.invalid_whole("rlqs", format!("more than {POLICIES_MAX} [[rlqs]] tables")));
        }
        let mut domains: Vec<RlqsDomain> = Vec::with_capacity(raw.rlqs.len());
        for (i, table) in raw.rlqs.iter().enumerate() {
            let at = At::File(table.span());
            let t = table.get_ref();
            let field = |name: &str| format!("rlqs[{i}].{name}");
            let domain = match &t.domain {
                None => return Err(self.invalid(field("domain"), &at, "missing: the Envoy filter's domain")),
                Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                    return Err(self.invalid(
                        field("domain"),
                        &v.at,
                        format!("{:?}: a domain of 1 to {NAME_BYTES_MAX} bytes", v.value),
                    ));
                }
                Some(v) if domains.iter().any(|d| d.domain == v.value) => {
                    return Err(self.invalid(
                        field("domain"),
                        &v.at,
                        format!("{:?} is named twice", v.value),
                    ));
                }
                Some(v) => v.value.clone(),
            };
            let policy = match &t.policy {
                None => {
                    return Err(self.invalid(field("policy"), &at, "missing: the policy the domain splits"));
                }
                Some(v) if !policies.iter().any(|p| p.name == v.value) => {
                    return Err(self.invalid(
                        field("policy"),
                        &v.at,
                        format!("{:?}: no such policy", v.value),
                    ));
                }
                Some(v) => v.value.clone(),
            };
            let key_entries = match &t.key_entries {
                None => None,
                Some(entries) => {
                    if entries.is_empty() || entries.len() > DESCRIPTOR_DEPTH_MAX {
                        return Err(self.invalid(
                            field("key_entries"),
                            &at,
                            format!("1 to {DESCRIPTOR_DEPTH_MAX} entry names, or unset for every entry"),
                        ));
                    }
                    let mut names = Vec::with_capacity(entries.len());
                    for (j, v) in entries.iter().enumerate() {
                        if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX || names.contains(&v.value) {
                            return Err(self.invalid(
                                format!("rlqs[{i}].key_entries[{j}]"),
                                &v.at,
                                format!("{:?}: a distinct name of 1 to {NAME_BYTES_MAX} bytes", v.value),
                            ));
                        }
                        names.push(v.value.clone());
                    }
                    Some(names)
                }
            };
            let tier_entry = match &t.tier_entry {
                Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                    return Err(self.invalid(
                        field("tier_entry"),
                        &v.at,
                        format!("{:?}: an entry name of 1 to {NAME_BYTES_MAX} bytes", v.value),
                    ));
                }
                v => v.as_ref().map(|v| v.value.clone()),
            };
            domains.push(RlqsDomain { domain, policy, key_entries, tier_entry });
        }
        Ok(RlqsSection {
            domains,
            unknown_domain,
            report_period: Duration::from_millis(report_period_ms),
            abandon_after_periods: u32::try_from(abandon_after_periods).unwrap_or(u32::MAX),
            sync_interval: Duration::from_millis(sync_interval_ms),
        })
    }

    /// `[rls]`; an all-or-nothing domain must be some policy's Envoy domain (a misspelt one
    /// would silently leave its requests partial).
    fn rls(&self, raw: &RawConfig, policies: &[PolicyConfig]) -> Result<RlsSection, ConfigError> {
        let mut domains = Vec::new();
        for (i, v) in raw.rls.all_or_nothing_domains.iter().flatten().enumerate() {
            if v.value.is_empty()
                || v.value.len() > NAME_BYTES_MAX
                || v.value.contains(char::is_whitespace)
                || v.value.contains('!')
            {
                return Err(self.invalid(
                    format!("rls.all_or_nothing_domains[{i}]"),
                    &v.at,
                    format!("{:?}: a domain of 1 to {NAME_BYTES_MAX} bytes without spaces", v.value),
                ));
            }
            if !policies
                .iter()
                .any(|policy| policy.envoy.as_ref().is_some_and(|envoy| envoy.domain == v.value))
            {
                return Err(self.invalid(
                    format!("rls.all_or_nothing_domains[{i}]"),
                    &v.at,
                    format!("{:?}: no policy has this domain", v.value),
                ));
            }
            domains.push(v.value.clone());
        }
        Ok(RlsSection { all_or_nothing_domains: domains, envoy_ratelimit: None })
    }

    fn node(&self, raw: &RawConfig) -> Result<NodeSection, ConfigError> {
        let n = &raw.node;
        let id_from = match &n.id_from {
            None => None,
            Some(v) if n.id.is_some() => {
                return Err(self.invalid("node.id_from", &v.at, "conflicts with node.id: set one of them"));
            }
            Some(v) => {
                Some(IdFrom::ALL.into_iter().find(|from| from.name() == v.value).ok_or_else(|| {
                    self.invalid(
                        "node.id_from",
                        &v.at,
                        format!("unknown {:?}: use hostname or reverse_dns", v.value),
                    )
                })?)
            }
        };
        let defaults = NodeSection::default();
        let data_dir = match &n.data_dir {
            // A relative directory would depend on where the daemon happens to be started.
            Some(v) if !Path::new(&v.value).is_absolute() => {
                return Err(self.invalid(
                    "node.data_dir",
                    &v.at,
                    format!("{:?}: must be an absolute path (leave it out for none)", v.value),
                ));
            }
            Some(v) => Some(PathBuf::from(&v.value)),
            None => None,
        };
        let interval_default = duration_ms(defaults.snapshot_interval);
        let snapshot_interval_ms = self.number(
            "node.snapshot_interval_ms",
            &n.snapshot_interval_ms,
            interval_default,
            SNAPSHOT_INTERVAL_MS_MIN,
            SNAPSHOT_INTERVAL_MS_MAX,
        )?;
        let period_min_default = duration_ms(defaults.snapshot_period_min);
        let snapshot_period_min_ms = self.number(
            "node.snapshot_period_min_ms",
            &n.snapshot_period_min_ms,
            period_min_default,
            0,
            PERIOD_NANOS_MAX / 1_000_000,
        )?;
        let region = match &n.region {
            None => Region::NONE,
            Some(v) => Region::new(&v.value)
                .map_err(|error| self.invalid("node.region", &v.at, format!("{:?}: {error}", v.value)))?,
        };
        let region_sync_interval_ms = self.number(
            "node.region_sync_interval_ms",
            &n.region_sync_interval_ms,
            duration_ms(defaults.region_sync_interval),
            1,
            INTERVAL_MS_MAX,
        )?;
        let region_lease_ms = self.number(
            "node.region_lease_ms",
            &n.region_lease_ms,
            duration_ms(defaults.region_lease),
            1,
            REGION_LEASE_MS_MAX,
        )?;
        // A lease is renewed when two region rounds or less are left of it.
        if region_lease_ms <= region_sync_interval_ms.saturating_mul(2) {
            let message = format!(
                "{region_lease_ms} must be longer than twice node.region_sync_interval_ms \
                 ({region_sync_interval_ms}): a lease is renewed two rounds before its end"
            );
            return Err(match &n.region_lease_ms {
                Some(v) => self.invalid("node.region_lease_ms", &v.at, message),
                None => self.invalid_whole("node.region_lease_ms", message),
            });
        }
        let region_fallback = match &n.region_fallback {
            None => defaults.region_fallback,
            Some(v) => region_fallback_named(&v.value)
                .map_err(|message| self.invalid("node.region_fallback", &v.at, message))?,
        };
        // 0 is valid: the node audits nothing.
        let audit_keys_max = self.number(
            "node.audit_keys_max",
            &n.audit_keys_max,
            defaults.audit_keys_max as u64,
            0,
            AUDIT_KEYS_MAX_MAX,
        )?;
        Ok(NodeSection {
            id: n.id.as_ref().map_or(defaults.id, |v| NodeId(v.value)),
            id_from,
            incarnation: n.incarnation.as_ref().map(|v| v.value),
            data_dir,
            snapshot_interval: Duration::from_millis(snapshot_interval_ms),
            snapshot_period_min: Duration::from_millis(snapshot_period_min_ms),
            region,
            region_sync_interval: Duration::from_millis(region_sync_interval_ms),
            region_lease: Duration::from_millis(region_lease_ms),
            region_fallback,
            // At most AUDIT_KEYS_MAX_MAX (2^24): fits every usize of 32 bits or more.
            audit_keys_max: usize::try_from(audit_keys_max).unwrap_or(usize::MAX),
        })
    }

    fn cluster(&self, raw: &RawConfig, listen: &ListenSection) -> Result<ClusterSection, ConfigError> {
        let c = &raw.cluster;
        let cluster_id = match &c.cluster_id {
            Some(v) if !is_plain_name(&v.value) => {
                return Err(self.invalid(
                    "cluster.cluster_id",
                    &v.at,
                    format!("{:?}: use 1 to {NAME_BYTES_MAX} letters, digits, '_', '-' or '.'", v.value),
                ));
            }
            Some(v) => v.value.clone(),
            None => CLUSTER_ID_DEFAULT.to_owned(),
        };
        let seeds = c.seeds.as_deref().unwrap_or_default();
        if seeds.len() > SEEDS_MAX {
            let at = &seeds[SEEDS_MAX].at;
            return Err(self.invalid("cluster.seeds", at, format!("more than {SEEDS_MAX} seeds")));
        }
        let seeds = seeds
            .iter()
            .enumerate()
            .map(|(i, seed)| {
                seed.value
                    .parse::<Seed>()
                    .map_err(|error| self.invalid(format!("cluster.seeds[{i}]"), &seed.at, error))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let auth = self.auth(raw, listen)?;
        let gossip_ms = self.number(
            "cluster.gossip_interval_ms",
            &c.gossip_interval_ms,
            GOSSIP_INTERVAL_MS_DEFAULT,
            1,
            INTERVAL_MS_MAX,
        )?;
        let sync_ms = self.number(
            "cluster.sync_interval_ms",
            &c.sync_interval_ms,
            SYNC_INTERVAL_MS_DEFAULT,
            1,
            INTERVAL_MS_MAX,
        )?;
        // A member forgotten before the failure detector could have declared it dead would come
        // back as a new member on every gossip round.
        let forget_ms = self.number(
            "cluster.dead_member_forget_ms",
            &c.dead_member_forget_ms,
            DEAD_MEMBER_FORGET_MS_DEFAULT,
            gossip_ms,
            DEAD_MEMBER_FORGET_MS_MAX,
        )?;
        let resolve_ms = self.number(
            "cluster.seed_resolve_interval_ms",
            &c.seed_resolve_interval_ms,
            SEED_RESOLVE_INTERVAL_MS_DEFAULT,
            SEED_RESOLVE_INTERVAL_MS_MIN,
            INTERVAL_MS_MAX,
        )?;
        let linger_ms = self.number(
            "cluster.leave_linger_ms",
            &c.leave_linger_ms,
            LEAVE_LINGER_MS_DEFAULT,
            0,
            LEAVE_LINGER_MS_MAX,
        )?;
        Ok(ClusterSection {
            cluster_id,
            seeds,
            seed_resolve_interval: Duration::from_millis(resolve_ms),
            leave_linger: Duration::from_millis(linger_ms),
            auth,
            gossip_interval: Duration::from_millis(gossip_ms),
            sync_interval: Duration::from_millis(sync_ms),
            dead_member_forget: Duration::from_millis(forget_ms),
        })
    }

    fn auth(&self, raw: &RawConfig, listen: &ListenSection) -> Result<ClusterAuth, ConfigError> {
        let c = &raw.cluster;
        let paths =
            [("ca_cert_path", &c.ca_cert_path), ("cert_path", &c.cert_path), ("key_path", &c.key_path)];
        let given: Vec<_> = paths.iter().filter_map(|(name, v)| v.as_ref().map(|v| (*name, v))).collect();
        for (name, value) in [("cluster.secret", &c.secret), ("cluster.secret_accepted", &c.secret_accepted)]
        {
            if let Some(secret) = value
                && let Err(error) = ClusterSecret::new(secret.value.as_str())
            {
                return Err(self.invalid(name, &secret.at, error));
            }
        }
        let accepted = c.secret_accepted.as_ref().map(|v| SecretString::new(v.value.as_str()));
        if !given.is_empty() {
            for (name, value) in &paths {
                match value {
                    None => {
                        let (other, v) = given[0];
                        let message = format!(
                            "missing: cluster.{other} is set, and certificates need ca_cert_path, cert_path \
                             and key_path"
                        );
                        return Err(self.invalid(format!("cluster.{name}"), &v.at, message));
                    }
                    Some(v) if v.value.is_empty() => {
                        return Err(self.invalid(format!("cluster.{name}"), &v.at, "must not be empty"));
                    }
                    Some(_) => {}
                }
            }
            let Some(gossip_secret) = &c.secret else {
                let (other, v) = given[0];
                let message = format!(
                    "missing: cluster.{other} is set, and with certificates cluster.secret (at least \
                     {CLUSTER_SECRET_LEN_MIN} bytes, shared by every node) seals gossip"
                );
                return Err(self.invalid("cluster.secret", &v.at, message));
            };
            let path = |v: &Option<Val<String>>| PathBuf::from(v.as_ref().map_or("", |v| v.value.as_str()));
            return Ok(ClusterAuth::Certs {
                ca_cert_path: path(&c.ca_cert_path),
                cert_path: path(&c.cert_path),
                key_path: path(&c.key_path),
                gossip_secret: SecretString::new(gossip_secret.value.as_str()),
                accepted,
            });
        }
        let secret = c.secret.as_ref().map_or(DEV_CLUSTER_SECRET, |v| v.value.as_str());
        if secret == DEV_CLUSTER_SECRET {
            // The development secret is public: a node reachable from other hosts with it would
            // admit anyone into its cluster.
            let exposed =
                [("gossip", listen.gossip, &raw.listen.gossip), ("quic", listen.quic, &raw.listen.quic)]
                    .into_iter()
                    .find(|(_, addr, _)| !addr.ip().is_loopback());
            if let Some((name, addr, at)) = exposed {
                let message = format!(
                    "the built-in development secret is public and only allowed on loopback, but \
                     listen.{name} is {addr}: set cluster.secret (at least {CLUSTER_SECRET_LEN_MIN} \
                     bytes)"
                );
                return Err(match (&c.secret, at) {
                    (Some(v), _) | (None, Some(v)) => self.invalid("cluster.secret", &v.at, message),
                    (None, None) => self.invalid_whole("cluster.secret", message),
                });
            }
        }
        Ok(ClusterAuth::Secret { secret: SecretString::new(secret), accepted })
    }

    fn listen(&self, raw: &RawConfig) -> Result<ListenSection, ConfigError> {
        let l = &raw.listen;
        let http = self.address("listen.http", l.http.as_ref())?.unwrap_or(HTTP_LISTEN_DEFAULT);
        let grpc = self.address("listen.grpc", l.grpc.as_ref())?.unwrap_or(GRPC_LISTEN_DEFAULT);
        let resp = self.address("listen.resp", l.resp.as_ref())?;
        let rlqs = self.address("listen.rlqs", l.rlqs.as_ref())?;
        let gossip = self.address("listen.gossip", l.gossip.as_ref())?.unwrap_or(GOSSIP_LISTEN_DEFAULT);
        let quic = self.address("listen.quic", l.quic.as_ref())?.unwrap_or(QUIC_LISTEN_DEFAULT);
        let advertise_gossip = l
            .advertise_gossip
            .as_ref()
            .map(|v| self.peer_address("listen.advertise_gossip", v))
            .transpose()?;
        let advertise_quic =
            l.advertise_quic.as_ref().map(|v| self.peer_address("listen.advertise_quic", v)).transpose()?;
        let advertise_ip_from =
            l.advertise_ip_from.as_ref().map(|v| self.advertise_ip_from(v, l, [gossip, quic])).transpose()?;
        // Two sockets of one protocol on one address fail at bind; say so now, with the line.
        // Port 0 asks the OS for a free port, so it never clashes.
        let mut pairs = vec![
            (("http", http, &l.http), ("grpc", grpc, &l.grpc)),
            (("gossip", gossip, &l.gossip), ("quic", quic, &l.quic)),
        ];
        if let Some(resp) = resp {
            pairs.push((("http", http, &l.http), ("resp", resp, &l.resp)));
            pairs.push((("grpc", grpc, &l.grpc), ("resp", resp, &l.resp)));
        }
        if let Some(rlqs) = rlqs {
            pairs.push((("http", http, &l.http), ("rlqs", rlqs, &l.rlqs)));
            pairs.push((("grpc", grpc, &l.grpc), ("rlqs", rlqs, &l.rlqs)));
            if let Some(resp) = resp {
                pairs.push((("resp", resp, &l.resp), ("rlqs", rlqs, &l.rlqs)));
            }
        }
        for ((a, addr_a, va), (b, addr_b, vb)) in pairs {
            if addr_a == addr_b && addr_a.port() != 0 {
                let message = format!("listen.{a} and listen.{b} are both {addr_a}");
                return Err(match (va, vb) {
                    (_, Some(v)) => self.invalid(format!("listen.{b}"), &v.at, message),
                    (Some(v), None) => self.invalid(format!("listen.{a}"), &v.at, message),
                    (None, None) => self.invalid_whole(format!("listen.{b}"), message),
                });
            }
        }
        // Peers cannot reach "any address": a node must announce a concrete one.
        for (name, addr, advertised, v) in
            [("gossip", gossip, advertise_gossip, &l.gossip), ("quic", quic, advertise_quic, &l.quic)]
        {
            if advertised.is_none() && advertise_ip_from.is_none() && addr.ip().is_unspecified() {
                let message = format!(
                    "listens on {addr}, which peers cannot reach: set listen.advertise_{name} to the \
                     address peers should use"
                );
                return Err(match v {
                    Some(v) => self.invalid(format!("listen.{name}"), &v.at, message),
                    None => self.invalid_whole(format!("listen.{name}"), message),
                });
            }
        }
        Ok(ListenSection {
            http,
            grpc,
            resp,
            rlqs,
            gossip,
            quic,
            advertise_gossip,
            advertise_quic,
            advertise_ip_from,
            grpc_tls: self.grpc_tls(l)?,
        })
    }

    /// `listen.grpc_tls_*`: a certificate and a key together, a client CA only beside them.
    fn grpc_tls(&self, l: &RawListen) -> Result<Option<TlsFiles>, ConfigError> {
        let fields = [
            ("listen.grpc_tls_cert_path", &l.grpc_tls_cert_path),
            ("listen.grpc_tls_key_path", &l.grpc_tls_key_path),
            ("listen.grpc_tls_client_ca_path", &l.grpc_tls_client_ca_path),
        ];
        for (name, value) in fields {
            if let Some(v) = value.as_ref().filter(|v| v.value.is_empty()) {
                return Err(self.invalid(name, &v.at, "must not be empty"));
            }
        }
        let path = |v: &Val<String>| PathBuf::from(&v.value);
        match (&l.grpc_tls_cert_path, &l.grpc_tls_key_path, &l.grpc_tls_client_ca_path) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), ca) => {
                Ok(Some(TlsFiles { cert: path(cert), key: path(key), client_ca: ca.as_ref().map(path) }))
            }
            (cert, key, ca) => {
                let (name, v) = [(fields[0].0, cert), (fields[1].0, key), (fields[2].0, ca)]
                    .into_iter()
                    .find_map(|(name, v)| v.as_ref().map(|v| (name, v)))
                    .expect("one is set");
                let message =
                    "TLS on the gRPC listener needs listen.grpc_tls_cert_path and listen.grpc_tls_key_path";
                Err(self.invalid(name, &v.at, message))
            }
        }
    }

    /// A listen address (`ip:port`; port 0 lets the OS choose), if given.
    fn address(&self, field: &str, v: Option<&Val<String>>) -> Result<Option<SocketAddr>, ConfigError> {
        v.map(|v| {
            v.value.trim().parse().map_err(|_| {
                self.invalid(field, &v.at, format!("{:?} is not an address of the form ip:port", v.value))
            })
        })
        .transpose()
    }

    /// `listen.advertise_ip_from`, which replaces both advertised addresses: the IP found at
    /// start with the ports of `listen` (which must therefore be chosen, not 0).
    fn advertise_ip_from(
        &self,
        v: &Val<String>,
        l: &RawListen,
        listen: [SocketAddr; 2],
    ) -> Result<AdvertiseIpFrom, ConfigError> {
        if v.value != AdvertiseIpFrom::Hostname.name() {
            return Err(self.invalid(
                "listen.advertise_ip_from",
                &v.at,
                format!("unknown {:?}: use hostname", v.value),
            ));
        }
        let given =
            [("listen.advertise_gossip", &l.advertise_gossip), ("listen.advertise_quic", &l.advertise_quic)];
        if let Some((field, Some(other))) = given.into_iter().find(|(_, v)| v.is_some()) {
            let message =
                "conflicts with listen.advertise_ip_from: give the addresses or where to find them, not both";
            return Err(self.invalid(field, &other.at, message));
        }
        if listen.iter().any(|addr| addr.port() == 0) {
            let message = "needs fixed ports in listen.gossip and listen.quic (0 is chosen at start, too late to advertise)";
            return Err(self.invalid("listen.advertise_ip_from", &v.at, message));
        }
        Ok(AdvertiseIpFrom::Hostname)
    }

    /// An address peers connect to: a concrete IP and a port.
    fn peer_address(&self, field: &str, v: &Val<String>) -> Result<SocketAddr, ConfigError> {
        match self.address(field, Some(v))? {
            Some(addr) if !addr.ip().is_unspecified() && addr.port() != 0 => Ok(addr),
            addr => {
                let shown = addr.map_or_else(|| v.value.clone(), |addr| addr.to_string());
                Err(self.invalid(field, &v.at, format!("{shown} cannot be connected to")))
            }
        }
    }

    /// A number in `min..=max`, or `default` when absent.
    fn number(
        &self,
        field: &str,
        v: &Option<Val<u64>>,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        match v {
            None => Ok(default),
            Some(v) if v.value < min || v.value > max => {
                Err(self.invalid(field, &v.at, format!("{} is out of range {min}..={max}", v.value)))
            }
            Some(v) => Ok(v.value),
        }
    }

    /// [`Self::number`] as a `usize`.
    fn size(
        &self,
        field: &str,
        v: &Option<Val<u64>>,
        default: usize,
        max: u64,
    ) -> Result<usize, ConfigError> {
        let value = self.number(field, v, default as u64, 1, max)?;
        // Bounds are far below usize::MAX on 64-bit targets; on smaller ones a huge value is
        // refused like any out-of-range value.
        usize::try_from(value).map_err(|_| match v {
            Some(v) => self.invalid(field, &v.at, format!("{value} is too large for this platform")),
            None => self.invalid_whole(field, "default too large for this platform"),
        })
    }

    fn bounds(&self, raw: &RawConfig) -> Result<Bounds, ConfigError> {
        let l = &raw.limits;
        let defaults = Bounds::default();
        let http_body_bytes_max = self.size(
            "limits.http_body_bytes_max",
            &l.http_body_bytes_max,
            defaults.http_body_bytes_max,
            HTTP_BODY_BYTES_MAX_MAX,
        )?;
        let http_in_flight_max = self.size(
            "limits.http_in_flight_max",
            &l.http_in_flight_max,
            defaults.http_in_flight_max,
            HTTP_IN_FLIGHT_MAX_MAX,
        )?;
        Ok(Bounds {
            keys_max: self.size("limits.keys_max", &l.keys_max, defaults.keys_max, KEYS_MAX_MAX)?,
            log_bytes_max: self.size(
                "limits.log_bytes_max",
                &l.log_bytes_max,
                defaults.log_bytes_max,
                LOG_BYTES_MAX_MAX,
            )?,
            http_in_flight_max,
            // The default follows the in-flight bound; the product is at most 4 << 20.
            connections_max: self.size(
                "limits.connections_max",
                &l.connections_max,
                connections_max_default(http_in_flight_max),
                CONNECTIONS_MAX_MAX,
            )?,
            batch_len_max: self.size(
                "limits.batch_len_max",
                &l.batch_len_max,
                defaults.batch_len_max,
                BATCH_LEN_MAX_MAX,
            )?,
            // A key must fit in a request body.
            key_bytes_max: self.size(
                "limits.key_bytes_max",
                &l.key_bytes_max,
                defaults.key_bytes_max.min(http_body_bytes_max),
                http_body_bytes_max as u64,
            )?,
            http_body_bytes_max,
            rlqs_streams_max: self.size(
                "limits.rlqs_streams_max",
                &l.rlqs_streams_max,
                defaults.rlqs_streams_max,
                RLQS_STREAMS_MAX_MAX,
            )?,
            rlqs_buckets_per_stream_max: self.size(
                "limits.rlqs_buckets_per_stream_max",
                &l.rlqs_buckets_per_stream_max,
                defaults.rlqs_buckets_per_stream_max,
                RLQS_BUCKETS_PER_STREAM_MAX_MAX,
            )?,
        })
    }

    fn log(&self, raw: &RawConfig) -> Result<LogSection, ConfigError> {
        let format = match &raw.log.format {
            None => LogFormat::default(),
            Some(v) => match v.value.as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(self.invalid(
                        "log.format",
                        &v.at,
                        format!("unknown format {other:?}: use text or json"),
                    ));
                }
            },
        };
        let level = match &raw.log.level {
            None => LogLevel::default(),
            Some(v) => LogLevel::ALL.into_iter().find(|level| level.name() == v.value).ok_or_else(|| {
                self.invalid(
                    "log.level",
                    &v.at,
                    format!("unknown level {:?}: use error, warn, info, debug or trace", v.value),
                )
            })?,
        };
        Ok(LogSection { format, level })
    }

    fn auth_section(&self, raw: &RawConfig) -> Result<AuthSection, ConfigError> {
        let header = |field: &str, value: &Option<Val<String>>, default: &str| match value {
            None => Ok(default.to_owned()),
            Some(v) if is_header_name(&v.value) => Ok(v.value.to_ascii_lowercase()),
            Some(v) => Err(self.invalid(
                field,
                &v.at,
                format!(
                    "{:?} is not a header name: use 1 to {NAME_BYTES_MAX} letters, digits, '-' or '_'",
                    v.value
                ),
            )),
        };
        let admin_token = match &raw.auth.admin_token {
            None => None,
            Some(v) if v.value.len() < ADMIN_TOKEN_BYTES_MIN || v.value.trim() != v.value => {
                return Err(self.invalid(
                    "auth.admin_token",
                    &v.at,
                    format!("use at least {ADMIN_TOKEN_BYTES_MIN} bytes, without surrounding spaces"),
                ));
            }
            Some(v) => Some(SecretString::new(v.value.clone())),
        };
        Ok(AuthSection {
            policy_header: header("auth.policy_header", &raw.auth.policy_header, AUTH_POLICY_HEADER_DEFAULT)?,
            key_header: header("auth.key_header", &raw.auth.key_header, AUTH_KEY_HEADER_DEFAULT)?,
            admin_token,
        })
    }
}
