//! Where every command's input comes from: a trace file (read with the [`Context`]'s
//! options), or a live workload named `workload:NAME?key=value&...`, and the progress bar
//! long runs show. Every command that takes a trace takes it through [`load_trace`].

use crate::Context;
use allocsim_core::Trace;
use anyhow::Context as _;
use std::path::Path;

/// Read a trace file with the context's options ([`allocsim_trace::read_trace_with`]).
fn read_trace(path: &Path, cx: &Context) -> anyhow::Result<Trace> {
    let mut trace = with_read_bar(path, cx.read.clone(), cx.progress, |opts| {
        allocsim_trace::read_trace_with(path, opts)
    })
    .map_err(with_hint)?;
    trace.warnings.extend(version_note(&trace.meta));
    Ok(trace)
}

/// When the recording was made by another PyTorch release than the clone's, the sentence that
/// says so and names the allocator changes between them
/// ([`allocsim_policies::pytorch::versions`]). Every trace read here carries it once among its
/// warnings.
pub fn version_note(meta: &allocsim_core::TraceMeta) -> Option<String> {
    let recorded = meta.recorded_with.as_deref()?;
    allocsim_policies::pytorch::versions::recorded_version_note(recorded)
}

/// Files at least this big get a bar of the bytes read (a snapshot of this size takes a
/// second or more).
const READ_BAR_FROM_BYTES: u64 = 16 << 20;

/// `read(opts)`, with a progress bar on stderr of the bytes of `path` read, when the file is
/// big and stderr a terminal. The bar follows [`allocsim_trace::ReadOptions::bytes_read`] from
/// a thread of its own, woken ten times a second and at the end.
fn with_read_bar<T>(
    path: &Path,
    mut opts: allocsim_trace::ReadOptions,
    progress: bool,
    read: impl FnOnce(&allocsim_trace::ReadOptions) -> T,
) -> T {
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    if !progress || total < READ_BAR_FROM_BYTES || !std::io::stderr().is_terminal() {
        return read(&opts);
    }
    let count = std::sync::Arc::new(AtomicU64::new(0));
    opts.bytes_read = Some(count.clone());
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let ticker = scope.spawn(|| {
            let bar = bytes_bar("read", total);
            while !done.load(Ordering::Relaxed) {
                // A file read twice (the generic reader after the fast one) counts twice.
                bar.set_position(count.load(Ordering::Relaxed) % (total + 1));
                std::thread::park_timeout(std::time::Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        let out = read(&opts);
        done.store(true, Ordering::Relaxed);
        ticker.thread().unpark();
        out
    })
}

/// Read a PyTorch snapshot as the command line says, but with only what a replay reads (no
/// stacks: interning them was a twentieth of the reading; no times; the device events alone
/// of the recording: a 40-byte event an entry, most of the trace's memory; the ops packed, a
/// few bytes each: `Replayed::packed`), replaying it as it is read
/// ([`allocsim_trace::pytorch::read_snapshot_replaying`]).
pub fn read_snapshot_replaying<R>(
    path: &Path,
    cx: &Context,
    replay: impl FnOnce(allocsim_trace::pytorch::Overlap) -> R,
) -> anyhow::Result<allocsim_trace::pytorch::Replayed<R>> {
    let opts = allocsim_trace::ReadOptions { stacks: false, ..packed_reading(cx) };
    read_snapshot_as(path, cx, opts, |opts| {
        allocsim_trace::pytorch::read_snapshot_replaying(path, opts, replay)
    })
}

/// The command line's reading, for a command that reads the ops in order and not the
/// recording's every event: no times, the device events alone, the ops packed past
/// [`allocsim_trace::PACK_OPS_FROM`].
fn packed_reading(cx: &Context) -> allocsim_trace::ReadOptions {
    allocsim_trace::ReadOptions {
        times: false,
        events: false,
        packed_ops: Some(allocsim_trace::PACK_OPS_FROM),
        ..cx.read.clone()
    }
}

/// `read` of the snapshot `path` under `opts`, with a bar of bytes read, the hint for a limit
/// reached and the note of another PyTorch version.
fn read_snapshot_as<R>(
    path: &Path,
    cx: &Context,
    opts: allocsim_trace::ReadOptions,
    read: impl FnOnce(
        &allocsim_trace::ReadOptions,
    ) -> Result<allocsim_trace::pytorch::Replayed<R>, allocsim_trace::TraceError>,
) -> anyhow::Result<allocsim_trace::pytorch::Replayed<R>> {
    let mut read = with_read_bar(path, opts, cx.progress, read).map_err(with_hint)?;
    read.trace.warnings.extend(version_note(&read.trace.meta));
    Ok(read)
}

/// Whether `path` is read as a PyTorch snapshot (by its name).
pub fn is_snapshot(path: &Path) -> bool {
    use allocsim_trace::Format;
    let format = Format::from_path(path);
    matches!(format, Some(Format::PytorchSnapshot | Format::PytorchSnapshotGz))
}

/// Read a PyTorch snapshot as the command line says, for a command that reads its ops in
/// order, once or a few times, and the recording's events only by kind: its ops packed, a few
/// bytes each (`Replayed::packed`); no times, no stack per op (the distinct stacks listed
/// where `stacks`); of the recording, the device events, OOMs and deferred completions, the
/// rest counted (`Replayed::recorded_counts`). Its memory grows with the distinct stacks and
/// the ops' few bytes, not with 40-byte ops and events.
pub fn read_snapshot_packed(
    path: &Path,
    cx: &Context,
    stacks: bool,
) -> anyhow::Result<allocsim_trace::pytorch::Replayed<()>> {
    let opts = allocsim_trace::ReadOptions { stacks, op_stacks: false, ..packed_reading(cx) };
    read_snapshot_as(path, cx, opts, |opts| {
        allocsim_trace::pytorch::read_snapshot_packed(path, opts)
    })
}

/// A reader's error, with what to do about a memory limit reached.
fn with_hint(e: allocsim_trace::TraceError) -> anyhow::Error {
    use allocsim_trace::{pickle::PickleErrorKind, TraceError};
    match &e {
        TraceError::Pickle { error, .. }
            if matches!(error.kind, PickleErrorKind::MemoryLimit(_)) =>
        {
            anyhow::anyhow!(
                "{e} (if the file is trusted, raise the limit: --max-reader-memory, or max_reader_memory= in Python)"
            )
        }
        TraceError::TooBig { .. } => {
            anyhow::anyhow!("{e} (if the file is trusted, raise it: --max-reader-memory, or max_reader_memory= in Python)")
        }
        _ => e.into(),
    }
}

/// The prefix that names a live workload where a trace path is expected.
pub const WORKLOAD_PREFIX: &str = "workload:";

/// Read a trace file, or build the workload a `workload:NAME?key=value&...` argument names.
pub fn load_trace(input: &Path, cx: &Context) -> anyhow::Result<Trace> {
    let text = input.to_string_lossy();
    match text.strip_prefix(WORKLOAD_PREFIX) {
        Some(spec) => allocsim_workloads::trace(spec).with_context(|| {
            format!(
                "building {} (`allocsim workload` lists workloads)",
                allocsim_core::text::excerpt(&text)
            )
        }),
        None => read_trace(input, cx),
    }
}

/// A trace's file name without its format's extension (`gpt2_train` for
/// `traces/gpt2_train.pickle.gz`): how pages and tables name it.
pub fn trace_name(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = [".pickle.gz", ".pickle", ".allocsim.json", ".allocsim", ".csv"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext));
    stem.map_or(name.clone(), str::to_string)
}

/// A progress bar on stderr for runs long enough to want one, when the context draws bars
/// (hidden when not a terminal).
pub fn progress_bar(cx: &Context, label: &str, ops: u64) -> impl FnMut(u64) {
    let bar = (cx.progress && ops >= 500_000).then(|| bar(label, ops, "ops"));
    move |done| {
        if let Some(bar) = &bar {
            bar.set_position(done);
            if done >= ops {
                bar.finish_and_clear();
            }
        }
    }
}

/// A progress bar on stderr: `label`, the bar, `done/total unit`, the rate and the time left,
/// as in `replay  [=====>    ] 3.1M/10.0M ops  24.6M ops/s  ETA 0s`.
pub fn bar(label: &str, total: u64, unit: &'static str) -> indicatif::ProgressBar {
    let style = indicatif::ProgressStyle::with_template(
        "{prefix:>9} [{bar:30}] {human_pos}/{human_len} {unit}  {rate}  ETA {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ")
    .with_key("unit", move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = w.write_str(unit);
    })
    .with_key("rate", move |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = w.write_str(&format!("{}/s", readable(s.per_sec(), unit)));
    });
    let bar = indicatif::ProgressBar::new(total).with_style(style);
    bar.set_prefix(label.to_string());
    bar
}

/// A progress bar on stderr of bytes: `label`, the bar, `done/total`, the rate and the time
/// left, as in `read  [=====>    ] 12.1 MiB/27.0 MiB  19.8 MiB/s  ETA 1s`.
fn bytes_bar(label: &str, total: u64) -> indicatif::ProgressBar {
    let style = indicatif::ProgressStyle::with_template(
        "{prefix:>9} [{bar:30}] {bytes}/{total_bytes}  {bytes_per_sec}  ETA {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    let bar = indicatif::ProgressBar::new(total).with_style(style);
    bar.set_prefix(label.to_string());
    bar
}

/// `24.6M ops`, `3.2k cells`, `0.5 cells`.
fn readable(n: f64, unit: &str) -> String {
    match n {
        n if n >= 1e6 => format!("{:.1}M {unit}", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k {unit}", n / 1e3),
        n => format!("{n:.1} {unit}"),
    }
}

/// The replay a command makes of the trace it read: a policy, its settings, the device's size.
/// Shared by `explain-oom` and `report`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The policy to replay under.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    /// Allocator settings in the policy's syntax. Default: the trace's.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Device memory, total and free at start (bytes, or `40GiB`, `40GB`, `4e10`). Default: the
    /// trace's own device.
    #[arg(long, value_parser = crate::output::parse_size)]
    pub device_total: Option<u64>,
}

impl RunArgs {
    /// The run: the device `auto` picks (the recording's own run follows it).
    pub fn options(&self) -> allocsim_run::RunOptions {
        allocsim_run::RunOptions {
            policy: self.policy.clone(),
            alloc_conf: self.alloc_conf.clone(),
            device: allocsim_run::DeviceChoice::Auto,
            device_total_bytes: self.device_total,
            device_free_bytes: self.device_total,
            ..allocsim_run::RunOptions::default()
        }
    }
}
