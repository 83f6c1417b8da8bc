//! The trace formats: what is written comes back, and what a reader accepts can be replayed.
//!
//! Round trips: the native binary and JSON forms give back every field of a trace; a
//! simulated run exported as a PyTorch snapshot (its events as trace entries) imports back to
//! the same entries. Decoders (the fuzz targets' oracles): any bytes give a trace or an error,
//! never a panic, and an accepted trace survives a round trip through its own format and
//! replays under the checker.

use super::failure::{Failure, Oracle};
use super::run::{checked_run, observed_run};
use allocsim_core::{RecordedEvent, Trace};
use allocsim_replay::Recorder;
use allocsim_trace::{native, pickle, pytorch, read_trace_with, rmm, ReadOptions};
use std::path::Path;

/// Decoders and replays stop here: a fuzzer's input must not make one execution take seconds.
pub const MAX_REPLAY_OPS: usize = 20_000;

const MEMORY: &str = "<memory>";

/// The largest size `allocsim-trace` writes in or reads from a snapshot.
pub const SNAPSHOT_MAX_BYTES: u64 = 1 << 62;

fn fail(policy: &str, message: String) -> Failure {
    Failure::new(Oracle::RoundTrip, policy, None, message)
}

/// The first field where two traces differ, or `Ok`.
pub fn same_trace(a: &Trace, b: &Trace) -> Result<(), String> {
    if a.meta != b.meta {
        return Err(format!("meta: {:?} became {:?}", a.meta, b.meta));
    }
    if let Some(i) = (0..a.ops.len().max(b.ops.len())).find(|&i| a.ops.get(i) != b.ops.get(i)) {
        return Err(format!("op {i}: {:?} became {:?}", a.ops.get(i), b.ops.get(i)));
    }
    if a.recorded != b.recorded {
        return Err("recorded events differ".into());
    }
    if a.stacks != b.stacks || a.op_stacks != b.op_stacks {
        return Err("stacks differ".into());
    }
    if a.warnings != b.warnings {
        return Err(format!("warnings: {:?} became {:?}", a.warnings, b.warnings));
    }
    Ok(())
}

fn native_bytes(trace: &Trace) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    native::write_native(trace, &mut out, Path::new(MEMORY)).map_err(|e| e.to_string())?;
    Ok(out)
}

fn native_json_bytes(trace: &Trace) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    native::write_native_json(trace, &mut out, Path::new(MEMORY)).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Decode the JSON form from memory, as `read_native_json` does from a file.
pub fn read_native_json_bytes(bytes: &[u8]) -> Result<Trace, String> {
    let file: native::NativeFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.format != native::FORMAT_NAME || file.version != native::VERSION {
        return Err("not an allocsim JSON trace of this version".into());
    }
    file.into_trace()
}

/// Native binary and JSON: write, read back, compare every field.
pub fn roundtrip_native(trace: &Trace) -> Result<(), Failure> {
    let bytes = native_bytes(trace).map_err(|e| fail("-", format!("native encode: {e}")))?;
    let back = native::read_native_from(&bytes[..], Path::new(MEMORY))
        .map_err(|e| fail("-", format!("native decode of our own bytes: {e}")))?;
    same_trace(trace, &back).map_err(|e| fail("-", format!("native (bincode) round trip: {e}")))?;
    let json = native_json_bytes(trace).map_err(|e| fail("-", format!("JSON encode: {e}")))?;
    let back = read_native_json_bytes(&json)
        .map_err(|e| fail("-", format!("JSON decode of our own bytes: {e}")))?;
    same_trace(trace, &back).map_err(|e| fail("-", format!("native JSON round trip: {e}")))
}

fn entries(events: &[RecordedEvent]) -> Vec<(&'static str, u64, u64, u64)> {
    events.iter().map(|e| (e.kind.action(), e.addr, e.size, e.stream.0)).collect()
}

/// Run `trace` under `policy`, export the run as a PyTorch snapshot (its events as trace
/// entries), import that snapshot, and compare the entries: our own export must read back.
pub fn roundtrip_snapshot(policy: &str, trace: &Trace) -> Result<(), Failure> {
    let mut recorder = Recorder::default();
    observed_run(policy, trace, &mut recorder)?;
    let run = Trace {
        meta: trace.meta.clone(),
        ops: trace.ops.clone(),
        recorded: recorder.events,
        ..Trace::default()
    };
    let mut bytes = Vec::new();
    if let Err(e) = pytorch::write_snapshot(&run, &mut bytes, false, Path::new(MEMORY)) {
        // A size the format cannot hold (over 2^62) is refused by name: nothing to read back.
        let too_big = run.recorded.iter().any(|r| r.size > SNAPSHOT_MAX_BYTES);
        return if too_big { Ok(()) } else { Err(fail(policy, format!("snapshot export: {e}"))) };
    }
    let root = pickle::from_slice(&bytes)
        .map_err(|e| fail(policy, format!("unpickling our own snapshot: {e}")))?;
    let back = pytorch::snapshot_to_trace(&root, Path::new(MEMORY), true)
        .map_err(|e| fail(policy, format!("importing our own snapshot: {e}")))?;
    let (want, got) = (entries(&run.recorded), entries(&back.recorded));
    if want != got {
        let i = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)).unwrap_or(0);
        return Err(fail(
            policy,
            format!(
                "snapshot round trip: entry {i} was {:?}, reads back as {:?}",
                want.get(i),
                got.get(i)
            ),
        ));
    }
    Ok(())
}

/// Replay a decoded trace under the checker. Settings the policy refuses (a corrupt
/// `alloc_conf`) are a clean error for the user, not a finding.
fn replay_decoded(policy: &str, trace: &Trace) -> Result<(), Failure> {
    if trace.ops.len() > MAX_REPLAY_OPS {
        return Ok(());
    }
    match checked_run(policy, trace) {
        Err(f) if f.oracle != Oracle::Setup => Err(f),
        _ => Ok(()),
    }
}

/// What every decoder's output must survive: its own format's round trip (by `encode` then
/// `decode`), and, when small enough, a replay under every oracle of the checked run.
fn accepted(
    trace: &Trace,
    again: impl Fn(&Trace) -> Result<Trace, String>,
    policy: &str,
) -> Result<(), Failure> {
    let back = again(trace).map_err(|e| fail(policy, format!("re-reading what was read: {e}")))?;
    same_trace(trace, &back)
        .map_err(|e| fail(policy, format!("read, written, read again: {e}")))?;
    roundtrip_native(trace)?;
    replay_decoded(policy, trace)
}

/// Fuzz oracle: native binary bytes.
pub fn decode_native(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    let Ok(trace) = native::read_native_from(bytes, Path::new(MEMORY)) else { return Ok(()) };
    let again = |t: &Trace| {
        let b = native_bytes(t)?;
        native::read_native_from(&b[..], Path::new(MEMORY)).map_err(|e| e.to_string())
    };
    accepted(&trace, again, policy)
}

/// Fuzz oracle: native JSON bytes.
pub fn decode_native_json(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    let Ok(trace) = read_native_json_bytes(bytes) else { return Ok(()) };
    let again = |t: &Trace| read_native_json_bytes(&native_json_bytes(t)?);
    accepted(&trace, again, policy)
}

/// Fuzz oracle: PyTorch snapshot pickle bytes (the safe pickle reader, then the converter).
pub fn decode_snapshot(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    let Ok(root) = pickle::from_slice(bytes) else { return Ok(()) };
    let Ok(trace) = pytorch::snapshot_to_trace(&root, Path::new(MEMORY), true) else {
        return Ok(());
    };
    // A snapshot's own round trip is only exact for recordings; the native one always is.
    roundtrip_native(&trace)?;
    replay_decoded(policy, &trace)
}

/// Fuzz oracle: snapshot bytes as a file, plain and gzipped, read the way the CLI reads it (by
/// path: the record streamer, falling back to the generic reader) and by the generic reader
/// alone. Both must give the same trace, or the same error; an accepted trace then goes on as
/// in [`decode_snapshot`].
pub fn decode_snapshot_file(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let gzipped = gz.write_all(bytes).and_then(|()| gz.finish());
    let gzipped = gzipped.map_err(|e| fail(policy, format!("gzip: {e}")))?;
    read_files(&[("input.pickle", bytes), ("input.pickle.gz", &gzipped)], policy)
}

/// Fuzz oracle: corrupt gzip streams. The bytes are a gzip stream (the corpus holds gzipped
/// snapshots), read as a `.pickle.gz` file as they are; then what of them inflates is
/// gzipped again and damaged as their header's MTIME field (bytes 4 to 6, which no decoder
/// reads) says: from an offset (bytes 4 and 5), cut the stream there, flip bits of the byte
/// there, drop that byte, or append the stream's first bytes up to there as a second member
/// (byte 6's low bits), and read as in [`decode_snapshot_file`].
pub fn decode_snapshot_gzip(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    use std::io::{Read, Write};
    let mut inflated = Vec::new();
    let mut decoder = flate2::read::MultiGzDecoder::new(bytes).take(1 << 20);
    let _ = decoder.read_to_end(&mut inflated);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let gzipped = gz.write_all(&inflated).and_then(|()| gz.finish());
    let mut damaged = gzipped.map_err(|e| fail(policy, format!("gzip: {e}")))?;
    let [a, b, how] = [4, 5, 6].map(|i| bytes.get(i).copied().unwrap_or(0));
    let at = usize::from(u16::from_le_bytes([a, b])) % (damaged.len() + 1);
    match how & 3 {
        0 => damaged.truncate(at),
        1 if at < damaged.len() => damaged[at] ^= how | 1,
        2 if at < damaged.len() => {
            damaged.remove(at);
        }
        _ => {
            let copy = damaged.clone();
            damaged.extend_from_slice(&copy[..at.min(copy.len())]);
        }
    }
    read_files(&[("raw.pickle.gz", bytes), ("damaged.pickle.gz", &damaged)], policy)
}

/// Each `(name, bytes)` written as a file and read by path both ways (the record streamer
/// falling back to the generic reader, and the generic reader alone): the same trace or the
/// same error. The last trace accepted goes on to the native round trip and a replay.
fn read_files(files: &[(&str, &[u8])], policy: &str) -> Result<(), Failure> {
    let dir = std::env::temp_dir().join(format!(
        "allocsim-fuzz-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let io =
        |e: std::io::Error| fail(policy, format!("writing the input to {}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let mut accepted = None;
    for &(name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(io)?;
        let read = |streaming| {
            let opts = ReadOptions { sidecar: false, streaming, ..ReadOptions::default() };
            read_trace_with(&path, &opts).map_err(|e| e.to_string())
        };
        match (read(true), read(false)) {
            (Ok(a), Ok(b)) => {
                same_trace(&b, &a).map_err(|e| {
                    fail(
                        policy,
                        format!("{}: streamed and generic readers differ: {e}", path.display()),
                    )
                })?;
                accepted = Some(a);
            }
            (Err(a), Err(b)) if a == b => {}
            (a, b) => {
                let show = |r: Result<Trace, String>| match r {
                    Ok(_) => "a trace".to_string(),
                    Err(e) => format!("the error {e:?}"),
                };
                let path = path.display();
                let (a, b) = (show(a), show(b));
                return Err(fail(policy, format!("{path}: streamed read gave {a}, generic {b}")));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let Some(trace) = accepted else { return Ok(()) };
    roundtrip_native(&trace)?;
    replay_decoded(policy, &trace)
}

/// Fuzz oracle: RMM `logging_resource_adaptor` CSV bytes.
pub fn decode_rmm(bytes: &[u8], policy: &str) -> Result<(), Failure> {
    let Ok(trace) = rmm::read_rmm_from(bytes, Path::new(MEMORY)) else { return Ok(()) };
    roundtrip_native(&trace)?;
    replay_decoded(policy, &trace)
}
