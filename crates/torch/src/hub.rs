//! The allocator PyTorch talks to, in safe code: one policy instance per device, each driven by
//! the replay engine as a recorded trace is, so a live run makes the same calls into the policy
//! that `allocsim replay` makes for its recording.
//!
//! Each device is an `allocsim_run::Session` (the map from pointers to allocation ids, each
//! call an op through the engine, the recording that `allocsim replay` reads back), and the
//! streams each block was recorded on, which the hub waits for before a free completes.
//!
//! Private pools (a CUDA graph's, a `torch.cuda.MemPool`'s) reach the hub as PyTorch's hooks
//! call them: a capture begins, each request says which pool PyTorch's filters chose for it
//! (the shim evaluates them: they are C++ closures over a stream or a thread), the capture
//! ends, the pool is released. The hub brackets each run of requests into one pool with the
//! policy's `BeginAllocate` and `EndAllocate`, as the trace converter does for a recording, and
//! balances them on release. A policy that would serve a pool from its common pool refuses the
//! capture: a graph's replays write to the blocks it allocated, so no one else may get them.

use allocsim_core::{AllocId, Device, MemPoolId, MemoryStats, SnapshotSegment, Trace};
use allocsim_run::Session;
use std::collections::{BTreeMap, HashMap};

/// Which policy, under which settings, and whether to keep the op stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub policy: String,
    /// In the policy's syntax (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string).
    pub conf: String,
    /// Keep every op and event, for [`Hub::recording`] and the snapshot's history.
    pub record: bool,
}

/// Opens device `n`: the real GPU, or a simulated one in tests.
pub type Opener = Box<dyn Fn(u32) -> Result<Opened, String>>;

/// Waits for all work queued on a stream of the device.
pub type StreamWaiter = Box<dyn Fn(u64) -> Result<(), String>>;

/// A device as opened, with how to wait for its streams (for blocks used on several).
pub struct Opened {
    pub device: Box<dyn Device>,
    pub wait: StreamWaiter,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").finish_non_exhaustive()
    }
}

impl Opened {
    /// A device whose streams have no work to wait for (the simulated one).
    pub fn without_streams(device: Box<dyn Device>) -> Opened {
        Opened { device, wait: Box::new(|_| Ok(())) }
    }
}

/// What a call that returns a pointer may fail with.
#[derive(Debug, Clone, PartialEq)]
pub enum AllocError {
    /// The policy could not serve the request: PyTorch's "CUDA out of memory", explained.
    OutOfMemory(String),
    /// The device could not be opened or the policy could not be built.
    Setup(String),
}

/// Every device's slot, opened on first use with the same settings.
pub struct Hub {
    settings: Settings,
    opener: Opener,
    slots: BTreeMap<u32, Slot>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("settings", &self.settings)
            .field("devices", &self.slots.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub that builds each device's policy from `settings` (refused here if the policy or
    /// its settings are unknown, before any device is touched).
    pub fn new(settings: Settings, opener: Opener) -> Result<Hub, String> {
        allocsim_policies::by_name(&settings.policy, Some(&settings.conf))
            .map_err(|e| format!("policy {:?}: {e}", settings.policy))?;
        Ok(Hub { settings, opener, slots: BTreeMap::new() })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The slot of `device`, opened now if this is its first call.
    fn slot(&mut self, device: u32) -> Result<&mut Slot, String> {
        if !self.slots.contains_key(&device) {
            let opened = (self.opener)(device)?;
            let s = &self.settings;
            let session = Session::new(&s.policy, &s.conf, opened.device, device, s.record)?;
            let slot =
                Slot { session, used_on: HashMap::new(), wait: opened.wait, stream_waits: (0, 0) };
            self.slots.insert(device, slot);
        }
        Ok(self.slots.get_mut(&device).expect("inserted above"))
    }

    /// The session of `device`, if it was opened.
    fn session(&self, device: u32) -> Option<&Session> {
        self.slots.get(&device).map(|s| &s.session)
    }

    /// PyTorch's `alloc(size, device, stream)`. A request of 0 bytes gets the null pointer
    /// without reaching the policy, as under PyTorch's own allocator.
    pub fn malloc(&mut self, size: u64, device: u32, stream: u64) -> Result<u64, AllocError> {
        self.malloc_in_pool(size, device, stream, MemPoolId::DEFAULT)
    }

    /// [`Hub::malloc`], served from `pool` (`MemPoolId::DEFAULT`: the policy's own pools).
    pub fn malloc_in_pool(
        &mut self,
        size: u64,
        device: u32,
        stream: u64,
        pool: MemPoolId,
    ) -> Result<u64, AllocError> {
        if size == 0 {
            return Ok(0);
        }
        let slot = self.slot(device).map_err(AllocError::Setup)?;
        slot.session.malloc(size, stream, pool).map_err(AllocError::OutOfMemory)
    }

    /// `beginAllocateToPool`: requests PyTorch's filters send to a private pool will come
    /// ([`Hub::malloc_in_pool`]). Refused (nothing changes) by a policy without private pools.
    pub fn begin_pool(&mut self, device: u32) -> Result<(), String> {
        if self.slot(device)?.session.has_private_pools() {
            return Ok(());
        }
        Err(format!(
            "policy {:?} has no private pools, which a CUDA graph capture needs (its replays \
             write to the blocks it allocated): use the pytorch policy",
            self.settings.policy
        ))
    }

    /// `endAllocateToPool`: no more requests go to `pool`.
    pub fn end_pool(&mut self, device: u32, pool: MemPoolId) {
        if let Some(slot) = self.slots.get_mut(&device) {
            slot.session.end_pool(pool);
        }
    }

    /// `releasePool`: the pool's owner (the graph, the `MemPool`) is gone; once its blocks
    /// are free, its segments go back to the device.
    pub fn release_pool(&mut self, device: u32, pool: MemPoolId) {
        if let Some(slot) = self.slots.get_mut(&device) {
            slot.session.release_pool(pool);
        }
    }

    /// PyTorch's `free(ptr, size, device, stream)`. False for a pointer this hub did not hand
    /// out (kept as a note; nothing else happens). A block used on other streams
    /// ([`Hub::record_stream`]) stays the policy's pending free until the work queued on those
    /// streams is done: the hub waits for them, then completes the free.
    pub fn free(&mut self, ptr: u64, device: u32) -> Result<bool, String> {
        if ptr == 0 {
            return Ok(true);
        }
        match self.slots.get_mut(&device) {
            Some(slot) => slot.free(ptr),
            None => Ok(false),
        }
    }

    /// `Tensor.record_stream(stream)`: the block at `ptr` is also used on `stream`. False for a
    /// pointer this hub did not hand out.
    pub fn record_stream(&mut self, ptr: u64, stream: u64) -> bool {
        for slot in self.slots.values_mut() {
            if let Some(id) = slot.session.block_at(ptr) {
                slot.session.record_stream(id, stream);
                slot.used_on.entry(id).or_default().push(stream);
                return true;
            }
        }
        false
    }

    /// `torch.cuda.empty_cache()` on every device opened.
    pub fn empty_cache(&mut self) {
        for slot in self.slots.values_mut() {
            slot.session.empty_cache();
        }
    }

    /// `torch.cuda.set_per_process_memory_fraction(fraction, device)`.
    pub fn set_memory_fraction(&mut self, fraction: f64, device: u32) -> Result<(), String> {
        self.slot(device)?.session.set_memory_fraction(fraction)
    }

    /// The policy's statistics under `torch.cuda.memory_stats()`'s names; all zero for a device
    /// not used yet.
    pub fn stats(&self, device: u32) -> MemoryStats {
        self.session(device).map(Session::stats).unwrap_or_default()
    }

    pub fn reset_peak_stats(&mut self, device: u32) {
        if let Some(slot) = self.slots.get_mut(&device) {
            slot.session.reset_peak_stats();
        }
    }

    /// Every segment with its blocks, as `torch.cuda.memory._snapshot()` lists them.
    pub fn segments(&self, device: u32) -> Vec<SnapshotSegment> {
        self.session(device).map(Session::segments).unwrap_or_default()
    }

    /// Pointers handed out and not yet freed, on `device`.
    pub fn live(&self, device: u32) -> usize {
        self.session(device).map_or(0, Session::live)
    }

    /// How many times a free waited for another stream on `device`, and for how long in all
    /// (nanoseconds).
    pub fn stream_waits(&self, device: u32) -> (u64, u64) {
        self.slots.get(&device).map_or((0, 0), |s| s.stream_waits)
    }

    /// Frees of pointers this hub never handed out, on `device`.
    pub fn unknown_frees(&self, device: u32) -> u64 {
        self.session(device).map_or(0, Session::unknown_frees)
    }

    /// Why the last request that failed on `device` failed.
    pub fn last_oom(&self, device: u32) -> Option<&str> {
        self.session(device).and_then(Session::last_oom)
    }

    pub fn devices(&self) -> Vec<u32> {
        self.slots.keys().copied().collect()
    }

    /// The op stream so far and the events it caused, as a trace `allocsim replay` reads
    /// ([`Session::recording`]). `None` without recording.
    pub fn recording(&self, device: u32) -> Option<Trace> {
        self.session(device)?.recording("allocsim-torch")
    }
}

/// One device: its session, and the other streams each block was recorded on.
struct Slot {
    session: Session,
    /// The other streams each block was recorded on.
    used_on: HashMap<AllocId, Vec<u64>>,
    wait: StreamWaiter,
    /// Waits for other streams before a free completed, and their total nanoseconds.
    stream_waits: (u64, u64),
}

impl Slot {
    fn free(&mut self, ptr: u64) -> Result<bool, String> {
        let Some(id) = self.session.free(ptr) else {
            return Ok(false);
        };
        if let Some(streams) = self.used_on.remove(&id) {
            // Waiting now rather than polling events later: the block is never handed out
            // while a stream may still use it, at the cost of a host stall per such free.
            let start = std::time::Instant::now();
            let waited = streams.iter().try_for_each(|&s| (self.wait)(s));
            self.stream_waits.0 += streams.len() as u64;
            self.stream_waits.1 += start.elapsed().as_nanos() as u64;
            self.session.complete_free(id);
            waited?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocsim_core::Op;
    use allocsim_sim::SimDevice;

    const GIB: u64 = 1 << 30;

    fn hub(policy: &str, conf: &str, total: u64) -> Hub {
        let settings = Settings { policy: policy.into(), conf: conf.into(), record: true };
        let opener: Opener =
            Box::new(move |_| Ok(Opened::without_streams(Box::new(SimDevice::for_tests(total)))));
        Hub::new(settings, opener).unwrap()
    }

    /// Device 0's recording replayed offline under `policy` on a simulated device of `total`
    /// bytes: the statistics it comes to.
    fn replayed_offline(h: &Hub, policy: &str, total: u64) -> MemoryStats {
        let trace = h.recording(0).unwrap();
        let opts = allocsim_run::RunOptions {
            policy: policy.to_string(),
            alloc_conf: Some(String::new()),
            ..allocsim_run::RunOptions::default()
        };
        let mut device = SimDevice::for_tests(total);
        allocsim_run::run_trace_on(&trace, &opts, &mut device, "sim", &mut [], |_| {})
            .unwrap()
            .stats
    }

    #[test]
    fn unknown_policies_and_settings_are_refused_before_any_device_opens() {
        let opener: Opener = Box::new(|_| panic!("no device may open"));
        let bad = Settings { policy: "nope".into(), conf: String::new(), record: false };
        assert!(Hub::new(bad, opener).unwrap_err().contains("nope"));
        let opener: Opener = Box::new(|_| panic!("no device may open"));
        let bad = Settings { policy: "pytorch".into(), conf: "bogus:1".into(), record: false };
        assert!(Hub::new(bad, opener).unwrap_err().contains("bogus"));
    }

    #[test]
    fn pointers_map_to_allocations_and_back() {
        let mut h = hub("pytorch", "", 8 * GIB);
        let a = h.malloc(1000, 0, 7).unwrap();
        let b = h.malloc(3 << 20, 0, 7).unwrap();
        assert_ne!(a, b);
        assert_eq!(h.malloc(0, 0, 7).unwrap(), 0, "0 bytes: the null pointer");
        assert_eq!(h.live(0), 2);
        let s = h.stats(0);
        assert_eq!(s.allocated_bytes.all.current, 1024 + (3 << 20), "1000 rounds up to 1024");
        assert!(h.free(a, 0).unwrap());
        assert!(!h.free(a, 0).unwrap(), "a second free of the same pointer is refused");
        assert_eq!(h.unknown_frees(0), 1);
        assert!(h.free(b, 0).unwrap());
        assert_eq!(h.stats(0).allocated_bytes.all.current, 0);
        assert!(h.free(0, 0).unwrap(), "freeing null is a no-op");
    }

    #[test]
    fn a_block_used_on_another_stream_waits_for_it_before_it_is_reused() {
        let waits = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = waits.clone();
        let opener: Opener = Box::new(move |_| {
            let seen = seen.clone();
            Ok(Opened {
                device: Box::new(SimDevice::for_tests(GIB)),
                wait: Box::new(move |s| {
                    seen.borrow_mut().push(s);
                    Ok(())
                }),
            })
        });
        let settings = Settings { policy: "pytorch".into(), conf: String::new(), record: true };
        let mut h = Hub::new(settings, opener).unwrap();
        let a = h.malloc(4 << 20, 0, 1).unwrap();
        assert!(h.record_stream(a, 2));
        assert!(!h.record_stream(a + 512, 2), "not a block of ours");
        h.free(a, 0).unwrap();
        assert_eq!(*waits.borrow(), vec![2], "the free waited for stream 2");
        assert_eq!(h.stream_waits(0).0, 1);
        assert_eq!(h.stats(0).active_bytes.all.current, 0, "and then completed");
        let ops = h.recording(0).unwrap().ops;
        let actions: Vec<_> = ops.iter().map(Op::action).collect();
        assert_eq!(actions, ["alloc", "record_stream", "free_requested", "free_completed"]);
        let b = h.malloc(1 << 20, 0, 1).unwrap();
        h.free(b, 0).unwrap();
        assert_eq!(waits.borrow().len(), 1, "a block used on its own stream waits for nothing");
    }

    #[test]
    fn each_device_has_its_own_policy() {
        let mut h = hub("pytorch", "", 8 * GIB);
        let a = h.malloc(1 << 20, 0, 0).unwrap();
        h.malloc(5 << 20, 1, 0).unwrap();
        assert_eq!(h.stats(0).allocated_bytes.all.current, 1 << 20);
        assert_eq!(h.stats(1).allocated_bytes.all.current, 5 << 20);
        assert!(!h.free(a + 4096, 1).unwrap(), "a pointer device 1 never handed out");
        assert!(h.free(a, 0).unwrap());
        assert_eq!(h.stats(0).allocated_bytes.all.current, 0);
        assert_eq!(h.stats(1).allocated_bytes.all.current, 5 << 20);
        assert_eq!(h.devices(), vec![0, 1]);
    }

    #[test]
    fn an_oom_is_explained_and_the_next_request_goes_on() {
        let mut h = hub("pytorch", "", GIB);
        let big = h.malloc(800 << 20, 0, 0).unwrap();
        let err = h.malloc(600 << 20, 0, 0).unwrap_err();
        let AllocError::OutOfMemory(text) = err else { panic!("{err:?}") };
        assert!(text.contains("Tried to allocate 600.00 MiB"), "{text}");
        assert_eq!(h.last_oom(0), Some(text.as_str()));
        assert_eq!(h.stats(0).num_ooms, 1);
        assert!(h.free(big, 0).unwrap());
        h.malloc(600 << 20, 0, 0).unwrap();
    }

    #[test]
    fn empty_cache_peaks_and_fraction_reach_the_policy() {
        let mut h = hub("pytorch", "", 8 * GIB);
        let a = h.malloc(100 << 20, 0, 0).unwrap();
        h.free(a, 0).unwrap();
        assert_eq!(h.stats(0).reserved_bytes.all.current, 100 << 20);
        h.empty_cache();
        assert_eq!(h.stats(0).reserved_bytes.all.current, 0);
        assert_eq!(h.stats(0).allocated_bytes.all.peak, 100 << 20);
        h.reset_peak_stats(0);
        assert_eq!(h.stats(0).allocated_bytes.all.peak, 0);
        h.set_memory_fraction(0.01, 0).unwrap();
        assert!(h.malloc(100 << 20, 0, 0).is_err(), "1 % of 8 GiB is less than 100 MiB");
        assert!(h.set_memory_fraction(2.0, 0).is_err());
    }

    /// The recording replays offline to the same statistics, for every policy.
    #[test]
    fn the_recording_replays_to_the_same_statistics() {
        for name in allocsim_policies::names() {
            let mut h = hub(name, "", 4 * GIB);
            let mut live = Vec::new();
            let mut rng = 12345u64;
            for i in 0..2000u64 {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let size = 1 + (rng >> 33) % (if i.is_multiple_of(7) { 64 << 20 } else { 2 << 20 });
                let stream = if i.is_multiple_of(5) { 2 } else { 1 };
                if let Ok(p) = h.malloc(size, 0, stream) {
                    live.push(p);
                }
                if live.len() > 40 || (rng >> 20).is_multiple_of(3) && !live.is_empty() {
                    let at = (rng >> 40) as usize % live.len();
                    assert!(h.free(live.swap_remove(at), 0).unwrap());
                }
                if i == 1500 {
                    h.empty_cache();
                }
            }
            assert_eq!(
                replayed_offline(&h, name, 4 * GIB),
                h.stats(0),
                "{name}: the offline replay's statistics"
            );
        }
    }

    /// A CUDA graph's capture: what its requests free stays the pool's (the graph's replays
    /// write there), requests outside it never get those blocks, and the pool's segments go
    /// back once it is released. The recording replays offline to the same statistics.
    #[test]
    fn a_private_pool_keeps_its_blocks_until_released() {
        let mut h = hub("pytorch", "", 8 * GIB);
        let graph = MemPoolId(1, 0);
        h.begin_pool(0).unwrap();
        let a = h.malloc_in_pool(8 << 20, 0, 3, graph).unwrap();
        let b = h.malloc_in_pool(8 << 20, 0, 3, graph).unwrap();
        let outside = h.malloc(1 << 20, 0, 1).unwrap(); // another stream, mid-capture
        assert!(h.free(b, 0).unwrap());
        let again = h.malloc_in_pool(8 << 20, 0, 3, graph).unwrap();
        assert_eq!(again, b, "the pool reuses its own free block");
        assert!(h.free(again, 0).unwrap());
        h.end_pool(0, graph);
        let reserved = h.stats(0).reserved_bytes.all.current;
        let eager = h.malloc(8 << 20, 0, 3).unwrap();
        assert!(![a, b, outside].contains(&eager), "the graph's free block is not handed out");
        assert!(h.stats(0).reserved_bytes.all.current > reserved, "a segment of its own");
        assert!(h.free(a, 0).unwrap());
        h.release_pool(0, graph);
        let released = h.stats(0).reserved_bytes.all.current;
        assert_eq!(released, reserved, "the eager request's segment came, the graph's went back");
        assert_eq!(h.stats(0).num_device_free, 1);

        assert_eq!(
            replayed_offline(&h, "pytorch", 8 * GIB),
            h.stats(0),
            "the offline replay's statistics"
        );
    }

    #[test]
    fn a_policy_without_private_pools_refuses_a_capture() {
        let mut h = hub("bfc", "", 8 * GIB);
        let err = h.begin_pool(0).unwrap_err();
        assert!(err.contains("bfc") && err.contains("private pools"), "{err}");
        assert!(hub("pytorch", "", 8 * GIB).begin_pool(0).is_ok());
    }

    /// Random captures: requests into two graphs' pools and the common pool, frees, captures
    /// ending, graphs released. No block overlaps one a live graph allocated (its replays
    /// write there) unless it is that graph's, and the recording replays offline to the same
    /// statistics.
    const REPRODUCE: &str = "reproduce: cargo test --release -p allocsim-torch --lib \
                             graphs_keep_their_blocks_under_random_captures";

    #[test]
    fn graphs_keep_their_blocks_under_random_captures() {
        for seed in 0..20u64 {
            let mut h = hub("pytorch", "", 4 * GIB);
            let mut rng = seed;
            let mut next = move || {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                rng >> 33
            };
            let pools = [MemPoolId(1, 0), MemPoolId(2, 0)];
            let (mut capturing, mut alive) = (Vec::new(), Vec::new());
            // What each live graph allocated, and the blocks held now.
            let mut graph_ranges: HashMap<MemPoolId, Vec<(u64, u64)>> = HashMap::new();
            let mut live: Vec<u64> = Vec::new();
            for step in 0..3000 {
                let pick = pools[next() as usize % 2];
                match next() % 10 {
                    0 if !alive.contains(&pick) => {
                        h.begin_pool(0).unwrap();
                        capturing.push(pick);
                        alive.push(pick);
                    }
                    1 if capturing.contains(&pick) => {
                        h.end_pool(0, pick);
                        capturing.retain(|&p| p != pick);
                    }
                    2 if alive.contains(&pick) && !capturing.contains(&pick) => {
                        h.release_pool(0, pick);
                        alive.retain(|&p| p != pick);
                        graph_ranges.remove(&pick);
                    }
                    3..=6 => {
                        let pool = match next() % 3 {
                            0 => MemPoolId::DEFAULT,
                            _ => capturing.get(next() as usize % 2).copied().unwrap_or_default(),
                        };
                        let size = 1 + next() % if next() % 4 == 0 { 30 << 20 } else { 1 << 20 };
                        let Ok(p) = h.malloc_in_pool(size, 0, 1, pool) else { continue };
                        for (g, ranges) in &graph_ranges {
                            let clash = ranges.iter().any(|&(a, n)| p < a + n && a < p + size);
                            assert!(
                                *g == pool || !clash,
                                "seed {seed}, step {step}: a block of {size} at {p:#x} for {pool:?} \
                                 overlaps what live graph {g:?} allocated; {REPRODUCE}"
                            );
                        }
                        if !pool.is_default() {
                            graph_ranges.entry(pool).or_default().push((p, size));
                        }
                        live.push(p);
                    }
                    7..=9 if !live.is_empty() => {
                        let at = next() as usize % live.len();
                        assert!(h.free(live.swap_remove(at), 0).unwrap());
                    }
                    _ => {}
                }
            }
            assert_eq!(
                replayed_offline(&h, "pytorch", 4 * GIB),
                h.stats(0),
                "seed {seed}: offline statistics; {REPRODUCE}"
            );
        }
    }
}
