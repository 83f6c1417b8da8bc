//! `allocsim._allocsim.Session`: a live session ([`allocsim_run::Session`]) on the simulated
//! device, for a program that makes its requests one by one (the estimator's storages).

use allocsim_core::{MemPoolId, Stack, StackFrame};
use allocsim_sim::{SimConfig, SimDevice};
use pyo3::exceptions::{PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;

/// One policy on a simulated device of `total_bytes`, `free_bytes` of them free at the start.
/// `malloc` raises `MemoryError` with PyTorch's out-of-memory message (the policy's figures)
/// when the policy cannot serve a request.
#[derive(Debug)]
#[pyclass(module = "allocsim._allocsim", unsendable)]
pub struct Session {
    inner: allocsim_run::Session,
    policy: String,
    conf: String,
    /// Each op's stack, when given, as indices into `stacks` (interned).
    stacks: Vec<Stack>,
    stack_ids: HashMap<Stack, u32>,
    op_stacks: Vec<(u64, u32)>,
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (total_bytes, free_bytes=None, policy="pytorch", alloc_conf="", record=true))]
    fn new(
        total_bytes: u64,
        free_bytes: Option<u64>,
        policy: &str,
        alloc_conf: &str,
        record: bool,
    ) -> PyResult<Session> {
        let free_bytes = free_bytes.unwrap_or(total_bytes);
        if free_bytes > total_bytes {
            return Err(PyValueError::new_err(format!(
                "free memory ({free_bytes} bytes) is more than the card's total ({total_bytes})"
            )));
        }
        let device = SimDevice::new(SimConfig { total_bytes, free_bytes, ..SimConfig::default() });
        let inner = allocsim_run::Session::new(policy, alloc_conf, Box::new(device), 0, record)
            .map_err(PyValueError::new_err)?;
        Ok(Session {
            inner,
            policy: policy.into(),
            conf: alloc_conf.into(),
            stacks: Vec::new(),
            stack_ids: HashMap::new(),
            op_stacks: Vec::new(),
        })
    }

    /// The address of a new block of `size` bytes on `stream`, in `pool` (a MemPool id pair,
    /// `(0, 0)` for the common pools). `stack`: the Python frames that asked, innermost first,
    /// as (filename, line, name), kept for the snapshot.
    #[pyo3(signature = (size, stream=0, pool=(0, 0), stack=None))]
    fn malloc(
        &mut self,
        size: u64,
        stream: u64,
        pool: (u64, u64),
        stack: Option<Vec<(String, u32, String)>>,
    ) -> PyResult<u64> {
        let ptr = self
            .inner
            .malloc(size, stream, MemPoolId(pool.0, pool.1))
            .map_err(PyMemoryError::new_err)?;
        self.keep_stack(stack);
        Ok(ptr)
    }

    /// Frees the block at `ptr`; False for a pointer this session never handed out. `stack`:
    /// the Python frames that freed it, as for `malloc`.
    #[pyo3(signature = (ptr, stack=None))]
    fn free(&mut self, ptr: u64, stack: Option<Vec<(String, u32, String)>>) -> bool {
        if ptr == 0 {
            return true;
        }
        let freed = self.inner.free(ptr).is_some();
        if freed {
            self.keep_stack(stack);
        }
        freed
    }

    fn empty_cache(&mut self) {
        self.inner.empty_cache();
    }

    fn set_memory_fraction(&mut self, fraction: f64) -> PyResult<()> {
        self.inner.set_memory_fraction(fraction).map_err(PyValueError::new_err)
    }

    fn reset_peak_stats(&mut self) {
        self.inner.reset_peak_stats();
    }

    /// `torch.cuda.memory_stats()`: every key under PyTorch's name.
    fn memory_stats(&self) -> Vec<(String, i64)> {
        self.inner.stats().flat().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// `torch.cuda.mem_get_info()`: (free, total) of the simulated device now.
    fn mem_get_info(&self) -> (u64, u64) {
        let m = self.inner.mem_info();
        (m.free_bytes, m.total_bytes)
    }

    /// Blocks handed out and not freed.
    fn live(&self) -> usize {
        self.inner.live()
    }

    /// How many requests were made so far (the op stream's length, when recording).
    fn ops(&self) -> usize {
        self.inner.ops().map_or(0, <[_]>::len)
    }

    /// Why the last request that failed failed.
    fn last_oom(&self) -> Option<String> {
        self.inner.last_oom().map(str::to_string)
    }

    /// Writes the op stream as a trace (`.allocsim`, `.allocsim.json`, ...).
    fn save_recording(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let trace = self.trace()?;
        py.detach(|| allocsim_trace::write_trace(&trace, &path))
            .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Writes a PyTorch snapshot (`.pickle`, `.pickle.gz`): the segments now and every event
    /// so far, with the stacks given to `malloc`.
    fn save_snapshot(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let mut trace = self.trace()?;
        let recorded = std::mem::take(&mut trace.recorded);
        let segments = self.inner.segments();
        let (policy, conf) = (&self.policy, &self.conf);
        py.detach(|| allocsim::write_snapshot(&path, &trace, recorded, &segments, policy, conf))
            .map_err(|e| PyOSError::new_err(format!("{e:#}")))
    }
}

impl Session {
    fn trace(&self) -> PyResult<allocsim_core::Trace> {
        let mut trace = self
            .inner
            .recording("allocsim-estimate")
            .ok_or_else(|| PyValueError::new_err("this session was opened with record=False"))?;
        trace.stacks = self.stacks.clone();
        trace.op_stacks = self.op_stacks.clone();
        Ok(trace)
    }
}

impl Session {
    /// Keeps `frames` as the stack of the op just recorded, interned.
    fn keep_stack(&mut self, frames: Option<Vec<(String, u32, String)>>) {
        let (Some(frames), Some(ops)) = (frames, self.inner.ops()) else {
            return;
        };
        let op = ops.len().saturating_sub(1) as u64;
        let stack = Stack {
            frames: frames
                .into_iter()
                .map(|(filename, line, name)| StackFrame { name, filename, line })
                .collect(),
        };
        let next = self.stacks.len() as u32;
        let id = *self.stack_ids.entry(stack.clone()).or_insert(next);
        if id == next {
            self.stacks.push(stack);
        }
        self.op_stacks.push((op, id));
    }
}
