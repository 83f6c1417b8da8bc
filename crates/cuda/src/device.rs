//! [`CudaDevice`]: the `Device` trait over the driver, with measured wall time per call.

use crate::driver::{self, AddressRange, DeviceAllocation, Gpu, Mapping};
use crate::{CudaError, Patterns};
use allocsim_core::{CallKind, Device, DeviceCalls, DeviceError, MemInfo};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

/// At most this many notes about refused or failed calls are kept.
const MAX_NOTES: usize = 16;

/// A real GPU as an allocsim device.
///
/// Segments come from `cuMemAlloc`. Expandable segments reserve address space with
/// `cuMemAddressReserve`, and `map` backs it chunk by chunk, one `cuMemCreate` + `cuMemMap` per
/// granularity unit (2 MiB on an H100), then one `cuMemSetAccess` over the whole range: the
/// driver can only unmap whole mappings, and a policy may unmap part of what it mapped in one
/// call, so each unit is its own mapping. A `map` of 20 MiB is then 21 driver calls where
/// PyTorch makes 3 (it maps its 20 MiB pages whole); the time recorded is the whole call's.
///
/// Addresses are the driver's, so they differ from a simulated device's; sizes, offsets within
/// segments and which calls happen do not, and that is what validation compares.
pub struct CudaDevice {
    // Field order is drop order: mappings, then segments and address ranges, then the
    // pattern checker, and the context last.
    mappings: BTreeMap<u64, Mapping>,
    segments: BTreeMap<u64, DeviceAllocation>,
    /// Usable start -> (usable size, the reservation holding it).
    ranges: BTreeMap<u64, (u64, AddressRange)>,
    patterns: Option<Rc<RefCell<Patterns>>>,
    calls: DeviceCalls,
    notes: Vec<String>,
    last_mem_info: std::cell::Cell<MemInfo>,
    gpu: Rc<Gpu>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("gpu", &self.gpu)
            .field("segments", &self.segments.len())
            .field("ranges", &self.ranges.len())
            .field("mappings", &self.mappings.len())
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Open GPU `ordinal`. Without a driver: [`CudaError::NoDriver`], never a panic.
    pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
        if !driver::driver_present() {
            return Err(CudaError::NoDriver);
        }
        let gpu = catch_panics(|| Gpu::open(ordinal))?;
        let gpu = Rc::new(gpu);
        let device = CudaDevice {
            mappings: BTreeMap::new(),
            segments: BTreeMap::new(),
            ranges: BTreeMap::new(),
            patterns: None,
            calls: DeviceCalls::default(),
            notes: Vec::new(),
            last_mem_info: std::cell::Cell::new(MemInfo::default()),
            gpu,
        };
        device.refresh_mem_info()?;
        Ok(device)
    }

    /// Compile and load the pattern kernels and check every block before the memory under it
    /// goes back to the driver. Returns the checker for the observer that fills and verifies.
    pub fn enable_patterns(&mut self) -> Result<Rc<RefCell<Patterns>>, CudaError> {
        let patterns = Rc::new(RefCell::new(catch_panics(|| Patterns::new(self.gpu.clone()))?));
        self.patterns = Some(patterns.clone());
        Ok(patterns)
    }

    /// `"NVIDIA H100 80GB HBM3 (device 0, sm_90)"`.
    pub fn description(&self) -> String {
        let (major, minor) = self.gpu.compute_capability;
        format!("{} (device {}, sm_{major}{minor})", self.gpu.name, self.gpu.ordinal)
    }

    /// The unit of `cuMemCreate`/`cuMemMap`.
    pub fn granularity(&self) -> u64 {
        self.gpu.granularity
    }

    /// Wait for all kernels of ours.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.gpu.synchronize()
    }

    /// Read `cuMemGetInfo` now (also what `mem_info` returns until the next refresh).
    pub fn refresh_mem_info(&self) -> Result<MemInfo, CudaError> {
        let _scope = self.gpu.scope()?;
        let (free_bytes, total_bytes) = self.gpu.mem_info()?;
        let info = MemInfo { free_bytes, total_bytes };
        self.last_mem_info.set(info);
        Ok(info)
    }

    /// A function that waits for all work queued on a stream of this GPU (a `cudaStream_t` of
    /// its primary context), from any thread; it holds the GPU open while it lives.
    pub fn stream_waiter(&self) -> impl Fn(u64) -> Result<(), CudaError> {
        let gpu = self.gpu.clone();
        move |stream| {
            let _scope = gpu.scope()?;
            driver::synchronize_stream(stream)
        }
    }

    /// Segments, reserved ranges and mapped chunks currently held.
    pub fn held(&self) -> (usize, usize, usize) {
        (self.segments.len(), self.ranges.len(), self.mappings.len())
    }

    fn note(&mut self, line: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(line);
        }
    }

    /// Before memory goes back to the driver, blocks in it are verified and our kernels have
    /// finished with it.
    fn before_release(&mut self, addr: u64, size: u64) {
        if let Some(p) = &self.patterns {
            p.borrow_mut().before_release(addr, size);
        }
    }

    fn refused(&self, size: u64, e: &CudaError) -> DeviceError {
        if e.is_out_of_memory() {
            let free = self.refresh_mem_info().map(|m| m.free_bytes).unwrap_or(0);
            DeviceError::OutOfMemory { requested: size, free }
        } else {
            DeviceError::Driver(e.to_string())
        }
    }

    fn timed<T>(
        &mut self,
        kind: CallKind,
        f: impl FnOnce(&mut Self) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let start = Instant::now();
        let result = self.gpu.clone().scope().and_then(|_scope| f(self));
        let ns = start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.calls.record(kind, result.is_ok(), ns);
        result
    }

    /// Map `[addr, addr+size)` one granularity chunk at a time and make it accessible; undo
    /// all of it on failure.
    fn map_chunks(&mut self, addr: u64, size: u64) -> Result<Vec<Mapping>, CudaError> {
        let g = self.gpu.granularity;
        let made = (addr..addr + size)
            .step_by(g as usize)
            .map(|at| Mapping::new(&self.gpu, at, g))
            .collect::<Result<Vec<_>, _>>()?;
        driver::grant_access(&self.gpu, addr, size)?;
        Ok(made)
    }

    fn in_reserved_range(&self, addr: u64, size: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, (usable, _))| addr >= start && addr + size <= start + usable)
    }
}

impl Device for CudaDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        match self.timed(CallKind::Malloc, |_| DeviceAllocation::new(size)) {
            Ok(a) => {
                let ptr = a.ptr;
                self.segments.insert(ptr, a);
                Ok(ptr)
            }
            Err(e) => Err(self.refused(size, &e)),
        }
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.before_release(addr, size);
        let Some(a) = self.segments.remove(&addr) else {
            self.note(format!("free of {addr:#x} ({size} bytes): not a segment of this device"));
            return;
        };
        if let Err(e) = self.timed(CallKind::Free, |_| a.free()) {
            self.note(format!("free of {addr:#x}: {e}"));
        }
    }

    /// The driver takes power-of-two alignments only; PyTorch asks for its page size (20 MiB
    /// for the large pool) and passes 0 itself. Any other alignment is honoured by reserving
    /// `alignment` more and starting at the first aligned address inside.
    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let g = self.gpu.granularity;
        let size = size.div_ceil(g) * g;
        let (driver_alignment, extra) = match alignment {
            a if a <= g => (0, 0),
            a if a.is_power_of_two() => (a, 0),
            a => (0, a.div_ceil(g) * g),
        };
        let reserved = self.timed(CallKind::ReserveAddress, |_| {
            AddressRange::reserve(size + extra, driver_alignment)
        });
        match reserved {
            Ok(r) => {
                let start = if extra == 0 { r.ptr } else { r.ptr.div_ceil(alignment) * alignment };
                self.ranges.insert(start, (size, r));
                Ok(start)
            }
            Err(e) => Err(self.refused(size, &e)),
        }
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        let Some((usable, range)) = self.ranges.remove(&addr) else {
            self.note(format!("release_address of {addr:#x}: not a reserved range"));
            return;
        };
        let end = addr + usable.max(size);
        let still_mapped: Vec<u64> = self.mappings.range(addr..end).map(|(&a, _)| a).collect();
        if !still_mapped.is_empty() {
            self.note(format!(
                "release_address of {addr:#x} with {} chunks still mapped: unmapped them first",
                still_mapped.len()
            ));
            self.before_release(addr, end - addr);
            for a in still_mapped {
                self.mappings.remove(&a);
            }
        }
        self.timed(CallKind::ReleaseAddress, |_| {
            drop(range);
            Ok(())
        })
        .ok();
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let g = self.gpu.granularity;
        if (addr | size) & (g - 1) != 0 || !self.in_reserved_range(addr, size) {
            self.calls.record(CallKind::Map, false, 0);
            return Err(DeviceError::Driver(format!(
                "map of [{addr:#x}, +{size}): not whole {g}-byte chunks of a reserved range"
            )));
        }
        if self.mappings.range(addr..addr + size).next().is_some() {
            self.calls.record(CallKind::Map, false, 0);
            return Err(DeviceError::Driver(format!(
                "map of [{addr:#x}, +{size}): already mapped"
            )));
        }
        match self.timed(CallKind::Map, |me| me.map_chunks(addr, size)) {
            Ok(chunks) => {
                for m in chunks {
                    self.mappings.insert(m.ptr, m);
                }
                Ok(())
            }
            Err(e) => Err(self.refused(size, &e)),
        }
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.before_release(addr, size);
        let g = self.gpu.granularity;
        if (addr | size) & (g - 1) != 0 {
            self.note(format!("unmap of [{addr:#x}, +{size}): not whole {g}-byte chunks"));
        }
        let chunks: Vec<u64> = self.mappings.range(addr..addr + size).map(|(&a, _)| a).collect();
        let result = self.timed(CallKind::Unmap, |me| {
            // Unlike cuMemFree, cuMemUnmap does not wait for kernels still using the memory (a
            // block freed by the program may still be in use by queued work on its stream):
            // wait for them first, as PyTorch's expandable segments wait for their stream.
            driver::synchronize_context()?;
            for a in &chunks {
                me.mappings.remove(a);
            }
            Ok(())
        });
        if chunks.len() as u64 != size / g {
            self.note(format!(
                "unmap of [{addr:#x}, +{size}): {} of {} chunks were mapped",
                chunks.len(),
                size / g
            ));
        }
        result.ok();
    }

    fn mem_info(&self) -> MemInfo {
        self.refresh_mem_info().unwrap_or_else(|_| self.last_mem_info.get())
    }

    fn calls(&self) -> &DeviceCalls {
        &self.calls
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// Run `f`, turning a panic inside the CUDA bindings (cudarc panics on a library or symbol it
/// cannot load) into an error. The panic hook still prints the panic message to stderr.
fn catch_panics<T>(f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(CudaError::Panicked(msg))
    })
}
