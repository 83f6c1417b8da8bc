//! Where a generator's choices come from: a seeded ChaCha stream (`allocsim fuzz`, benches) or
//! the bytes a coverage-guided fuzzer mutates (`fuzz/`). One generator serves both, so a byte
//! string and a seed describe programs from the same distribution, and the fuzzer's mutations
//! change one choice at a time, as `arbitrary` does.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A source of choices. Only `below` is required; the rest are built on it.
pub trait Entropy {
    /// A value in `0..n`; `n` must be positive.
    fn below(&mut self, n: u64) -> u64;

    /// True when a byte source has run dry: generators stop adding steps then.
    fn exhausted(&self) -> bool {
        false
    }

    /// True with probability `num / den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One element of a non-empty slice.
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A value in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(n) => lo + self.below(n),
            None => self.below(u64::MAX),
        }
    }
}

/// Choices from a seed: the same seed gives the same program on every machine.
#[derive(Debug, Clone)]
pub struct SeededEntropy(ChaCha8Rng);

impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        SeededEntropy(ChaCha8Rng::seed_from_u64(seed))
    }
}

impl Entropy for SeededEntropy {
    fn below(&mut self, n: u64) -> u64 {
        self.0.gen_range(0..n.max(1))
    }
}

/// Choices read from fuzzer bytes, little-endian, as few bytes as `n` needs. Once the bytes run
/// out every choice is 0, which every generator treats as the simplest option.
#[derive(Debug, Clone)]
pub struct ByteEntropy<'a> {
    data: &'a [u8],
}

impl<'a> ByteEntropy<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        ByteEntropy { data }
    }
}

impl Entropy for ByteEntropy<'_> {
    fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        let width = (64 - (n - 1).leading_zeros()).div_ceil(8) as usize;
        let take = width.min(self.data.len());
        let mut value = 0u64;
        for (i, &b) in self.data[..take].iter().enumerate() {
            value |= u64::from(b) << (8 * i);
        }
        self.data = &self.data[take..];
        value % n
    }

    fn exhausted(&self) -> bool {
        self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_map_to_small_choices_and_run_dry() {
        let mut e = ByteEntropy::new(&[5, 1, 2]);
        assert_eq!(e.below(10), 5);
        assert_eq!(e.below(1000), 513, "two bytes, little-endian: 0x0201");
        assert!(e.exhausted());
        assert_eq!(e.below(7), 0);
    }

    #[test]
    fn seeds_are_reproducible() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut e = SeededEntropy::new(3);
                move |_| e.below(1000)
            })
            .collect();
        let mut e = SeededEntropy::new(3);
        let b: Vec<u64> = (0..8).map(|_| e.below(1000)).collect();
        assert_eq!(a, b);
        assert_eq!(SeededEntropy::new(0).between(5, 5), 5);
    }
}
