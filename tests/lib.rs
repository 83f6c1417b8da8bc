//! Helpers for the workspace-level integration tests in `tests.rs`.

use std::path::PathBuf;

/// The bundled real traces (PyTorch snapshots with their recorded statistics).
pub fn bundled_traces() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces/pytorch-2.11-h100");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    traces.sort();
    traces
}
