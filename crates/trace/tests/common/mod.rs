//! Helpers shared by the integration tests: scratch directories, hand-built snapshots, and
//! trace comparison (core's `Trace` has no `PartialEq` on purpose).
#![allow(dead_code)]

use allocsim_core::Trace;
use allocsim_trace::pickle::{self, Value};
use std::path::{Path, PathBuf};

/// The bundled real traces.
pub fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/pytorch-2.11-h100")
}

/// Every bundled PyTorch snapshot.
pub fn real_traces() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"] {
        let dir = traces_dir().join("..").join(dir);
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.to_string_lossy().ends_with(".pickle.gz") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    assert!(paths.len() >= 13, "{paths:?}");
    paths
}

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// A fresh empty directory under the system temp dir, removed with what it holds when the
/// guard is dropped.
pub fn scratch(name: &str) -> Scratch {
    let prefix = format!("allocsim-trace-{name}-");
    Scratch(tempfile::Builder::new().prefix(&prefix).tempdir().unwrap())
}

/// A [`scratch`] directory.
pub struct Scratch(tempfile::TempDir);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

impl Scratch {
    /// `name` in the directory, which lives as long as the path.
    pub fn file(self, name: &str) -> ScratchFile {
        let path = self.0.path().join(name);
        ScratchFile { path, _dir: self }
    }
}

/// A path in a [`Scratch`] directory that keeps the directory.
pub struct ScratchFile {
    path: PathBuf,
    _dir: Scratch,
}

impl std::ops::Deref for ScratchFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchFile {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// A trace entry as PyTorch writes it (without time and metadata).
pub fn entry(action: &str, addr: i64, size: i64, stream: i64) -> Value {
    let addr_key = if action == "oom" { "device_free" } else { "addr" };
    Value::str_dict([
        ("action", Value::str(action)),
        (addr_key, Value::Int(addr)),
        ("size", Value::Int(size)),
        ("stream", Value::Int(stream)),
    ])
}

/// A block of a `segments` entry.
pub fn block(address: i64, size: i64, requested: i64, state: &str) -> Value {
    Value::str_dict([
        ("address", Value::Int(address)),
        ("size", Value::Int(size)),
        ("requested_size", Value::Int(requested)),
        ("state", Value::str(state)),
    ])
}

pub fn segment(address: i64, stream: i64, blocks: Vec<Value>) -> Value {
    let total: i64 = blocks.iter().map(|b| b.get("size").unwrap().as_int().unwrap()).sum();
    Value::str_dict([
        ("device", Value::Int(0)),
        ("address", Value::Int(address)),
        ("total_size", Value::Int(total)),
        ("stream", Value::Int(stream)),
        ("blocks", Value::list(blocks)),
    ])
}

/// A snapshot dict with one device's trace.
pub fn snapshot(entries: Vec<Value>, segments: Vec<Value>, conf: &str) -> Value {
    Value::str_dict([
        ("segments", Value::list(segments)),
        ("device_traces", Value::list(vec![Value::list(entries)])),
        ("allocator_settings", Value::str_dict([("PYTORCH_CUDA_ALLOC_CONF", Value::str(conf))])),
        ("external_annotations", Value::list(Vec::new())),
    ])
}

/// Pickle `value` into `dir/name`.
pub fn write_pickle(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pickle::to_vec(value).unwrap()).unwrap();
    path
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

pub fn assert_same(a: &Trace, b: &Trace) {
    assert_eq!(a.meta, b.meta, "meta");
    assert_eq!(a.ops.len(), b.ops.len(), "op count");
    assert_eq!(a.ops, b.ops, "ops");
    assert_eq!(a.recorded, b.recorded, "recorded");
    assert_eq!(a.stacks, b.stacks, "stacks");
    assert_eq!(a.op_stacks, b.op_stacks, "op_stacks");
    assert_eq!(a.warnings, b.warnings, "warnings");
}

/// What the native format keeps of a trace: all but the version of the library that recorded
/// it (`TraceMeta::recorded_with`), which its schema has no place for.
pub fn native_keeps(mut t: Trace) -> Trace {
    t.meta.recorded_with = None;
    t
}
