//! The uncached baseline: one device segment per allocation, returned at free, like PyTorch
//! with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`. Its peak reserved is the workload's peak live
//! bytes rounded to segment granularity, and its device-call count the worst possible: the two
//! ends every caching policy sits between.

use allocsim_core::{
    AllocId, Allocator, BlockState, ConfigError, Env, Event, FreeSpace, Granted, MemoryStats,
    OomInfo, Pool, SnapshotBlock, SnapshotSegment, StreamId,
};
use std::collections::BTreeMap;

/// Segments are whole multiples of this, as `cudaMalloc` rounds to 2 MiB pages.
const SEGMENT_GRANULARITY_BYTES: u64 = 2 << 20;

#[derive(Debug, Clone, Copy)]
struct Live {
    addr: u64,
    size: u64,
    requested: u64,
    stream: StreamId,
    pool: Pool,
    pending: bool,
    stream_uses: bool,
}

#[derive(Debug, Default)]
pub struct Uncached {
    live: BTreeMap<AllocId, Live>,
    stats: MemoryStats,
    allowed_bytes: Option<u64>,
}

impl Uncached {
    pub fn from_conf(conf: &str) -> Result<Self, ConfigError> {
        let mut me = Uncached::default();
        me.set_settings(conf)?;
        Ok(me)
    }

    fn release(&mut self, env: &mut Env<'_>, id: AllocId) {
        let Some(b) = self.live.remove(&id) else { return };
        env.events.emit(Event::FreeCompleted {
            id,
            addr: b.addr,
            size: b.size,
            requested: b.requested,
        });
        self.stats.active.decrease(b.pool, 1);
        self.stats.active_bytes.decrease(b.pool, b.size);
        self.stats.requested_bytes.decrease(b.pool, b.requested);
        env.device.free(b.addr, b.size);
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(b.pool, 1);
        self.stats.reserved_bytes.decrease(b.pool, b.size);
        env.events.emit(Event::SegmentFree {
            addr: b.addr,
            size: b.size,
            stream: b.stream,
            pool: b.pool,
        });
    }
}

impl Allocator for Uncached {
    fn name(&self) -> &str {
        "uncached"
    }

    fn malloc(
        &mut self,
        env: &mut Env<'_>,
        id: AllocId,
        size: u64,
        stream: StreamId,
    ) -> Result<Granted, OomInfo> {
        // A request so large that rounding it overflows can only be refused.
        let segment = size.max(1).checked_next_multiple_of(SEGMENT_GRANULARITY_BYTES);
        let segment = segment.unwrap_or(u64::MAX - (u64::MAX % SEGMENT_GRANULARITY_BYTES));
        // Rounding to 512 B, as PyTorch would, never moves a size across the 1 MiB pool line.
        let pool = Pool::for_size(size);
        let reserved = self.stats.reserved_bytes.all.current as u64;
        let within_limit = size <= segment
            && self.allowed_bytes.is_none_or(|allowed| reserved.saturating_add(segment) <= allowed);
        let addr = match within_limit.then(|| env.device.malloc(segment)) {
            Some(Ok(addr)) => addr,
            _ => {
                let mem = env.device.mem_info();
                let info = OomInfo {
                    rounded_bytes: segment,
                    device_free_bytes: mem.free_bytes,
                    device_total_bytes: mem.total_bytes,
                    allowed_bytes: self.allowed_bytes,
                    allocated_bytes: self.stats.allocated_bytes.all.current as u64,
                    reserved_bytes: reserved,
                    ..OomInfo::default()
                };
                self.stats.num_ooms += 1;
                env.events.emit(Event::Oom { id, size: segment, stream, info });
                return Err(info);
            }
        };
        self.stats.num_device_alloc += 1;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, segment);
        env.events.emit(Event::SegmentAlloc { addr, size: segment, stream, pool });
        self.stats.allocation.increase(pool, 1);
        self.stats.active.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, segment);
        self.stats.active_bytes.increase(pool, segment);
        self.stats.requested_bytes.increase(pool, size);
        env.events.emit(Event::Alloc { id, addr, size: segment, requested: size, stream, pool });
        let live = Live {
            addr,
            size: segment,
            requested: size,
            stream,
            pool,
            pending: false,
            stream_uses: false,
        };
        self.live.insert(id, live);
        Ok(Granted { addr, size: segment })
    }

    fn free(&mut self, env: &mut Env<'_>, id: AllocId) {
        let Some(b) = self.live.get_mut(&id) else { return };
        b.pending = true;
        let b = *b;
        env.events.emit(Event::FreeRequested {
            id,
            addr: b.addr,
            size: b.size,
            requested: b.requested,
        });
        self.stats.allocation.decrease(b.pool, 1);
        self.stats.allocated_bytes.decrease(b.pool, b.size);
        if !b.stream_uses {
            self.release(env, id);
        }
    }

    fn record_stream(&mut self, id: AllocId, stream: StreamId) {
        if let Some(b) = self.live.get_mut(&id) {
            b.stream_uses |= b.stream != stream;
        }
    }

    fn free_completed(&mut self, env: &mut Env<'_>, id: AllocId) {
        if self.live.get(&id).is_some_and(|b| b.pending) {
            self.release(env, id);
        }
    }

    fn empty_cache(&mut self, _env: &mut Env<'_>) {}

    fn set_memory_fraction(&mut self, env: &mut Env<'_>, fraction: f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError(format!("memory fraction {fraction} is not in [0, 1]")));
        }
        let total = env.device.mem_info().total_bytes;
        self.allowed_bytes = (fraction < 1.0).then_some((fraction * total as f64) as u64);
        Ok(())
    }

    fn stats(&self) -> MemoryStats {
        self.stats.clone()
    }

    fn snapshot(&self) -> Vec<SnapshotSegment> {
        let mut segments: Vec<SnapshotSegment> = self
            .live
            .values()
            .map(|b| SnapshotSegment {
                pool_id: allocsim_core::MemPoolId::DEFAULT,
                address: b.addr,
                total_size: b.size,
                stream: b.stream,
                pool: b.pool,
                is_expandable: false,
                blocks: vec![SnapshotBlock {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.pending {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::ActiveAllocated
                    },
                }],
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        segments
    }

    fn free_space(&self) -> FreeSpace {
        FreeSpace::default()
    }
}
