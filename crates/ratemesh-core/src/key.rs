//! Keys: what a bucket is stored, owned and sent under.
//!
//! A bucket is identified by a 128-bit [`KeyHash`] of its namespace (the policy, or the inline limit
//! definition) and the client's key. The hash is XXH3-128, whose output is fixed by its
//! specification, not by the compiler: every node of every build computes the same hash, which the
//! ring (owner placement) and the wire (state handoff) rely on. Golden vectors pin it. Hashing once
//! gives fixed-size keys in memory and on the wire whatever the client's key length.

use xxhash_rust::xxh3::{xxh3_64, xxh3_128_with_seed};

/// A namespace for keys: the policy (or inline limit) the keys are counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub u64);

impl Namespace {
    /// The namespace named `name` (a policy name, or an inline limit's canonical text).
    pub fn new(name: &[u8]) -> Namespace {
        Namespace(xxh3_64(name))
    }

    /// The hash of `key` within this namespace.
    pub fn key(self, key: &[u8]) -> KeyHash {
        KeyHash(xxh3_128_with_seed(key, self.0))
    }
}

/// The identity of one bucket: a 128-bit hash of namespace and key (collisions are negligible:
/// about 10⁻²⁶ for a billion keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub u128);

impl KeyHash {
    /// 64 well-mixed bits of the hash, for hash tables and ring placement.
    pub fn low64(self) -> u64 {
        self.0 as u64
    }
}

/// A [`core::hash::Hasher`] for tables keyed by [`KeyHash`]: the key is already a uniform hash, so
/// it only folds it to 64 bits (no second hashing on the hot path).
#[derive(Clone, Copy, Default)]
pub struct KeyHasher(u64);

impl core::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached if something other than a KeyHash is hashed with this hasher.
        self.0 = xxh3_64(bytes) ^ self.0.rotate_left(5);
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = (value as u64) ^ ((value >> 64) as u64);
    }
}

/// Builds [`KeyHasher`]s.
pub type KeyHasherBuilder = core::hash::BuildHasherDefault<KeyHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;

    /// Golden vectors: these values are part of the cluster protocol. If this test fails, nodes of
    /// this build would disagree with older nodes about every key's owner. The values were checked
    /// against an independent XXH3 implementation (Python `xxhash` 3.x).
    #[test]
    fn key_hashes_are_pinned() {
        let cases: [(&[u8], &[u8], u128); 3] = [
            (b"", b"", 0x7a3edd697cf3f9535310e30cce3262d6),
            (b"api", b"user:42", 0xbad1a046fc6a9b6cca6b331238374353),
            (b"inline:token_bucket:100/1s", b"10.0.0.1", 0x0337ce2ad73d56524e85b79efef44f40),
        ];
        let got: Vec<u128> =
            cases.iter().map(|(namespace, key, _)| Namespace::new(namespace).key(key).0).collect();
        let expected: Vec<u128> = cases.iter().map(|case| case.2).collect();
        assert_eq!(got, expected, "got {got:#034x?}");
    }
}
