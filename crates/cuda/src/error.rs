//! Everything that can go wrong talking to the driver, as data.

use cudarc::driver::sys::CUresult;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver found: could not load libcuda.so (is this a machine with an NVIDIA GPU \
         and its driver installed?)"
    )]
    NoDriver,
    /// NVRTC, needed to compile the pattern kernels, could not be loaded.
    #[error(
        "no NVRTC library found: could not load libnvrtc.so, which compiles kernels/patterns.cu \
         at run time; add the CUDA toolkit's lib64 folder (or the nvidia-cuda-nvrtc wheel's lib \
         folder) to LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("CUDA device {ordinal} does not exist: the driver sees {count} device(s)")]
    NoDevice { ordinal: usize, count: i32 },
    /// A driver call returned an error.
    #[error("{call} failed: {name} (CUresult {code})")]
    Driver { call: &'static str, code: i32, name: String },
    #[error("NVRTC could not compile kernels/patterns.cu ({stage}): {log}")]
    Compile { stage: &'static str, log: String },
    /// cudarc panicked (a missing symbol in an old driver, say); the message is the panic's.
    #[error("the CUDA bindings panicked: {0}")]
    Panicked(String),
}

impl CudaError {
    pub(crate) fn driver(call: &'static str, r: CUresult) -> CudaError {
        let name = cudarc::driver::result::DriverError(r)
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{r:?}"));
        CudaError::Driver { call, code: r as i32, name }
    }

    /// True for the driver's out-of-memory refusal.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CudaError::Driver { code, .. } if *code == CUresult::CUDA_ERROR_OUT_OF_MEMORY as i32)
    }
}

/// `Ok` on `CUDA_SUCCESS`, else the error naming `call`.
pub(crate) fn check(call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::driver(call, r))
    }
}
