//! The event log: one compact line per event, hashed into a digest (for determinism checks) and
//! optionally handed to a sink (for humans to read or diff).

use core::fmt;
use core::fmt::Write as _;

use xxhash_rust::xxh3::Xxh3;

/// Receives every line of the log (without the newline).
pub type LogSink<'a> = &'a mut dyn FnMut(&str);

/// See the module documentation.
pub struct EventLog<'a> {
    hasher: Xxh3,
    sink: Option<LogSink<'a>>,
    line: String,
}

impl<'a> EventLog<'a> {
    /// A log whose lines also go to `sink`, if any.
    pub fn new(sink: Option<LogSink<'a>>) -> EventLog<'a> {
        EventLog { hasher: Xxh3::new(), sink, line: String::new() }
    }

    /// Appends one line.
    pub fn line(&mut self, args: fmt::Arguments<'_>) {
        self.line.clear();
        // Writing into a String cannot fail.
        let _ = self.line.write_fmt(args);
        self.hasher.update(self.line.as_bytes());
        self.hasher.update(b"\n");
        if let Some(sink) = self.sink.as_mut() {
            sink(&self.line);
        }
    }

    /// The digest of every line so far.
    pub fn digest(&self) -> u64 {
        self.hasher.digest()
    }
}
