//! HPACK (RFC 7541): the decoder of a connection's request header blocks, and the few literal
//! forms the server's answers are written in.
//!
//! The decoder keeps the static table and the connection's dynamic table (entries as owned
//! bytes, sizes as RFC 7541 4.1 counts them), decodes Huffman-coded strings (Appendix B) and
//! hands each field to the caller as borrowed bytes. Every length, index and integer is checked
//! against the block and the bounds given: a malformed block is an error, never a panic.
//!
//! The encoder writes only literals without indexing (and static-table references): the server
//! never adds to the peer's dynamic table, so its answers depend on no state of the peer's.

use std::collections::VecDeque;

/// Why a header block could not be decoded: in HTTP/2 always a connection error
/// (COMPRESSION_ERROR), since the dynamic table can no longer follow the peer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ended inside a field.
    #[error("HPACK: the header block ends inside a field")]
    Truncated,
    /// An integer beyond what any field or table can need.
    #[error("HPACK: an integer too large")]
    IntegerOverflow,
    /// An index that names no entry (0, or past both tables).
    #[error("HPACK: index {0} names no table entry")]
    Index(usize),
    /// A Huffman-coded string that is not one (EOS, or padding that is not a short run of ones).
    #[error("HPACK: an invalid Huffman-coded string")]
    Huffman,
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
    /// A decoded header list larger than the bound.
    #[error("HPACK: a header list over {0} bytes")]
    ListTooLarge(usize),
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

/// The bit length of each symbol's Huffman code (RFC 7541 Appendix B; 256 is EOS), as the h2
/// crate's generated table has them (MIT). The code is canonical (codes of one length are
/// consecutive, in symbol order, and follow the shorter ones), so the lengths define it.
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

const CANONICAL: Canonical = canonical();

/// The shortest Huffman code, in bits.
const CODE_BITS_MIN: usize = 5;

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
/// far below an overflow.
const INTEGER_MAX: usize = 1 << 28;

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The size RFC 7541 4.1 counts for an entry: its name, its value and 32 bytes of overhead.
fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
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
    /// Huffman-decoded strings (name, value) of the field being decoded.
    name_buffer: Vec<u8>,
    value_buffer: Vec<u8>,
}

/// Where a field's name comes from: a table index, or a string at the decoder's position.
enum Name {
    Indexed(usize),
    Literal,
}

/// A string of a block: bytes of the block itself, or Huffman-decoded into a buffer.
enum Text {
    Raw(std::ops::Range<usize>),
    Decoded,
}

impl Decoder {
    /// A decoder whose dynamic table may hold at most `table_bytes_max` bytes (the
    /// SETTINGS_HEADER_TABLE_SIZE the server advertised; 4096 is HTTP/2's default), and which
    /// refuses a header list whose decoded size (RFC 9113 SETTINGS_MAX_HEADER_LIST_SIZE: names,
    /// values and 32 per field) passes `list_bytes_max`.
    pub fn new(table_bytes_max: usize, list_bytes_max: usize) -> Decoder {
        Decoder {
            dynamic: VecDeque::new(),
            dynamic_bytes: 0,
            dynamic_bytes_max: table_bytes_max,
            table_bytes_max,
            list_bytes_max,
            name_buffer: Vec::new(),
            value_buffer: Vec::new(),
        }
    }

    /// Decodes one complete header block (HEADERS and CONTINUATION payloads joined), calling
    /// `field(name, value)` for each field in order. The dynamic table follows the block whatever
    /// the caller keeps, so that the connection's later blocks decode right.
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), HpackError> {
        let mut position = 0;
        let mut list_bytes = 0;
        let mut fields_seen = false;
        while let Some(&first) = block.get(position) {
            if first & 0x80 != 0 {
                // Indexed field (6.1).
                let index = integer(block, &mut position, 7)?;
                let (name, value) = self.entry(index)?;
                list_bytes += entry_size(name, value);
                check_list(list_bytes, self.list_bytes_max)?;
                field(name, value);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the block's first field.
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
                // Literals (6.2): with incremental indexing (01), without (0000), never (0001).
                let (prefix, indexing) = if first & 0xc0 == 0x40 { (6, true) } else { (4, false) };
                let index = integer(block, &mut position, prefix)?;
                let name = if index == 0 { Name::Literal } else { Name::Indexed(index) };
                list_bytes += self.literal(block, &mut position, name, indexing, &mut field)?;
                check_list(list_bytes, self.list_bytes_max)?;
            }
            fields_seen = true;
        }
        Ok(())
    }

    /// A literal field whose representation and name index were read: its name (if literal)
    /// and value are read, the field handed to `field` and, with `indexing`, added to the
    /// dynamic table. Returns its size.
    fn literal(
        &mut self,
        block: &[u8],
        position: &mut usize,
        name: Name,
        indexing: bool,
        field: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<usize, HpackError> {
        let name_text = match name {
            Name::Indexed(index) => {
                // Checked now; borrowed again below, after the value is read.
                self.entry(index)?;
                None
            }
            Name::Literal => Some(string(block, position, &mut self.name_buffer)?),
        };
        let value_text = string(block, position, &mut self.value_buffer)?;
        let value = match &value_text {
            Text::Raw(range) => &block[range.clone()],
            Text::Decoded => &self.value_buffer[..],
        };
        let name = match (&name_text, &name) {
            (Some(Text::Raw(range)), _) => &block[range.clone()],
            (Some(Text::Decoded), _) => &self.name_buffer[..],
            (None, Name::Indexed(index)) => entry(&self.dynamic, *index)?.0,
            (None, Name::Literal) => &[][..],
        };
        let size = entry_size(name, value);
        field(name, value);
        if indexing {
            let entry = (Box::from(name), Box::from(value));
            self.insert(entry);
        }
        Ok(size)
    }

    /// The entry at `index` (static first, then dynamic, newest first).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        entry(&self.dynamic, index)
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
        self.dynamic_bytes += size;
        self.dynamic.push_front((name, value));
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.dynamic_bytes + room > self.dynamic_bytes_max {
            let Some((name, value)) = self.dynamic.pop_back() else {
                self.dynamic_bytes = 0;
                return;
            };
            self.dynamic_bytes -= entry_size(&name, &value);
        }
    }

    /// The dynamic table's size (RFC 7541 4.1), for tests.
    #[cfg(test)]
    fn dynamic_bytes(&self) -> usize {
        self.dynamic_bytes
    }
}

/// The entry at `index` of the static table and then of `dynamic` (newest first).
fn entry(dynamic: &VecDeque<Entry>, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
    if index == 0 {
        return Err(HpackError::Index(index));
    }
    if let Some(&(name, value)) = STATIC.get(index - 1) {
        return Ok((name, value));
    }
    dynamic
        .get(index - 1 - STATIC.len())
        .map(|(name, value)| (&name[..], &value[..]))
        .ok_or(HpackError::Index(index))
}

fn check_list(list_bytes: usize, list_bytes_max: usize) -> Result<(), HpackError> {
    if list_bytes > list_bytes_max {
        return Err(HpackError::ListTooLarge(list_bytes_max));
    }
    Ok(())
}

/// Reads an integer with a `prefix_bits`-bit prefix (RFC 7541 5.1) at `position`.
fn integer(block: &[u8], position: &mut usize, prefix_bits: u32) -> Result<usize, HpackError> {
    let prefix_max = (1usize << prefix_bits) - 1;
    let first = *block.get(*position).ok_or(HpackError::Truncated)?;
    *position += 1;
    let mut value = usize::from(first) & prefix_max;
    if value < prefix_max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(*position).ok_or(HpackError::Truncated)?;
        *position += 1;
        value += usize::from(byte & 0x7f) << shift;
        if value > INTEGER_MAX {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::IntegerOverflow);
        }
    }
}

/// Reads a string literal (RFC 7541 5.2) at `position`: its bytes in the block, or decoded
/// into `buffer` when Huffman-coded.
fn string(block: &[u8], position: &mut usize, buffer: &mut Vec<u8>) -> Result<Text, HpackError> {
    let huffman = block.get(*position).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let length = integer(block, position, 7)?;
    let end = position.checked_add(length).ok_or(HpackError::Truncated)?;
    let bytes = block.get(*position..end).ok_or(HpackError::Truncated)?;
    *position = end;
    if !huffman {
        return Ok(Text::Raw(end - length..end));
    }
    buffer.clear();
    huffman_decode(bytes, buffer)?;
    Ok(Text::Decoded)
}

/// Decodes a Huffman-coded string (RFC 7541 5.2, Appendix B) into `out`, a symbol at a time:
/// the next 32 bits, left-aligned, fall below the limit of their code's length. EOS in the
/// string, or padding longer than 7 bits or not all ones, is an error.
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
        // Ends: every 32-bit window is below the limit of the longest codes.
        while length < CODE_BITS_MAX && window >= CANONICAL.limits[length] {
            length += 1;
        }
        if length as u32 > bits {
            // Not a whole code: padding, which must be a few ones.
            let ones = (1u64 << bits) - 1;
            if bits > 7 || buffer >> (64 - bits) != ones {
                return Err(HpackError::Huffman);
            }
            return Ok(());
        }
        let code = (window >> (32 - length)) as u32;
        let position =
            usize::from(CANONICAL.offsets[length]) + code.wrapping_sub(CANONICAL.firsts[length]) as usize;
        let symbol = *CANONICAL.symbols.get(position).ok_or(HpackError::Huffman)?;
        if symbol == EOS {
            return Err(HpackError::Huffman);
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

/// Appends a field of the static table by its index (RFC 7541 6.1), e.g. 8 for `:status 200`.
pub fn encode_indexed(out: &mut Vec<u8>, index: usize) {
    encode_integer(out, 0x80, 7, index);
}

/// Appends a literal without indexing whose name is the static table's entry `name_index`
/// (e.g. 31, `content-type`), its value not Huffman-coded.
pub fn encode_literal_indexed_name(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
    encode_integer(out, 0x00, 4, name_index);
    encode_string(out, value);
}

fn encode_string(out: &mut Vec<u8>, text: &[u8]) {
    encode_integer(out, 0x00, 7, text.len());
    out.extend_from_slice(text);
}

/// An integer with a `prefix_bits`-bit prefix, the first byte's other bits `flags`.
fn encode_integer(out: &mut Vec<u8>, flags: u8, prefix_bits: u32, value: usize) {
    let prefix_max = (1usize << prefix_bits) - 1;
    if value < prefix_max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | prefix_max as u8);
    let mut rest = value - prefix_max;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// RFC 7541 C.3 and C.4: the same three requests, without and with Huffman coding, on one
    /// decoder each (the dynamic table carries over from request to request).
    #[test]
    fn the_rfc_request_examples_decode_with_their_tables() {
        let first = pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]);
        let mut second = first.clone();
        second.push(("cache-control".to_owned(), "no-cache".to_owned()));
        let third = pairs(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]);
        let plain = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::new(4096, 16 * 1024);
            for (block, (fields, table_bytes)) in
                blocks.iter().zip([(&first, 57), (&second, 110), (&third, 164)])
            {
                assert_eq!(&decode(&mut decoder, &hex(block)).expect("decodes"), fields, "{block}");
                assert_eq!(decoder.dynamic_bytes(), table_bytes, "{block}");
            }
            assert_eq!(decoder.entry(62).expect("an entry"), (&b"custom-key"[..], &b"custom-value"[..]));
        }
    }

    /// The code's canonical form, rebuilt from the lengths: every symbol but EOS encodes and
    /// decodes back, and the code of every symbol is as long as the table says.
    #[test]
    fn every_symbol_round_trips_through_the_canonical_code() {
        let mut codes = [0u32; 257];
        let (mut code, mut previous) = (0u32, 0usize);
        for (position, &symbol) in CANONICAL.symbols.iter().enumerate() {
            let length = usize::from(CODE_LENGTHS[usize::from(symbol)]);
            if position > 0 {
                code = (code + 1) << (length - previous);
            }
            previous = length;
            codes[usize::from(symbol)] = code;
        }
        assert_eq!(codes[usize::from(b'0')], 0, "'0' is 00000");
        assert_eq!(codes[usize::from(b' ')], 0x14, "' ' is 010100");
        assert_eq!(codes[256], 0x3fff_ffff, "EOS is thirty ones");
        let text: Vec<u8> = (0..=255u8).chain(b"www.example.com".iter().copied()).collect();
        let (mut bits, mut count, mut encoded) = (0u64, 0u32, Vec::new());
        for &byte in &text {
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
        let mut decoded = Vec::new();
        huffman_decode(&encoded, &mut decoded).expect("decodes");
        assert_eq!(decoded, text);
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let cases: [(&str, HpackError); 8] = [
            ("80", HpackError::Index(0)),
            ("be", HpackError::Index(62)),
            ("ff ff ff ff ff ff 7f", HpackError::IntegerOverflow),
            ("3f e2 1f", HpackError::TableSize { size: 4097, max: 4096 }),
            ("82 20", HpackError::LateTableSize),
            // A Huffman string of one byte of ones: 8 bits of padding.
            ("00 81 ff 00", HpackError::Huffman),
            // "0" (00000) then padding of zeros.
            ("00 81 00 00", HpackError::Huffman),
            // EOS in a string: thirty ones and two more.
            ("00 84 ff ff ff ff 00", HpackError::Huffman),
        ];
        for (block, error) in cases {
            assert_eq!(decode(&mut Decoder::new(4096, 16 * 1024), &hex(block)), Err(error), "{block}");
        }
        // Every cut of a valid block either decodes (a cut between fields) or is Truncated.
        let block = hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65");
        for end in 0..block.len() {
            let mut decoder = Decoder::new(4096, 16 * 1024);
            decoder
                .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"), |_, _| {})
                .expect("valid");
            decoder.decode(&hex("8286 84be 5808 6e6f 2d63 6163 6865"), |_, _| {}).expect("valid");
            match decoder.decode(&block[..end], |_, _| {}) {
                Ok(()) | Err(HpackError::Truncated) => {}
                Err(error) => panic!("cut at {end}: {error}"),
            }
        }
        // The list bound counts names, values and 32 per field.
        let mut decoder = Decoder::new(4096, 100);
        assert_eq!(decode(&mut decoder, &hex("82 82")).map(|f| f.len()), Ok(2), "2 × 42 bytes fit in 100");
        assert_eq!(decode(&mut decoder, &hex("82 82 82")), Err(HpackError::ListTooLarge(100)));
    }

    #[test]
    fn the_dynamic_table_evicts_the_oldest_and_follows_size_updates() {
        let mut decoder = Decoder::new(100, 16 * 1024);
        let mut block = Vec::new();
        // Two entries of 32 + 2 + 30 = 64 bytes: the second evicts the first.
        for name in [b"aa", b"bb"] {
            block.push(0x40);
            encode_string(&mut block, name);
            encode_string(&mut block, &[b'v'; 30]);
        }
        decode(&mut decoder, &block).expect("decodes");
        assert_eq!(decoder.dynamic_bytes(), 64);
        assert_eq!(decoder.entry(62).expect("an entry").0, b"bb");
        assert_eq!(decoder.entry(63), Err(HpackError::Index(63)));
        // A size update to 0 empties it; one above the maximum is refused.
        decode(&mut decoder, &hex("20")).expect("decodes");
        assert_eq!(decoder.dynamic_bytes(), 0);
        assert_eq!(decoder.entry(62), Err(HpackError::Index(62)));
        // An entry larger than the table empties it and is not added.
        let mut decoder = Decoder::new(50, 16 * 1024);
        let mut block = vec![0x40];
        encode_string(&mut block, b"name");
        encode_string(&mut block, &[b'x'; 40]);
        assert_eq!(decode(&mut decoder, &block).expect("decodes").len(), 1);
        assert_eq!(decoder.dynamic_bytes(), 0);
    }

    #[test]
    fn what_the_encoders_write_decodes_back() {
        let mut block = Vec::new();
        encode_indexed(&mut block, 8);
        encode_literal_indexed_name(&mut block, 31, b"application/grpc");
        encode_literal(&mut block, b"grpc-status", b"0");
        let long = vec![b'm'; 300];
        encode_literal(&mut block, b"grpc-message", &long);
        let fields = decode(&mut Decoder::new(4096, 16 * 1024), &block).expect("decodes");
        let long = String::from_utf8(long).expect("ASCII");
        let expected = [
            (":status".to_owned(), "200".to_owned()),
            ("content-type".to_owned(), "application/grpc".to_owned()),
            ("grpc-status".to_owned(), "0".to_owned()),
            ("grpc-message".to_owned(), long),
        ];
        assert_eq!(fields, expected);
    }

    #[test]
    fn arbitrary_blocks_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut decoder = Decoder::new(4096, 16 * 1024);
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let length = (state % 24) as usize;
            let block: Vec<u8> = (0..length).map(|i| (state >> (i % 8 * 8)) as u8 ^ i as u8).collect();
            let _ = decoder.decode(&block, |_, _| {});
        }
    }
}
