//! envoyproxy/ratelimit's environment variables (its `src/settings/settings.go`), as
//! `ratemeshd envoy-ratelimit` reads them, and what they change in the daemon's [`Config`].

use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use super::Loaded;
use crate::config::{Config, EnvoyRatelimitAnswers, LogFormat, LogLevel};
use crate::rls::tls::TlsFiles;
use crate::xds::{XdsError, XdsSettings};

/// Upstream's defaults.
const RUNTIME_ROOT_DEFAULT: &str = "/srv/runtime_data/current";
const RUNTIME_APPDIRECTORY_DEFAULT: &str = "config";
const PORT_DEFAULT: u16 = 8080;
const GRPC_PORT_DEFAULT: u16 = 8081;
const DEBUG_PORT_DEFAULT: u16 = 6070;
const HOST_DEFAULT: &str = "0.0.0.0";
const HEADER_NAMES_DEFAULT: [&str; 3] = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

/// The settings of `ratemeshd envoy-ratelimit`, from envoyproxy/ratelimit's variables.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`: where the YAML files are.
    pub config_dir: PathBuf,
    /// `RUNTIME_IGNOREDOTFILES`: skip files and directories whose name starts with `.`.
    pub ignore_dot_files: bool,
    /// `MERGE_DOMAIN_CONFIG`: files of the same domain join instead of being refused.
    pub merge_domains: bool,
    /// `HOST:PORT`: the HTTP API, `/healthcheck`, `/json` and `/rlconfig`.
    pub http: SocketAddr,
    /// `GRPC_HOST:GRPC_PORT`: the Rate Limit Service.
    pub grpc: SocketAddr,
    /// `DEBUG_HOST:DEBUG_PORT`: `/rlconfig`, where upstream serves it.
    pub debug: SocketAddr,
    /// `SHADOW_MODE`, `LIMIT_RESPONSE_HEADERS_ENABLED` and the header names.
    pub answers: EnvoyRatelimitAnswers,
    /// `LOG_LEVEL`, if set.
    pub log_level: Option<LogLevel>,
    /// `LOG_FORMAT`, if set.
    pub log_format: Option<LogFormat>,
    /// Variables of upstream's that change nothing here (`REDIS_*`, `USE_STATSD`, …), by name.
    pub ignored: Vec<String>,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration comes from an xDS management server
    /// (`CONFIG_GRPC_XDS_*`, see [`crate::xds`]) instead of the files of `config_dir`.
    pub xds: Option<XdsSettings>,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: with xDS, serve (and answer `/healthcheck`) before
    /// the first configuration arrived, with no limits until then; otherwise the listeners open
    /// once it is applied, as upstream starts.
    pub force_start_without_initial_config: bool,
    /// `GRPC_SERVER_USE_TLS` with `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and, for mutual
    /// TLS, `GRPC_CLIENT_TLS_CACERT`: TLS on the Rate Limit Service's listener.
    pub grpc_tls: Option<TlsFiles>,
}

/// A variable's value is invalid, or asks for what is not supported. Nothing started.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse.
    #[error("{name}={value:?}: {expected}")]
    Invalid {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A `CONFIG_GRPC_XDS_*` or `XDS_CLIENT_*` variable.
    #[error(transparent)]
    Xds(#[from] XdsError),
    /// A variable that needs another one.
    #[error("{name} is set: {needs}")]
    Missing {
        /// The variable.
        name: &'static str,
        /// What it needs.
        needs: &'static str,
    },
}

/// The variables whose only effect upstream is on what ratemesh does not have (Redis,
/// Memcache, statsd, tracing): their names are logged once, and they are ignored.
const IGNORED_PREFIXES: [&str; 6] =
    ["REDIS_", "MEMCACHE_", "USE_STATSD", "STATSD_", "TRACING_", "BACKEND_TYPE"];

impl Settings {
    /// The settings from `vars` (pass `std::env::vars_os()`); upstream's default for each
    /// variable not set.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Settings, SettingsError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .map(|(k, v)| {
                (k.as_ref().to_string_lossy().into_owned(), v.as_ref().to_string_lossy().into_owned())
            })
            .collect();
        let env = Env(&vars);
        let xds = match env.get("CONFIG_TYPE").unwrap_or("FILE") {
            "FILE" => None,
            "GRPC_XDS_SOTW" => Some(XdsSettings::from_env(|name| env.get(name).map(str::to_owned))?),
            other => return Err(invalid("CONFIG_TYPE", other, "FILE or GRPC_XDS_SOTW")),
        };
        let mut config_dir = PathBuf::from(env.get("RUNTIME_ROOT").unwrap_or(RUNTIME_ROOT_DEFAULT));
        config_dir.push(env.get("RUNTIME_SUBDIRECTORY").unwrap_or(""));
        config_dir.push(env.get("RUNTIME_APPDIRECTORY").unwrap_or(RUNTIME_APPDIRECTORY_DEFAULT));
        // RUNTIME_WATCH_ROOT only says which directory upstream watches: every file is polled here.
        env.boolean("RUNTIME_WATCH_ROOT", true)?;
        let headers = match env.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            false => None,
            true => {
                let names = ["LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"];
                Some([0, 1, 2].map(|i| env.get(names[i]).unwrap_or(HEADER_NAMES_DEFAULT[i]).to_owned()))
            }
        };
        Ok(Settings {
            config_dir,
            ignore_dot_files: env.boolean("RUNTIME_IGNOREDOTFILES", false)?,
            merge_domains: env.boolean("MERGE_DOMAIN_CONFIG", false)?,
            http: env.addr("HOST", "PORT", PORT_DEFAULT)?,
            grpc: env.addr("GRPC_HOST", "GRPC_PORT", GRPC_PORT_DEFAULT)?,
            debug: env.addr("DEBUG_HOST", "DEBUG_PORT", DEBUG_PORT_DEFAULT)?,
            answers: EnvoyRatelimitAnswers {
                global_shadow_mode: env.boolean("SHADOW_MODE", false)?,
                global_quota_mode: env.boolean("QUOTA_MODE", false)?,
                headers,
                dump: String::new(),
            },
            log_level: env.get("LOG_LEVEL").map(log_level).transpose()?,
            log_format: env.get("LOG_FORMAT").map(log_format).transpose()?,
            ignored: vars
                .iter()
                .map(|(name, _)| name)
                .filter(|name| IGNORED_PREFIXES.iter().any(|prefix| name.starts_with(prefix)))
                .cloned()
                .collect(),
            xds,
            force_start_without_initial_config: env.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
            grpc_tls: grpc_tls(&env)?,
        })
    }

    /// `config` (the daemon's own settings: cluster, data directory, bounds) with these
    /// settings' listeners, logging and answers, and the policies of `loaded`.
    pub fn apply(&self, config: &mut Config, loaded: Loaded) {
        config.listen.http = self.http;
        config.listen.grpc = self.grpc;
        if let Some(tls) = &self.grpc_tls {
            config.listen.grpc_tls = Some(tls.clone());
        }
        if let Some(level) = self.log_level {
            config.log.level = level;
        }
        if let Some(format) = self.log_format {
            config.log.format = format;
        }
        config.policies = loaded.policies;
        let answers = EnvoyRatelimitAnswers { dump: loaded.dump, ..self.answers.clone() };
        config.rls.envoy_ratelimit = Some(Arc::new(answers));
    }
}

struct Env<'a>(&'a [(String, String)]);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// Go's `strconv.ParseBool`, as upstream's `envconfig` reads booleans.
    fn boolean(&self, name: &str, default: bool) -> Result<bool, SettingsError> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
            Some(other) => Err(invalid(name, other, "a boolean (true, false, 1, 0, t, f)")),
        }
    }

    fn addr(&self, host: &str, port: &str, default_port: u16) -> Result<SocketAddr, SettingsError> {
        let host_text = self.get(host).filter(|h| !h.is_empty()).unwrap_or(HOST_DEFAULT);
        let ip: IpAddr = host_text.parse().map_err(|_| invalid(host, host_text, "an IP address"))?;
        let port = match self.get(port) {
            None | Some("") => default_port,
            Some(text) => text.parse().map_err(|_| invalid(port, text, "a port number (0 to 65535)"))?,
        };
        Ok(SocketAddr::new(ip, port))
    }
}

/// TLS on the gRPC listener from upstream's `GRPC_SERVER_*` variables (Envoy Gateway sets them to
/// the certificates it mounts at `/certs`).
fn grpc_tls(env: &Env<'_>) -> Result<Option<TlsFiles>, SettingsError> {
    if !env.boolean("GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let path = |name: &'static str| env.get(name).filter(|p| !p.is_empty()).map(PathBuf::from);
    let needs = "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY";
    let cert =
        path("GRPC_SERVER_TLS_CERT").ok_or(SettingsError::Missing { name: "GRPC_SERVER_USE_TLS", needs })?;
    let key =
        path("GRPC_SERVER_TLS_KEY").ok_or(SettingsError::Missing { name: "GRPC_SERVER_USE_TLS", needs })?;
    Ok(Some(TlsFiles { cert, key, client_ca: path("GRPC_CLIENT_TLS_CACERT") }))
}

fn invalid(name: &str, value: &str, expected: &'static str) -> SettingsError {
    SettingsError::Invalid { name: name.to_owned(), value: value.to_owned(), expected }
}

/// logrus's level names (any case); `fatal` and `panic` are `error` here.
fn log_level(text: &str) -> Result<LogLevel, SettingsError> {
    match text.to_ascii_lowercase().as_str() {
        "trace" => Ok(LogLevel::Trace),
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" | "warning" => Ok(LogLevel::Warn),
        "error" | "fatal" | "panic" => Ok(LogLevel::Error),
        _ => Err(invalid("LOG_LEVEL", text, "trace, debug, info, warn, error, fatal or panic")),
    }
}

fn log_format(text: &str) -> Result<LogFormat, SettingsError> {
    match text {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(invalid("LOG_FORMAT", text, "text or json")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_defaults_and_variables() {
        let none: [(&str, &str); 0] = [];
        let defaults = Settings::from_vars(none).expect("defaults");
        assert_eq!(defaults.config_dir, PathBuf::from("/srv/runtime_data/current/config"));
        assert_eq!(defaults.http, "0.0.0.0:8080".parse().expect("addr"));
        assert_eq!(defaults.grpc, "0.0.0.0:8081".parse().expect("addr"));
        assert_eq!(defaults.debug, "0.0.0.0:6070".parse().expect("addr"));
        assert_eq!(defaults.answers.headers, None);
        let set = Settings::from_vars([
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "conf"),
            ("GRPC_PORT", "9081"),
            ("SHADOW_MODE", "True"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
            ("LOG_LEVEL", "DEBUG"),
            ("REDIS_URL", "redis:6379"),
        ])
        .expect("valid");
        assert_eq!(set.config_dir, PathBuf::from("/data/ratelimit/conf"));
        assert_eq!(set.grpc.port(), 9081);
        assert!(set.answers.global_shadow_mode);
        assert_eq!(set.answers.headers.as_ref().map(|h| h[0].as_str()), Some("RateLimit-Limit"));
        assert_eq!(set.log_level, Some(LogLevel::Debug));
        assert_eq!(set.ignored, ["REDIS_URL"]);
        let xds = Settings::from_vars([
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ])
        .expect("Envoy Gateway's variables");
        assert_eq!(xds.xds.as_ref().map(|x| x.server_url.as_str()), Some("envoy-gateway:18001"));
        assert!(xds.force_start_without_initial_config);
        let tls = xds.grpc_tls.expect("TLS");
        assert_eq!(tls.client_ca, Some(PathBuf::from("/certs/ca.crt")));
        assert!(matches!(
            Settings::from_vars([("GRPC_SERVER_USE_TLS", "true")]),
            Err(SettingsError::Missing { .. })
        ));
        assert!(matches!(
            Settings::from_vars([
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "x")
            ]),
            Err(SettingsError::Xds(_))
        ));
        assert!(matches!(Settings::from_vars([("SHADOW_MODE", "yes")]), Err(SettingsError::Invalid { .. })));
        assert!(matches!(Settings::from_vars([("PORT", "70000")]), Err(SettingsError::Invalid { .. })));
    }
}
