//! Swarm generation (Groce et al., as TigerBeetle's VOPR does it): each case first draws its
//! own *shape* (which step kinds are on and how heavily each is weighted, a device, a handful
//! of "hot" sizes that force reuse, starting settings) and then its steps from that shape. A
//! case with frees switched off piles up memory until it OOMs; one with only allocs and
//! empty_cache churns segments; one heavy in record_stream keeps many frees pending. Uniform
//! weights would visit none of those corners.
//!
//! The same tables serve the proptest strategies (`crate::strategy`) and the entropy-driven
//! generator here (seeds for `allocsim fuzz`, bytes for the fuzz targets).

use crate::conf::{settings_string, AllocConf};
use crate::entropy::Entropy;
use crate::program::{DeviceSpec, Program, Step, STREAMS};
use allocsim_core::{GIB, MIB};

/// Picks are drawn below this; the modulo by the live count does the rest.
const PICKS: u64 = 1 << 16;

/// Step kinds, in the order of [`Shape::weights`].
pub const KINDS: [&str; 8] = [
    "alloc",
    "free",
    "record_stream",
    "complete",
    "empty_cache",
    "set_fraction",
    "settings",
    "pool",
];

/// Device capacities a case can draw: small ones make OOM and the retry paths common.
pub const DEVICE_BYTES: [u64; 6] = [64 * MIB, 256 * MIB, GIB, 4 * GIB, 16 * GIB, 85_017_493_504];

/// Sizes where PyTorch's rules change: the 512 B minimum block, the 1 MiB small/large pool
/// boundary, the 10 MiB large-segment boundary, the 20 MiB large buffer and their neighbours.
pub const BOUNDARY_SIZES: [u64; 16] = [
    1,
    511,
    512,
    513,
    MIB - 1,
    MIB,
    MIB + 1,
    2 * MIB,
    10 * MIB - 1,
    10 * MIB,
    10 * MIB + 1,
    20 * MIB,
    20 * MIB + 512,
    40 * MIB,
    64 * MIB,
    0,
];

/// Memory fractions, mostly valid; the last two are refused by PyTorch's range check.
pub const FRACTIONS: [f64; 10] = [0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, -0.5, 1.5];

/// How a case draws its steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Relative weight of each kind in [`KINDS`]; 0 switches the kind off.
    pub weights: [u32; 8],
    pub device: DeviceSpec,
    pub hot_sizes: Vec<u64>,
    /// Percent of allocations that take a hot size.
    pub hot_percent: u64,
    /// Percent of allocations that take a boundary size.
    pub boundary_percent: u64,
    /// Per mille of allocations far beyond the device ([`huge`], or [`absurd`] when allowed).
    pub huge_permille: u64,
    pub absurd_sizes: bool,
    /// Sizes are drawn log-uniformly below `2^max_log2`.
    pub max_log2: u32,
    /// How many streams (from [`STREAMS`]) allocations use.
    pub streams: u8,
    pub alloc_conf: String,
    pub memory_fraction: Option<f64>,
    pub drain: bool,
}

/// What the generators may produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_steps: usize,
    /// Allow `expandable_segments:True` (the reference model does not follow them).
    pub expandable: bool,
    /// Allow settings strings PyTorch refuses in `SetAllocatorSettings` steps.
    pub invalid_settings: bool,
    /// Allow requests of 1 EiB (2^60, where PyTorch refuses outright) up to `u64::MAX`, as a
    /// corrupt trace may hold.
    pub absurd_sizes: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_steps: 200, expandable: true, invalid_settings: true, absurd_sizes: true }
    }
}

impl Limits {
    /// What the reference model follows: no expandable segments, only valid settings.
    pub fn for_reference(max_steps: usize) -> Self {
        Limits { max_steps, expandable: false, invalid_settings: false, absurd_sizes: true }
    }
}

/// Requests far beyond any device (64 GiB to 1 EiB): they must end in OOM, not in overflow.
pub fn huge(e: &mut impl Entropy) -> u64 {
    let k = e.between(36, 59);
    (1u64 << k) + e.below(1u64 << k)
}

/// 1 EiB: PyTorch refuses any request this large outright ("more than 1EB").
pub const ABSURD_BYTES: u64 = 1 << 60;

/// Requests from 1 EiB to `u64::MAX`.
pub fn absurd(e: &mut impl Entropy) -> u64 {
    match e.below(4) {
        0 => u64::MAX - e.below(1 << 12),
        _ => ABSURD_BYTES + e.below(u64::MAX - ABSURD_BYTES),
    }
}

/// Log-uniform sizes over `[1, 2^max_log2)`: every power of two equally likely, then uniform
/// within it, so a 600-byte and a 600-MiB request are drawn about as often.
pub fn log_uniform(e: &mut impl Entropy, max_log2: u32) -> u64 {
    let k = e.below(u64::from(max_log2.max(1)));
    (1u64 << k) + e.below(1u64 << k)
}

/// Real tensors come in multiples of their element size, and big ones in round MiB: sizes a
/// whole MiB (or exactly 512 B) away from a segment size are where PyTorch's split rules
/// change (`remaining > 1 MiB`, `remaining >= 512`). `how` (0..8) picks the rounding.
pub fn align(size: u64, how: u64) -> u64 {
    match how {
        0..=2 => size,
        3..=4 => size.next_multiple_of(4),
        5 => size.next_multiple_of(MIB),
        6 => size.next_multiple_of(MIB) + 512,
        _ => size.next_multiple_of(MIB).saturating_sub(512).max(1),
    }
}

impl Shape {
    pub fn generate(e: &mut impl Entropy, limits: &Limits) -> Shape {
        let mut weights = [0u32; 8];
        weights[0] = 1 + e.below(16) as u32;
        for (i, w) in weights.iter_mut().enumerate().skip(1) {
            let on = match i {
                1 => e.chance(7, 8),
                2 | 3 => e.chance(1, 2),
                _ => e.chance(1, 3),
            };
            *w = if on { 1 + e.below(if i >= 4 { 2 } else { 16 }) as u32 } else { 0 };
        }
        let total_bytes = *e.pick(&DEVICE_BYTES);
        let free_bytes = if e.chance(1, 4) { total_bytes - total_bytes / 64 } else { total_bytes };
        let device = DeviceSpec { total_bytes, free_bytes };
        let max_log2 = 64 - total_bytes.leading_zeros() + e.below(2) as u32 - e.below(8) as u32;
        let hot_sizes = (0..1 + e.below(6)).map(|_| log_uniform(e, max_log2.min(27))).collect();
        let mut conf = if e.chance(1, 2) { AllocConf::generate(e) } else { AllocConf::default() };
        if !limits.expandable {
            conf.expandable_segments = None;
        }
        Shape {
            weights,
            device,
            hot_sizes,
            hot_percent: e.below(91),
            boundary_percent: e.below(11),
            huge_permille: if e.chance(1, 4) { 1 + e.below(20) } else { 0 },
            absurd_sizes: limits.absurd_sizes,
            max_log2,
            streams: 1 + e.below(STREAMS.len() as u64) as u8,
            alloc_conf: conf.to_string(),
            memory_fraction: e.chance(1, 4).then(|| *e.pick(&FRACTIONS[..8])),
            drain: e.chance(1, 2),
        }
    }

    /// One allocation size from this shape's mix.
    pub fn size(&self, e: &mut impl Entropy) -> u64 {
        if e.below(1000) < self.huge_permille {
            return if self.absurd_sizes && e.chance(1, 2) { absurd(e) } else { huge(e) };
        }
        let roll = e.below(100);
        if roll < self.hot_percent && !self.hot_sizes.is_empty() {
            *e.pick(&self.hot_sizes)
        } else if roll < self.hot_percent + self.boundary_percent {
            *e.pick(&BOUNDARY_SIZES)
        } else {
            align(log_uniform(e, self.max_log2), e.below(8))
        }
    }

    /// One step drawn from this shape.
    pub fn step(&self, e: &mut impl Entropy, limits: &Limits) -> Step {
        let total: u64 = self.weights.iter().map(|&w| u64::from(w)).sum();
        let mut roll = e.below(total);
        let mut kind = 0;
        for (i, &w) in self.weights.iter().enumerate() {
            if roll < u64::from(w) {
                kind = i;
                break;
            }
            roll -= u64::from(w);
        }
        match kind {
            0 => Step::Alloc { size: self.size(e), stream: e.below(u64::from(self.streams)) as u8 },
            1 => Step::Free { pick: e.below(PICKS) as u32 },
            2 => Step::RecordStream {
                pick: e.below(PICKS) as u32,
                stream: e.below(STREAMS.len() as u64) as u8,
            },
            3 => Step::Complete { pick: e.below(PICKS) as u32 },
            4 => Step::EmptyCache,
            5 => Step::SetFraction { fraction: *e.pick(&FRACTIONS) },
            7 => Step::Pool { pool: e.below(2) as u8, action: e.below(3) as u8 },
            _ => {
                let mut conf = settings_string(e);
                if !limits.invalid_settings && crate::conf::INVALID.contains(&conf.as_str()) {
                    conf = String::new();
                }
                if !limits.expandable {
                    conf = conf.replace("expandable_segments:True", "expandable_segments:False");
                }
                Step::Settings { conf }
            }
        }
    }
}

/// A whole program from `e`: a shape, then steps until `limits.max_steps` or, for fuzzer
/// bytes, until the bytes run out.
pub fn generate(e: &mut impl Entropy, limits: &Limits) -> Program {
    let shape = Shape::generate(e, limits);
    let steps_wanted = if e.exhausted() { 0 } else { limits.max_steps };
    let mut steps = Vec::with_capacity(steps_wanted.min(1024));
    while steps.len() < steps_wanted && !e.exhausted() {
        steps.push(shape.step(e, limits));
    }
    Program {
        device: shape.device,
        alloc_conf: shape.alloc_conf,
        memory_fraction: shape.memory_fraction,
        steps,
        drain: shape.drain,
    }
}

/// A program from a seed with a step count drawn up to `limits.max_steps`.
pub fn from_seed(seed: u64, limits: &Limits) -> Program {
    let mut e = crate::entropy::SeededEntropy::new(seed);
    let steps = 1 + e.below(limits.max_steps.max(1) as u64) as usize;
    generate(&mut e, &Limits { max_steps: steps, ..*limits })
}

/// A program from fuzzer bytes (what every op-program fuzz target calls).
pub fn from_bytes(data: &[u8], limits: &Limits) -> Program {
    generate(&mut crate::entropy::ByteEntropy::new(data), limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_give_varied_shapes_and_valid_programs() {
        let limits = Limits::default();
        let mut kinds_off = 0;
        for seed in 0..64 {
            let p = from_seed(seed, &limits);
            assert_eq!(p, from_seed(seed, &limits), "seed {seed} is not reproducible");
            assert!(!p.steps.is_empty());
            let _ = p.ops();
            let mut e = crate::entropy::SeededEntropy::new(seed);
            let shape = Shape::generate(&mut e, &limits);
            kinds_off += shape.weights.iter().filter(|&&w| w == 0).count();
        }
        assert!(kinds_off > 0, "swarm never switched a kind off");
    }

    #[test]
    fn bytes_stop_when_they_run_out() {
        let p = from_bytes(&[], &Limits::default());
        assert!(p.steps.is_empty());
        let p = from_bytes(&[7u8; 300], &Limits::default());
        assert!(!p.steps.is_empty() && p.steps.len() < 300);
    }

    #[test]
    fn log_uniform_stays_in_range() {
        let mut e = crate::entropy::SeededEntropy::new(1);
        for _ in 0..1000 {
            let s = log_uniform(&mut e, 20);
            assert!((1..1 << 20).contains(&s));
        }
    }
}
