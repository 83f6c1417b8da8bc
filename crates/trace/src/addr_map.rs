//! Hash maps keyed by addresses, ids and op indices.
//!
//! Converting a trace looks up every allocation's address a few times, and SipHash (the std
//! default) was a fifth of reading a snapshot. A SplitMix64 finalizer over the key XOR a
//! per-process random seed is several times cheaper and still keeps a crafted file from
//! choosing colliding addresses. Nothing iterates these maps, so their order never matters.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

pub type AddrMap<K, V> = HashMap<K, V, BuildAddrHasher>;

#[derive(Clone)]
pub struct BuildAddrHasher {
    seed: u64,
}

impl Default for BuildAddrHasher {
    fn default() -> Self {
        BuildAddrHasher { seed: RandomState::new().hash_one(0x5eed_u64) }
    }
}

impl BuildHasher for BuildAddrHasher {
    type Hasher = AddrHasher;

    fn build_hasher(&self) -> AddrHasher {
        AddrHasher { state: self.seed }
    }
}

pub struct AddrHasher {
    state: u64,
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write_u64(&mut self, x: u64) {
        self.state = mix(self.state ^ x);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.write_u64(u64::from_le_bytes(word.try_into().unwrap()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
}
