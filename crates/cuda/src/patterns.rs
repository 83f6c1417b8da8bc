//! Pattern checks on real memory: fill every live block, verify it when it dies.
//!
//! The observer that drives this (in the CLI, over the replay engine's events) calls
//! [`Patterns::on_alloc`] for each block handed out and [`Patterns::on_free`] when the program
//! frees it; [`crate::CudaDevice`] calls [`Patterns::before_release`] before memory goes back to
//! the driver, because a policy can free a block and return its segment within one op, before
//! the observer hears of the free. [`Patterns::finish`] verifies what is still live and reads
//! the mismatch counters.
//!
//! Kernel launches are asynchronous and go to one stream in order, so a fill, later touches and
//! the final verify of a block run in program order; only releases and `finish` wait.

use crate::driver::{self, DeviceAllocation, Gpu, Module};
use crate::{CudaError, KERNEL_SOURCE};
use allocsim_core::AllocId;
use cudarc::nvrtc;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_void, CStr, CString};
use std::rc::Rc;

const THREADS_PER_BLOCK: u32 = 256;
/// Grid cap: enough blocks to fill an H100's 132 SMs several times over.
const MAX_GRID: u64 = 132 * 16;
/// How many other live blocks each allocation touches (reads, checks, rewrites).
const TOUCH_PREVIOUS: usize = 1;

/// The first corrupted word found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub id: AllocId,
    /// Index of the 8-byte word within the block.
    pub word: u64,
    pub expected: u64,
    pub found: u64,
}

/// What the pattern checks did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatternReport {
    pub blocks_filled: u64,
    pub blocks_verified: u64,
    /// Read-modify-write passes of the compute kernel.
    pub touches: u64,
    pub bytes_filled: u64,
    /// Blocks verified because their memory went back to the driver before the free was
    /// observed (the policy freed block and segment within one op).
    pub verified_at_release: u64,
    /// Corrupted 8-byte words over all checks; 0 on a correct run.
    pub mismatched_words: u64,
    pub first_mismatch: Option<Mismatch>,
    /// Blocks handed out over a block still live: the checker's overlap, seen on real memory.
    pub overlapping_allocs: u64,
    /// Frees of blocks never filled (an alloc the observer did not see): none on a good run.
    pub unknown_frees: u64,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    id: AllocId,
    size: u64,
    generation: u32,
}

/// The pattern kernels and the blocks they watch.
pub struct Patterns {
    live: BTreeMap<u64, Live>,
    by_id: HashMap<AllocId, u64>,
    /// Blocks verified at a release whose free the observer has not seen yet (same op).
    released: HashSet<AllocId>,
    /// Most recent allocations first, for the compute kernel's touches.
    recent: Vec<AllocId>,
    report: PatternReport,
    error: Option<CudaError>,
    fill: cudarc::driver::sys::CUfunction,
    verify: cudarc::driver::sys::CUfunction,
    touch: cudarc::driver::sys::CUfunction,
    /// Device words: mismatch count, then the first mismatch's id, word, expected, found.
    counters: DeviceAllocation,
    _module: Module,
    gpu: Rc<Gpu>,
}

impl std::fmt::Debug for Patterns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Patterns")
            .field("live", &self.live.len())
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl Patterns {
    pub(crate) fn new(gpu: Rc<Gpu>) -> Result<Self, CudaError> {
        let image = compile(&gpu)?;
        let module = Module::load(&image)?;
        let fill = module.function(c"fill_pattern")?;
        let verify = module.function(c"verify_pattern")?;
        let touch = module.function(c"touch_pattern")?;
        let counters = DeviceAllocation::new(5 * 8)?;
        driver::zero(counters.ptr, counters.size)?;
        Ok(Patterns {
            live: BTreeMap::new(),
            by_id: HashMap::new(),
            released: HashSet::new(),
            recent: Vec::new(),
            report: PatternReport::default(),
            error: None,
            fill,
            verify,
            touch,
            counters,
            _module: module,
            gpu,
        })
    }

    /// The first launch error, if any; checks stop after one.
    pub fn error(&self) -> Option<&CudaError> {
        self.error.as_ref()
    }

    /// A block was handed out: fill it, then run the compute kernel over it and the previous
    /// live allocation.
    pub fn on_alloc(&mut self, id: AllocId, addr: u64, size: u64) {
        if size == 0 || self.error.is_some() {
            return;
        }
        let overlaps_before =
            self.live.range(..addr).next_back().is_some_and(|(&a, b)| a + b.size > addr);
        let overlaps_after = self.live.range(addr..).next().is_some_and(|(&a, _)| a < addr + size);
        if overlaps_before || overlaps_after {
            self.report.overlapping_allocs += 1;
        }
        self.live.insert(addr, Live { id, size, generation: 0 });
        self.by_id.insert(id, addr);
        self.launch(self.fill, addr, Live { id, size, generation: 0 }, false);
        self.report.blocks_filled += 1;
        self.report.bytes_filled += size;
        self.recent.retain(|r| self.by_id.contains_key(r));
        self.recent.insert(0, id);
        self.recent.truncate(TOUCH_PREVIOUS + 1);
        for touched in self.recent.clone() {
            self.touch_block(touched);
        }
    }

    /// The program freed `id`: verify it and stop watching it.
    pub fn on_free(&mut self, id: AllocId) {
        let Some(addr) = self.by_id.remove(&id) else {
            // Verified at release already, or never filled.
            if !self.released.remove(&id) {
                self.report.unknown_frees += 1;
            }
            return;
        };
        if let Some(block) = self.live.remove(&addr) {
            self.verify_block(addr, block);
        }
    }

    /// Memory `[addr, addr+size)` is about to go back to the driver: verify the blocks still
    /// watched there, and wait until our kernels are done with it.
    pub fn before_release(&mut self, addr: u64, size: u64) {
        let inside: Vec<u64> = self.live.range(addr..addr + size).map(|(&a, _)| a).collect();
        for a in inside {
            if let Some(block) = self.live.remove(&a) {
                self.by_id.remove(&block.id);
                self.released.insert(block.id);
                self.verify_block(a, block);
                self.report.verified_at_release += 1;
            }
        }
        if let Err(e) = self.gpu.synchronize() {
            self.error.get_or_insert(e);
        }
    }

    /// Verify every block still live and read the counters.
    pub fn finish(&mut self) -> Result<PatternReport, CudaError> {
        let all: Vec<(u64, Live)> = std::mem::take(&mut self.live).into_iter().collect();
        self.by_id.clear();
        for (addr, block) in all {
            self.verify_block(addr, block);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.gpu.synchronize()?;
        let mut words = [0u64; 5];
        driver::copy_to_host(self.counters.ptr, &mut words)?;
        self.report.mismatched_words = words[0];
        self.report.first_mismatch = (words[0] > 0).then_some(Mismatch {
            id: AllocId(words[1]),
            word: words[2],
            expected: words[3],
            found: words[4],
        });
        Ok(self.report.clone())
    }

    fn touch_block(&mut self, id: AllocId) {
        let Some(&addr) = self.by_id.get(&id) else { return };
        let Some(block) = self.live.get(&addr).copied() else { return };
        self.launch(self.touch, addr, block, true);
        if let Some(b) = self.live.get_mut(&addr) {
            b.generation += 1;
        }
        self.report.touches += 1;
    }

    fn verify_block(&mut self, addr: u64, block: Live) {
        self.launch(self.verify, addr, block, true);
        self.report.blocks_verified += 1;
    }

    fn launch(
        &mut self,
        f: cudarc::driver::sys::CUfunction,
        addr: u64,
        block: Live,
        with_counters: bool,
    ) {
        if self.error.is_some() {
            return;
        }
        let words = block.size.div_ceil(8);
        let grid = words.div_ceil(u64::from(THREADS_PER_BLOCK)).clamp(1, MAX_GRID) as u32;
        let mut base = addr;
        let mut nbytes = block.size;
        let mut id = block.id.0;
        let mut generation = block.generation;
        let mut counters = self.counters.ptr;
        let mut params: Vec<*mut c_void> = vec![
            (&mut base as *mut u64).cast(),
            (&mut nbytes as *mut u64).cast(),
            (&mut id as *mut u64).cast(),
            (&mut generation as *mut u32).cast(),
        ];
        if with_counters {
            params.push((&mut counters as *mut u64).cast());
        }
        // SAFETY: the parameters point at live locals of the kernels' exact parameter types
        // (unsigned char*, u64, u64, u32[, u64*]), in order; `base` is a block of `nbytes`
        // inside memory the device holds mapped (the policy handed it out and the release hook
        // verifies before memory goes back); `counters` is our own 40-byte allocation.
        let result = unsafe { driver::launch(&self.gpu, f, grid, THREADS_PER_BLOCK, &mut params) };
        if let Err(e) = result {
            self.error = Some(e);
        }
    }
}

/// NVRTC: CUDA C to a CUBIN for this GPU's architecture.
fn compile(gpu: &Gpu) -> Result<Vec<u8>, CudaError> {
    if !driver::nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let (major, minor) = gpu.compute_capability;
    let src = CString::new(KERNEL_SOURCE).map_err(|_| CudaError::Compile {
        stage: "source",
        log: "kernels/patterns.cu contains a NUL byte".into(),
    })?;
    let prog = nvrtc::result::create_program(&src, Some(c"patterns.cu"))
        .map_err(|e| CudaError::Compile { stage: "create", log: format!("{e:?}") })?;
    let prog = Program(prog);
    let arch = format!("--gpu-architecture=sm_{major}{minor}");
    let options = [arch.as_str(), "--std=c++17"];
    // SAFETY: `prog` is a live program created above, destroyed only by `Program`'s Drop.
    if let Err(e) = unsafe { nvrtc::result::compile_program(prog.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { nvrtc::result::get_program_log(prog.0) }
            .map(|raw| {
                // SAFETY: NVRTC NUL-terminates the log it returns.
                unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().into_owned()
            })
            .unwrap_or_default();
        return Err(CudaError::Compile { stage: "compile", log: format!("{e:?}: {log}") });
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; `size` is a live local.
    let r = unsafe { nvrtc::sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    nvrtc_check("nvrtcGetCUBINSize", r)?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    let r = unsafe { nvrtc::sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) };
    nvrtc_check("nvrtcGetCUBIN", r)?;
    Ok(cubin)
}

fn nvrtc_check(stage: &'static str, r: nvrtc::sys::nvrtcResult) -> Result<(), CudaError> {
    match r {
        nvrtc::sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        other => Err(CudaError::Compile { stage, log: format!("{other:?}") }),
    }
}

/// An NVRTC program, destroyed by `Drop`.
struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed once, here.
        unsafe {
            let _ = nvrtc::result::destroy_program(self.0);
        }
    }
}
