//! RESP2 framing: commands parsed in place from the connection's input buffer, replies encoded
//! into its output buffer. Neither parsing nor encoding allocates: a command is the ranges of its
//! arguments in the input (in a reused vector), integers are formatted by hand.
//!
//! A command is a multibulk array (`*<n>\r\n` then `n` × `$<len>\r\n<bytes>\r\n`, what every
//! client sends) or an inline command (a line of words separated by spaces, what `telnet`
//! sends; no quoting). Everything a client declares is checked against the bounds before it is
//! waited for: [`ARGS_MAX`] arguments, [`BULK_BYTES_MAX`] bytes per argument, [`LINE_BYTES_MAX`]
//! bytes per inline command, [`HEADER_BYTES_MAX`] bytes per length line. So an incomplete
//! command never holds more than [`COMMAND_BYTES_MAX`] bytes of the buffer.

use std::ops::Range;

/// The most arguments of one command (the command name included). `CL.THROTTLE` takes 6.
pub const ARGS_MAX: usize = 16;

/// The longest argument, in bytes (keys are bounded further by `limits.key_bytes_max`).
pub const BULK_BYTES_MAX: usize = 16 * 1024;

/// The longest inline command (a line), in bytes. Inline commands are for people typing into
/// `telnet` (clients send multibulk); the bound is small because an incomplete line is scanned
/// again on every read.
pub const LINE_BYTES_MAX: usize = 1024;

/// The longest length line (`*<n>` or `$<len>`, without its `\r\n`): the marker, a sign and
/// 19 digits.
pub const HEADER_BYTES_MAX: usize = 21;

/// The largest command the parser waits for: every argument at its bound with its length line.
pub const COMMAND_BYTES_MAX: usize =
    HEADER_BYTES_MAX + 2 + ARGS_MAX * (HEADER_BYTES_MAX + 2 + BULK_BYTES_MAX + 2);

/// A frame the protocol does not allow: answered `-ERR Protocol error: …`, then the connection
/// closes (as Redis does). The client is at fault; nothing was executed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `*` not followed by an integer (a count of zero or less is an empty command, as in Redis).
    #[error("invalid multibulk length")]
    MultibulkLength,
    /// More arguments than [`ARGS_MAX`].
    #[error("{0} arguments, at most {ARGS_MAX} are accepted")]
    TooManyArguments(u64),
    /// A multibulk element that is not a bulk string.
    #[error("expected '$', got '{}'", char::from(*.0))]
    ExpectedBulk(u8),
    /// `$` not followed by an integer in `0..=BULK_BYTES_MAX`.
    #[error("invalid bulk length")]
    BulkLength,
    /// A bulk string not followed by `\r\n`.
    #[error("bulk string not followed by CRLF")]
    BulkEnd,
    /// A length line longer than [`HEADER_BYTES_MAX`].
    #[error("too big {0} count string")]
    HeaderTooLong(&'static str),
    /// An inline command longer than [`LINE_BYTES_MAX`].
    #[error("too big inline request")]
    LineTooLong,
}

/// Parses the first command of `input`. `Ok(Some(n))`: a complete command of `n` bytes, its
/// arguments' ranges in `args` (empty for an empty command, which is answered with nothing, as
/// Redis does); `Ok(None)`: more bytes are needed (`args` is then meaningless).
pub fn parse(input: &[u8], args: &mut Vec<Range<usize>>) -> Result<Option<usize>, ProtocolError> {
    args.clear();
    match input.first() {
        None => Ok(None),
        Some(b'*') => parse_multibulk(input, args),
        Some(_) => parse_inline(input, args),
    }
}

fn parse_multibulk(input: &[u8], args: &mut Vec<Range<usize>>) -> Result<Option<usize>, ProtocolError> {
    let Some((count, mut at)) = header(input, 0, "mbulk")? else { return Ok(None) };
    let count = match count {
        Some(count) if count <= 0 => return Ok(Some(at)),
        Some(count) => count.unsigned_abs(),
        None => return Err(ProtocolError::MultibulkLength),
    };
    if count > ARGS_MAX as u64 {
        return Err(ProtocolError::TooManyArguments(count));
    }
    // At most ARGS_MAX rounds.
    for _ in 0..count {
        match input.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => return Err(ProtocolError::ExpectedBulk(other)),
        }
        let Some((len, start)) = header(input, at, "bulk")? else { return Ok(None) };
        let len = match len {
            Some(len) if (0..=BULK_BYTES_MAX as i64).contains(&len) => len.unsigned_abs() as usize,
            _ => return Err(ProtocolError::BulkLength),
        };
        let end = start + len;
        match input.get(end..end + 2) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return Err(ProtocolError::BulkEnd),
        }
        args.push(start..end);
        at = end + 2;
    }
    Ok(Some(at))
}

/// A complete length line: its integer (`None` when the line is not one) and where the line
/// ends (after its `\r\n`).
type Header = (Option<i64>, usize);

/// The length line that starts at `input[at]` (its marker byte); `Ok(None)` when it is
/// incomplete.
fn header(input: &[u8], at: usize, what: &'static str) -> Result<Option<Header>, ProtocolError> {
    let digits_start = at + 1;
    let window_end = input.len().min(digits_start + HEADER_BYTES_MAX + 1);
    let window = input.get(digits_start..window_end).unwrap_or_default();
    let Some(cr) = window.iter().position(|&byte| byte == b'\r') else {
        return if window.len() > HEADER_BYTES_MAX {
            Err(ProtocolError::HeaderTooLong(what))
        } else {
            Ok(None)
        };
    };
    let line_end = digits_start + cr;
    match input.get(line_end + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some((parse_i64(&input[digits_start..line_end]), line_end + 2))),
        Some(_) => Ok(Some((None, line_end + 2))),
    }
}

fn parse_inline(input: &[u8], args: &mut Vec<Range<usize>>) -> Result<Option<usize>, ProtocolError> {
    let window = &input[..input.len().min(LINE_BYTES_MAX + 1)];
    let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
        return if window.len() > LINE_BYTES_MAX { Err(ProtocolError::LineTooLong) } else { Ok(None) };
    };
    let line = &input[..newline];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut start = None;
    // Bounded by the line's length (at most LINE_BYTES_MAX).
    for (i, &byte) in line.iter().chain(std::iter::once(&b' ')).enumerate() {
        match (byte == b' ' || byte == b'\t', start) {
            (false, None) => start = Some(i),
            (true, Some(word)) => {
                if args.len() == ARGS_MAX {
                    return Err(ProtocolError::TooManyArguments(ARGS_MAX as u64 + 1));
                }
                args.push(word..i);
                start = None;
            }
            _ => {}
        }
    }
    Ok(Some(newline + 1))
}

/// A decimal integer as Redis reads one (`string2ll`): an optional `-`, digits, no leading zero,
/// no `+`, no spaces; `None` for anything else or a value outside `i64`.
pub fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(digits) => (true, digits),
        None => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || (digits[0] == b'0' && text.len() > 1) {
        return None;
    }
    // Accumulated negative: i64::MIN has no positive counterpart.
    let mut value: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(digit - b'0'))?;
    }
    if negative { Some(value) } else { value.checked_neg() }
}

/// Appends `+text\r\n` (a status reply).
pub fn simple(out: &mut Vec<u8>, text: &str) {
    out.push(b'+');
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `-message\r\n`; `message` starts with the error code (`ERR …`). Control bytes become
/// spaces: an error is one line, whatever a client's argument quoted in it holds.
pub fn error(out: &mut Vec<u8>, message: &str) {
    out.push(b'-');
    out.extend(message.bytes().map(|byte| if byte.is_ascii_control() { b' ' } else { byte }));
    out.extend_from_slice(b"\r\n");
}

/// Appends `:value\r\n`.
pub fn integer(out: &mut Vec<u8>, value: i64) {
    out.push(b':');
    decimal(out, value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `$len\r\nbytes\r\n`.
pub fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    decimal(out, bytes.len() as i64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends `*len\r\n`, the header of an array of `len` replies (which follow).
pub fn array(out: &mut Vec<u8>, len: usize) {
    out.push(b'*');
    decimal(out, len as i64);
    out.extend_from_slice(b"\r\n");
}

/// Appends the header of a map of `pairs` key–value pairs (which follow): RESP3's `%pairs`, or
/// in RESP2 an array of twice as many replies, keys and values alternating.
pub fn map(out: &mut Vec<u8>, pairs: usize, resp3: bool) {
    if !resp3 {
        return array(out, 2 * pairs);
    }
    out.push(b'%');
    decimal(out, pairs as i64);
    out.extend_from_slice(b"\r\n");
}

/// Appends a null: RESP3's `_`, or RESP2's null array `*-1`.
pub fn null(out: &mut Vec<u8>, resp3: bool) {
    out.extend_from_slice(if resp3 { b"_\r\n" } else { b"*-1\r\n" });
}

/// Appends `value` in decimal, formatted on the stack.
fn decimal(out: &mut Vec<u8>, value: i64) {
    let mut digits = [0_u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    // At most 20 rounds (u64::MAX has 20 digits).
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commands of `input`, parsed one after the other, and the bytes left unparsed.
    fn commands(input: &[u8]) -> Result<(Vec<Vec<String>>, usize), ProtocolError> {
        let mut args = Vec::new();
        let mut at = 0;
        let mut parsed = Vec::new();
        while let Some(len) = parse(&input[at..], &mut args)? {
            let base = at;
            parsed.push(
                args.iter()
                    .map(|range| String::from_utf8_lossy(&input[base..][range.clone()]).into_owned())
                    .collect(),
            );
            at += len;
        }
        Ok((parsed, input.len() - at))
    }

    fn one(input: &[u8]) -> Vec<String> {
        let (mut parsed, left) = commands(input).expect("valid");
        assert_eq!((parsed.len(), left), (1, 0), "{input:?}");
        parsed.remove(0)
    }

    #[test]
    fn a_multibulk_command_is_parsed() {
        assert_eq!(one(b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n"), ["PING", "hi"]);
        assert_eq!(one(b"*1\r\n$0\r\n\r\n"), [""]);
        // Binary-safe: a bulk may hold \r\n.
        assert_eq!(one(b"*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n"), ["ECHO", "a\r\nb"]);
    }

    #[test]
    fn an_empty_multibulk_is_consumed_with_no_arguments() {
        for input in [&b"*0\r\n"[..], b"*-1\r\n"] {
            let (parsed, left) = commands(input).expect("valid");
            assert_eq!((parsed, left), (vec![Vec::<String>::new()], 0));
        }
    }

    #[test]
    fn an_inline_command_is_split_on_spaces() {
        assert_eq!(one(b"PING\r\n"), ["PING"]);
        assert_eq!(one(b"  CL.THROTTLE  k 1\t2 3\n"), ["CL.THROTTLE", "k", "1", "2", "3"]);
        assert_eq!(one(b"\r\n"), Vec::<String>::new());
    }

    #[test]
    fn every_prefix_of_a_command_waits_for_more() {
        let input =
            b"*6\r\n$11\r\nCL.THROTTLE\r\n$3\r\nkey\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n$1\r\n1\r\n";
        let mut args = Vec::new();
        for end in 0..input.len() {
            assert_eq!(parse(&input[..end], &mut args), Ok(None), "prefix of {end} bytes");
        }
        assert_eq!(parse(input, &mut args), Ok(Some(input.len())));
        assert_eq!(args.len(), 6);
    }

    #[test]
    fn a_pipeline_is_parsed_in_order_and_a_partial_tail_is_left() {
        let input = b"*1\r\n$4\r\nPING\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n*1\r\n$4\r\nPI";
        let (parsed, left) = commands(input).expect("valid");
        assert_eq!(parsed, [vec!["PING"], vec!["PING"], vec!["ECHO", "x"]]);
        assert_eq!(left, 10);
    }

    #[test]
    fn malformed_frames_are_protocol_errors() {
        let cases: [(&[u8], ProtocolError); 10] = [
            (b"*x\r\n", ProtocolError::MultibulkLength),
            (b"*1x\r\n", ProtocolError::MultibulkLength),
            (b"*+1\r\n", ProtocolError::MultibulkLength),
            (b"*1\r\n:1\r\n", ProtocolError::ExpectedBulk(b':')),
            (b"*1\r\n$-1\r\n", ProtocolError::BulkLength),
            (b"*1\r\n$01\r\nx\r\n", ProtocolError::BulkLength),
            (b"*1\r\n$1\r\nxy\r\n", ProtocolError::BulkEnd),
            (b"*1\r\n$1\rx", ProtocolError::BulkLength),
            (b"*17\r\n", ProtocolError::TooManyArguments(17)),
            (b"*99999999999999999999\r\n", ProtocolError::MultibulkLength),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input, &mut Vec::new()), Err(expected), "{:?}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn hostile_lengths_are_refused_before_they_are_waited_for() {
        let mut args = Vec::new();
        // Declared, not sent: refused at once, nothing buffered for them.
        let huge_bulk = format!("*1\r\n${}\r\n", BULK_BYTES_MAX + 1);
        assert_eq!(parse(huge_bulk.as_bytes(), &mut args), Err(ProtocolError::BulkLength));
        let at_bound = format!("*1\r\n${BULK_BYTES_MAX}\r\n");
        assert_eq!(parse(at_bound.as_bytes(), &mut args), Ok(None));
        assert_eq!(parse(b"*1\r\n$9223372036854775807\r\n", &mut args), Err(ProtocolError::BulkLength));
        // A length line that never ends.
        let digits = vec![b'1'; HEADER_BYTES_MAX + 2];
        let endless = [&b"*"[..], &digits].concat();
        assert_eq!(parse(&endless, &mut args), Err(ProtocolError::HeaderTooLong("mbulk")));
        let endless_bulk = [&b"*1\r\n$"[..], &digits].concat();
        assert_eq!(parse(&endless_bulk, &mut args), Err(ProtocolError::HeaderTooLong("bulk")));
        // An inline line that never ends, and one of too many words.
        assert_eq!(parse(&vec![b'a'; LINE_BYTES_MAX + 1], &mut args), Err(ProtocolError::LineTooLong));
        assert_eq!(parse(&vec![b'a'; LINE_BYTES_MAX], &mut args), Ok(None));
        let words = "a ".repeat(ARGS_MAX + 1) + "\n";
        assert_eq!(parse(words.as_bytes(), &mut args), Err(ProtocolError::TooManyArguments(17)));
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        let cases: [(&[u8], Option<i64>); 12] = [
            (b"0", Some(0)),
            (b"15", Some(15)),
            (b"-1", Some(-1)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"", None),
            (b"-", None),
            (b"+1", None),
            (b"01", None),
            (b" 1", None),
            (b"1.5", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_i64(text), expected, "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn replies_are_encoded_as_resp2() {
        let mut out = Vec::new();
        simple(&mut out, "PONG");
        integer(&mut out, 0);
        integer(&mut out, -1);
        integer(&mut out, i64::MIN);
        integer(&mut out, i64::MAX);
        bulk(&mut out, b"hi");
        bulk(&mut out, b"");
        array(&mut out, 5);
        null(&mut out, false);
        null(&mut out, true);
        map(&mut out, 2, false);
        map(&mut out, 2, true);
        error(&mut out, "ERR unknown command 'a\r\nb'");
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "+PONG\r\n:0\r\n:-1\r\n:-9223372036854775808\r\n:9223372036854775807\r\n$2\r\nhi\r\n$0\r\n\r\n\
             *5\r\n*-1\r\n_\r\n*4\r\n%2\r\n-ERR unknown command 'a  b'\r\n"
        );
    }
}
