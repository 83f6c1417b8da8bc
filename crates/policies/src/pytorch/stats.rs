//! Statistics updates on the hot path.
//!
//! `allocsim_core::Stat::increase` and friends are ordinary functions in another crate, so
//! without LTO every one of the ten or so updates per allocation is an out-of-line call. These
//! are the same updates (PyTorch's `Stat::increase`/`decrease`: current, peak, allocated,
//! freed) written inline on the public fields. Keep them identical to core's.

use allocsim_core::{raise_peak, Pool, Stat, StatArray};

pub(super) trait StatExt {
    /// `Stat::increase`.
    fn inc(&mut self, amount: u64);
    /// `Stat::decrease`.
    fn dec(&mut self, amount: u64);
}

impl StatExt for Stat {
    #[inline(always)]
    fn inc(&mut self, amount: u64) {
        self.current += amount as i64;
        raise_peak(&mut self.peak, self.current);
        self.allocated += amount as i64;
    }

    #[inline(always)]
    fn dec(&mut self, amount: u64) {
        self.current -= amount as i64;
        self.freed += amount as i64;
    }
}

pub(super) trait StatArrayExt {
    /// `StatArray::increase`: `all` and the pool's entry.
    fn inc(&mut self, pool: Pool, amount: u64);
    /// `StatArray::decrease`.
    fn dec(&mut self, pool: Pool, amount: u64);
    /// `StatArray::apply`: increase for a positive delta, decrease for a negative one.
    fn add(&mut self, pool: Pool, delta: i64);
}

impl StatArrayExt for StatArray {
    #[inline(always)]
    fn inc(&mut self, pool: Pool, amount: u64) {
        self.all.inc(amount);
        match pool {
            Pool::Small => self.small_pool.inc(amount),
            Pool::Large => self.large_pool.inc(amount),
        }
    }

    #[inline(always)]
    fn dec(&mut self, pool: Pool, amount: u64) {
        self.all.dec(amount);
        match pool {
            Pool::Small => self.small_pool.dec(amount),
            Pool::Large => self.large_pool.dec(amount),
        }
    }

    /// Without a branch on the sign of `delta`, which is data (a merge, a split) and so
    /// mispredicted often: a decrease cannot raise the peak, and the side that does not apply
    /// adds zero.
    #[inline(always)]
    fn add(&mut self, pool: Pool, delta: i64) {
        let stat = match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        };
        for s in [&mut self.all, stat] {
            s.current += delta;
            raise_peak(&mut s.peak, s.current);
            s.allocated += delta.max(0);
            s.freed += (-delta).max(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_core() {
        let (mut a, mut b) = (StatArray::default(), StatArray::default());
        for (pool, delta) in
            [(Pool::Small, 5), (Pool::Large, -3), (Pool::Small, 0), (Pool::Large, 9)]
        {
            a.apply(pool, delta);
            b.add(pool, delta);
            a.increase(pool, 2);
            b.inc(pool, 2);
            a.decrease(pool, 1);
            b.dec(pool, 1);
        }
        assert_eq!(a, b);
    }
}
