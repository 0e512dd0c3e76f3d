//! The commands: `CL.THROTTLE` (redis-cell's), and what clients send when they connect or probe
//! (`PING`, `ECHO`, `QUIT`, `HELLO`, `COMMAND`, `CLIENT SETNAME/SETINFO`, `SELECT 0`, `CONFIG
//! GET`). Anything else is `-ERR unknown command`, worded as Redis words it, but for an HTTP
//! request's `POST` line or `Host:` header, which close the connection unanswered, as in Redis.
//!
//! # `CL.THROTTLE key max_burst count_per_period period [quantity]`
//!
//! redis-cell's GCRA is the daemon's token bucket: a theoretical arrival time that moves one
//! emission interval (`period / count_per_period`) later per hit and may run at most
//! `max_burst + 1` intervals ahead of now. So the command is an inline `token_bucket` limit of
//! `count_per_period` per `period` seconds with `burst = max_burst + 1`, in the daemon's default
//! mode and fallback: the same bucket as an HTTP inline check of those parameters and the same
//! key, and different parameters are different buckets. The reply is redis-cell's:
//!
//! 1. limited: 0 or 1;
//! 2. limit: `max_burst + 1`;
//! 3. remaining: hits that would pass now;
//! 4. retry_after: seconds until the same request would pass, `-1` when allowed or when it can
//!    never pass (`quantity` above `max_burst + 1`);
//! 5. reset_after: seconds until the bucket is full again.
//!
//! Times are rounded up to whole seconds when their fraction has a millisecond or more, as
//! redis-cell rounds. `quantity` 0 peeks: never limited, nothing counted. Argument errors are
//! redis-cell's (`-Cell error: …`); negative values, which redis-cell does not define, are
//! refused the same way.

use std::sync::Arc;
use std::time::Duration;

use ratemesh::CheckError;
use ratemesh_core::{Algorithm, Decision, Limit, LimitError, LimitParameter, LimitSpec, Policy};
use tracing::debug;

use super::protocol;
use crate::check::{InlineLimit, Target};
use crate::config::{FALLBACK_DEFAULT, MODE_DEFAULT};
use crate::daemon::Daemon;

/// The commands answered, lower case (`COMMAND COUNT` counts them).
const COMMANDS: [&str; 10] =
    ["cl.throttle", "ping", "echo", "quit", "hello", "command", "client", "select", "config", "auth"];

/// redis-cell's usage error.
const THROTTLE_USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Reads the next command.
    Continue,
    /// Sends what is answered and closes (`QUIT`).
    Close,
}

/// One command: its arguments as ranges of the input buffer.
#[derive(Clone, Copy, Debug)]
pub struct Command<'a> {
    /// The bytes the ranges index.
    pub input: &'a [u8],
    /// The arguments, the command's name first; never empty.
    pub args: &'a [std::ops::Range<usize>],
}

impl<'a> Command<'a> {
    /// The `i`th argument (0: the name); empty when absent.
    fn arg(&self, i: usize) -> &'a [u8] {
        self.args.get(i).and_then(|range| self.input.get(range.clone())).unwrap_or_default()
    }

    fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether argument `i` is `word`, ignoring ASCII case.
    fn is(&self, i: usize, word: &str) -> bool {
        self.arg(i).eq_ignore_ascii_case(word.as_bytes())
    }
}

/// The parameters of a `CL.THROTTLE` and the target they name, kept by a connection: clients
/// repeat the same parameters, so a connection builds its limit once.
#[derive(Debug)]
struct ThrottleTarget {
    parameters: [i64; 3],
    target: Target,
    capacity: u64,
}

/// A connection's state: the daemon, its id (`HELLO`), the protocol it speaks, the last
/// `CL.THROTTLE` limit, and the key bound of the configuration as of the connection's current
/// round of commands.
#[derive(Debug)]
pub struct Session {
    daemon: Arc<Daemon>,
    id: u64,
    /// RESP3 after `HELLO 3` (clients such as redis-py 8 send it on connect): replies that have
    /// a RESP3 form of their own (maps, nulls) take it; the others are the same in both.
    resp3: bool,
    key_bytes_max: usize,
    last_target: Option<ThrottleTarget>,
}

impl Session {
    /// The state of connection `id`.
    pub fn new(daemon: Arc<Daemon>, id: u64) -> Session {
        let key_bytes_max = daemon.current().0.limits.key_bytes_max;
        Session { daemon, id, resp3: false, key_bytes_max, last_target: None }
    }

    /// Takes the configuration's key bound anew (reloadable): once per round of commands.
    pub fn refresh(&mut self) {
        self.key_bytes_max = self.daemon.current().0.limits.key_bytes_max;
    }

    /// Executes `command` (not empty), appending its reply to `out`.
    pub async fn execute(&mut self, command: Command<'_>, out: &mut Vec<u8>) -> Flow {
        let name = command.arg(0);
        if is_http(name) {
            // An HTTP request sent to this port (a browser's page posting to it): closed without
            // running what follows, or a body of commands would spend any key's quota.
            debug!("RESP: an HTTP request line or header, connection closed");
            return Flow::Close;
        }
        if name.eq_ignore_ascii_case(b"cl.throttle") {
            self.throttle(command, out).await;
        } else if name.eq_ignore_ascii_case(b"ping") {
            match command.len() {
                1 => protocol::simple(out, "PONG"),
                2 => protocol::bulk(out, command.arg(1)),
                _ => wrong_arity(out, "ping"),
            }
        } else if name.eq_ignore_ascii_case(b"echo") {
            match command.len() {
                2 => protocol::bulk(out, command.arg(1)),
                _ => wrong_arity(out, "echo"),
            }
        } else if name.eq_ignore_ascii_case(b"quit") {
            protocol::simple(out, "OK");
            return Flow::Close;
        } else if name.eq_ignore_ascii_case(b"hello") {
            self.hello(command, out);
        } else if name.eq_ignore_ascii_case(b"auth") {
            match command.len() {
                2 => protocol::error(out, NO_AUTH),
                3 => match default_user(command.arg(1)) {
                    true => protocol::simple(out, "OK"),
                    false => protocol::error(out, WRONG_PASS),
                },
                _ => protocol::error(out, "ERR syntax error"),
            }
        } else if name.eq_ignore_ascii_case(b"command") {
            command_introspection(command, out, self.resp3);
        } else if name.eq_ignore_ascii_case(b"client") {
            client(command, out);
        } else if name.eq_ignore_ascii_case(b"select") {
            match command.len() {
                2 if command.arg(1) == b"0" => protocol::simple(out, "OK"),
                2 => protocol::error(out, "ERR DB index is out of range"),
                _ => wrong_arity(out, "select"),
            }
        } else if name.eq_ignore_ascii_case(b"config") {
            config(command, out, self.resp3);
        } else {
            unknown_command(out, command);
        }
        Flow::Continue
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`: RESP2 or RESP3 (from then on).
    fn hello(&mut self, command: Command<'_>, out: &mut Vec<u8>) {
        let mut resp3 = self.resp3;
        if command.len() >= 2 {
            match protocol::parse_i64(command.arg(1)) {
                Some(2) => resp3 = false,
                Some(3) => resp3 = true,
                Some(_) => return protocol::error(out, "NOPROTO unsupported protocol version"),
                None => {
                    return protocol::error(out, "ERR Protocol version is not an integer or out of range");
                }
            }
        }
        let mut option = 2;
        // Bounded by the command's arguments.
        while option < command.len() {
            match (command.arg(option).to_ascii_lowercase().as_slice(), command.len() - option) {
                (b"setname", 2..) => option += 2,
                (b"auth", 3..) if default_user(command.arg(option + 1)) => option += 3,
                (b"auth", 3..) => return protocol::error(out, WRONG_PASS),
                _ => {
                    let text = String::from_utf8_lossy(command.arg(option));
                    return protocol::error(out, &format!("ERR Syntax error in HELLO option '{text:.128}'"));
                }
            }
        }
        self.resp3 = resp3;
        protocol::map(out, 7, resp3);
        for (field, value) in [("server", "ratemeshd"), ("version", env!("CARGO_PKG_VERSION"))] {
            protocol::bulk(out, field.as_bytes());
            protocol::bulk(out, value.as_bytes());
        }
        protocol::bulk(out, b"proto");
        protocol::integer(out, if resp3 { 3 } else { 2 });
        protocol::bulk(out, b"id");
        protocol::integer(out, i64::try_from(self.id).unwrap_or(i64::MAX));
        for (field, value) in [("mode", "standalone"), ("role", "master")] {
            protocol::bulk(out, field.as_bytes());
            protocol::bulk(out, value.as_bytes());
        }
        protocol::bulk(out, b"modules");
        protocol::array(out, 0);
    }

    /// `CL.THROTTLE` (see the module documentation).
    async fn throttle(&mut self, command: Command<'_>, out: &mut Vec<u8>) {
        let request = match ThrottleRequest::parse(command) {
            Ok(request) => request,
            Err(message) => return protocol::error(out, &message),
        };
        if request.key.len() > self.key_bytes_max {
            let message = format!(
                "ERR key of {} bytes, at most {} are accepted",
                request.key.len(),
                self.key_bytes_max
            );
            return protocol::error(out, &message);
        }
        let (target, capacity) = match cached_target(&mut self.last_target, request.parameters) {
            Ok(last) => (&last.target, last.capacity),
            Err(message) => return protocol::error(out, &message),
        };
        let key = target.namespace().key(request.key);
        // Inline limits are not recorded in the top-keys sketches: no key text needed.
        match self.daemon.check(target, key, "", request.quantity).await {
            Ok(answer) => {
                let decision = answer.answered().map(|(_, decision)| decision);
                throttle_reply(out, capacity, request.quantity, decision.as_ref());
            }
            Err(error @ (CheckError::ShutDown | CheckError::Joining)) => {
                protocol::error(out, &format!("TRYAGAIN {error}: ask another node"));
            }
            Err(error) => protocol::error(out, &format!("ERR {error}")),
        }
    }
}

/// The target of `parameters`: `last`'s when they are the same, else built and kept in `last`.
fn cached_target(last: &mut Option<ThrottleTarget>, parameters: [i64; 3]) -> Result<&ThrottleTarget, String> {
    let target = match last.take() {
        Some(target) if target.parameters == parameters => target,
        _ => throttle_target(parameters)?,
    };
    Ok(last.insert(target))
}

/// A `CL.THROTTLE`'s arguments, validated.
#[derive(Debug)]
struct ThrottleRequest<'a> {
    key: &'a [u8],
    /// `max_burst`, `count_per_period`, `period` (seconds).
    parameters: [i64; 3],
    quantity: u64,
}

impl<'a> ThrottleRequest<'a> {
    /// The arguments, or redis-cell's error for them.
    fn parse(command: Command<'a>) -> Result<ThrottleRequest<'a>, String> {
        if command.len() != 5 && command.len() != 6 {
            return Err(THROTTLE_USAGE.to_owned());
        }
        let number = |i: usize| -> Result<i64, String> {
            let text = command.arg(i);
            // redis-cell parses with Rust's `i64` parser (which takes a leading `+`).
            std::str::from_utf8(text).ok().and_then(|text| text.parse::<i64>().ok()).ok_or_else(|| {
                format!("Cell error: Couldn't parse as integer: {:.128}", String::from_utf8_lossy(text))
            })
        };
        let parameters = [number(2)?, number(3)?, number(4)?];
        let quantity = if command.len() == 6 { number(5)? } else { 1 };
        if let Some(negative) = parameters.iter().chain([&quantity]).find(|value| **value < 0) {
            return Err(format!("Cell error: Negative values are not supported: {negative}"));
        }
        Ok(ThrottleRequest { key: command.arg(1), parameters, quantity: quantity.unsigned_abs() })
    }
}

/// The inline token bucket of `[max_burst, count_per_period, period]` (none negative).
fn throttle_target(parameters: [i64; 3]) -> Result<ThrottleTarget, String> {
    let [max_burst, count, period_s] = parameters.map(i64::unsigned_abs);
    if count == 0 || period_s == 0 {
        return Err("Cell error: Zero rates are not supported".to_owned());
    }
    let capacity = max_burst.saturating_add(1);
    let spec = LimitSpec {
        algorithm: Algorithm::TokenBucket,
        limit: count,
        period: Duration::from_secs(period_s),
        burst: Some(capacity),
        delay: None,
        calendar: None,
    };
    let limit = Limit::new(spec).map_err(|error| format!("Cell error: {}", throttle_limit_error(&error)))?;
    let inline = InlineLimit::new(Policy { fallback: FALLBACK_DEFAULT, ..Policy::new(limit, MODE_DEFAULT) });
    Ok(ThrottleTarget { parameters, target: Target::Inline(inline), capacity })
}

/// A limit the command's parameters cannot make, worded in them: `max_burst` (the capacity less
/// one), `count_per_period`, a period in seconds.
fn throttle_limit_error(error: &LimitError) -> String {
    const NANOS_PER_S: u64 = 1_000_000_000;
    match error {
        LimitError::TooLarge { parameter: LimitParameter::Burst, max } => {
            format!("max_burst is too large for this rate (at most {})", max.saturating_sub(1))
        }
        LimitError::TooLarge { parameter: LimitParameter::Limit, max } => {
            format!("count_per_period is too large (at most {max})")
        }
        LimitError::TooLarge { parameter: LimitParameter::Period, max } => {
            format!("period is too large (at most {} s, 100 years)", max / NANOS_PER_S)
        }
        LimitError::RateTooHigh { limit, period_nanos } => {
            let period_s = period_nanos / NANOS_PER_S;
            format!(
                "{limit} per {period_s} s is above one hit per nanosecond: at most {period_nanos} per {period_s} s"
            )
        }
        other => other.to_string(),
    }
}

/// Appends redis-cell's 5-integer reply for `decision` (`None`: an unlimited answer, allowed
/// with the whole capacity left). A query (`quantity` 0) is never limited.
fn throttle_reply(out: &mut Vec<u8>, capacity: u64, quantity: u64, decision: Option<&Decision>) {
    let as_integer = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let (limited, remaining, retry_after, reset_after) = match decision {
        None => (false, capacity, -1, 0),
        Some(decision) => {
            let limited = quantity > 0 && !decision.allowed;
            let retry_after = match decision.retry_after {
                Some(retry_after) if limited => as_integer(whole_seconds(retry_after)),
                _ => -1,
            };
            (limited, decision.remaining, retry_after, as_integer(whole_seconds(decision.reset_after)))
        }
    };
    protocol::array(out, 5);
    protocol::integer(out, i64::from(limited));
    protocol::integer(out, as_integer(capacity));
    protocol::integer(out, as_integer(remaining));
    protocol::integer(out, retry_after);
    protocol::integer(out, reset_after);
}

/// Seconds, rounded up as redis-cell rounds: when the fraction has a whole millisecond.
fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_millis() > 0)
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND DOCS [name…]`, `COMMAND INFO [name…]`: enough for clients
/// that probe (redis-cli asks for the docs for its hints; an empty answer means none).
fn command_introspection(command: Command<'_>, out: &mut Vec<u8>, resp3: bool) {
    if command.len() == 1 {
        return protocol::array(out, 0);
    }
    if command.is(1, "count") && command.len() == 2 {
        protocol::integer(out, COMMANDS.len() as i64);
    } else if command.is(1, "docs") {
        protocol::map(out, 0, resp3);
    } else if command.is(1, "info") {
        protocol::array(out, command.len() - 2);
        for _ in 2..command.len() {
            protocol::null(out, resp3);
        }
    } else {
        unknown_subcommand(out, command.arg(1), "COMMAND");
    }
}

/// `CONFIG GET parameter…`: redis-benchmark asks for `save` and `appendonly` (whether the
/// server persists, which it reports); ratemeshd writes neither snapshots nor an append-only
/// file. Other parameters are unknown: not listed, as Redis answers for a pattern that matches
/// nothing.
fn config(command: Command<'_>, out: &mut Vec<u8>, resp3: bool) {
    if command.len() < 3 || !command.is(1, "get") {
        return unknown_subcommand(out, command.arg(1), "CONFIG");
    }
    let known =
        |i: usize| [("save", ""), ("appendonly", "no")].into_iter().find(|(name, _)| command.is(i, name));
    protocol::map(out, (2..command.len()).filter_map(known).count(), resp3);
    for (name, value) in (2..command.len()).filter_map(known) {
        protocol::bulk(out, name.as_bytes());
        protocol::bulk(out, value.as_bytes());
    }
}

/// `CLIENT SETNAME name`, `CLIENT SETINFO attribute value`: accepted, nothing kept.
fn client(command: Command<'_>, out: &mut Vec<u8>) {
    match command.len() {
        3 if command.is(1, "setname") => protocol::simple(out, "OK"),
        4 if command.is(1, "setinfo") => protocol::simple(out, "OK"),
        _ => unknown_subcommand(out, command.arg(1), "CLIENT"),
    }
}

/// `AUTH password`, answered as Redis answers it when no password is set (ratemeshd has no RESP
/// authentication): a client configured with one learns why, rather than of an unknown command.
const NO_AUTH: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";

/// `AUTH user password` (and `HELLO … AUTH`) for another user than `default`, as Redis answers
/// it; the `default` user, which has no password, takes any (clients configured with a password
/// connect, as they do to a Redis without one).
const WRONG_PASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Whether `user` is Redis's `default` user.
fn default_user(user: &[u8]) -> bool {
    user == b"default"
}

fn wrong_arity(out: &mut Vec<u8>, name: &str) {
    protocol::error(out, &format!("ERR wrong number of arguments for '{name}' command"));
}

fn unknown_subcommand(out: &mut Vec<u8>, subcommand: &[u8], name: &str) {
    let subcommand = String::from_utf8_lossy(subcommand);
    protocol::error(out, &format!("ERR unknown subcommand '{subcommand:.128}'. Try {name} HELP."));
}

/// Whether a command's name is an HTTP request's `POST` line or a `Host:` header: the names on
/// which Redis closes the connection too (cross-protocol scripting), since a browser can send an
/// HTTP request to any port but can never avoid sending its `Host` header before the body.
fn is_http(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:")
}

/// Redis's wording: the name, then the first arguments quoted, at most 128 bytes of them.
fn unknown_command(out: &mut Vec<u8>, command: Command<'_>) {
    let name = String::from_utf8_lossy(command.arg(0));
    let mut message = format!("ERR unknown command '{name:.128}', with args beginning with: ");
    let start = message.len();
    for i in 1..command.len() {
        let room = 128_usize.saturating_sub(message.len() - start);
        if room == 0 {
            break;
        }
        message.push_str(&format!("'{:.room$}' ", String::from_utf8_lossy(command.arg(i))));
    }
    protocol::error(out, &message);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(capacity: u64, quantity: u64, decision: Option<&Decision>) -> String {
        let mut out = Vec::new();
        throttle_reply(&mut out, capacity, quantity, decision);
        String::from_utf8(out).expect("ascii")
    }

    fn decision(
        allowed: bool,
        remaining: u64,
        retry_after: Option<Duration>,
        reset_after: Duration,
    ) -> Decision {
        Decision {
            allowed,
            limit: 30,
            remaining,
            reset_after,
            retry_after,
            delay: Duration::ZERO,
            lease: None,
        }
    }

    #[test]
    fn the_reply_is_redis_cells_five_integers() {
        let allowed = decision(true, 15, None, Duration::from_secs(2));
        assert_eq!(reply(16, 1, Some(&allowed)), "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n");
        // Refused: retry rounded up from 1.5 s; reset 32 s.
        let refused = decision(false, 0, Some(Duration::from_millis(1500)), Duration::from_secs(32));
        assert_eq!(reply(16, 1, Some(&refused)), "*5\r\n:1\r\n:16\r\n:0\r\n:2\r\n:32\r\n");
        // More than the capacity: limited, never retried.
        let never = decision(false, 16, None, Duration::ZERO);
        assert_eq!(reply(16, 17, Some(&never)), "*5\r\n:1\r\n:16\r\n:16\r\n:-1\r\n:0\r\n");
        // A query is never limited, even of an empty bucket.
        let empty = decision(false, 0, Some(Duration::from_secs(2)), Duration::from_secs(32));
        assert_eq!(reply(16, 0, Some(&empty)), "*5\r\n:0\r\n:16\r\n:0\r\n:-1\r\n:32\r\n");
    }

    #[test]
    fn seconds_round_up_from_a_whole_millisecond_as_redis_cell_rounds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(whole_seconds(Duration::from_micros(2_000_999)), 2);
    }

    fn args(words: &[&str]) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut input = Vec::new();
        let mut ranges = Vec::new();
        for word in words {
            ranges.push(input.len()..input.len() + word.len());
            input.extend_from_slice(word.as_bytes());
        }
        (input, ranges)
    }

    fn parse_error(words: &[&str]) -> String {
        let (input, ranges) = args(words);
        ThrottleRequest::parse(Command { input: &input, args: &ranges }).expect_err("refused")
    }

    #[test]
    fn throttle_arguments_are_refused_with_redis_cells_errors() {
        assert_eq!(parse_error(&["CL.THROTTLE", "k", "1", "2"]), THROTTLE_USAGE);
        assert_eq!(parse_error(&["CL.THROTTLE", "k", "1", "2", "3", "4", "5"]), THROTTLE_USAGE);
        assert_eq!(
            parse_error(&["CL.THROTTLE", "k", "x", "2", "3"]),
            "Cell error: Couldn't parse as integer: x"
        );
        assert_eq!(
            parse_error(&["CL.THROTTLE", "k", "1", "2", "3", "1.5"]),
            "Cell error: Couldn't parse as integer: 1.5"
        );
        assert_eq!(
            parse_error(&["CL.THROTTLE", "k", "1", "2", "99999999999999999999"]),
            "Cell error: Couldn't parse as integer: 99999999999999999999"
        );
        assert_eq!(
            parse_error(&["CL.THROTTLE", "k", "1", "-2", "3"]),
            "Cell error: Negative values are not supported: -2"
        );
        let (input, ranges) = args(&["CL.THROTTLE", "k", "+15", "30", "60", "0"]);
        let request = ThrottleRequest::parse(Command { input: &input, args: &ranges }).expect("valid");
        assert_eq!((request.key, request.parameters, request.quantity), (&b"k"[..], [15, 30, 60], 0));
    }

    #[test]
    fn throttle_parameters_become_a_token_bucket_of_burst_plus_one() {
        assert_eq!(
            throttle_target([1, 0, 60]).expect_err("zero"),
            "Cell error: Zero rates are not supported"
        );
        assert_eq!(throttle_target([1, 5, 0]).expect_err("zero"), "Cell error: Zero rates are not supported");
        let target = throttle_target([15, 30, 60]).expect("valid");
        assert_eq!(target.capacity, 16);
        let policy = target.target.policy().expect("limited");
        assert_eq!(policy.limit.capacity(), 16);
        assert_eq!(target.target.label(), crate::config::INLINE_LABEL);
        // Other parameters, another bucket.
        let other = throttle_target([15, 30, 61]).expect("valid");
        assert_ne!(target.target.namespace(), other.target.namespace());
        assert!(throttle_target([i64::MAX, 1, 1]).expect_err("too large").starts_with("Cell error: "));
    }

    #[test]
    fn a_throttle_key_is_the_bucket_of_the_same_http_inline_limit() {
        let body = r#"{"algorithm": "token_bucket", "limit": 5, "period_ms": 60000, "burst": 5}"#;
        let body: crate::http::body::LimitBody = serde_json::from_str(body).expect("valid JSON");
        let http = body.validate("limit").expect("valid limit");
        let resp = throttle_target([4, 5, 60]).expect("valid");
        assert_eq!(resp.target.namespace(), http.namespace);
        assert_eq!(resp.target.policy().as_deref(), Some(&*http.policy));
    }

    #[test]
    fn an_unknown_command_is_named_as_redis_names_it() {
        let (input, ranges) = args(&["FOO", "a", "b\r\nc"]);
        let mut out = Vec::new();
        unknown_command(&mut out, Command { input: &input, args: &ranges });
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "-ERR unknown command 'FOO', with args beginning with: 'a' 'b  c' \r\n"
        );
        let long = "x".repeat(300);
        let (input, ranges) = args(&["FOO", &long, "next"]);
        let mut out = Vec::new();
        unknown_command(&mut out, Command { input: &input, args: &ranges });
        assert!(out.len() < 250, "{}", out.len());
    }
}
