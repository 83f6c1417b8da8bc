//! The device: where segments come from.
//!
//! The trait has the shape of the CUDA driver calls a GPU allocator makes, and nothing more:
//! whole segments (`cudaMalloc`/`cudaFree`), and for expandable segments an address range
//! (`cuMemAddressReserve`) into which physical pages are mapped and unmapped
//! (`cuMemCreate`+`cuMemMap`, `cuMemUnmap`). Policies decide sizes, the device decides
//! addresses and whether there is memory. That split lets the same policy run on the simulated
//! device (`allocsim-sim`), a device that follows a recording, and a real GPU (`allocsim-cuda`).
//!
//! Every call reports its cost into [`DeviceCalls`]: virtual time on a simulated device,
//! measured wall time on a real one, so policies can be compared on device-call overhead.
//!
//! `begin_op` exists because a device may depend on where the workload is, not only on the
//! calls it receives: fault injection takes memory away at op K, and a device that follows a
//! recording answers each call from what the recording shows for the current op.

use std::fmt;

/// Why a device call failed. An allocator turns `OutOfMemory` into its own retry or OOM path;
/// anything else is a bug or a broken device and should stop the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// The driver refused: `cudaErrorMemoryAllocation` / `CUDA_ERROR_OUT_OF_MEMORY`.
    OutOfMemory { requested: u64, free: u64 },
    /// Any other driver failure, with the driver's words.
    Driver(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory { requested, free } => {
                write!(f, "device out of memory: asked {requested} bytes, {free} free")
            }
            DeviceError::Driver(msg) => write!(f, "driver error: {msg}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// `cudaMemGetInfo`: what the driver says is free and the card's total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The kinds of device call, for counting and costing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CallKind {
    Malloc,
    Free,
    ReserveAddress,
    ReleaseAddress,
    Map,
    Unmap,
}

impl CallKind {
    pub const ALL: [CallKind; 6] = [
        CallKind::Malloc,
        CallKind::Free,
        CallKind::ReserveAddress,
        CallKind::ReleaseAddress,
        CallKind::Map,
        CallKind::Unmap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CallKind::Malloc => "malloc",
            CallKind::Free => "free",
            CallKind::ReserveAddress => "reserve_address",
            CallKind::ReleaseAddress => "release_address",
            CallKind::Map => "map",
            CallKind::Unmap => "unmap",
        }
    }
}

/// Count, failures and cost of one kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallStats {
    pub calls: u64,
    pub failed: u64,
    pub time_ns: u64,
}

/// Per-kind call statistics of a device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceCalls {
    by_kind: [CallStats; 6],
}

impl DeviceCalls {
    pub fn record(&mut self, kind: CallKind, ok: bool, time_ns: u64) {
        let s = &mut self.by_kind[kind as usize];
        s.calls += 1;
        s.failed += u64::from(!ok);
        s.time_ns += time_ns;
    }

    pub fn get(&self, kind: CallKind) -> CallStats {
        self.by_kind[kind as usize]
    }

    pub fn total_calls(&self) -> u64 {
        self.by_kind.iter().map(|s| s.calls).sum()
    }

    pub fn total_time_ns(&self) -> u64 {
        self.by_kind.iter().map(|s| s.time_ns).sum()
    }
}

/// Memory a policy carves into blocks. See the module doc for why it has this shape.
///
/// Addresses are `u64` device virtual addresses. Implementations must never hand out
/// overlapping live ranges; `allocsim-check` verifies that from the event stream.
pub trait Device {
    /// The workload is about to run op `index` (0-based). Default: nothing to do.
    fn begin_op(&mut self, index: u64) {
        let _ = index;
    }

    /// Reserve a whole segment of `size` bytes (`cudaMalloc`).
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;

    /// Count `[addr, addr+size)` as a segment the allocator already holds when the run starts
    /// (a recording that begins mid-run, [`crate::StartState`]), as if `malloc` had returned
    /// it, without being a call. Default: refused, as a real device must (it cannot adopt
    /// memory it never gave).
    fn adopt_segment(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (addr, size);
        Err(DeviceError::Driver("this device cannot adopt a recording's segments".to_string()))
    }

    /// [`Device::adopt_segment`] for an expandable segment: the address range `[addr,
    /// addr+size)` is reserved, and the `mapped` ranges in it are backed, as if
    /// `reserve_address` and `map` had made them. Default: refused.
    fn adopt_reservation(
        &mut self,
        addr: u64,
        size: u64,
        mapped: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        let _ = (addr, size, mapped);
        Err(DeviceError::Driver("this device cannot adopt a recording's reservations".to_string()))
    }

    /// Return a segment obtained from `malloc` (`cudaFree`).
    fn free(&mut self, addr: u64, size: u64);

    /// Reserve `size` bytes of address space with no memory behind it (`cuMemAddressReserve`).
    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError>;

    /// Release an address range from `reserve_address`; it must be wholly unmapped.
    fn release_address(&mut self, addr: u64, size: u64);

    /// Back `[addr, addr+size)` of a reserved range with physical memory
    /// (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, for whole pages).
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;

    /// Unmap and release the physical memory behind `[addr, addr+size)`.
    fn unmap(&mut self, addr: u64, size: u64);

    /// `cudaMemGetInfo`.
    fn mem_info(&self) -> MemInfo;

    /// What the calls so far cost.
    fn calls(&self) -> &DeviceCalls;

    /// A line for the report when the device did something the user should know about
    /// (fell back from a recording to its model, injected a fault); `None` otherwise.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A trait object as a [`Device`] of a known type (see [`crate::DynAllocator`]).
pub struct DynDevice<'a>(pub &'a mut dyn Device);

impl fmt::Debug for DynDevice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynDevice").finish_non_exhaustive()
    }
}

impl Device for DynDevice<'_> {
    fn begin_op(&mut self, index: u64) {
        self.0.begin_op(index)
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.0.malloc(size)
    }
    fn adopt_segment(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.0.adopt_segment(addr, size)
    }
    fn adopt_reservation(
        &mut self,
        addr: u64,
        size: u64,
        mapped: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        self.0.adopt_reservation(addr, size, mapped)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.0.free(addr, size)
    }
    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        self.0.reserve_address(size, alignment)
    }
    fn release_address(&mut self, addr: u64, size: u64) {
        self.0.release_address(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.0.map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.0.unmap(addr, size)
    }
    fn mem_info(&self) -> MemInfo {
        self.0.mem_info()
    }
    fn calls(&self) -> &DeviceCalls {
        self.0.calls()
    }
    fn notes(&self) -> Vec<String> {
        self.0.notes()
    }
}
