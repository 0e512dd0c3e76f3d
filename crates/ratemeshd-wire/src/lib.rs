//! The daemon's wire parsers, without I/O: what `ratemeshd` makes of the bytes a client sent
//! before anything is decided.
//!
//! - [`resp`]: RESP2 framing for the Redis protocol listener: commands parsed in place from the
//!   connection's buffer, replies encoded into its output.
//! - [`http`]: the request heads the HTTP/1.1 front answers itself (`POST /v1/check`), told from
//!   those it hands to hyper.
//!
//! A crate of its own so that the fuzz targets (`crates/ratemeshd/fuzz`) build these parsers and
//! nothing else; `ratemeshd` re-exports [`resp`] as `ratemeshd::resp::protocol`. Like the
//! daemon's library, its items are internal: the public surfaces are the protocols themselves.

pub mod http;
pub mod resp;
