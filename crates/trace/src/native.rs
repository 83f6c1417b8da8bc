//! allocsim's own format: everything a `Trace` holds, losslessly, two ways.
//!
//! - `.allocsim`: `b"ALLOCSIM"`, a little-endian `u32` version, then bincode 2 (standard
//!   config) of [`NativeFile`]: compact and fast for large traces.
//! - `.allocsim.json`: the same [`NativeFile`] as JSON, for people and other tools.
//!
//! Core types are deliberately not serde (so a file format can change without touching the
//! vocabulary every policy is written in): the schema is this module's mirror structs, and the
//! version number changes when they do. The stored `meta.source_format` is kept as written, so
//! a snapshot converted to native still says where it came from.

use crate::error::TraceError;
use allocsim_core::{
    AllocId, Op, RecordedEvent, RecordedKind, Stack, StackFrame, StreamId, Trace, TraceMeta,
};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"ALLOCSIM";
pub const VERSION: u32 = 1;
pub const FORMAT_NAME: &str = "allocsim";
/// `source_format` of a native file that does not name its origin.
pub const SOURCE_FORMAT: &str = "allocsim-native";

/// Strings in a binary file may claim at most this many bytes in all, so a corrupt length
/// cannot make bincode allocate without bound.
const MAX_STRING_BYTES: usize = 1 << 30;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_STRING_BYTES>()
}

/// The on-disk schema, version 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeFile {
    pub format: String,
    pub version: u32,
    pub meta: NativeMeta,
    pub ops: Vec<NativeOp>,
    pub recorded: Vec<NativeRecorded>,
    pub stacks: Vec<Vec<NativeFrame>>,
    pub op_stacks: Vec<(u64, u32)>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeMeta {
    pub source_format: String,
    pub alloc_conf: Option<String>,
    pub memory_fraction: Option<f64>,
    pub device_total_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    pub expected_stats: Option<Vec<(String, i64)>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeOp {
    Alloc { id: u64, size: u64, stream: u64 },
    FreeRequested { id: u64 },
    FreeCompleted { id: u64 },
    RecordStream { id: u64, stream: u64 },
    EmptyCache,
    SetMemoryFraction { fraction: f64 },
    SetAllocatorSettings { conf: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeKind {
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Alloc,
    FreeRequested,
    FreeCompleted,
    Oom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeRecorded {
    pub op: u64,
    pub kind: NativeKind,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFrame {
    pub name: String,
    pub filename: String,
    pub line: u32,
}

impl NativeFile {
    pub fn from_trace(t: &Trace) -> NativeFile {
        let m = &t.meta;
        NativeFile {
            format: FORMAT_NAME.to_string(),
            version: VERSION,
            meta: NativeMeta {
                source_format: m.source_format.clone(),
                alloc_conf: m.alloc_conf.clone(),
                memory_fraction: m.memory_fraction,
                device_total_bytes: m.device_total_bytes,
                device_free_bytes: m.device_free_bytes,
                expected_stats: m.expected_stats.clone(),
            },
            ops: t.ops.iter().map(op_out).collect(),
            recorded: t.recorded.iter().map(recorded_out).collect(),
            stacks: t.stacks.iter().map(|s| s.frames.iter().map(frame_out).collect()).collect(),
            op_stacks: t.op_stacks.clone(),
            warnings: t.warnings.clone(),
        }
    }

    /// The trace, after checking that every index points somewhere.
    pub fn into_trace(self) -> Result<Trace, String> {
        let ops = self.ops.len() as u64;
        if let Some((i, r)) = self.recorded.iter().enumerate().find(|(_, r)| r.op >= ops) {
            return Err(format!("recorded[{i}].op is {} but there are {ops} ops", r.op));
        }
        let stacks = self.stacks.len() as u64;
        for (i, &(op, s)) in self.op_stacks.iter().enumerate() {
            if op >= ops || u64::from(s) >= stacks {
                return Err(format!(
                    "op_stacks[{i}] = ({op}, {s}) but there are {ops} ops and {stacks} stacks"
                ));
            }
        }
        let m = self.meta;
        let source_format =
            if m.source_format.is_empty() { SOURCE_FORMAT.to_string() } else { m.source_format };
        Ok(Trace {
            meta: TraceMeta {
                source_format,
                alloc_conf: m.alloc_conf,
                memory_fraction: m.memory_fraction,
                device_total_bytes: m.device_total_bytes,
                device_free_bytes: m.device_free_bytes,
                expected_stats: m.expected_stats,
            },
            ops: self.ops.into_iter().map(op_in).collect(),
            recorded: self.recorded.into_iter().map(recorded_in).collect(),
            stacks: self
                .stacks
                .into_iter()
                .map(|frames| Stack { frames: frames.into_iter().map(frame_in).collect() })
                .collect(),
            op_stacks: self.op_stacks,
            warnings: self.warnings,
        })
    }
}

fn op_out(op: &Op) -> NativeOp {
    match op {
        Op::Alloc { id, size, stream } => {
            NativeOp::Alloc { id: id.0, size: *size, stream: stream.0 }
        }
        Op::FreeRequested { id } => NativeOp::FreeRequested { id: id.0 },
        Op::FreeCompleted { id } => NativeOp::FreeCompleted { id: id.0 },
        Op::RecordStream { id, stream } => NativeOp::RecordStream { id: id.0, stream: stream.0 },
        Op::EmptyCache => NativeOp::EmptyCache,
        Op::SetMemoryFraction { fraction } => NativeOp::SetMemoryFraction { fraction: *fraction },
        Op::SetAllocatorSettings { conf } => NativeOp::SetAllocatorSettings { conf: conf.clone() },
    }
}

fn op_in(op: NativeOp) -> Op {
    match op {
        NativeOp::Alloc { id, size, stream } => {
            Op::Alloc { id: AllocId(id), size, stream: StreamId(stream) }
        }
        NativeOp::FreeRequested { id } => Op::FreeRequested { id: AllocId(id) },
        NativeOp::FreeCompleted { id } => Op::FreeCompleted { id: AllocId(id) },
        NativeOp::RecordStream { id, stream } => {
            Op::RecordStream { id: AllocId(id), stream: StreamId(stream) }
        }
        NativeOp::EmptyCache => Op::EmptyCache,
        NativeOp::SetMemoryFraction { fraction } => Op::SetMemoryFraction { fraction },
        NativeOp::SetAllocatorSettings { conf } => Op::SetAllocatorSettings { conf },
    }
}

fn recorded_out(r: &RecordedEvent) -> NativeRecorded {
    let kind = match r.kind {
        RecordedKind::SegmentAlloc => NativeKind::SegmentAlloc,
        RecordedKind::SegmentFree => NativeKind::SegmentFree,
        RecordedKind::SegmentMap => NativeKind::SegmentMap,
        RecordedKind::SegmentUnmap => NativeKind::SegmentUnmap,
        RecordedKind::Alloc => NativeKind::Alloc,
        RecordedKind::FreeRequested => NativeKind::FreeRequested,
        RecordedKind::FreeCompleted => NativeKind::FreeCompleted,
        RecordedKind::Oom => NativeKind::Oom,
    };
    NativeRecorded { op: r.op, kind, addr: r.addr, size: r.size, stream: r.stream.0 }
}

fn recorded_in(r: NativeRecorded) -> RecordedEvent {
    let kind = match r.kind {
        NativeKind::SegmentAlloc => RecordedKind::SegmentAlloc,
        NativeKind::SegmentFree => RecordedKind::SegmentFree,
        NativeKind::SegmentMap => RecordedKind::SegmentMap,
        NativeKind::SegmentUnmap => RecordedKind::SegmentUnmap,
        NativeKind::Alloc => RecordedKind::Alloc,
        NativeKind::FreeRequested => RecordedKind::FreeRequested,
        NativeKind::FreeCompleted => RecordedKind::FreeCompleted,
        NativeKind::Oom => RecordedKind::Oom,
    };
    RecordedEvent { op: r.op, kind, addr: r.addr, size: r.size, stream: StreamId(r.stream) }
}

fn frame_out(f: &StackFrame) -> NativeFrame {
    NativeFrame { name: f.name.clone(), filename: f.filename.clone(), line: f.line }
}

fn frame_in(f: NativeFrame) -> StackFrame {
    StackFrame { name: f.name, filename: f.filename, line: f.line }
}

fn native_err(path: &Path, message: impl Into<String>) -> TraceError {
    TraceError::Native { path: path.to_path_buf(), message: message.into() }
}

/// Write the binary form.
pub fn write_native<W: Write>(trace: &Trace, mut out: W, path: &Path) -> Result<(), TraceError> {
    out.write_all(MAGIC).map_err(|e| TraceError::io(path, e))?;
    out.write_all(&VERSION.to_le_bytes()).map_err(|e| TraceError::io(path, e))?;
    bincode::serde::encode_into_std_write(
        NativeFile::from_trace(trace),
        &mut out,
        bincode_config(),
    )
    .map_err(|e| native_err(path, format!("encoding: {e}")))?;
    Ok(())
}

/// Read the binary form.
pub fn read_native(path: &Path) -> Result<Trace, TraceError> {
    let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
    read_native_from(BufReader::with_capacity(256 * 1024, file), path)
}

/// Read the binary form from any reader; `path` names it in errors.
pub fn read_native_from<R: Read>(mut input: R, path: &Path) -> Result<Trace, TraceError> {
    let mut header = Vec::with_capacity(12);
    (&mut input).take(12).read_to_end(&mut header).map_err(|e| TraceError::io(path, e))?;
    if header.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    if header.len() < 12 || &header[..8] != MAGIC {
        return Err(native_err(path, "not an allocsim file (no ALLOCSIM magic at the start)"));
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version != VERSION {
        return Err(native_err(
            path,
            format!("unsupported allocsim format version {version} (this build reads {VERSION})"),
        ));
    }
    let file: NativeFile = bincode::serde::decode_from_std_read(&mut input, bincode_config())
        .map_err(|e| native_err(path, format!("corrupt or truncated: {e}")))?;
    file.into_trace().map_err(|m| native_err(path, m))
}

/// Write the JSON form.
pub fn write_native_json<W: Write>(trace: &Trace, out: W, path: &Path) -> Result<(), TraceError> {
    serde_json::to_writer_pretty(out, &NativeFile::from_trace(trace))
        .map_err(|error| TraceError::Json { path: path.to_path_buf(), error })
}

/// Just the header fields, read first so a wrong file gets a clear message.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u32>,
}

/// Read the JSON form.
pub fn read_native_json(path: &Path) -> Result<Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    let json_err = |error| TraceError::Json { path: path.to_path_buf(), error };
    let header: Header = serde_json::from_slice(&bytes).map_err(json_err)?;
    if header.format.as_deref() != Some(FORMAT_NAME) {
        return Err(native_err(path, "not an allocsim JSON trace (no \"format\": \"allocsim\")"));
    }
    if header.version != Some(VERSION) {
        let v = header.version.map_or("none".to_string(), |v| v.to_string());
        return Err(native_err(
            path,
            format!("unsupported allocsim format version {v} (this build reads {VERSION})"),
        ));
    }
    let file: NativeFile = serde_json::from_slice(&bytes).map_err(json_err)?;
    file.into_trace().map_err(|m| native_err(path, m))
}
