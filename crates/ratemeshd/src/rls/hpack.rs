//! HPACK (RFC 7541): the decoder of a connection's request header blocks, and the few literal
//! forms the server's answers are written in.
//!
//! The decoder keeps the static table and the connection's dynamic table (entries as owned
//! bytes, sizes as RFC 7541 4.1 counts them), decodes Huffman-coded strings (Appendix B) and
//! hands each field to the caller as borrowed bytes. Every length, index and integer is checked
//! against the block and the bounds given: a malformed block is an error, never a panic.
//!
//! The server's answers use only literals without indexing (and static-table references): it
//! never adds to the peer's dynamic table, so its answers depend on no state of the peer's.
//! [`encode_literal_indexing`] is for the client side (the `rls_load` example).

use std::collections::VecDeque;

/// Why a header block could not be decoded: in HTTP/2 always a connection error
/// (COMPRESSION_ERROR), since the dynamic table can no longer follow the peer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ended inside a field.
    #[error("HPACK: the header block ends inside a field")]
    Truncated,
    /// An integer beyond what any field or table can need (more than 2^28).
    #[error("HPACK: an integer too large")]
    IntegerOverflow,
    /// An index that names no entry (0, or past both tables).
    #[error("HPACK: index {0} names no table entry")]
    Index(usize),
    /// A Huffman-coded string that holds EOS, which RFC 7541 5.2 makes an error.
    #[error("HPACK: a Huffman-coded string holds EOS")]
    HuffmanEos,
    /// A Huffman-coded string whose padding is longer than 7 bits or not all ones.
    #[error("HPACK: a Huffman-coded string with invalid padding")]
    HuffmanPadding,
    /// A dynamic table size update above the size the server allows.
    #[error("HPACK: a table size update to {size} bytes (at most {max})")]
    TableSize {
        /// The size asked for.
        size: usize,
        /// The size allowed (SETTINGS_HEADER_TABLE_SIZE).
        max: usize,
    },
    /// A dynamic table size update after the first field of a block.
    #[error("HPACK: a table size update after a field")]
    LateTableSize,
}

/// What a decoded block's header list was, against the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// Within the bound: every field was handed over.
    Whole,
    /// Larger than the bound: the fields past it were decoded (the dynamic table follows the
    /// block) but not handed over. Not a connection error: the block's stream is refused alone.
    TooLarge {
        /// The whole list's size (names, values and 32 per field).
        size: usize,
    },
}

/// The static table (RFC 7541 Appendix A), index 1 first.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The bit length of each symbol's Huffman code (RFC 7541 Appendix B; 256 is EOS), copied from
/// the h2 crate's generated table (h2 0.4.20, `src/hpack/huffman/table.rs`, ENCODE_CODE_LENGTHS;
/// MIT license, Copyright (c) 2017 h2 authors), EOS's 30 bits added. The code is canonical
/// (codes of one length are consecutive, in symbol order, and follow the shorter ones), so the
/// lengths alone define it; a test checks the codes so rebuilt against h2's ENCODE_CODES.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28, 28, 28,
    28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6,
    6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7,
    8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7,
    15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24,
    23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23,
    23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26,
    26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20,
    21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27,
    27, 27, 26, 30,
];

/// The longest Huffman code, in bits.
const CODE_BITS_MAX: usize = 30;

/// The shortest Huffman code, in bits.
const CODE_BITS_MIN: usize = 5;

/// EOS, the symbol that must never appear in a string.
const EOS: u16 = 256;

/// The canonical Huffman code as a decoder reads it, by code length `L`: the symbols in code
/// order, where those of length `L` start among them (`offsets`), the first code of length `L`
/// (`firsts`), and the codes of length at most `L` as 32-bit left-aligned numbers: all below
/// `limits[L]` (the ranges of the lengths follow each other, as the code is canonical).
struct Canonical {
    symbols: [u16; 257],
    offsets: [u16; CODE_BITS_MAX + 1],
    firsts: [u32; CODE_BITS_MAX + 1],
    limits: [u64; CODE_BITS_MAX + 1],
}

/// Built at compile time: an index out of bounds here fails the build, not a decode.
const CANONICAL: Canonical = canonical();

/// Walks the lengths in canonical order (by length, then symbol) as RFC 7541 Appendix B's codes
/// were assigned.
const fn canonical() -> Canonical {
    let mut canonical = Canonical {
        symbols: [0; 257],
        offsets: [0; CODE_BITS_MAX + 1],
        firsts: [0; CODE_BITS_MAX + 1],
        limits: [0; CODE_BITS_MAX + 1],
    };
    let (mut next, mut first, mut length) = (0, 0u32, 1);
    while length <= CODE_BITS_MAX {
        canonical.offsets[length] = next as u16;
        canonical.firsts[length] = first;
        let mut symbol = 0;
        while symbol < 257 {
            if CODE_LENGTHS[symbol] as usize == length {
                canonical.symbols[next] = symbol as u16;
                next += 1;
            }
            symbol += 1;
        }
        let count = next as u32 - canonical.offsets[length] as u32;
        canonical.limits[length] = ((first + count) as u64) << (32 - length);
        first = (first + count) << 1;
        length += 1;
    }
    canonical
}

/// The most an integer may be: far above any string, index or table size a valid block holds,
/// far below an overflow (even of a 32-bit `usize`).
const INTEGER_MAX: u64 = 1 << 28;

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The size RFC 7541 4.1 counts for an entry (and RFC 9113 6.5.2 for a header list's field):
/// its name, its value and 32 bytes of overhead. Saturating, though no real string comes near.
fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len().saturating_add(value.len()).saturating_add(32)
}

/// An HPACK decoder: the static table and one connection's dynamic table.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first, as indices count them.
    dynamic: VecDeque<Entry>,
    /// The entries' size (RFC 7541 4.1).
    dynamic_bytes: usize,
    /// The table's current maximum size (the peer's last size update).
    dynamic_bytes_max: usize,
    /// The most the peer may make it (SETTINGS_HEADER_TABLE_SIZE).
    table_bytes_max: usize,
    /// The largest decoded header list.
    list_bytes_max: usize,
    /// Huffman-decoded strings (name, value) of the field being decoded, kept from field to
    /// field so that decoding allocates only while they grow.
    name_buffer: Vec<u8>,
    value_buffer: Vec<u8>,
}

/// A string of a block: bytes of the block itself, or Huffman-decoded into a buffer.
enum Text<'b> {
    Raw(&'b [u8]),
    Decoded,
}

impl Decoder {
    /// A decoder whose dynamic table may hold at most `table_bytes_max` bytes (RFC 7541 4.1
    /// sizes: name + value + 32; the SETTINGS_HEADER_TABLE_SIZE the server advertised, 4096 being
    /// HTTP/2's default), and which refuses a header list whose decoded size (names, values and
    /// 32 per field: RFC 9113 SETTINGS_MAX_HEADER_LIST_SIZE) passes `list_bytes_max`.
    pub fn new(table_bytes_max: usize, list_bytes_max: usize) -> Decoder {
        Decoder {
            dynamic: VecDeque::new(),
            dynamic_bytes: 0,
            // The peer starts from the advertised size and may only lower it by size updates.
            dynamic_bytes_max: table_bytes_max,
            table_bytes_max,
            list_bytes_max,
            name_buffer: Vec::new(),
            value_buffer: Vec::new(),
        }
    }

    /// Decodes one complete header block (HEADERS and CONTINUATION payloads joined), calling
    /// `field(name, value)` for each field in order. The dynamic table follows the block whatever
    /// the caller keeps, so that the connection's later blocks decode right. Names and values
    /// are borrowed from the block, the tables or a buffer of Huffman-decoded bytes.
    ///
    /// A list past `list_bytes_max` is decoded to its end, its fields past the bound not handed
    /// over ([`List::TooLarge`]). After an error the dynamic table may be part-way through the
    /// block, so the connection must end (COMPRESSION_ERROR); the fields handed over before the
    /// error belong to a refused block.
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<List, HpackError> {
        let mut position = 0;
        let mut list_bytes: usize = 0;
        let mut fields_seen = false;
        while let Some(&first) = block.get(position) {
            if first & 0x80 != 0 {
                // Indexed field (6.1).
                let index = integer(block, &mut position, 7)?;
                let (name, value) = entry(&self.dynamic, index)?;
                list_bytes = list_bytes.saturating_add(entry_size(name, value));
                if list_bytes <= self.list_bytes_max {
                    field(name, value);
                }
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the block's first field (4.2).
                if fields_seen {
                    return Err(HpackError::LateTableSize);
                }
                let size = integer(block, &mut position, 5)?;
                if size > self.table_bytes_max {
                    return Err(HpackError::TableSize { size, max: self.table_bytes_max });
                }
                self.dynamic_bytes_max = size;
                self.evict(0);
                continue;
            } else {
                // Literals (6.2): with incremental indexing (01), without (0000), never indexed
                // (0001); the last two differ only for intermediaries, which this is not.
                let (prefix_bits, indexing) = if first & 0xc0 == 0x40 { (6, true) } else { (4, false) };
                let name_index = integer(block, &mut position, prefix_bits)?;
                list_bytes =
                    self.literal(block, &mut position, name_index, indexing, list_bytes, &mut field)?;
            }
            fields_seen = true;
        }
        Ok(match list_bytes <= self.list_bytes_max {
            true => List::Whole,
            false => List::TooLarge { size: list_bytes },
        })
    }

    /// A literal field whose representation and name index (0: a literal name) were read: its
    /// name (if literal) and value are read, the field handed to
    /// `field` if the list is still within its bound and, with `indexing`, added to the dynamic table. Returns the list's new size.
    fn literal(
        &mut self,
        block: &[u8],
        position: &mut usize,
        name_index: usize,
        indexing: bool,
        list_bytes: usize,
        field: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<usize, HpackError> {
        let name_text = if name_index == 0 {
            Some(string(block, position, &mut self.name_buffer)?)
        } else {
            // Checked now, so that a bad index fails first; looked up again below, once the
            // value's buffer is no longer borrowed mutably.
            entry(&self.dynamic, name_index)?;
            None
        };
        let value = match string(block, position, &mut self.value_buffer)? {
            Text::Raw(bytes) => bytes,
            Text::Decoded => self.value_buffer.as_slice(),
        };
        let name = match name_text {
            Some(Text::Raw(bytes)) => bytes,
            Some(Text::Decoded) => self.name_buffer.as_slice(),
            None => entry(&self.dynamic, name_index)?.0,
        };
        let list_bytes = list_bytes.saturating_add(entry_size(name, value));
        if list_bytes <= self.list_bytes_max {
            field(name, value);
        }
        if indexing {
            // Copied out before the insertion, which may evict the entry the name came from.
            let entry = (Box::from(name), Box::from(value));
            self.insert(entry);
        }
        Ok(list_bytes)
    }

    /// Adds an entry to the dynamic table, evicting the oldest to make room; one larger than the
    /// table empties it and is not added (RFC 7541 4.4).
    fn insert(&mut self, (name, value): Entry) {
        let size = entry_size(&name, &value);
        if size > self.dynamic_bytes_max {
            self.dynamic.clear();
            self.dynamic_bytes = 0;
            return;
        }
        self.evict(size);
        self.dynamic_bytes = self.dynamic_bytes.saturating_add(size);
        self.dynamic.push_front((name, value));
    }

    /// Evicts the oldest entries until `room` more bytes fit (RFC 7541 4.3, 4.4).
    fn evict(&mut self, room: usize) {
        while self.dynamic_bytes.saturating_add(room) > self.dynamic_bytes_max {
            let Some((name, value)) = self.dynamic.pop_back() else {
                self.dynamic_bytes = 0;
                return;
            };
            self.dynamic_bytes = self.dynamic_bytes.saturating_sub(entry_size(&name, &value));
        }
    }
}

/// The entry at `index` of the static table and then of `dynamic` (newest first, RFC 7541 2.3.3).
fn entry(dynamic: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
    let Some(static_index) = index.checked_sub(1) else {
        return Err(HpackError::Index(index));
    };
    if let Some(&(name, value)) = STATIC.get(static_index) {
        return Ok((name, value));
    }
    static_index
        .checked_sub(STATIC.len())
        .and_then(|dynamic_index| dynamic.get(dynamic_index))
        .map(|(name, value)| (&name[..], &value[..]))
        .ok_or(HpackError::Index(index))
}

/// Reads an integer with a `prefix_bits`-bit prefix (RFC 7541 5.1, `prefix_bits` 4 to 7) at
/// `position`. At most [`INTEGER_MAX`], so that a few bytes cannot make an overflow or a huge
/// length: every continuation byte adds 7 bits, and the value is checked after each.
fn integer(block: &[u8], position: &mut usize, prefix_bits: u32) -> Result<usize, HpackError> {
    let prefix_max = u8::MAX >> (8 - prefix_bits);
    let first = *block.get(*position).ok_or(HpackError::Truncated)?;
    *position += 1;
    let prefix = first & prefix_max;
    if prefix < prefix_max {
        return Ok(usize::from(prefix));
    }
    let mut value = u64::from(prefix_max);
    let mut shift = 0;
    loop {
        let byte = *block.get(*position).ok_or(HpackError::Truncated)?;
        *position += 1;
        // At most 2^28 + 127 << 28 here: no u64 overflow.
        value += u64::from(byte & 0x7f) << shift;
        if value > INTEGER_MAX {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return usize::try_from(value).map_err(|_| HpackError::IntegerOverflow);
        }
        shift += 7;
        if shift > 28 {
            // Continuation bytes of zeros would otherwise go on without bound.
            return Err(HpackError::IntegerOverflow);
        }
    }
}

/// Reads a string literal (RFC 7541 5.2) at `position`: its bytes in the block, or decoded
/// into `buffer` when Huffman-coded.
fn string<'b>(block: &'b [u8], position: &mut usize, buffer: &mut Vec<u8>) -> Result<Text<'b>, HpackError> {
    let huffman = block.get(*position).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let length = integer(block, position, 7)?;
    let end = position.checked_add(length).ok_or(HpackError::Truncated)?;
    let bytes = block.get(*position..end).ok_or(HpackError::Truncated)?;
    *position = end;
    if !huffman {
        return Ok(Text::Raw(bytes));
    }
    buffer.clear();
    huffman_decode(bytes, buffer)?;
    Ok(Text::Decoded)
}

/// Decodes a Huffman-coded string (RFC 7541 5.2, Appendix B) into `out`, a symbol at a time:
/// the next 32 bits, left-aligned, fall below the limit of their code's length, and the code's
/// offset from the first of that length is the symbol's place among them. EOS in the string, or
/// padding longer than 7 bits or not all ones, is an error.
fn huffman_decode(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    // Bits not yet decoded, from the most significant, and how many.
    let (mut buffer, mut bits) = (0u64, 0u32);
    let mut input = bytes.iter();
    loop {
        while bits <= 56 {
            let Some(&byte) = input.next() else { break };
            buffer |= u64::from(byte) << (56 - bits);
            bits += 8;
        }
        if bits == 0 {
            return Ok(());
        }
        // Past the input, ones: what EOS, and so padding, starts with.
        let window = (buffer | u64::MAX.checked_shr(bits).unwrap_or(0)) >> 32;
        let mut length = CODE_BITS_MIN;
        // Ends: the code is complete, so every 32-bit window is below the longest codes' limit.
        while length < CODE_BITS_MAX && CANONICAL.limits.get(length).is_some_and(|&limit| window >= limit) {
            length += 1;
        }
        if length as u32 > bits {
            // Not a whole code: padding, which must be at most 7 bits, all ones (a prefix of EOS).
            let ones = (1u64 << bits) - 1;
            if bits > 7 || buffer >> (64 - bits) != ones {
                return Err(HpackError::HuffmanPadding);
            }
            return Ok(());
        }
        let code = (window >> (32 - length)) as u32;
        let first = CANONICAL.firsts.get(length).copied().unwrap_or(0);
        let offset = CANONICAL.offsets.get(length).copied().unwrap_or(0);
        let position = usize::from(offset).saturating_add(code.wrapping_sub(first) as usize);
        let symbol = *CANONICAL.symbols.get(position).ok_or(HpackError::HuffmanPadding)?;
        if symbol == EOS {
            return Err(HpackError::HuffmanEos);
        }
        out.push(symbol as u8);
        buffer <<= length;
        bits -= length as u32;
    }
}

/// Appends a field as a literal without indexing, with a literal name, neither string
/// Huffman-coded (RFC 7541 6.2.2): what the server's answers use, so that they need no
/// dynamic table of the peer's.
pub fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    encode_string(out, name);
    encode_string(out, value);
}

/// Appends a field of the static table by its index (RFC 7541 6.1, 1 to 61), e.g. 8 for
/// `:status 200`.
pub fn encode_indexed(out: &mut Vec<u8>, index: usize) {
    encode_integer(out, 0x80, 7, index);
}

/// Appends a literal without indexing (RFC 7541 6.2.2) whose name is the static table's entry
/// `name_index` (1 to 61, e.g. 31, `content-type`), its value not Huffman-coded.
pub fn encode_literal_indexed_name(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
    encode_integer(out, 0x00, 4, name_index);
    encode_string(out, value);
}

/// Appends a literal with incremental indexing (RFC 7541 6.2.1), its value not Huffman-coded:
/// the name is the static table's entry `name_index` (1 to 61), or with 0 the literal `name`.
/// The peer's decoder adds the field to its dynamic table, so later blocks can name it by index
/// (62 for the newest): what clients do with the fields every request repeats. The server never
/// writes it; the load generator `rls_load` does, as Envoy's HTTP/2 codec does.
pub fn encode_literal_indexing(out: &mut Vec<u8>, name_index: usize, name: &[u8], value: &[u8]) {
    encode_integer(out, 0x40, 6, name_index);
    if name_index == 0 {
        encode_string(out, name);
    }
    encode_string(out, value);
}

/// A string literal, not Huffman-coded (RFC 7541 5.2).
fn encode_string(out: &mut Vec<u8>, text: &[u8]) {
    encode_integer(out, 0x00, 7, text.len());
    out.extend_from_slice(text);
}

/// An integer with a `prefix_bits`-bit prefix (RFC 7541 5.1), the first byte's other bits
/// `flags`.
fn encode_integer(out: &mut Vec<u8>, flags: u8, prefix_bits: u32, value: usize) {
    let prefix_max = u8::MAX >> (8 - prefix_bits);
    let Some(rest) = value.checked_sub(usize::from(prefix_max)) else {
        // Below the prefix's maximum: it fits in the prefix.
        out.push(flags | value as u8);
        return;
    };
    out.push(flags | prefix_max);
    let mut rest = rest;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7541 Appendix B's codes as the h2 crate generated them (h2 0.4.20,
    /// `src/hpack/huffman/table.rs`, ENCODE_CODES; MIT license): what the canonical code rebuilt
    /// from [`CODE_LENGTHS`] must equal.
    const H2_CODES: [u32; 256] = [
        0x1ff8, 0x7fffd8, 0xfffffe2, 0xfffffe3, 0xfffffe4, 0xfffffe5, 0xfffffe6, 0xfffffe7, 0xfffffe8,
        0xffffea, 0x3ffffffc, 0xfffffe9, 0xfffffea, 0x3ffffffd, 0xfffffeb, 0xfffffec, 0xfffffed, 0xfffffee,
        0xfffffef, 0xffffff0, 0xffffff1, 0xffffff2, 0x3ffffffe, 0xffffff3, 0xffffff4, 0xffffff5, 0xffffff6,
        0xffffff7, 0xffffff8, 0xffffff9, 0xffffffa, 0xffffffb, 0x14, 0x3f8, 0x3f9, 0xffa, 0x1ff9, 0x15, 0xf8,
        0x7fa, 0x3fa, 0x3fb, 0xf9, 0x7fb, 0xfa, 0x16, 0x17, 0x18, 0x0, 0x1, 0x2, 0x19, 0x1a, 0x1b, 0x1c,
        0x1d, 0x1e, 0x1f, 0x5c, 0xfb, 0x7ffc, 0x20, 0xffb, 0x3fc, 0x1ffa, 0x21, 0x5d, 0x5e, 0x5f, 0x60, 0x61,
        0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72,
        0xfc, 0x73, 0xfd, 0x1ffb, 0x7fff0, 0x1ffc, 0x3ffc, 0x22, 0x7ffd, 0x3, 0x23, 0x4, 0x24, 0x5, 0x25,
        0x26, 0x27, 0x6, 0x74, 0x75, 0x28, 0x29, 0x2a, 0x7, 0x2b, 0x76, 0x2c, 0x8, 0x9, 0x2d, 0x77, 0x78,
        0x79, 0x7a, 0x7b, 0x7ffe, 0x7fc, 0x3ffd, 0x1ffd, 0xffffffc, 0xfffe6, 0x3fffd2, 0xfffe7, 0xfffe8,
        0x3fffd3, 0x3fffd4, 0x3fffd5, 0x7fffd9, 0x3fffd6, 0x7fffda, 0x7fffdb, 0x7fffdc, 0x7fffdd, 0x7fffde,
        0xffffeb, 0x7fffdf, 0xffffec, 0xffffed, 0x3fffd7, 0x7fffe0, 0xffffee, 0x7fffe1, 0x7fffe2, 0x7fffe3,
        0x7fffe4, 0x1fffdc, 0x3fffd8, 0x7fffe5, 0x3fffd9, 0x7fffe6, 0x7fffe7, 0xffffef, 0x3fffda, 0x1fffdd,
        0xfffe9, 0x3fffdb, 0x3fffdc, 0x7fffe8, 0x7fffe9, 0x1fffde, 0x7fffea, 0x3fffdd, 0x3fffde, 0xfffff0,
        0x1fffdf, 0x3fffdf, 0x7fffeb, 0x7fffec, 0x1fffe0, 0x1fffe1, 0x3fffe0, 0x1fffe2, 0x7fffed, 0x3fffe1,
        0x7fffee, 0x7fffef, 0xfffea, 0x3fffe2, 0x3fffe3, 0x3fffe4, 0x7ffff0, 0x3fffe5, 0x3fffe6, 0x7ffff1,
        0x3ffffe0, 0x3ffffe1, 0xfffeb, 0x7fff1, 0x3fffe7, 0x7ffff2, 0x3fffe8, 0x1ffffec, 0x3ffffe2,
        0x3ffffe3, 0x3ffffe4, 0x7ffffde, 0x7ffffdf, 0x3ffffe5, 0xfffff1, 0x1ffffed, 0x7fff2, 0x1fffe3,
        0x3ffffe6, 0x7ffffe0, 0x7ffffe1, 0x3ffffe7, 0x7ffffe2, 0xfffff2, 0x1fffe4, 0x1fffe5, 0x3ffffe8,
        0x3ffffe9, 0xffffffd, 0x7ffffe3, 0x7ffffe4, 0x7ffffe5, 0xfffec, 0xfffff3, 0xfffed, 0x1fffe6,
        0x3fffe9, 0x1fffe7, 0x1fffe8, 0x7ffff3, 0x3fffea, 0x3fffeb, 0x1ffffee, 0x1ffffef, 0xfffff4, 0xfffff5,
        0x3ffffea, 0x7ffff4, 0x3ffffeb, 0x7ffffe6, 0x3ffffec, 0x3ffffed, 0x7ffffe7, 0x7ffffe8, 0x7ffffe9,
        0x7ffffea, 0x7ffffeb, 0xffffffe, 0x7ffffec, 0x7ffffed, 0x7ffffee, 0x7ffffef, 0x7fffff0, 0x3ffffee,
    ];

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).expect("ASCII"), 16).expect("hex"))
            .collect()
    }

    fn decode(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
        let mut fields = Vec::new();
        decoder.decode(block, |name, value| {
            fields.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ))
        })?;
        Ok(fields)
    }

    fn pairs(fields: &[(&str, &str)]) -> Vec<(String, String)> {
        fields.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
    }

    /// The dynamic table, newest first, checked against the size counter.
    fn table(decoder: &Decoder) -> Vec<(String, String)> {
        let entries: Vec<(String, String)> = decoder
            .dynamic
            .iter()
            .map(|(name, value)| {
                (String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned())
            })
            .collect();
        let size: usize = entries.iter().map(|(name, value)| name.len() + value.len() + 32).sum();
        assert_eq!(size, decoder.dynamic_bytes, "the size counter follows the entries");
        entries
    }

    /// One step of an RFC example: a block, the fields it decodes to, the table after it.
    struct Step<'a> {
        block: &'a str,
        fields: &'a [(&'a str, &'a str)],
        table: &'a [(&'a str, &'a str)],
        table_bytes: usize,
    }

    /// Runs steps on one decoder, as one connection's blocks.
    fn run(table_bytes_max: usize, steps: &[Step<'_>]) {
        let mut decoder = Decoder::new(table_bytes_max, 16 * 1024);
        for step in steps {
            let fields = decode(&mut decoder, &hex(step.block)).expect("decodes");
            assert_eq!(fields, pairs(step.fields), "{}", step.block);
            assert_eq!(table(&decoder), pairs(step.table), "{}", step.block);
            assert_eq!(decoder.dynamic_bytes, step.table_bytes, "{}", step.block);
        }
    }

    const C3: [&str; 3] = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    const C4: [&str; 3] = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    const C5: [&str; 3] = [
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a \
         3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 \
         677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 \
         553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31",
    ];
    const C6: [&str; 3] = [
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e \
         919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 \
         821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed \
         4ee5 b106 3d50 07",
    ];

    /// RFC 7541 C.2: one field of each representation, each on a new decoder.
    #[test]
    fn the_rfc_field_examples_decode() {
        run(
            4096,
            &[Step {
                block: "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                fields: &[("custom-key", "custom-header")],
                table: &[("custom-key", "custom-header")],
                table_bytes: 55,
            }],
        );
        run(
            4096,
            &[Step {
                block: "040c 2f73 616d 706c 652f 7061 7468",
                fields: &[(":path", "/sample/path")],
                table: &[],
                table_bytes: 0,
            }],
        );
        run(
            4096,
            &[Step {
                block: "1008 7061 7373 776f 7264 0673 6563 7265 74",
                fields: &[("password", "secret")],
                table: &[],
                table_bytes: 0,
            }],
        );
        run(4096, &[Step { block: "82", fields: &[(":method", "GET")], table: &[], table_bytes: 0 }]);
    }

    /// RFC 7541 C.3 and C.4: the same three requests, without and with Huffman coding, on one
    /// decoder each (the dynamic table carries over from request to request).
    #[test]
    fn the_rfc_request_examples_decode_with_their_tables() {
        let authority = (":authority", "www.example.com");
        let cache = ("cache-control", "no-cache");
        let custom = ("custom-key", "custom-value");
        let first = [(":method", "GET"), (":scheme", "http"), (":path", "/"), authority];
        let second = [(":method", "GET"), (":scheme", "http"), (":path", "/"), authority, cache];
        let third = [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), authority, custom];
        for blocks in [C3, C4] {
            run(
                4096,
                &[
                    Step { block: blocks[0], fields: &first, table: &[authority], table_bytes: 57 },
                    Step { block: blocks[1], fields: &second, table: &[cache, authority], table_bytes: 110 },
                    Step {
                        block: blocks[2],
                        fields: &third,
                        table: &[custom, cache, authority],
                        table_bytes: 164,
                    },
                ],
            );
        }
    }

    /// RFC 7541 C.5 and C.6: three responses, without and with Huffman coding, with a table of
    /// 256 bytes, so that entries are evicted.
    #[test]
    fn the_rfc_response_examples_decode_with_evictions() {
        let status_302 = (":status", "302");
        let status_307 = (":status", "307");
        let private = ("cache-control", "private");
        let date_21 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT");
        let date_22 = ("date", "Mon, 21 Oct 2013 20:13:22 GMT");
        let location = ("location", "https://www.example.com");
        let gzip = ("content-encoding", "gzip");
        let cookie = ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1");
        for blocks in [C5, C6] {
            run(
                256,
                &[
                    Step {
                        block: blocks[0],
                        fields: &[status_302, private, date_21, location],
                        table: &[location, date_21, private, status_302],
                        table_bytes: 222,
                    },
                    Step {
                        block: blocks[1],
                        fields: &[status_307, private, date_21, location],
                        table: &[status_307, location, date_21, private],
                        table_bytes: 222,
                    },
                    Step {
                        block: blocks[2],
                        fields: &[(":status", "200"), private, date_22, location, gzip, cookie],
                        table: &[cookie, gzip, date_22],
                        table_bytes: 215,
                    },
                ],
            );
        }
    }

    /// The lengths define a canonical code equal to RFC 7541 Appendix B's (as h2 has it), and
    /// every symbol but EOS encodes and decodes back.
    #[test]
    fn the_code_is_canonical_and_every_symbol_round_trips() {
        let mut order: Vec<usize> = (0..257).collect();
        order.sort_by_key(|&symbol| (CODE_LENGTHS[symbol], symbol));
        let mut codes = [0u32; 257];
        let (mut code, mut previous) = (0u32, 0u8);
        for (position, &symbol) in order.iter().enumerate() {
            let length = CODE_LENGTHS[symbol];
            if position > 0 {
                code = (code + 1) << (length - previous);
            }
            previous = length;
            codes[symbol] = code;
        }
        assert_eq!(codes[..256], H2_CODES[..], "the codes rebuilt from the lengths are Appendix B's");
        assert_eq!(codes[256], 0x3fff_ffff, "EOS is thirty ones");
        assert_eq!(CANONICAL.symbols[..], order.iter().map(|&s| s as u16).collect::<Vec<_>>()[..]);
        let text: Vec<u8> = (0..=255u8).chain(b"www.example.com".iter().copied()).collect();
        let mut decoded = Vec::new();
        huffman_decode(&huffman_encode(&codes, &text), &mut decoded).expect("decodes");
        assert_eq!(decoded, text);
        // Every single symbol alone, with its own padding.
        for symbol in 0..=255u8 {
            decoded.clear();
            huffman_decode(&huffman_encode(&codes, &[symbol]), &mut decoded).expect("decodes");
            assert_eq!(decoded, [symbol]);
        }
    }

    /// Huffman-codes `text` with `codes`, padded with ones.
    fn huffman_encode(codes: &[u32; 257], text: &[u8]) -> Vec<u8> {
        let (mut bits, mut count, mut encoded) = (0u64, 0u32, Vec::new());
        for &byte in text {
            let length = u32::from(CODE_LENGTHS[usize::from(byte)]);
            bits = bits << length | u64::from(codes[usize::from(byte)]);
            count += length;
            while count >= 8 {
                count -= 8;
                encoded.push((bits >> count) as u8);
            }
        }
        if count > 0 {
            encoded.push((bits << (8 - count)) as u8 | ((1u8 << (8 - count)) - 1));
        }
        encoded
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let cases = [
            ("80", HpackError::Index(0)),
            ("be", HpackError::Index(62)),
            ("ff 00", HpackError::Index(127)),
            // Literals whose indexed name is past both tables: with incremental indexing
            // (63 + 56), without (15 + 100), never indexed (15 + 100).
            ("7f 38 01 61", HpackError::Index(119)),
            ("0f 64 01 61", HpackError::Index(115)),
            ("1f 64 01 61", HpackError::Index(115)),
            // A literal with a literal name but no value.
            ("40 01 61", HpackError::Truncated),
            ("ff ff ff ff ff ff 7f", HpackError::IntegerOverflow),
            // Continuation bytes of zeros: the shift passes 28 bits.
            ("ff 80 80 80 80 80 01", HpackError::IntegerOverflow),
            // A string longer than the block.
            ("00 05 61 62", HpackError::Truncated),
            ("3f e2 1f", HpackError::TableSize { size: 4097, max: 4096 }),
            ("82 20", HpackError::LateTableSize),
            ("20 82 3f e1 1f", HpackError::LateTableSize),
            // A Huffman string of one byte of ones: 8 bits of padding.
            ("00 81 ff 00", HpackError::HuffmanPadding),
            // "0" (00000) then three bits of padding, zeros.
            ("00 81 00 00", HpackError::HuffmanPadding),
            // 'a' (00011) then 101: padding not all ones.
            ("00 81 1d 00", HpackError::HuffmanPadding),
            // Two bytes of ones: 16 bits of padding (no symbol is that long and all ones).
            ("00 01 61 82 ff ff", HpackError::HuffmanPadding),
            // EOS in a string: thirty ones and two more.
            ("00 84 ff ff ff ff 00", HpackError::HuffmanEos),
            // EOS after a symbol: '0' (00000), thirty ones, five ones of padding.
            ("00 85 07 ff ff ff ff 00", HpackError::HuffmanEos),
        ];
        for (block, error) in cases {
            assert_eq!(decode(&mut Decoder::new(4096, 16 * 1024), &hex(block)), Err(error), "{block}");
        }
    }

    /// Integers at the bound and one past it, as indices and as string lengths.
    #[test]
    fn integers_past_two_to_the_28_are_refused() {
        for (index, expected) in [
            (126, HpackError::Index(126)),
            (127, HpackError::Index(127)),
            (128, HpackError::Index(128)),
            (127 + 0x80, HpackError::Index(127 + 0x80)),
            (1 << 28, HpackError::Index(1 << 28)),
            ((1 << 28) + 1, HpackError::IntegerOverflow),
            (usize::MAX, HpackError::IntegerOverflow),
        ] {
            let mut block = Vec::new();
            encode_indexed(&mut block, index);
            assert_eq!(decode(&mut Decoder::new(4096, 16 * 1024), &block), Err(expected), "{index}");
        }
        for (length, expected) in
            [(1 << 28, HpackError::Truncated), ((1 << 28) + 1, HpackError::IntegerOverflow)]
        {
            let mut block = vec![0];
            encode_integer(&mut block, 0, 7, length);
            assert_eq!(decode(&mut Decoder::new(4096, 16 * 1024), &block), Err(expected), "{length}");
        }
    }

    /// Every cut of every block of the RFC examples, on a decoder that decoded the blocks before
    /// it: an error (Truncated) or, where the cut falls between fields, the fields before it.
    #[test]
    fn every_cut_of_a_valid_block_is_truncated_or_whole_fields() {
        for (table_bytes_max, blocks) in [(4096, C3), (4096, C4), (256, C5), (256, C6)] {
            let blocks: Vec<Vec<u8>> = blocks.iter().map(|block| hex(block)).collect();
            for (number, block) in blocks.iter().enumerate() {
                let whole = {
                    let mut decoder = Decoder::new(table_bytes_max, 16 * 1024);
                    for earlier in &blocks[..number] {
                        decode(&mut decoder, earlier).expect("decodes");
                    }
                    decode(&mut decoder, block).expect("decodes")
                };
                for end in 0..block.len() {
                    let mut decoder = Decoder::new(table_bytes_max, 16 * 1024);
                    for earlier in &blocks[..number] {
                        decode(&mut decoder, earlier).expect("decodes");
                    }
                    match decode(&mut decoder, &block[..end]) {
                        Ok(fields) => assert_eq!(fields[..], whole[..fields.len()], "cut at {end}"),
                        Err(error) => assert_eq!(error, HpackError::Truncated, "cut at {end}"),
                    }
                }
            }
        }
    }

    /// The list bound counts names, values and 32 per field; a field past it is never handed
    /// over, but the block is decoded to its end (the dynamic table follows it).
    #[test]
    fn the_header_list_bound_is_checked_as_fields_are_decoded() {
        // :method GET is 7 + 3 + 32 = 42 bytes.
        let mut decoder = Decoder::new(4096, 84);
        assert_eq!(decoder.decode(&hex("82 82"), |_, _| {}), Ok(List::Whole), "2 × 42 bytes fit in 84");
        let mut seen = 0;
        let result = decoder.decode(&hex("82 82 82"), |_, _| seen += 1);
        assert_eq!(result, Ok(List::TooLarge { size: 126 }));
        assert_eq!(seen, 2, "the third field is not handed over");
        // A literal past the bound: not handed over, but added to the table all the same.
        let mut block = vec![0x40];
        encode_string(&mut block, b"name");
        encode_string(&mut block, &[b'v'; 60]);
        let mut decoder = Decoder::new(4096, 84);
        let mut seen = 0;
        assert_eq!(decoder.decode(&block, |_, _| seen += 1), Ok(List::TooLarge { size: 96 }));
        assert_eq!(seen, 0);
        assert_eq!(decode(&mut Decoder::new(4096, 1024), &block).map(|f| f.len()), Ok(1));
        let mut fields = Vec::new();
        let list = decoder.decode(&hex("be"), |name, _| fields.push(name.to_vec()));
        assert_eq!((list, fields), (Ok(List::TooLarge { size: 96 }), Vec::<Vec<u8>>::new()));
        // The bound is per block, not per connection.
        let mut decoder = Decoder::new(4096, 42);
        for _ in 0..3 {
            assert_eq!(decode(&mut decoder, &hex("82")).map(|f| f.len()), Ok(1));
        }
    }

    #[test]
    fn the_dynamic_table_evicts_the_oldest_and_follows_size_updates() {
        let mut decoder = Decoder::new(100, 16 * 1024);
        let mut block = Vec::new();
        // Two entries of 32 + 2 + 30 = 64 bytes: the second evicts the first.
        for name in [b"aa", b"bb"] {
            encode_literal_indexing(&mut block, 0, name, &[b'v'; 30]);
        }
        decode(&mut decoder, &block).expect("decodes");
        assert_eq!(decoder.dynamic_bytes, 64);
        assert_eq!(entry(&decoder.dynamic, 62).expect("an entry").0, b"bb");
        assert_eq!(decode(&mut decoder, &hex("bf")), Err(HpackError::Index(63)));
        // A literal with incremental indexing whose name is the entry it evicts: 62's name is
        // copied before "bb" leaves.
        let mut block = vec![0x7e];
        encode_string(&mut block, &[b'w'; 30]);
        let fields = decode(&mut decoder, &block).expect("decodes");
        assert_eq!(fields, [("bb".to_owned(), "w".repeat(30))]);
        assert_eq!(table(&decoder), [("bb".to_owned(), "w".repeat(30))]);
        // Two size updates at the start of a block are allowed: to 0 (empties the table), then
        // back up to the maximum.
        assert_eq!(decode(&mut decoder, &hex("20 3f 45 be")), Err(HpackError::Index(62)));
        assert_eq!(decoder.dynamic_bytes, 0);
        assert_eq!(decoder.dynamic_bytes_max, 100);
        // A smaller size evicts down to it; a larger one than advertised is refused.
        let mut block = Vec::new();
        encode_literal_indexing(&mut block, 0, b"a", b"b");
        encode_literal_indexing(&mut block, 0, b"c", b"d");
        decode(&mut decoder, &block).expect("decodes");
        assert_eq!(decoder.dynamic_bytes, 68);
        assert_eq!(decode(&mut decoder, &hex("3f 16 be")), Ok(pairs(&[("c", "d")])), "a size of 53");
        assert_eq!(table(&decoder), pairs(&[("c", "d")]));
        assert_eq!(decode(&mut decoder, &hex("3f 46")), Err(HpackError::TableSize { size: 101, max: 100 }));
        // An entry larger than the table empties it and is not added (RFC 7541 4.4).
        let mut decoder = Decoder::new(50, 16 * 1024);
        let mut block = Vec::new();
        encode_literal_indexing(&mut block, 0, b"k", b"v");
        encode_literal_indexing(&mut block, 0, b"name", &[b'x'; 40]);
        assert_eq!(decode(&mut decoder, &block).expect("decodes").len(), 2);
        assert_eq!(decoder.dynamic_bytes, 0);
        assert!(decoder.dynamic.is_empty());
        // A table of 0 bytes holds nothing, and decodes as well.
        let mut decoder = Decoder::new(0, 16 * 1024);
        assert_eq!(decode(&mut decoder, &hex(C3[0])).map(|f| f.len()), Ok(4));
        assert_eq!(decoder.dynamic_bytes, 0);
    }

    #[test]
    fn what_the_encoders_write_decodes_back() {
        let mut block = Vec::new();
        encode_indexed(&mut block, 8);
        encode_literal_indexed_name(&mut block, 31, b"application/grpc");
        encode_literal_indexed_name(&mut block, 1, b"");
        encode_literal(&mut block, b"grpc-status", b"0");
        encode_literal(&mut block, b"", b"");
        let mut expected = pairs(&[
            (":status", "200"),
            ("content-type", "application/grpc"),
            (":authority", ""),
            ("grpc-status", "0"),
            ("", ""),
        ]);
        // Lengths around the 7-bit prefix's maximum (127) and a two-byte continuation.
        for length in [126, 127, 128, 300, 20_000] {
            encode_literal(&mut block, b"grpc-message", &vec![b'm'; length]);
            expected.push(("grpc-message".to_owned(), "m".repeat(length)));
        }
        let fields = decode(&mut Decoder::new(4096, 1 << 20), &block).expect("decodes");
        assert_eq!(fields, expected);
        // The exact bytes of the simplest forms (RFC 7541 C.2.4, and 31 past a 4-bit prefix).
        let mut block = Vec::new();
        encode_indexed(&mut block, 2);
        encode_literal_indexed_name(&mut block, 31, b"x");
        assert_eq!(block, [0x82, 0x0f, 0x10, 0x01, b'x']);
        // The RFC's C.2.2 block, written by the encoder.
        let mut block = Vec::new();
        encode_literal_indexed_name(&mut block, 4, b"/sample/path");
        assert_eq!(block, hex("040c 2f73 616d 706c 652f 7061 7468"));
        // The RFC's C.2.1 block (a new name, indexed), and a field it then names by index 62.
        let mut block = Vec::new();
        encode_literal_indexing(&mut block, 0, b"custom-key", b"custom-header");
        assert_eq!(block, hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"));
        encode_literal_indexing(&mut block, 1, b"", b"www.example.com");
        encode_indexed(&mut block, 63);
        let mut decoder = Decoder::new(4096, 16 * 1024);
        let fields = decode(&mut decoder, &block).expect("decodes");
        let expected = [
            ("custom-key", "custom-header"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-header"),
        ];
        assert_eq!(fields, pairs(&expected));
    }

    /// A tiny xorshift, deterministic.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Random bytes, and the RFC's blocks with random bytes changed, on decoders that keep their
    /// tables from block to block: any result, never a panic, and the size counter stays right.
    #[test]
    fn arbitrary_blocks_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut decoder = Decoder::new(4096, 16 * 1024);
        let mut small = Decoder::new(64, 256);
        for _ in 0..20_000 {
            let length = (next(&mut state) % 40) as usize;
            let block: Vec<u8> = (0..length).map(|_| next(&mut state) as u8).collect();
            let _ = decoder.decode(&block, |_, _| {});
            let _ = small.decode(&block, |_, _| {});
        }
        table(&decoder);
        table(&small);
        let valid: Vec<Vec<u8>> = [C3, C4, C5, C6].iter().flatten().map(|block| hex(block)).collect();
        for _ in 0..5_000 {
            let mut block = valid[(next(&mut state) % valid.len() as u64) as usize].clone();
            for _ in 0..1 + next(&mut state) % 3 {
                let at = (next(&mut state) % block.len() as u64) as usize;
                block[at] = next(&mut state) as u8;
            }
            let _ = decoder.decode(&block, |_, _| {});
            let _ = small.decode(&block, |_, _| {});
        }
        table(&decoder);
        table(&small);
    }
}
