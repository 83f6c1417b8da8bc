//! The uncached baseline: one device segment per allocation, returned at free, like PyTorch
//! with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`. Its peak reserved is the workload's peak live
//! bytes rounded to segment granularity, and its device-call count the worst possible: the two
//! ends every caching policy sits between.

use crate::kit::{rounded_request, Kit, Rules, Setting, PAGE_2MIB};

/// No settings: every block is its own segment of whole 2 MiB pages.
#[derive(Debug, Default, Clone)]
pub struct NoCache;

impl Rules for NoCache {
    const NAME: &'static str = "uncached";
    type Tag = ();
    const SETTINGS: &'static [Setting<Self>] = &[];

    fn block_size(&self, size: u64) -> u64 {
        rounded_request(size, PAGE_2MIB)
    }

    fn dedicated(&self, _: u64) -> bool {
        true
    }
}

pub type Uncached = Kit<NoCache>;
