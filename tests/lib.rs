//! Helpers for the workspace-level integration tests in `tests.rs`.

use std::path::PathBuf;

/// The bundled real traces (PyTorch snapshots with their recorded statistics): the ten shared
/// lab recordings, four held out from the PyTorch policy's development, and twenty-four
/// recorded the way users record them.
pub fn bundled_traces() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut traces = Vec::new();
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"] {
        let dir = root.join(dir);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        traces.extend(
            entries
                .map(|entry| entry.expect("directory entry").path())
                .filter(|p| p.to_string_lossy().ends_with(".pickle.gz")),
        );
    }
    traces.sort();
    traces
}

/// Statistics of bundled recordings that the recording cannot determine: (trace, key, why).
/// The exactness test lets exactly these differ, and fails when one of them matches, so that
/// the list shrinks as the conversion learns more.
pub const UNDETERMINED_STATS: [(&str, &str, &str); 3] = [
    ("d_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
    ("h_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
    ("s_cudagraphs", "num_sync_all_streams", EMPTY_CACHE_FREEING_NOTHING),
];

/// Why [`UNDETERMINED_STATS`] lists the CUDA graph recordings.
const EMPTY_CACHE_FREEING_NOTHING: &str = "`torch.cuda.graph` calls `empty_cache` before each \
    capture; one that frees no segment counts in num_sync_all_streams but leaves no trace entry";
