//! Statistics under the names of `torch.cuda.memory_stats()`.
//!
//! Every policy reports a [`MemoryStats`], not only the PyTorch clone: one shape makes policies
//! comparable and lets the checker verify any policy's counters against its events.

use crate::Pool;

/// PyTorch's `Stat`: `current`, `peak`, and the running totals `allocated` and `freed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

/// `*peak = max(*peak, value)` as a branch, not a select: past a run's first steps a new peak
/// is rare, so the branch is predicted and the peak is not stored again on every update (on
/// the hot paths of a replay that store cost more than its instruction: `benches/README.md`).
#[inline(always)]
pub fn raise_peak<T: PartialOrd>(peak: &mut T, value: T) {
    if value > *peak {
        *peak = value;
    }
}

impl Stat {
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        raise_peak(&mut self.peak, self.current);
        self.allocated += amount;
    }

    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    /// `increase` for positive `delta`, `decrease` for negative, nothing for zero.
    pub fn apply(&mut self, delta: i64) {
        if delta > 0 {
            self.increase(delta as u64)
        } else if delta < 0 {
            self.decrease(delta.unsigned_abs())
        }
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// PyTorch's `StatArray`: `all`, `small_pool`, `large_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    pub fn pool(&mut self, pool: Pool) -> &mut Stat {
        match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        }
    }

    /// Every update hits `all` and the pool's own entry, as in PyTorch.
    pub fn increase(&mut self, pool: Pool, amount: u64) {
        self.all.increase(amount);
        self.pool(pool).increase(amount);
    }

    pub fn decrease(&mut self, pool: Pool, amount: u64) {
        self.all.decrease(amount);
        self.pool(pool).decrease(amount);
    }

    pub fn apply(&mut self, pool: Pool, delta: i64) {
        self.all.apply(delta);
        self.pool(pool).apply(delta);
    }

    fn each(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }
}

/// `torch.cuda.memory_stats()`, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryStats {
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    /// The allocator's `max_split_size` when it was constructed; -1 when unlimited.
    pub max_split_size: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
}

impl Default for MemoryStats {
    fn default() -> Self {
        MemoryStats {
            num_alloc_retries: 0,
            num_ooms: 0,
            max_split_size: -1,
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
        }
    }
}

impl MemoryStats {
    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The flat `"a.b.c"` keys of `torch.cuda.memory_stats()`, sorted as Python sorts them.
    pub fn flat(&self) -> Vec<(String, i64)> {
        fn stat(out: &mut Vec<(String, i64)>, prefix: &str, s: &Stat) {
            out.push((format!("{prefix}.allocated"), s.allocated));
            out.push((format!("{prefix}.current"), s.current));
            out.push((format!("{prefix}.freed"), s.freed));
            out.push((format!("{prefix}.peak"), s.peak));
        }
        let mut out = Vec::with_capacity(128);
        for (name, array) in self.arrays() {
            stat(&mut out, &format!("{name}.all"), &array.all);
            stat(&mut out, &format!("{name}.large_pool"), &array.large_pool);
            stat(&mut out, &format!("{name}.small_pool"), &array.small_pool);
        }
        stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        stat(&mut out, "oversize_segments", &self.oversize_segments);
        out.push(("max_split_size".into(), self.max_split_size));
        out.push(("num_alloc_retries".into(), self.num_alloc_retries));
        out.push(("num_device_alloc".into(), self.num_device_alloc));
        out.push(("num_device_free".into(), self.num_device_free));
        out.push(("num_ooms".into(), self.num_ooms));
        out.push(("num_sync_all_streams".into(), self.num_sync_all_streams));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            for s in array.each() {
                s.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for s in array.each() {
                s.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// Set the value of one flat key of [`MemoryStats::flat`]; false for a key it does not
    /// have. Setting every key of `flat` gives back the same stats.
    pub fn set_flat(&mut self, key: &str, value: i64) -> bool {
        let scalar = match key {
            "max_split_size" => Some(&mut self.max_split_size),
            "num_alloc_retries" => Some(&mut self.num_alloc_retries),
            "num_device_alloc" => Some(&mut self.num_device_alloc),
            "num_device_free" => Some(&mut self.num_device_free),
            "num_ooms" => Some(&mut self.num_ooms),
            "num_sync_all_streams" => Some(&mut self.num_sync_all_streams),
            _ => None,
        };
        if let Some(slot) = scalar {
            *slot = value;
            return true;
        }
        let (stat, field) = match key.rsplit_once('.') {
            Some(parts) => parts,
            None => return false,
        };
        let stat = match stat {
            "oversize_allocations" => Some(&mut self.oversize_allocations),
            "oversize_segments" => Some(&mut self.oversize_segments),
            _ => stat.split_once('.').and_then(|(array, pool)| {
                let i = self.arrays().iter().position(|(name, _)| *name == array)?;
                let array = self.arrays_mut().into_iter().nth(i)?;
                match pool {
                    "all" => Some(&mut array.all),
                    "small_pool" => Some(&mut array.small_pool),
                    "large_pool" => Some(&mut array.large_pool),
                    _ => None,
                }
            }),
        };
        let Some(stat) = stat else { return false };
        let slot = match field {
            "current" => &mut stat.current,
            "peak" => &mut stat.peak,
            "allocated" => &mut stat.allocated,
            "freed" => &mut stat.freed,
            _ => return false,
        };
        *slot = value;
        true
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keys_are_pytorchs() {
        let keys: Vec<String> = MemoryStats::default().flat().into_iter().map(|(k, _)| k).collect();
        // 9 stat arrays x 3 pools x 4 fields, 2 single stats x 4 fields, 6 scalars.
        assert_eq!(keys.len(), 9 * 3 * 4 + 2 * 4 + 6);
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        assert!(keys.contains(&"allocation.all.current".to_string()));
        assert!(keys.contains(&"oversize_segments.peak".to_string()));
        assert!(keys.contains(&"max_split_size".to_string()));
    }

    #[test]
    fn set_flat_inverts_flat() {
        let mut s = MemoryStats::default();
        for (i, (key, _)) in MemoryStats::default().flat().into_iter().enumerate() {
            assert!(s.set_flat(&key, i as i64 + 1), "{key}");
        }
        let flat = s.flat();
        assert!(flat.iter().enumerate().all(|(i, (_, v))| *v == i as i64 + 1), "{flat:?}");
        assert!(!s.set_flat("allocation.all", 1) && !s.set_flat("nope.all.current", 1));
    }

    #[test]
    fn stat_semantics_follow_pytorch() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(1);
        assert_eq!(s, Stat { current: 7, peak: 10, allocated: 11, freed: 4 });
        s.reset_peak();
        assert_eq!(s.peak, 7);
    }
}
