//! Fault injection: the device misbehaving on purpose, deterministically.
//!
//! Faults answer the question a policy author cares about: what does my allocator do when the
//! driver says no at a bad moment, or when another process takes memory mid-run? Every fault
//! is a pure function of the config, the seed and the sequence of calls, so a failing run is
//! reproduced by its seed alone.
//!
//! The random source is SplitMix64 kept in this file rather than `rand_chacha`: the fault
//! stream needs no cryptographic quality, and a fixed in-crate algorithm keeps seeds
//! reproducible across dependency upgrades without adding to the workspace's lock file.

use allocsim_core::CallKind;

/// A misbehaviour to inject.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The n-th reservation attempt (1-based, counting `malloc` and `map` calls together, failed
    /// or not) fails with `OutOfMemory`.
    FailNthMalloc(u64),
    /// When op `at_op` begins, another process takes `bytes` of free memory for the rest of the
    /// run (as much as is free, if less).
    TakeMemory { at_op: u64, bytes: u64 },
    /// Every reservation attempt fails with this probability (clamped to [0, 1]), drawn from
    /// the seeded generator.
    FailRandom { probability: f64 },
}

/// SplitMix64 (Steele, Lea, Flood 2014): one multiply-xorshift chain per draw.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits.
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The faults of one device and what they did so far.
#[derive(Debug, Clone)]
pub(crate) struct FaultState {
    faults: Vec<Fault>,
    taken: Vec<bool>,
    rng: SplitMix64,
    seed: u64,
    attempts: u64,
    random_refusals: u64,
    notes: Vec<String>,
    /// The earliest op of a `TakeMemory` not yet done (`u64::MAX`: none), so that the check
    /// at every op is one comparison.
    next_take: u64,
}

impl FaultState {
    pub(crate) fn new(faults: Vec<Fault>, seed: u64) -> Self {
        let taken = vec![false; faults.len()];
        let next_take = next_take(&faults, &taken);
        FaultState {
            faults,
            taken,
            rng: SplitMix64(seed),
            seed,
            attempts: 0,
            random_refusals: 0,
            notes: Vec::new(),
            next_take,
        }
    }

    /// A reservation attempt (`malloc` or `map`) of `size_bytes` during `op`: true if a fault
    /// makes it fail. Every `FailRandom` draws on every attempt, so the stream of draws does not
    /// depend on which other faults fired.
    pub(crate) fn refuses(&mut self, op: Option<u64>, kind: CallKind, size_bytes: u64) -> bool {
        self.attempts += 1;
        let attempt = self.attempts;
        let mut refused = false;
        for fault in &self.faults {
            match *fault {
                Fault::FailNthMalloc(n) if n == attempt => {
                    self.notes.push(format!(
                        "fault FailNthMalloc({n}) refused reservation attempt {n}: {} of \
                         {size_bytes} bytes{}",
                        kind.name(),
                        at_op(op)
                    ));
                    refused = true;
                }
                // The guard draws on every attempt, refused or not.
                Fault::FailRandom { probability }
                    if self.rng.next_unit() < probability.clamp(0.0, 1.0) =>
                {
                    self.random_refusals += 1;
                    refused = true;
                }
                _ => {}
            }
        }
        refused
    }

    /// Whether another process takes memory as op `index` begins.
    #[inline]
    pub(crate) fn takes_at(&self, index: u64) -> bool {
        index >= self.next_take
    }

    /// Op `index` begins with `free_bytes` free: the bytes another process takes now.
    #[cold]
    pub(crate) fn take_at_op(&mut self, index: u64, free_bytes: u64) -> u64 {
        let mut taken_bytes = 0;
        for (fault, done) in self.faults.iter().zip(self.taken.iter_mut()) {
            let Fault::TakeMemory { at_op, bytes } = *fault else { continue };
            if *done || index < at_op {
                continue;
            }
            *done = true;
            let now = bytes.min(free_bytes - taken_bytes);
            taken_bytes += now;
            self.notes.push(format!(
                "fault TakeMemory at op {at_op}: another process took {now} of {bytes} bytes \
                 asked (at op {index}, {} bytes free before)",
                free_bytes - (taken_bytes - now)
            ));
        }
        self.next_take = next_take(&self.faults, &self.taken);
        taken_bytes
    }

    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes = self.notes.clone();
        for fault in &self.faults {
            if let Fault::FailRandom { probability } = fault {
                notes.push(format!(
                    "fault FailRandom(p={probability}, seed {}): {} of {} reservation attempts \
                     refused",
                    self.seed, self.random_refusals, self.attempts
                ));
            }
        }
        notes
    }
}

/// The earliest op of a `TakeMemory` not yet done; `u64::MAX` if none.
fn next_take(faults: &[Fault], taken: &[bool]) -> u64 {
    let pending = faults.iter().zip(taken).filter(|(_, &done)| !done);
    pending
        .filter_map(|(f, _)| match *f {
            Fault::TakeMemory { at_op, .. } => Some(at_op),
            _ => None,
        })
        .min()
        .unwrap_or(u64::MAX)
}

fn at_op(op: Option<u64>) -> String {
    op.map(|i| format!(", op {i}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 0 (the reference implementation's).
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn random_refusals_follow_the_seed() {
        let run = |seed| {
            let mut f = FaultState::new(vec![Fault::FailRandom { probability: 0.3 }], seed);
            (0..200).map(|_| f.refuses(None, CallKind::Malloc, 1)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let refused = run(7).iter().filter(|&&r| r).count();
        assert!((30..90).contains(&refused), "{refused} of 200 at p=0.3");
    }
}
