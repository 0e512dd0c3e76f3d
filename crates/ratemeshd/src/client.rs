//! A minimal HTTP/1.1 client over a tokio `TcpStream`, for the CLI (`ratemeshd check`,
//! `ratemeshd cluster`) and the tests.
//!
//! One request per connection (`Connection: close`), the answer read to the end of the stream
//! (at most [`RESPONSE_BYTES_MAX`]), `Content-Length` and chunked bodies understood, everything
//! bounded by a timeout. That is all the daemon's own API needs, without pulling an HTTP client
//! stack (and its TLS) into the binary.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The largest response read, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 16 << 20;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting, writing or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The whole exchange took longer than the timeout.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The response is not HTTP/1.1 as understood here.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The response is larger than [`RESPONSE_BYTES_MAX`].
    #[error("response larger than {RESPONSE_BYTES_MAX} bytes")]
    TooLarge,
}

/// A response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields in order, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding removed).
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `method target` to `addr` (`host:port`) with `headers` and `body` (a `Content-Length`
/// is added when the body is not empty or the method is `POST`), and reads the response.
pub async fn request(
    addr: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, ClientError> {
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes, timeout).await
}

/// Sends `bytes` as they are (a whole request, well-formed or not) and reads the response.
pub async fn raw(addr: &str, bytes: &[u8], timeout: Duration) -> Result<Response, ClientError> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(bytes).await?;
        let mut received = Vec::new();
        // One byte more than the bound tells "at the bound" from "over it".
        (&mut stream).take(RESPONSE_BYTES_MAX as u64 + 1).read_to_end(&mut received).await?;
        if received.len() > RESPONSE_BYTES_MAX {
            return Err(ClientError::TooLarge);
        }
        parse(&received)
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| ClientError::Timeout(timeout))?
}

fn malformed(message: impl Into<String>) -> ClientError {
    ClientError::Malformed(message.into())
}

/// Parses a whole response.
pub fn parse(bytes: &[u8]) -> Result<Response, ClientError> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| malformed("no end of head"))?;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| malformed("head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| malformed(format!("status line {status_line:?}")))?;
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').ok_or_else(|| malformed(format!("header {line:?}")))?;
            Ok((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect::<Result<Vec<_>, ClientError>>()?;
    let rest = &bytes[end + 4..];
    let mut response = Response { status, headers, body: Vec::new() };
    let chunked = response.header("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
    response.body = if chunked {
        dechunk(rest)?
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len.parse().map_err(|_| malformed(format!("content-length {len:?}")))?;
        rest.get(..len).ok_or_else(|| malformed("body shorter than its content-length"))?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

/// Removes chunked transfer encoding (trailers ignored).
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, ClientError> {
    let mut body = Vec::new();
    // Every chunk consumes at least the bytes of its size line: bounded by the input's length.
    for _ in 0..=rest.len() {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").ok_or_else(|| malformed("chunk size"))?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| malformed("chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| malformed("chunk size"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or_else(|| malformed("chunk shorter than its size"))?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or_else(|| malformed("chunk without CRLF"))?;
    }
    Err(malformed("chunked body without its last chunk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let r = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nX-A: b\r\n\r\nhi").expect("parses");
        assert_eq!((r.status, r.body.as_slice(), r.header("x-a")), (200, &b"hi"[..], Some("b")));
        let r = parse(
            b"HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .expect("parses");
        assert_eq!((r.status, r.body.as_slice()), (429, &b"abc"[..]));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n").is_err());
    }
}
