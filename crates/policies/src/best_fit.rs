//! Best fit with coalescing, written on the policy kit as the example of a new policy: a
//! request takes the smallest free chunk of its stream that holds it (the lowest address among
//! equals) and is cut to size; freed chunks merge with free neighbours; a new segment is at
//! least `min_segment` bytes, so small requests share one; segments stay cached until
//! `empty_cache` or a refused reservation.
//!
//! Settings: `min_segment` (bytes, default 20 MiB).

use crate::kit::{round_up, Apply, Room, Rules, Setting, Tiling, PAGE_2MIB};
use allocsim_core::StreamId;

#[derive(Debug, Clone)]
pub struct BestFit {
    min_segment: u64,
}

impl Default for BestFit {
    fn default() -> Self {
        BestFit { min_segment: 20 << 20 }
    }
}

impl Rules for BestFit {
    const NAME: &'static str = "best_fit";
    type Tag = ();
    const SETTINGS: &'static [Setting<Self>] = &[Setting {
        key: "min_segment",
        help: "the smallest segment reserved, in bytes",
        apply: Apply::Bytes(|rules, v| rules.min_segment = v),
    }];

    fn segment_size(&mut self, _: &Tiling<()>, block: u64, _: &Room<'_>) -> Option<u64> {
        Some(round_up(block.max(self.min_segment), PAGE_2MIB))
    }

    fn place(&self, tiling: &Tiling<()>, block: u64, stream: StreamId) -> Option<u64> {
        tiling
            .free_chunks()
            .filter(|(_, chunk, seg)| seg.stream == stream && chunk.size >= block)
            .min_by_key(|&(addr, chunk, _)| (chunk.size, addr))
            .map(|(addr, _, _)| addr)
    }
}
