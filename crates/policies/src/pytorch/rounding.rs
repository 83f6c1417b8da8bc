//! Sizes: how a request becomes a block size, which pool it goes to, and how big a segment it
//! asks the device for (docs/pytorch-caching-allocator.md §1). Kept apart from the allocator because these are pure
//! functions of the config, tested on their own against PyTorch's numbers.

use super::config::Config;

pub use super::config::{
    K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_SMALL_BUFFER,
    K_SMALL_SIZE,
};

/// `DeviceCachingAllocator::round_size`.
#[inline]
pub fn round_size(config: &Config, size: u64) -> u64 {
    if size < K_MIN_BLOCK_SIZE {
        return K_MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_divisions_for(size);
    if divisions > 1 && size > K_MIN_BLOCK_SIZE.saturating_mul(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
    }
}

/// `roundup_power2_next_division`: round up to the next of `divisions` equal steps between
/// two powers of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor << 1;
    }
    let rounded_floor = size & !(step - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor + step
    }
}

/// `DeviceCachingAllocator::get_allocation_size`: the segment a miss asks for.
#[inline]
pub fn get_allocation_size(size: u64) -> u64 {
    if size <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if size < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        size.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE
    }
}

/// `get_pool`: the small pool serves rounded sizes up to 1 MiB.
#[inline]
pub fn is_small(size: u64) -> bool {
    size <= K_SMALL_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::config::MB;

    #[test]
    fn default_rounding() {
        let c = Config::default();
        assert_eq!(round_size(&c, 0), 512);
        assert_eq!(round_size(&c, 1), 512);
        assert_eq!(round_size(&c, 512), 512);
        assert_eq!(round_size(&c, 513), 1024);
        assert_eq!(round_size(&c, 21 * MB), 21 * MB);
    }

    #[test]
    fn power2_divisions() {
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        let c = Config::parse("roundup_power2_divisions:4").unwrap();
        // test_allocator_settings: 4 x 21 MiB round to 4 x 24 MiB = 96 MiB.
        assert_eq!(round_size(&c, 21 * MB), 24 * MB);
        let c =
            Config::parse("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]").unwrap();
        assert_eq!(round_size(&c, 21 * MB), 22 * MB);
        assert_eq!(round_size(&c, 84 * MB), 88 * MB);
        assert_eq!(round_size(&c, 400 * MB), 512 * MB);
        // Rounding before pool selection: just under 1 MiB can land in the large pool.
        let c = Config::parse("roundup_power2_divisions:2").unwrap();
        assert_eq!(round_size(&c, 1_000_000), 1 << 20);
        assert_eq!(round_size(&c, 600_000), 786_432);
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(get_allocation_size(512), 2 * MB);
        assert_eq!(get_allocation_size(MB), 2 * MB);
        assert_eq!(get_allocation_size(MB + 512), 20 * MB);
        assert_eq!(get_allocation_size(10 * MB - 512), 20 * MB);
        assert_eq!(get_allocation_size(10 * MB), 10 * MB);
        assert_eq!(get_allocation_size(19 * MB + 1), 20 * MB);
    }
}
