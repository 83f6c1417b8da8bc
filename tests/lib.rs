//! Helpers for the workspace-level integration tests in `tests.rs`.

use std::path::PathBuf;

/// The bundled real traces (PyTorch snapshots with their recorded statistics): the ten shared
/// recordings and the three held-out ones.
pub fn bundled_traces() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut traces = Vec::new();
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra"] {
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
