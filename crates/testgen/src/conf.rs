//! Allocator configuration strings in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax: every key that
//! changes the PyTorch policy's decisions, both forms of `roundup_power2_divisions`, keys in
//! any order, and a few strings PyTorch refuses (a policy must refuse them too, without
//! panicking).

use crate::entropy::Entropy;
use std::fmt;

/// `roundup_power2_divisions`: one value for every size, or a list by MiB boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roundup {
    /// `roundup_power2_divisions:D`.
    All(u32),
    /// `roundup_power2_divisions:[B:D,...,>:D]`; boundaries in MiB, increasing powers of two.
    List { entries: Vec<(u32, u32)>, rest: Option<u32> },
}

/// One settings string, as structured values so that generators choose meaningful numbers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllocConf {
    pub max_split_size_mb: Option<u64>,
    pub max_non_split_rounding_mb: Option<u64>,
    pub roundup_power2_divisions: Option<Roundup>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    pub release_lock_on_cudamalloc: Option<bool>,
    /// The order keys are written in (indices into the keys above); PyTorch accepts any.
    pub order: Vec<u8>,
}

/// `max_split_size_mb` values: PyTorch 2.11 accepts 20 and up.
pub const MAX_SPLIT_MB: [u64; 8] = [20, 21, 32, 40, 64, 100, 256, 1024];
pub const MAX_NON_SPLIT_ROUNDING_MB: [u64; 4] = [20, 24, 40, 128];
/// `roundup_power2_divisions:D` values: a power of two (PyTorch refuses 0 in this form).
pub const ALL_DIVISIONS: [u32; 5] = [1, 2, 4, 8, 16];
/// Values in the list form, where 0 disables rounding for the interval.
pub const DIVISIONS: [u32; 6] = [0, 1, 2, 4, 8, 16];
pub const GC_THRESHOLDS: [f64; 5] = [0.05, 0.3, 0.5, 0.8, 0.99];

/// Strings PyTorch refuses with a ValueError (from its own `test_allocator_settings`, and a few
/// more of the same kinds).
pub const INVALID: [&str; 11] = [
    "foo:1,bar:2",
    "garbage_collection_threshold:1.2",
    "garbage_collection_threshold:0",
    "max_split_size_mb:2",
    "release_lock_on_cudamalloc:none",
    "expandable_segments:true",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:0",
    "roundup_power2_divisions:[3:4]",
    "max_split_size_mb:",
    "max_split_size_mb:40,,",
];

const KEYS: u8 = 6;

impl AllocConf {
    /// A random valid settings string: each key present with probability about one half.
    pub fn generate(e: &mut impl Entropy) -> AllocConf {
        let mut c = AllocConf::default();
        if e.chance(1, 2) {
            c.max_split_size_mb = Some(*e.pick(&MAX_SPLIT_MB));
        }
        if e.chance(1, 6) {
            c.max_non_split_rounding_mb = Some(*e.pick(&MAX_NON_SPLIT_ROUNDING_MB));
        }
        if e.chance(1, 2) {
            c.roundup_power2_divisions = Some(if e.chance(1, 2) {
                Roundup::All(*e.pick(&ALL_DIVISIONS))
            } else {
                let n = 1 + e.below(4) as usize;
                let mut boundary = 1u32 << e.below(3);
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((boundary, *e.pick(&DIVISIONS)));
                    boundary <<= 1 + e.below(3);
                }
                let rest = e.chance(1, 2).then(|| *e.pick(&DIVISIONS));
                Roundup::List { entries, rest }
            });
        }
        if e.chance(1, 3) {
            c.garbage_collection_threshold = Some(*e.pick(&GC_THRESHOLDS));
        }
        if e.chance(1, 3) {
            c.expandable_segments = Some(e.chance(1, 2));
        }
        if e.chance(1, 8) {
            c.release_lock_on_cudamalloc = Some(e.chance(1, 2));
        }
        c.order = (0..KEYS).collect();
        for i in (1..c.order.len()).rev() {
            let j = e.below(i as u64 + 1) as usize;
            c.order.swap(i, j);
        }
        c
    }

    /// True when the string turns expandable segments on.
    pub fn expandable(&self) -> bool {
        self.expandable_segments == Some(true)
    }

    fn part(&self, key: u8) -> Option<String> {
        let b = |v: bool| if v { "True" } else { "False" };
        match key {
            0 => self.max_split_size_mb.map(|v| format!("max_split_size_mb:{v}")),
            1 => self.max_non_split_rounding_mb.map(|v| format!("max_non_split_rounding_mb:{v}")),
            2 => self.roundup_power2_divisions.as_ref().map(|r| match r {
                Roundup::All(d) => format!("roundup_power2_divisions:{d}"),
                Roundup::List { entries, rest } => {
                    let mut items: Vec<String> =
                        entries.iter().map(|(b, d)| format!("{b}:{d}")).collect();
                    if let Some(d) = rest {
                        items.push(format!(">:{d}"));
                    }
                    format!("roundup_power2_divisions:[{}]", items.join(","))
                }
            }),
            3 => self
                .garbage_collection_threshold
                .map(|t| format!("garbage_collection_threshold:{t}")),
            4 => self.expandable_segments.map(|v| format!("expandable_segments:{}", b(v))),
            5 => self
                .release_lock_on_cudamalloc
                .map(|v| format!("release_lock_on_cudamalloc:{}", b(v))),
            _ => None,
        }
    }
}

impl fmt::Display for AllocConf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let order: Vec<u8> =
            if self.order.is_empty() { (0..KEYS).collect() } else { self.order.clone() };
        let parts: Vec<String> = order.iter().filter_map(|&k| self.part(k)).collect();
        f.write_str(&parts.join(","))
    }
}

/// A settings string for a run-time `SetAllocatorSettings` op: mostly valid, sometimes one
/// PyTorch refuses, sometimes empty (which resets the keys a parse resets).
pub fn settings_string(e: &mut impl Entropy) -> String {
    match e.below(16) {
        0 => e.pick(&INVALID).to_string(),
        1 => String::new(),
        _ => AllocConf::generate(e).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entropy::SeededEntropy;

    #[test]
    fn renders_both_roundup_forms() {
        let c = AllocConf {
            max_split_size_mb: Some(40),
            roundup_power2_divisions: Some(Roundup::List {
                entries: vec![(64, 8), (128, 2)],
                rest: Some(1),
            }),
            ..AllocConf::default()
        };
        assert_eq!(c.to_string(), "max_split_size_mb:40,roundup_power2_divisions:[64:8,128:2,>:1]");
        let c =
            AllocConf { roundup_power2_divisions: Some(Roundup::All(4)), ..AllocConf::default() };
        assert_eq!(c.to_string(), "roundup_power2_divisions:4");
    }

    #[test]
    fn generated_strings_use_only_known_keys() {
        let mut e = SeededEntropy::new(7);
        for _ in 0..200 {
            let s = AllocConf::generate(&mut e).to_string();
            for part in s.split(',').filter(|p| !p.is_empty() && !p.contains('>')) {
                let key = part.split(':').next().unwrap();
                assert!(
                    key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '[')
                        || key.chars().all(|c| c.is_ascii_digit() || c == ']'),
                    "{s}"
                );
            }
        }
    }
}
