//! Logs: `tracing` events to stderr, as text or JSON lines (`[log] format`, fixed at start),
//! at a level that a reload can change (`[log] level`).

use tracing::level_filters::LevelFilter;
use tracing_subscriber::Registry;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{LogFormat, LogLevel, LogSection};

/// Libraries whose debug output would drown the daemon's own (per-packet and per-handshake
/// events): they log at `warn` and above unless the level is `trace`.
const CHATTY_TARGETS: [&str; 4] = ["quinn", "quinn_proto", "rustls", "chitchat"];

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A global subscriber is installed already.
    #[error("installing the log subscriber: {0}")]
    Init(#[from] tracing_subscriber::util::TryInitError),
    /// The filter could not be replaced.
    #[error("changing the log level: {0}")]
    Reload(#[from] reload::Error),
}

/// Changes the level of the installed subscriber.
#[derive(Debug, Clone)]
pub struct LogControl {
    handle: reload::Handle<Targets, Registry>,
}

impl LogControl {
    /// Logs at `level` from now on.
    pub fn set_level(&self, level: LogLevel) -> Result<(), LogError> {
        self.handle.reload(targets(level))?;
        Ok(())
    }
}

fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

fn targets(level: LogLevel) -> Targets {
    let chatty =
        level_filter(if level == LogLevel::Trace { LogLevel::Trace } else { level.min(LogLevel::Warn) });
    CHATTY_TARGETS.iter().fold(Targets::new().with_default(level_filter(level)), |targets, target| {
        targets.with_target(*target, chatty)
    })
}

/// Installs the process's subscriber: stderr, `log.format`, `log.level`.
pub fn init(log: &LogSection) -> Result<LogControl, LogError> {
    let (filter, handle) = reload::Layer::new(targets(log.level));
    let (text, json) = match log.format {
        LogFormat::Text => {
            // Colours only for a person at a terminal, not in a file or a collector.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            (Some(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr)), None)
        }
        LogFormat::Json => (None, Some(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr))),
    };
    tracing_subscriber::registry().with(filter).with(text).with(json).try_init()?;
    Ok(LogControl { handle })
}
