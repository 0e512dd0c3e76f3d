//! The request heads the daemon's HTTP/1.1 front answers itself: [`parse`] tells a whole
//! `POST /v1/check` at the start of a connection's input (its body's place in the input) from the
//! start of one, from an HTTP/2 preface, and from any other request, which the front hands to
//! hyper with the connection (`ratemeshd`'s `http::front`).
//!
//! A request is the front's when it is `POST /v1/check HTTP/1.1` with exactly one `Host`, one
//! `Content-Length` (at most `body_bytes_max`), no `Transfer-Encoding`, no `Expect`, no
//! `Connection` but one `keep-alive` or `close`, at most [`HEADERS_MAX`] headers, and a head of
//! at most [`HEAD_BYTES_MAX`] bytes, however many arrived at once (the front waits for at most
//! that many bytes of an incomplete head).

use std::ops::Range;

/// A request head longer than this is not the front's (hyper answers it: 431 past its own bound).
pub const HEAD_BYTES_MAX: usize = 16 * 1024;

/// Headers a request the front answers may have (more: hyper's).
pub const HEADERS_MAX: usize = 32;

/// What the input begins with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole `POST /v1/check`: its body is `input[body]`, the request ends at `body.end`;
    /// `close` when it asked for the connection to be closed after it (`Connection: close`).
    Check {
        /// Where the body is in the input.
        body: Range<usize>,
        /// `Connection: close`.
        close: bool,
    },
    /// The start of one: its head is whole when `head_whole`.
    Incomplete {
        /// The head is whole (the body is not).
        head_whole: bool,
    },
    /// A request that is not the front's.
    Other,
    /// An HTTP/2 connection preface (prior knowledge): this port speaks HTTP/1.1 only.
    Http2,
}

/// What `input` begins with (see [`Parsed`]); a body longer than `body_bytes_max` makes the
/// request [`Parsed::Other`] (the router answers 413).
pub fn parse(input: &[u8], body_bytes_max: usize) -> Parsed {
    if input.is_empty() {
        return Parsed::Incomplete { head_whole: false };
    }
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(input) {
        // A whole head over the bound is not the front's however it arrived: in pieces, the front
        // stops waiting for it at HEAD_BYTES_MAX bytes (below), so in one read it is not answered
        // either.
        Ok(httparse::Status::Complete(len)) if len <= HEAD_BYTES_MAX => len,
        Ok(httparse::Status::Partial) if input.len() <= HEAD_BYTES_MAX => {
            return Parsed::Incomplete { head_whole: false };
        }
        // Too long, too many headers, malformed: hyper's to answer, but for HTTP/2's preface,
        // whose version httparse refuses before the whole of it is here.
        _ if input.starts_with(HTTP2_PREFACE_START) => return Parsed::Http2,
        _ if HTTP2_PREFACE_START.starts_with(input) => return Parsed::Incomplete { head_whole: false },
        _ => return Parsed::Other,
    };
    if request.method != Some("POST") || request.path != Some("/v1/check") || request.version != Some(1) {
        return Parsed::Other;
    }
    let Some((body_len, close)) = body_len(request.headers) else { return Parsed::Other };
    if body_len > body_bytes_max {
        return Parsed::Other;
    }
    match input.len() >= head_len + body_len {
        true => Parsed::Check { body: head_len..head_len + body_len, close },
        false => Parsed::Incomplete { head_whole: true },
    }
}

/// How the client connection preface of HTTP/2 with prior knowledge begins (RFC 9113, 3.4);
/// httparse reads it as a request line as far as here, then refuses its version.
pub const HTTP2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

/// The body length of a request the front answers, and whether it asks to close the connection
/// after it: one `Host`, one `Content-Length`, no `Transfer-Encoding`, no `Expect`, no
/// `Connection` but one `keep-alive` or `close`; `None` for any other.
fn body_len(headers: &[httparse::Header<'_>]) -> Option<(usize, bool)> {
    let mut len = None;
    let mut connection = None;
    let mut hosts = 0;
    for header in headers {
        let name = header.name;
        if name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if name.eq_ignore_ascii_case("content-length") {
            let digits = header.value.trim_ascii();
            let valid = !digits.is_empty() && digits.len() <= 9 && digits.iter().all(u8::is_ascii_digit);
            if len.is_some() || !valid {
                return None;
            }
            len = Some(digits.iter().fold(0, |len, digit| len * 10 + usize::from(digit - b'0')));
        } else if name.eq_ignore_ascii_case("transfer-encoding") || name.eq_ignore_ascii_case("expect") {
            return None;
        } else if name.eq_ignore_ascii_case("connection") {
            let value = header.value.trim_ascii();
            let close = match value {
                _ if value.eq_ignore_ascii_case(b"close") => true,
                _ if value.eq_ignore_ascii_case(b"keep-alive") => false,
                _ => return None,
            };
            if connection.replace(close).is_some() {
                return None;
            }
        }
    }
    if hosts != 1 {
        return None;
    }
    Some((len?, connection.unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"policy":"api","key":"k"}"#;

    fn check(extra_headers: &str) -> Vec<u8> {
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nHost: a\r\n{extra_headers}Content-Length: {}\r\n\r\n",
            BODY.len()
        );
        [head.as_bytes(), BODY].concat()
    }

    #[test]
    fn a_check_is_the_fronts_and_waits_for_its_last_byte() {
        let input = check("");
        let head = input.len() - BODY.len();
        assert_eq!(parse(&input, 1024), Parsed::Check { body: head..input.len(), close: false });
        assert_eq!(
            parse(&check("Connection: close\r\n"), 1024),
            Parsed::Check { body: head + 19..input.len() + 19, close: true }
        );
        assert_eq!(parse(&input[..input.len() - 1], 1024), Parsed::Incomplete { head_whole: true });
        assert_eq!(parse(&input[..head - 1], 1024), Parsed::Incomplete { head_whole: false });
        assert_eq!(parse(&input, BODY.len() - 1), Parsed::Other, "a body over the bound");
    }

    #[test]
    fn other_requests_and_http2_are_told_apart() {
        assert_eq!(parse(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", 1024), Parsed::Other);
        assert_eq!(parse(&check("Transfer-Encoding: chunked\r\n"), 1024), Parsed::Other);
        assert_eq!(parse(&check("Host: b\r\n"), 1024), Parsed::Other, "two Host fields");
        assert_eq!(parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 1024), Parsed::Http2);
        assert_eq!(parse(b"PRI * HTTP/2", 1024), Parsed::Incomplete { head_whole: false });
    }

    #[test]
    fn a_head_over_the_bound_is_handed_off_however_it_arrives() {
        let pad = format!("X-Pad: {}\r\n", "p".repeat(HEAD_BYTES_MAX));
        let input = check(&pad);
        // Whole in one read, or in pieces (the front has waited for HEAD_BYTES_MAX bytes of it).
        assert_eq!(parse(&input, 1024), Parsed::Other);
        assert_eq!(parse(&input[..HEAD_BYTES_MAX + 1], 1024), Parsed::Other);
        assert_eq!(parse(&input[..HEAD_BYTES_MAX], 1024), Parsed::Incomplete { head_whole: false });
    }
}
