//! Commands built from the fuzzer's bytes, encoded as a client sends them (multibulk with the
//! reply encoders `array` and `bulk`, or an inline line of words), pipelined into one stream,
//! and delivered in pieces cut where the fuzzer says, to a loop that parses as the listener does
//! (whole commands out of a buffer that grows with each piece). The commands parsed are the
//! commands sent, in order, with nothing left over; a command past a bound is refused with the
//! error that names it, whatever the pieces, and nothing after it is parsed.

#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use ratemeshd_wire::resp::{ARGS_MAX, BULK_BYTES_MAX, LINE_BYTES_MAX, ProtocolError, array, bulk, parse};

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut stream = Vec::new();
    let mut sent = Vec::new();
    let mut refused = None;
    for _ in 0..u.int_in_range(1..=4)? {
        let args = arguments(u)?;
        if u.arbitrary()? && inline_able(&args) {
            stream.extend(args.join(&b' '));
            stream.extend_from_slice(if u.arbitrary()? { b"\r\n" } else { b"\n" });
        } else {
            array(&mut stream, args.len());
            for arg in &args {
                bulk(&mut stream, arg);
            }
        }
        if args.len() > ARGS_MAX {
            refused = Some(ProtocolError::TooManyArguments(args.len() as u64));
            break;
        }
        if args.iter().any(|arg| arg.len() > BULK_BYTES_MAX) {
            refused = Some(ProtocolError::BulkLength);
            break;
        }
        sent.push(args);
    }

    // The stream in pieces, parsed as it arrives.
    let mut cuts =
        (0..u.int_in_range(0..=8)?).map(|_| u.int_in_range(0..=stream.len())).collect::<Result<Vec<_>>>()?;
    cuts.push(stream.len());
    cuts.sort_unstable();
    let (mut buffer, mut parsed, mut fed, mut args) = (Vec::new(), Vec::new(), 0, Vec::new());
    let outcome = 'stream: {
        for cut in cuts {
            buffer.extend_from_slice(&stream[fed..cut]);
            fed = cut;
            loop {
                match parse(&buffer, &mut args) {
                    Ok(Some(len)) => {
                        parsed.push(
                            args.iter().map(|range| buffer[range.clone()].to_vec()).collect::<Vec<_>>(),
                        );
                        buffer.drain(..len);
                    }
                    Ok(None) => break,
                    Err(error) => break 'stream Some(error),
                }
            }
        }
        None
    };
    assert_eq!(parsed, sent, "the commands parsed are not those sent");
    assert_eq!(outcome, refused, "refusal");
    if refused.is_none() {
        assert!(buffer.is_empty(), "{} bytes left over", buffer.len());
    }
    Ok(())
}

/// A command's arguments: at least one, now and then more than the parser takes, each now and
/// then at (or one byte past) the bound of a bulk string.
fn arguments(u: &mut Unstructured<'_>) -> Result<Vec<Vec<u8>>> {
    let count = match u.int_in_range(0..=15)? {
        0 => ARGS_MAX + 1 + u.int_in_range(0..=3)?,
        _ => u.int_in_range(1..=ARGS_MAX)?,
    };
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let mut arg: Vec<u8> = u.arbitrary()?;
        match u.int_in_range(0..=31)? {
            0 => arg.resize(BULK_BYTES_MAX, b'x'),
            1 => arg.resize(BULK_BYTES_MAX + 1, b'x'),
            _ => {}
        }
        args.push(arg);
    }
    Ok(args)
}

/// Whether `args` can be sent as an inline command: non-empty words without separators, on a
/// line within the bound that does not start as a multibulk would.
fn inline_able(args: &[Vec<u8>]) -> bool {
    let words = args
        .iter()
        .all(|arg| !arg.is_empty() && !arg.iter().any(|byte| matches!(byte, b' ' | b'\t' | b'\r' | b'\n')));
    let line = args.iter().map(|arg| arg.len() + 1).sum::<usize>();
    words && line <= LINE_BYTES_MAX && args[0][0] != b'*' && args.len() <= ARGS_MAX
}
