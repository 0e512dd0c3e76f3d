//! The sealed datagram: ChaCha20-Poly1305 over every gossip message, with a replay window.
//!
//! ```text
//! 0        1          5             13            17                      len - 16   len
//! | version | key id  | session (LE) | counter (LE) | ciphertext ...        | tag      |
//! ```
//!
//! - `version` is [`SEAL_VERSION`]; `key id` names the key (4 bytes of HKDF output, see
//!   [`GossipKeys`]), so that a receiver that accepts two keys during a rotation opens with the
//!   right one and a datagram under an unknown key costs no decryption at all.
//! - `session` is drawn at random when a socket opens (and again when its counter runs out),
//!   `counter` counts the datagrams of the session: together they are the 96-bit nonce, never
//!   reused under one key.
//! - The 17-byte header is the AEAD's associated data; the plaintext is the sender's gossip
//!   address ([`encode_addr`]) followed by the chitchat message.
//!
//! Opening is constant work per datagram: the header is parsed, then one AEAD open over at most
//! a datagram's bytes, in place, before anything else looks at the contents. Only then does the
//! replay window ([`Opener`]) record the nonce: per session the highest counter seen and a bitmap
//! of the [`REPLAY_WINDOW_LEN`] below it (RFC 6479's scheme), for at most [`SESSIONS_MAX`]
//! sessions (least recently heard evicted; only holders of a key can create sessions).
//!
//! A sender's counter runs across all its destinations and no clock is involved, so a datagram
//! captured on its way to one member and replayed to another (or to a receiver that restarted,
//! or evicted the session, since) is accepted there once. It is authentic gossip the sender did
//! send: old versions and heartbeats that newer gossip overrides, and its answer goes to the
//! sender, not to whoever replayed it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::security::{ClusterSecret, SecurityError, hkdf_sha256_32};

/// The datagram format's version byte.
pub const SEAL_VERSION: u8 = 1;
/// Bytes before the ciphertext: version, key id, session, counter.
pub const HEADER_LEN: usize = 1 + 4 + 8 + 4;
/// The AEAD tag's length.
pub const TAG_LEN: usize = 16;
/// The longest encoded sender address (IPv6: family, 16 bytes, port).
pub const ADDR_LEN_MAX: usize = 1 + 16 + 2;
/// What sealing adds to a chitchat message, at most: header, sender address and tag. chitchat
/// (patched) sizes its deltas to leave `chitchat::TRANSPORT_OVERHEAD_MAX` bytes for it.
pub const SEAL_OVERHEAD_MAX: usize = HEADER_LEN + ADDR_LEN_MAX + TAG_LEN;
/// The largest UDP payload (IPv4: 65 535 − 8 − 20).
pub const DATAGRAM_LEN_MAX: usize = 65_507;
/// Counters remembered below the highest of a session: datagrams reordered by more than this
/// are dropped as replays.
pub const REPLAY_WINDOW_LEN: u32 = 64;
/// Sessions (sending sockets) remembered by a receiver.
pub const SESSIONS_MAX: usize = 1024;

const _: () = assert!(SEAL_OVERHEAD_MAX <= chitchat::TRANSPORT_OVERHEAD_MAX);

/// HKDF salt and infos of the gossip keys (version 1 of the format: changing one changes every
/// key). The cluster id is part of the info, so two clusters that share a secret still reject
/// each other's gossip.
const GOSSIP_HKDF_SALT: &[u8] = b"ratemesh gossip salt v1";
const GOSSIP_KEY_INFO: &[u8] = b"ratemesh gossip chacha20-poly1305 key v1";
const GOSSIP_KEY_ID_INFO: &[u8] = b"ratemesh gossip key id v1";

/// Why a datagram was dropped before reaching chitchat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Too short, too long or an unknown format version: not a sealed datagram.
    NotSealed,
    /// Sealed under a key this node does not hold (another cluster, another secret).
    UnknownKey,
    /// The tag does not verify: forged or corrupted.
    Forged,
    /// Authentic, but its nonce was seen already (or is older than the replay window).
    Replayed,
    /// Authentic, but its contents are not what a ratemesh node sends (an insider's bug or
    /// attack): see [`crate::gossip::check`].
    Malformed,
    /// Authentic and well formed, but over a bound ([`crate::gossip::GossipLimits`]).
    OverBound,
}

/// One key: its id on the wire and the AEAD key.
struct Key {
    id: [u8; 4],
    aead: LessSafeKey,
}

impl Key {
    fn derive(secret: &[u8], cluster_id: &str) -> Result<Key, SecurityError> {
        let key = hkdf_sha256_32(GOSSIP_HKDF_SALT, secret, &[GOSSIP_KEY_INFO, cluster_id.as_bytes()])?;
        let id = hkdf_sha256_32(GOSSIP_HKDF_SALT, secret, &[GOSSIP_KEY_ID_INFO, cluster_id.as_bytes()])?;
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key[..]).map_err(|_| SecurityError::Derive)?;
        Ok(Key { id: [id[0], id[1], id[2], id[3]], aead: LessSafeKey::new(unbound) })
    }
}

/// The keys of a node's gossip: the one it seals with, and every one it opens with (that one
/// and, during a rotation, the accepted one).
pub struct GossipKeys {
    seal: Key,
    accepted: Option<Key>,
}

impl GossipKeys {
    /// The keys of `secret` (and of the secret it also accepts, if any) for `cluster_id`.
    pub fn derive(secret: &ClusterSecret, cluster_id: &str) -> Result<GossipKeys, SecurityError> {
        let seal = Key::derive(secret.bytes(), cluster_id)?;
        let accepted = secret.accepted_bytes().map(|bytes| Key::derive(bytes, cluster_id)).transpose()?;
        Ok(GossipKeys { seal, accepted })
    }

    fn opening(&self, id: &[u8]) -> Option<&Key> {
        std::iter::once(&self.seal).chain(self.accepted.as_ref()).find(|key| key.id == id)
    }
}

impl std::fmt::Debug for GossipKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipKeys").field("accepted", &self.accepted.is_some()).finish_non_exhaustive()
    }
}

/// Seals outgoing messages of one socket.
pub struct Sealer {
    session: u64,
    counter: u32,
    random: SystemRandom,
}

impl Sealer {
    /// A sealer with a fresh random session.
    pub fn new() -> Result<Sealer, SecurityError> {
        let random = SystemRandom::new();
        Ok(Sealer { session: random_session(&random)?, counter: 0, random })
    }

    /// Seals `message` from `sender` into `out` (cleared first): the datagram to send.
    pub fn seal(
        &mut self,
        keys: &GossipKeys,
        sender: SocketAddr,
        message: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), SecurityError> {
        if self.counter == u32::MAX {
            // The nonce space of this session is used up: a new session, never a reused nonce.
            self.session = random_session(&self.random)?;
            self.counter = 0;
        }
        let counter = self.counter;
        self.counter += 1;
        out.clear();
        out.push(SEAL_VERSION);
        out.extend_from_slice(&keys.seal.id);
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&counter.to_le_bytes());
        encode_addr(sender, out);
        out.extend_from_slice(message);
        let (header, plaintext) = out.split_at_mut(HEADER_LEN);
        let nonce = nonce(header);
        let tag = keys
            .seal
            .aead
            .seal_in_place_separate_tag(nonce, Aad::from(&header[..]), plaintext)
            .map_err(|_| SecurityError::Derive)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

fn random_session(random: &SystemRandom) -> Result<u64, SecurityError> {
    let mut bytes = [0_u8; 8];
    random.fill(&mut bytes).map_err(|_| SecurityError::Derive)?;
    Ok(u64::from_le_bytes(bytes))
}

fn nonce(header: &[u8]) -> Nonce {
    let mut nonce = [0_u8; 12];
    nonce.copy_from_slice(&header[5..HEADER_LEN]);
    Nonce::assume_unique_for_key(nonce)
}

/// What one session's receiver remembers: the highest counter and which of the
/// [`REPLAY_WINDOW_LEN`] below it arrived (bit `i`: counter `top - i`).
#[derive(Clone, Copy, Debug)]
struct Window {
    top: u32,
    seen: u64,
    /// When the session was last heard, in datagrams opened by this receiver (for eviction).
    heard: u64,
}

impl Window {
    /// Records `counter`; false if it was seen or is older than the window.
    fn accept(&mut self, counter: u32) -> bool {
        if counter > self.top {
            let shift = counter - self.top;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.top = counter;
            return true;
        }
        let age = self.top - counter;
        if age >= REPLAY_WINDOW_LEN {
            return false;
        }
        let bit = 1_u64 << age;
        let fresh = self.seen & bit == 0;
        self.seen |= bit;
        fresh
    }
}

/// Opens incoming datagrams and keeps the replay windows of the sessions heard.
#[derive(Debug, Default)]
pub struct Opener {
    sessions: HashMap<u64, Window>,
    opened: u64,
}

impl Opener {
    /// Authenticates and decrypts `datagram` in place; returns the sender's gossip address and
    /// the chitchat message (a slice of `datagram`). Nothing but the header is read before the
    /// tag verified.
    pub fn open<'a>(
        &mut self,
        keys: &GossipKeys,
        datagram: &'a mut [u8],
    ) -> Result<(SocketAddr, &'a [u8]), Reject> {
        if datagram.len() < HEADER_LEN + TAG_LEN || datagram.len() > DATAGRAM_LEN_MAX {
            return Err(Reject::NotSealed);
        }
        if datagram[0] != SEAL_VERSION {
            return Err(Reject::NotSealed);
        }
        let key = keys.opening(&datagram[1..5]).ok_or(Reject::UnknownKey)?;
        let (header, sealed) = datagram.split_at_mut(HEADER_LEN);
        let plaintext = key
            .aead
            .open_in_place(nonce(header), Aad::from(&header[..]), sealed)
            .map_err(|_| Reject::Forged)?;
        let session = u64::from_le_bytes(header[5..13].try_into().map_err(|_| Reject::NotSealed)?);
        let counter = u32::from_le_bytes(header[13..17].try_into().map_err(|_| Reject::NotSealed)?);
        if !self.accept(session, counter) {
            return Err(Reject::Replayed);
        }
        let mut cursor: &[u8] = plaintext;
        let sender = decode_addr(&mut cursor).ok_or(Reject::Malformed)?;
        Ok((sender, cursor))
    }

    fn accept(&mut self, session: u64, counter: u32) -> bool {
        self.opened += 1;
        let heard = self.opened;
        if let Some(window) = self.sessions.get_mut(&session) {
            window.heard = heard;
            return window.accept(counter);
        }
        if self.sessions.len() >= SESSIONS_MAX
            && let Some(oldest) =
                self.sessions.iter().min_by_key(|(_, window)| window.heard).map(|(&id, _)| id)
        {
            self.sessions.remove(&oldest);
        }
        self.sessions.insert(session, Window { top: counter, seen: 1, heard });
        true
    }
}

/// Appends `addr`: family (4 or 6), the address's bytes, the port (little-endian).
pub fn encode_addr(addr: SocketAddr, out: &mut Vec<u8>) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

/// Reads an address written by [`encode_addr`] from the front of `input`.
pub fn decode_addr(input: &mut &[u8]) -> Option<SocketAddr> {
    let (&family, rest) = input.split_first()?;
    let (ip, rest) = match family {
        4 => {
            let (octets, rest) = rest.split_first_chunk::<4>()?;
            (IpAddr::V4(Ipv4Addr::from(*octets)), rest)
        }
        6 => {
            let (octets, rest) = rest.split_first_chunk::<16>()?;
            (IpAddr::V6(Ipv6Addr::from(*octets)), rest)
        }
        _ => return None,
    };
    let (port, rest) = rest.split_first_chunk::<2>()?;
    *input = rest;
    Some(SocketAddr::new(ip, u16::from_le_bytes(*port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &str) -> GossipKeys {
        GossipKeys::derive(&ClusterSecret::new(secret).expect("long enough"), "test").expect("derive")
    }

    fn sender() -> SocketAddr {
        SocketAddr::from(([10, 1, 2, 3], 7946))
    }

    fn sealed(sealer: &mut Sealer, keys: &GossipKeys, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        sealer.seal(keys, sender(), message, &mut out).expect("seals");
        out
    }

    #[test]
    fn a_sealed_message_opens_once_and_hides_its_contents() {
        let keys = keys("a secret of sixteen bytes or more");
        let mut sealer = Sealer::new().expect("random");
        let mut opener = Opener::default();
        let message = b"ratemesh.quic_addr=10.1.2.3:7947";
        let datagram = sealed(&mut sealer, &keys, message);
        assert!(datagram.len() <= message.len() + SEAL_OVERHEAD_MAX);
        assert!(!datagram.windows(8).any(|window| window == b"ratemesh"), "encrypted");
        let mut copy = datagram.clone();
        let (from, opened) = opener.open(&keys, &mut copy).expect("opens");
        assert_eq!((from, opened), (sender(), &message[..]));
        let mut replay = datagram.clone();
        assert_eq!(opener.open(&keys, &mut replay), Err(Reject::Replayed));
    }

    #[test]
    fn wrong_keys_flipped_bits_and_junk_are_refused() {
        let keys = keys("a secret of sixteen bytes or more");
        let other = keys_for_cluster("a secret of sixteen bytes or more", "another cluster");
        let mut sealer = Sealer::new().expect("random");
        let mut opener = Opener::default();
        let datagram = sealed(&mut sealer, &keys, b"hello");
        assert_eq!(opener.open(&other, &mut datagram.clone()), Err(Reject::UnknownKey));
        for at in 0..datagram.len() {
            let mut flipped = datagram.clone();
            flipped[at] ^= 0x20;
            let refused = opener.open(&keys, &mut flipped);
            assert!(
                matches!(refused, Err(Reject::NotSealed | Reject::UnknownKey | Reject::Forged)),
                "byte {at}: {refused:?}"
            );
        }
        for junk in [&b""[..], b"\x01", &[0_u8; 40], &[1_u8; 40]] {
            assert!(opener.open(&keys, &mut junk.to_vec()).is_err());
        }
        // The untouched datagram still opens: refusals recorded nothing.
        assert!(opener.open(&keys, &mut datagram.clone()).is_ok());
    }

    fn keys_for_cluster(secret: &str, cluster: &str) -> GossipKeys {
        GossipKeys::derive(&ClusterSecret::new(secret).expect("long enough"), cluster).expect("derive")
    }

    #[test]
    fn during_a_rotation_both_secrets_open_and_the_current_one_seals() {
        let old = keys("the old secret, sixteen bytes+");
        let new = keys("the new secret, sixteen bytes+");
        let both = GossipKeys::derive(
            &ClusterSecret::new("the new secret, sixteen bytes+")
                .expect("long enough")
                .also_accepting(ClusterSecret::new("the old secret, sixteen bytes+").expect("long enough")),
            "test",
        )
        .expect("derive");
        let mut opener = Opener::default();
        for sealing in [&old, &new] {
            let datagram = sealed(&mut Sealer::new().expect("random"), sealing, b"hi");
            assert!(opener.open(&both, &mut datagram.clone()).is_ok());
        }
        let datagram = sealed(&mut Sealer::new().expect("random"), &both, b"hi");
        assert!(opener.open(&new, &mut datagram.clone()).is_ok());
        assert_eq!(opener.open(&old, &mut datagram.clone()), Err(Reject::UnknownKey));
    }

    #[test]
    fn the_replay_window_accepts_reordering_within_it_and_nothing_twice() {
        let mut window = Window { top: 100, seen: 1, heard: 0 };
        assert!(window.accept(90));
        assert!(!window.accept(90));
        assert!(window.accept(101));
        assert!(!window.accept(100));
        assert!(!window.accept(101 - REPLAY_WINDOW_LEN));
        assert!(window.accept(1000));
        assert!(!window.accept(999 - REPLAY_WINDOW_LEN));
        assert!(window.accept(999));
    }

    #[test]
    fn sessions_are_bounded() {
        let mut opener = Opener::default();
        for session in 0..(SESSIONS_MAX as u64 * 2) {
            assert!(opener.accept(session, 0));
        }
        assert_eq!(opener.sessions.len(), SESSIONS_MAX);
        // The most recent sessions are the ones remembered.
        assert!(!opener.accept(SESSIONS_MAX as u64 * 2 - 1, 0));
    }

    #[test]
    fn addresses_round_trip() {
        for addr in ["10.0.0.1:7946", "[::1]:1", "[2001:db8::7]:65535"] {
            let addr: SocketAddr = addr.parse().expect("address");
            let mut out = Vec::new();
            encode_addr(addr, &mut out);
            assert!(out.len() <= ADDR_LEN_MAX);
            let mut input = &out[..];
            assert_eq!(decode_addr(&mut input), Some(addr));
            assert!(input.is_empty());
        }
        assert_eq!(decode_addr(&mut &[5_u8, 1, 2, 3, 4, 5, 6][..]), None);
        assert_eq!(decode_addr(&mut &[4_u8, 1, 2][..]), None);
    }
}
