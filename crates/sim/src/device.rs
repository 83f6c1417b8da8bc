//! The modelled device: memory accounting, address placement, costs and faults in one place.
//!
//! Free memory is `free at start − reserved − taken by faults`, where reserved counts every
//! page under a live `malloc` segment and every mapped page. The driver backs memory in whole
//! 2 MiB pages ([`PAGE_BYTES`]), so a segment the model places starts on a page and counts,
//! and is compared against free memory, rounded up to whole pages. A request fails with
//! `OutOfMemory` exactly when that rounded size exceeds free memory; PyTorch asks only for page
//! multiples, and with this rule the OOMs of the recorded `synthetic_default` run fall exactly
//! where they fell on the GPU.
//!
//! A real driver also packs `cudaMalloc`s smaller than a page side by side inside one page
//! (512-byte aligned on an H100). Segments placed where a real device put them
//! ([`SimDevice::malloc_at`], for the devices that follow one) therefore occupy their exact
//! byte range, not whole pages, and a page under several live segments counts once: only a
//! segment's first and last page can be shared (the pages between lie wholly inside it), so
//! those two are reference-counted.
//!
//! Calls that break the driver's contract are policy bugs, not outcomes: those that can fail
//! (`map` outside a reservation, a double map, a zero size) return `DeviceError::Driver`; those
//! that cannot (`free`, `unmap`, `release_address` of something not live) are kept in
//! [`SimDevice::errors`] and reported by `notes()`. Nothing panics.

use crate::address::{align_up, AddressSpace, IntervalSet};
use crate::faults::FaultState;
use crate::{CostModel, Placement, SimConfig};
use allocsim_core::{CallKind, Device, DeviceCalls, DeviceError, MemInfo};
use std::collections::BTreeMap;

/// The driver's physical page: sizes are rounded up to it, addresses aligned to it.
pub const PAGE_BYTES: u64 = 2 << 20;
/// How many invalid calls are kept verbatim; all are counted.
const ERRORS_KEPT: usize = 100;

/// An address range from `reserve_address` and the pages mapped into it.
#[derive(Debug, Clone)]
struct Reservation {
    size_bytes: u64,
    end: u64,
    mapped: IntervalSet,
}

/// A simulated GPU. See the module doc for its rules and `crate::address` for placement.
#[derive(Debug, Clone)]
pub struct SimDevice {
    total_bytes: u64,
    start_free_bytes: u64,
    cost: CostModel,
    faults: FaultState,
    va: AddressSpace,
    /// Live `malloc` segments: address -> size as asked.
    segments: BTreeMap<u64, u64>,
    /// The first and last page of every live segment (page index -> live segments touching
    /// it), so that a page shared by packed segments counts once.
    edge_pages: BTreeMap<u64, u32>,
    reservations: BTreeMap<u64, Reservation>,
    /// Pages under live segments plus mapped pages.
    reserved_bytes: u64,
    taken_bytes: u64,
    calls: DeviceCalls,
    /// The op running (`Device::begin_op`), `NO_OP` before the first: a plain number, so
    /// that `begin_op` is one store.
    op: u64,
    errors: Vec<String>,
    errors_total: u64,
    config_notes: Vec<String>,
}

/// `SimDevice::op` before the first op.
const NO_OP: u64 = u64::MAX;

impl SimDevice {
    /// The op running, if one has begun.
    fn current_op(&self) -> Option<u64> {
        (self.op != NO_OP).then_some(self.op)
    }

    pub fn new(cfg: SimConfig) -> Self {
        let mut config_notes = Vec::new();
        if cfg.free_bytes > cfg.total_bytes {
            config_notes.push(format!(
                "device: free at start {} exceeds total {}; clamped to the total",
                cfg.free_bytes, cfg.total_bytes
            ));
        }
        SimDevice {
            total_bytes: cfg.total_bytes,
            start_free_bytes: cfg.free_bytes.min(cfg.total_bytes),
            cost: cfg.cost,
            faults: FaultState::new(cfg.faults, cfg.seed),
            va: AddressSpace::with_recorded(cfg.placement, &cfg.recorded_segments),
            segments: BTreeMap::new(),
            edge_pages: BTreeMap::new(),
            reservations: BTreeMap::new(),
            reserved_bytes: 0,
            taken_bytes: 0,
            calls: DeviceCalls::default(),
            op: NO_OP,
            errors: Vec::new(),
            errors_total: 0,
            config_notes,
        }
    }

    /// The test device: `total_bytes`, all of it free, calls that cost nothing, addresses
    /// lowest-first. Contract breaches are kept in [`SimDevice::errors`], never panics.
    pub fn for_tests(total_bytes: u64) -> Self {
        SimDevice::new(SimConfig {
            cost: CostModel::zero(),
            placement: Placement::Lowest,
            ..SimConfig::with_total_bytes(total_bytes)
        })
    }

    /// What `cudaMemGetInfo` reports free.
    pub fn free_bytes(&self) -> u64 {
        self.start_free_bytes.saturating_sub(self.reserved_bytes.saturating_add(self.taken_bytes))
    }

    /// Pages under live segments (a page under several counted once) plus mapped pages.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// Memory other processes took through `Fault::TakeMemory`.
    pub fn taken_bytes(&self) -> u64 {
        self.taken_bytes
    }

    /// Live `malloc` segments and address reservations.
    pub fn live_ranges(&self) -> usize {
        self.va.live_ranges()
    }

    /// The first invalid calls (policy bugs) the device saw, in order.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// How many invalid calls there were, kept or not.
    pub fn errors_total(&self) -> u64 {
        self.errors_total
    }

    fn error(&mut self, message: String) {
        self.errors_total += 1;
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(message);
        }
    }

    fn record(&mut self, kind: CallKind, ok: bool, size_bytes: u64) {
        let time_ns = self.cost.call_ns(kind, size_bytes);
        self.calls.record(kind, ok, time_ns);
    }

    fn oom(&self, size_bytes: u64) -> DeviceError {
        DeviceError::OutOfMemory { requested: size_bytes, free: self.free_bytes() }
    }

    fn try_malloc(&mut self, size_bytes: u64) -> Result<u64, DeviceError> {
        let footprint = page_footprint("malloc", size_bytes)?;
        if self.faults.refuses(self.current_op(), CallKind::Malloc, size_bytes)
            || footprint > self.free_bytes()
        {
            return Err(self.oom(size_bytes));
        }
        let addr = self.va.place(footprint, PAGE_BYTES).ok_or_else(va_exhausted)?;
        self.insert_segment(addr, size_bytes);
        Ok(addr)
    }

    /// Book a placed segment: its pages, those at its ends only if no other segment has them.
    fn insert_segment(&mut self, addr: u64, size_bytes: u64) {
        self.segments.insert(addr, size_bytes);
        let (first, last) = (addr / PAGE_BYTES, (addr + (size_bytes - 1)) / PAGE_BYTES);
        let mut pages = last - first + 1;
        for page in edges(first, last) {
            let users = self.edge_pages.entry(page).or_insert(0);
            if *users > 0 {
                pages -= 1;
            }
            *users += 1;
        }
        self.reserved_bytes += pages * PAGE_BYTES;
    }

    /// Undo [`Self::insert_segment`] for the live segment `[addr, addr + size_bytes)`.
    fn remove_segment(&mut self, addr: u64, size_bytes: u64) {
        let (first, last) = (addr / PAGE_BYTES, (addr + (size_bytes - 1)) / PAGE_BYTES);
        let mut pages = last - first + 1;
        for page in edges(first, last) {
            if let Some(users) = self.edge_pages.get_mut(&page) {
                *users -= 1;
                if *users > 0 {
                    pages -= 1;
                } else {
                    self.edge_pages.remove(&page);
                }
            }
        }
        self.reserved_bytes -= pages * PAGE_BYTES;
    }

    fn try_free(&mut self, addr: u64, size_bytes: u64) -> bool {
        let Some(asked) = self.segments.remove(&addr) else {
            self.error(format!("free({addr:#x}, {size_bytes}): no live segment starts there"));
            return false;
        };
        self.va.release(addr);
        self.remove_segment(addr, asked);
        if asked != size_bytes {
            self.error(format!(
                "free({addr:#x}, {size_bytes}): the segment there has {asked} bytes; freed it"
            ));
        }
        true
    }

    fn try_reserve(&mut self, size_bytes: u64, alignment: u64) -> Result<u64, DeviceError> {
        let footprint = page_footprint("reserve_address", size_bytes)?;
        let align = checked_alignment(alignment)?;
        let addr = self.va.place(footprint, align).ok_or_else(va_exhausted)?;
        self.insert_reservation(addr, size_bytes, footprint);
        Ok(addr)
    }

    fn insert_reservation(&mut self, addr: u64, size_bytes: u64, footprint: u64) {
        let r = Reservation { size_bytes, end: addr + footprint, mapped: IntervalSet::default() };
        self.reservations.insert(addr, r);
    }

    fn try_release(&mut self, addr: u64, size_bytes: u64) -> bool {
        let call = format!("release_address({addr:#x}, {size_bytes})");
        let Some(r) = self.reservations.get(&addr) else {
            self.error(format!("{call}: no reservation starts there"));
            return false;
        };
        if !r.mapped.is_empty() {
            let mapped = r.mapped.total_bytes();
            self.error(format!("{call}: {mapped} bytes still mapped; not released"));
            return false;
        }
        let asked = r.size_bytes;
        self.reservations.remove(&addr);
        self.va.release(addr);
        if asked != size_bytes {
            self.error(format!("{call}: the reservation has {asked} bytes; released it"));
        }
        true
    }

    /// The reservation wholly holding `[addr, addr + size)`.
    fn reservation_holding(&self, addr: u64, size_bytes: u64) -> Option<u64> {
        let (&start, r) = self.reservations.range(..=addr).next_back()?;
        (addr.checked_add(size_bytes)? <= r.end).then_some(start)
    }

    fn try_map(
        &mut self,
        addr: u64,
        size_bytes: u64,
        check_memory: bool,
    ) -> Result<(), DeviceError> {
        let call = format!("map({addr:#x}, {size_bytes})");
        check_pages(&call, addr, size_bytes)?;
        let holder = self.reservation_holding(addr, size_bytes).ok_or_else(|| {
            DeviceError::Driver(format!("{call}: not inside a reserved address range"))
        })?;
        let end = addr + size_bytes;
        if self.reservations.get(&holder).is_some_and(|r| r.mapped.overlaps(addr, end)) {
            return Err(DeviceError::Driver(format!(
                "{call}: part of the range is already mapped"
            )));
        }
        if check_memory
            && (self.faults.refuses(self.current_op(), CallKind::Map, size_bytes)
                || size_bytes > self.free_bytes())
        {
            return Err(self.oom(size_bytes));
        }
        if let Some(r) = self.reservations.get_mut(&holder) {
            r.mapped.insert(addr, end);
        }
        self.reserved_bytes += size_bytes;
        Ok(())
    }

    fn try_unmap(&mut self, addr: u64, size_bytes: u64) -> bool {
        let call = format!("unmap({addr:#x}, {size_bytes})");
        if let Err(e) = check_pages(&call, addr, size_bytes) {
            self.error(e.to_string());
            return false;
        }
        let holder = self.reservation_holding(addr, size_bytes);
        let removed = holder
            .and_then(|h| self.reservations.get_mut(&h))
            .is_some_and(|r| r.mapped.remove(addr, addr + size_bytes));
        if !removed {
            self.error(format!("{call}: the range is not wholly mapped in one reservation"));
            return false;
        }
        self.reserved_bytes -= size_bytes;
        true
    }
}

/// What the device needs to follow a recording: act as the recording says, keep the books.
impl SimDevice {
    /// Place a `malloc` segment at `addr` regardless of free memory and faults (the recording
    /// says the driver granted it there). It occupies exactly `[addr, addr + size_bytes)`, so
    /// segments the driver packed into one page fit side by side. False, with nothing
    /// recorded, if that overlaps a live range.
    pub(crate) fn malloc_at(&mut self, addr: u64, size_bytes: u64) -> bool {
        if size_bytes == 0 || !self.va.place_at(addr, size_bytes) {
            return false;
        }
        self.insert_segment(addr, size_bytes);
        self.record(CallKind::Malloc, true, size_bytes);
        true
    }

    /// Refuse a reservation attempt because the recording says the driver did.
    pub(crate) fn refuse(&mut self, kind: CallKind, size_bytes: u64) -> DeviceError {
        self.record(kind, false, size_bytes);
        self.oom(size_bytes)
    }

    /// `map` without the free-memory and fault checks (the recording says it was granted).
    pub(crate) fn map_granted(&mut self, addr: u64, size_bytes: u64) -> Result<(), DeviceError> {
        let result = self.try_map(addr, size_bytes, false);
        self.record(CallKind::Map, result.is_ok(), size_bytes);
        result
    }

    /// `reserve_address` at exactly `addr` regardless of alignment (a real device granted it
    /// there), if that range is free; false records nothing.
    pub(crate) fn reserve_address_granted(&mut self, addr: u64, size_bytes: u64) -> bool {
        let Ok(footprint) = page_footprint("reserve_address", size_bytes) else { return false };
        if !self.va.place_at(addr, footprint) {
            return false;
        }
        self.insert_reservation(addr, size_bytes, footprint);
        self.record(CallKind::ReserveAddress, true, size_bytes);
        true
    }

    /// `reserve_address` at exactly `addr`, if it is aligned and free; `None` records nothing.
    pub(crate) fn reserve_address_at(
        &mut self,
        addr: u64,
        size_bytes: u64,
        alignment: u64,
    ) -> Option<u64> {
        let footprint = page_footprint("reserve_address", size_bytes).ok()?;
        let align = checked_alignment(alignment).ok()?;
        if !addr.is_multiple_of(align) || !self.va.place_at(addr, footprint) {
            return None;
        }
        self.insert_reservation(addr, size_bytes, footprint);
        self.record(CallKind::ReserveAddress, true, size_bytes);
        Some(addr)
    }

    /// True if `addr` lies in a live address reservation.
    pub(crate) fn is_reserved(&self, addr: u64) -> bool {
        self.reservations.range(..=addr).next_back().is_some_and(|(_, r)| addr < r.end)
    }
}

impl Device for SimDevice {
    #[inline]
    fn begin_op(&mut self, index: u64) {
        self.op = index;
        if self.faults.takes_at(index) {
            self.taken_bytes += self.faults.take_at_op(index, self.free_bytes());
        }
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let result = self.try_malloc(size);
        self.record(CallKind::Malloc, result.is_ok(), size);
        result
    }

    /// The segment takes its place and its pages, free memory or not: it was there before.
    fn adopt_segment(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        if size == 0 || !self.va.place_at(addr, size) {
            let msg = format!("cannot adopt segment {size} at {addr:#x}: overlaps a live range");
            return Err(DeviceError::Driver(msg));
        }
        self.insert_segment(addr, size);
        Ok(())
    }

    fn adopt_reservation(
        &mut self,
        addr: u64,
        size: u64,
        mapped: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        let footprint = page_footprint("adopt_reservation", size)?;
        if !self.va.place_at(addr, footprint) {
            let msg =
                format!("cannot adopt reservation {size} at {addr:#x}: overlaps a live range");
            return Err(DeviceError::Driver(msg));
        }
        self.insert_reservation(addr, size, footprint);
        for &(at, bytes) in mapped {
            self.try_map(at, bytes, false)?;
        }
        Ok(())
    }

    fn free(&mut self, addr: u64, size: u64) {
        let ok = self.try_free(addr, size);
        self.record(CallKind::Free, ok, size);
    }

    fn reserve_address(&mut self, size: u64, alignment: u64) -> Result<u64, DeviceError> {
        let result = self.try_reserve(size, alignment);
        self.record(CallKind::ReserveAddress, result.is_ok(), size);
        result
    }

    fn release_address(&mut self, addr: u64, size: u64) {
        let ok = self.try_release(addr, size);
        self.record(CallKind::ReleaseAddress, ok, size);
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let result = self.try_map(addr, size, true);
        self.record(CallKind::Map, result.is_ok(), size);
        result
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let ok = self.try_unmap(addr, size);
        self.record(CallKind::Unmap, ok, size);
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo { free_bytes: self.free_bytes(), total_bytes: self.total_bytes }
    }

    fn calls(&self) -> &DeviceCalls {
        &self.calls
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.config_notes.clone();
        notes.extend(self.faults.notes());
        if let Some(first) = self.errors.first() {
            notes.push(format!(
                "device: {} invalid calls (policy bugs), the first: {first}",
                self.errors_total
            ));
        }
        notes
    }
}

/// The first and last page of a segment, once each.
fn edges(first: u64, last: u64) -> impl Iterator<Item = u64> {
    std::iter::once(first).chain((last != first).then_some(last))
}

/// `size_bytes` rounded up to whole pages; a zero or overflowing size is a driver error.
fn page_footprint(call: &str, size_bytes: u64) -> Result<u64, DeviceError> {
    match align_up(size_bytes, PAGE_BYTES) {
        Some(footprint) if size_bytes > 0 => Ok(footprint),
        _ => Err(DeviceError::Driver(format!("{call} of {size_bytes} bytes: invalid size"))),
    }
}

/// `cuMemMap`/`cuMemUnmap` work on whole pages at page-aligned addresses.
fn check_pages(call: &str, addr: u64, size_bytes: u64) -> Result<(), DeviceError> {
    if size_bytes == 0 || !addr.is_multiple_of(PAGE_BYTES) || !size_bytes.is_multiple_of(PAGE_BYTES)
    {
        return Err(DeviceError::Driver(format!(
            "{call}: address and size must be non-zero multiples of the {PAGE_BYTES}-byte page"
        )));
    }
    Ok(())
}

/// The alignment a reservation gets: a multiple of both `alignment` and the page (their least
/// common multiple; 0 means the page). The driver's contract names no constraint on it, and
/// PyTorch passes its segment page (20 MiB), which is no power of two.
fn checked_alignment(alignment: u64) -> Result<u64, DeviceError> {
    let a = alignment.max(1);
    let (mut x, mut y) = (a, PAGE_BYTES);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    (a / x).checked_mul(PAGE_BYTES).ok_or_else(|| {
        DeviceError::Driver(format!("reserve_address: alignment {alignment} is too large"))
    })
}

fn va_exhausted() -> DeviceError {
    DeviceError::Driver("virtual address space exhausted".to_string())
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
