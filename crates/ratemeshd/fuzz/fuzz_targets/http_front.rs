//! Arbitrary bytes through the HTTP/1.1 front's classifier (`ratemeshd_wire::http::parse`), with a
//! body bound from the first two bytes (`limits.http_body_bytes_max` is reloadable: any value).
//!
//! - A check the front answers is `POST /v1/check` HTTP/1.1 with one `Host`, one
//!   `Content-Length` that is its body's length (at most the bound, and inside the input), no
//!   `Transfer-Encoding` or `Expect`, and `close` exactly when it says `Connection: close`:
//!   checked against httparse's own reading of the head, written here as counts.
//! - Its head is at most `HEAD_BYTES_MAX` bytes, and the answer is decided by its own bytes: the
//!   same without what follows it, and incomplete one byte short of its end or of its head's (the
//!   front, reading in pieces, answers the same requests).
//! - The front waits for at most `HEAD_BYTES_MAX` bytes of a head, and for a body only when one
//!   within the bound was announced.
//! - The body bound is exact: a check or a wait for a body of `n` bytes is the same under a bound
//!   of `n`, and the request is not the front's under `n - 1`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ratemeshd_wire::http::{HEAD_BYTES_MAX, HEADERS_MAX, HTTP2_PREFACE_START, Parsed, parse};

fuzz_target!(|data: &[u8]| {
    let [low, high, input @ ..] = data else { return };
    let bound = usize::from(u16::from_le_bytes([*low, *high]));
    let parsed = parse(input, bound);
    match parsed {
        Parsed::Check { ref body, close } => {
            assert!(body.start <= body.end && body.end <= input.len(), "{body:?} in {}", input.len());
            assert!(body.len() <= bound, "a body of {} bytes over {bound}", body.len());
            assert!(body.start <= HEAD_BYTES_MAX, "a head of {} bytes answered", body.start);
            let head = Head::read(&input[..body.start]).expect("a check's head parses");
            assert_eq!(head.len, body.start);
            assert!(head.is_check(), "{head:?}");
            assert_eq!(head.content_length, Some(body.len()), "{head:?}");
            assert_eq!(head.close, close, "{head:?}");
            assert_eq!(parse(&input[..body.end], bound), parsed, "without what follows");
            check_bound_edge(input, body.len(), &parsed);
            let waiting = Parsed::Incomplete { head_whole: !body.is_empty() };
            assert_eq!(parse(&input[..body.end - 1], bound), waiting, "one byte short of its end");
            let waiting = Parsed::Incomplete { head_whole: false };
            assert_eq!(parse(&input[..body.start - 1], bound), waiting, "one byte short of its head");
        }
        Parsed::Incomplete { head_whole: false } => {
            assert!(input.len() <= HEAD_BYTES_MAX, "waits for a head with {} bytes", input.len());
        }
        Parsed::Incomplete { head_whole: true } => {
            let head = Head::read(input).expect("a whole head parses");
            assert!(head.is_check(), "{head:?}");
            let announced = head.content_length.expect("a body announced");
            assert!(announced <= bound, "waits for a body of {announced} bytes over {bound}");
            assert!(input.len() < head.len + announced, "waits with the body in");
            check_bound_edge(input, announced, &parsed);
        }
        Parsed::Http2 => assert!(input.starts_with(HTTP2_PREFACE_START)),
        Parsed::Other => {}
    }
});

/// The body bound is exact: a body of `len` bytes is the front's under a bound of `len`, not
/// under `len - 1` (what the first two bytes rarely hit: the bound that equals a decimal
/// `Content-Length`).
fn check_bound_edge(input: &[u8], len: usize, parsed: &Parsed) {
    assert_eq!(&parse(input, len), parsed, "a body of {len} bytes under a bound of {len}");
    if let Some(under) = len.checked_sub(1) {
        assert_eq!(parse(input, under), Parsed::Other, "a body of {len} bytes under a bound of {under}");
    }
}

/// A request head as httparse reads it, its fields counted.
#[derive(Debug)]
struct Head {
    len: usize,
    method: Option<String>,
    path: Option<String>,
    version: Option<u8>,
    hosts: usize,
    content_lengths: usize,
    /// The value of the only `Content-Length`, if a number.
    content_length: Option<usize>,
    /// `Transfer-Encoding` or `Expect` fields.
    framing: usize,
    connections: usize,
    close: bool,
    keep_alive: bool,
}

impl Head {
    fn read(input: &[u8]) -> Option<Head> {
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut request = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(len)) = request.parse(input) else { return None };
        let fields: Vec<(String, String)> = (request.headers.iter())
            .map(|header| {
                let value = String::from_utf8_lossy(header.value.trim_ascii()).into_owned();
                (header.name.to_ascii_lowercase(), value)
            })
            .collect();
        let named =
            |name: &'static str| fields.iter().filter(move |field| field.0 == name).map(|field| &field.1);
        let lengths: Vec<&String> = named("content-length").collect();
        let connection: Vec<&String> = named("connection").collect();
        Some(Head {
            len,
            method: request.method.map(str::to_owned),
            path: request.path.map(str::to_owned),
            version: request.version,
            hosts: named("host").count(),
            content_lengths: lengths.len(),
            content_length: match &lengths[..] {
                [one] if one.len() <= 9 && one.bytes().all(|byte| byte.is_ascii_digit()) => one.parse().ok(),
                _ => None,
            },
            framing: named("transfer-encoding").count() + named("expect").count(),
            connections: connection.len(),
            close: connection.iter().any(|value| value.eq_ignore_ascii_case("close")),
            keep_alive: connection.iter().any(|value| value.eq_ignore_ascii_case("keep-alive")),
        })
    }

    /// A head the front answers.
    fn is_check(&self) -> bool {
        self.method.as_deref() == Some("POST")
            && self.path.as_deref() == Some("/v1/check")
            && self.version == Some(1)
            && self.hosts == 1
            && self.content_lengths == 1
            && self.content_length.is_some()
            && self.framing == 0
            && self.connections <= 1
            && (self.connections == 0 || self.close || self.keep_alive)
    }
}
