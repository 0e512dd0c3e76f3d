//! Arbitrary bytes through the RESP parser, command after command as the listener parses a
//! connection's buffer. For each call the parser returns a command, asks for more bytes, or
//! refuses, and:
//!
//! - a command is at least one byte and at most the input (the listener's loop advances and never
//!   reads past its buffer); its arguments lie inside it, in order, within the bounds; a multibulk
//!   argument is what its length line announced, an inline one a word;
//! - a command is decided by its own bytes: the same without what follows it, and not complete
//!   one byte earlier (the listener, reading in pieces, sees the same commands);
//! - a refusal is final: more bytes do not change it (the listener answers it at once); a wait
//!   for more bytes was not a refusal one byte earlier either.

#![no_main]

use std::ops::Range;

use libfuzzer_sys::fuzz_target;
use ratemeshd_wire::resp::{ARGS_MAX, BULK_BYTES_MAX, COMMAND_BYTES_MAX, LINE_BYTES_MAX, parse};

fuzz_target!(|data: &[u8]| {
    let mut args = Vec::new();
    let mut again = Vec::new();
    let mut at = 0;
    loop {
        let input = &data[at..];
        match parse(input, &mut args) {
            Ok(Some(len)) => {
                assert!(0 < len && len <= input.len(), "a command of {len} bytes in {}", input.len());
                check_args(&input[..len], &args);
                assert_eq!(parse(&input[..len], &mut again), Ok(Some(len)), "without what follows");
                assert_eq!(again, args, "without what follows");
                assert_eq!(parse(&input[..len - 1], &mut again), Ok(None), "one byte short of a command");
                at += len;
            }
            Ok(None) => {
                assert!(input.len() < COMMAND_BYTES_MAX, "waits with {} bytes", input.len());
                if let Some(shorter) = input.len().checked_sub(1) {
                    assert_eq!(parse(&input[..shorter], &mut again), Ok(None), "refused, then waited for");
                }
                return;
            }
            Err(error) => {
                let longer = [input, b"\r\n*1\r\n$4\r\nPING\r\n"].concat();
                assert_eq!(parse(&longer, &mut again), Err(error), "more bytes changed a refusal");
                return;
            }
        }
    }
});

/// The arguments of `command`, a whole command, are within it, in order, within the bounds.
fn check_args(command: &[u8], args: &[Range<usize>]) {
    assert!(args.len() <= ARGS_MAX, "{} arguments", args.len());
    let mut end = 0;
    for arg in args {
        assert!(end <= arg.start && arg.start <= arg.end && arg.end <= command.len(), "{arg:?} after {end}");
        end = arg.end;
        let bytes = &command[arg.clone()];
        if command[0] == b'*' {
            assert!(bytes.len() <= BULK_BYTES_MAX, "a bulk of {} bytes", bytes.len());
            let line = format!("${}\r\n", bytes.len());
            assert!(command[..arg.start].ends_with(line.as_bytes()), "{arg:?} not announced by {line:?}");
            assert_eq!(command.get(arg.end..arg.end + 2), Some(&b"\r\n"[..]), "{arg:?} not followed by CRLF");
        } else {
            assert!(
                !bytes.is_empty() && bytes.len() <= LINE_BYTES_MAX,
                "an inline word of {} bytes",
                bytes.len()
            );
            assert!(
                !bytes.iter().any(|byte| matches!(byte, b' ' | b'\t' | b'\n')),
                "a word with a separator"
            );
        }
    }
}
