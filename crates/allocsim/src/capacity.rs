//! `allocsim capacity TRACE`: the smallest free memory the recorded program needs, and
//! `allocsim advise TRACE`: the settings people try, ranked.

use crate::output::{bytes, outln, parse_size};
use allocsim_core::text::quoted;
use allocsim_core::Trace;
use allocsim_run::{
    capacity, capacity_of, run_trace, Capacity, CapacityOptions, DeviceChoice, RunOptions, Runs,
};
use rayon::prelude::*;
use serde_json::json;

pub use crate::capacity_model::outside_bytes;
use crate::capacity_model::{capacity_json, options, JITTERS};
use std::path::PathBuf;

/// What both commands take besides the trace.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Memory the run takes outside the caching allocator (CUDA context growth, lazily loaded
    /// kernels, library workspaces), as bytes or `256MiB`. Default: the sidecar's
    /// `meta.outside_allocator_bytes` (recorded by validation/fit.py), else 246 MiB, measured
    /// on an H100 with PyTorch 2.11 (docs/capacity.md).
    #[arg(long, value_parser = parse_size)]
    pub outside: Option<u64>,
}

impl ModelArgs {
    /// The outside memory, and where the figure came from.
    fn outside(&self, trace: &Trace) -> (u64, &'static str) {
        outside_bytes(self.outside, trace)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The trace (any format `replay` reads); or a job of per-rank traces: a folder of them,
    /// a pattern (`run/rank*.pickle.gz`), or several paths. A job answers per rank and for
    /// the job: the rank that needs the most free memory decides.
    pub trace: PathBuf,
    /// Further ranks' traces of the job.
    pub more: Vec<PathBuf>,
    /// Allocator settings in the policy's syntax (for pytorch: a PYTORCH_CUDA_ALLOC_CONF
    /// string). Default: the trace's own.
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// The policy.
    #[arg(long, default_value = "pytorch")]
    pub policy: String,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: &Args, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        let outs = job.each(|r, cx| {
            run(&Args { trace: r.path.clone(), more: Vec::new(), ..args.clone() }, cx)
        })?;
        return crate::per_rank::capacity(&job, outs);
    }
    // A snapshot's ops are held packed and replayed from there (the offline policy is planned
    // from the whole trace): its memory grows with the distinct stacks, not the entries.
    let packs = cx.preloaded(&args.trace).is_none()
        && crate::input::is_snapshot(&args.trace)
        && args.policy != allocsim_run::OFFLINE;
    let (trace, packed) = match packs {
        true => {
            let read = crate::input::read_snapshot_packed(&args.trace, cx, false)?;
            let packed = read.packed.map(|ops| (ops, read.recorded_len));
            (std::borrow::Cow::Owned(read.trace), packed)
        }
        false => (cx.trace(&args.trace)?, None),
    };
    let runs = match &packed {
        Some((ops, recorded_len)) => {
            Runs::Packed { head: &trace, ops, recorded_len: *recorded_len }
        }
        None => Runs::Whole(&trace),
    };
    let (outside, source) = args.model.outside(&trace);
    let conf = args.alloc_conf.clone();
    // The trace's own settings are PyTorch's, and apply to the PyTorch policy only.
    let own = trace.meta.alloc_conf.clone().filter(|_| args.policy == "pytorch");
    let shown_conf = conf.clone().or(own).unwrap_or_default();
    let c = capacity_of(runs, &options(&args.policy, conf, outside, &trace))?;
    let mut j = capacity_json(&c);
    j["trace"] = json!(args.trace.display().to_string());
    j["policy"] = json!(args.policy);
    j["alloc_conf"] = json!(shown_conf);
    j["outside_allocator_source"] = json!(source);
    let why = c.capacity_bytes.is_none().then(|| {
        let whole = packed
            .as_ref()
            .map(|(ops, _)| Trace { ops: ops.to_vec(), ..trace.clone().into_owned() });
        why_not(whole.as_ref().unwrap_or(&trace), outside, c.searched_up_to_bytes)
    });
    j["does_not_fit_because"] = json!(why);
    let mut out = String::new();
    outln!(out, "allocsim capacity {}", args.trace.display());
    outln!(out, "  policy: {} (settings {})", args.policy, quoted(&shown_conf));
    match c.capacity_bytes {
        Some(p) => {
            outln!(out, "  needs free at start: {}", bytes(p));
            outln!(
                out,
                "  band: [{}, {}]",
                c.low_bytes.map_or("-".into(), bytes),
                c.high_bytes.map_or("more than the device".into(), bytes)
            );
        }
        None => {
            outln!(out, "  does not fit in {} free", bytes(c.searched_up_to_bytes));
            outln!(out, "  why: {}", why.as_deref().unwrap_or_default());
        }
    }
    outln!(out, "  of which outside the allocator: {} ({source})", bytes(outside));
    if c.floor_bytes > 0 {
        outln!(
            out,
            "  and never handed out by the driver: {} (measured on an H200: docs/capacity.md)",
            bytes(c.floor_bytes)
        );
    }
    outln!(
        out,
        "  (free at start: what torch.cuda.mem_get_info() reports once the CUDA context exists;"
    );
    outln!(out, "   the point: segments where the recording had them, else by the driver's rule;");
    outln!(
        out,
        "   the band: the spread over that and {} other address placements, widened below by 0.35 % of",
        JITTERS
    );
    outln!(out, "   the point, as much as real runs under other chunk orders needed less;");
    if c.outside_profiled {
        outln!(out, "   the outside memory taken step by step, as the sidecar profiles it:");
    } else {
        outln!(
            out,
            "   above by {} for outside memory taken late beside the allocator's peak,",
            bytes(allocsim_run::TRANSIENT_OUTSIDE_BYTES)
        );
        outln!(out, "   no further than what the run takes unconstrained:");
    }
    outln!(out, "   docs/capacity.md)");
    Ok(crate::Output::both(j, out))
}

/// Why a run fits in no free memory the search tried (`searched`, the device's): a request
/// larger than that alone, more bytes alive at once, or the policy's own layout.
fn why_not(trace: &Trace, outside: u64, searched: u64) -> String {
    let largest = (trace.ops.iter())
        .filter_map(|op| match *op {
            allocsim_core::Op::Alloc { size, .. } | allocsim_core::Op::AllocAt { size, .. } => {
                Some(size)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let room = searched.saturating_sub(outside);
    let peak = allocsim_bound::lower_bound(&allocsim_bound::lifetimes(trace));
    if largest > room {
        format!(
            "one request alone asks for {}, more than the {} left beside the memory outside \
             the allocator",
            bytes(largest),
            bytes(room)
        )
    } else if peak > room {
        format!(
            "the bytes alive at once peak at {}, more than the {} left beside the memory \
             outside the allocator",
            bytes(peak),
            bytes(room)
        )
    } else {
        "the policy's own layout (rounding, splits, cached blocks) needs more than the \
         device has, though the live bytes alone would fit: `allocsim bound` and `allocsim \
         advise` show how much and which settings need less"
            .to_string()
    }
}

/// The settings people try, in the order the table lists them before ranking.
pub const ADVISE_SETTINGS: [&str; 8] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "max_split_size_mb:128,roundup_power2_divisions:4",
    "expandable_segments:True,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.8,max_split_size_mb:128",
];

/// Jittered placements per setting in `advise` (`capacity` takes more): the band is coarser,
/// the eight settings take a second.
const ADVISE_JITTERS: u32 = 3;

#[derive(Debug, Clone, clap::Args)]
pub struct AdviseArgs {
    /// The trace (a PyTorch recording; any format `replay` reads); or a job of per-rank
    /// traces: a folder of them, a pattern (`run/rank*.pickle.gz`), or several paths. A job
    /// fits a setting when every rank fits: the settings are ranked by what the rank that
    /// needs the most needs.
    pub trace: PathBuf,
    /// Further ranks' traces of the job.
    pub more: Vec<PathBuf>,
    /// Free memory on the card you want to run on, at the start (bytes, or `40GiB`, `40GB`,
    /// `4e10`): OOMs are counted there. Default: the recording's own.
    #[arg(long, value_parser = parse_size)]
    pub device_free: Option<u64>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One setting's row.
#[derive(Debug)]
pub struct Row {
    pub conf: &'static str,
    pub capacity: Capacity,
    pub peak_reserved: u64,
    pub fragmentation: f64,
    pub ooms: usize,
}

/// Every setting of [`ADVISE_SETTINGS`], ranked: least memory needed first, a setting that
/// does not fit at all last. OOMs are counted on `device_free` (default: the recording's).
pub fn advice(trace: &Trace, outside: u64, device_free: Option<u64>) -> anyhow::Result<Vec<Row>> {
    let mut rows = ADVISE_SETTINGS
        .par_iter()
        .map(|conf| advise_row(trace, conf, outside, device_free))
        .collect::<anyhow::Result<Vec<Row>>>()?;
    rows.sort_by_key(|r| (r.capacity.capacity_bytes.unwrap_or(u64::MAX), r.peak_reserved));
    Ok(rows)
}

fn advise_row(
    trace: &Trace,
    conf: &'static str,
    outside: u64,
    device_free: Option<u64>,
) -> anyhow::Result<Row> {
    let run = RunOptions {
        policy: "pytorch".to_string(),
        alloc_conf: Some(conf.to_string()),
        device: DeviceChoice::Sim,
        device_free_bytes: device_free.map(|f| f.saturating_sub(outside)),
        ..RunOptions::default()
    };
    let report = run_trace(trace, &run, &mut [], |_| {})?;
    let opts = CapacityOptions {
        run: RunOptions { device_free_bytes: None, ..run },
        outside_bytes: outside,
        floor_bytes: crate::capacity_model::floor_bytes(trace),
        jitters: ADVISE_JITTERS,
    };
    let peak_reserved = report.stats.reserved_bytes.all.peak.max(0) as u64;
    let peak_allocated = report.stats.allocated_bytes.all.peak.max(0) as u64;
    Ok(Row {
        conf,
        capacity: capacity(trace, &opts)?,
        peak_reserved,
        fragmentation: 1.0 - peak_allocated as f64 / peak_reserved.max(1) as f64,
        ooms: report.metrics.ooms.len(),
    })
}

pub fn advise(args: &AdviseArgs, cx: &crate::Context) -> anyhow::Result<crate::Output> {
    if let Some(paths) = crate::job::paths(&args.trace, &args.more)? {
        let job = crate::job::load(&paths, cx)?;
        let outs = job.each(|r, cx| {
            advise(&AdviseArgs { trace: r.path.clone(), more: Vec::new(), ..args.clone() }, cx)
        })?;
        return crate::per_rank::advise(&job, outs);
    }
    let trace = cx.trace(&args.trace)?;
    let (outside, source) = args.model.outside(&trace);
    let rows = advice(&trace, outside, args.device_free)?;
    let device_free = args.device_free.or(trace.meta.device_free_bytes);
    // How far each setting's peak is above the bound (`allocsim bound`'s cheap part: its
    // offline placement would take longer than the eight settings' runs).
    let bound = allocsim_bound::bound_bytes(&trace);
    let headroom = |peak_reserved: u64| peak_reserved as i64 - bound as i64;
    let json_rows: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut j = capacity_json(&r.capacity);
            j["rank"] = json!(i + 1);
            j["PYTORCH_CUDA_ALLOC_CONF"] = json!(r.conf);
            j["peak_reserved_bytes"] = json!(r.peak_reserved);
            j["fragmentation_at_peak"] = json!(r.fragmentation);
            j["ooms_on_device"] = json!(r.ooms);
            j["headroom_over_bound_bytes"] = json!(headroom(r.peak_reserved));
            j
        })
        .collect();
    let j = json!({
        "trace": args.trace.display().to_string(),
        "device_free_bytes": device_free,
        "outside_allocator_bytes": outside,
        "outside_allocator_source": source,
        "bound_bytes": bound,
        "settings": json_rows,
    });
    let mut out = String::new();
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let opt_gib = |b: Option<u64>| b.map_or("-".to_string(), gib);
    outln!(out, "allocsim advise {}", args.trace.display());
    outln!(
        out,
        "  OOMs counted with {} free at start; outside the allocator: {} ({source})",
        device_free.map_or("the recording's memory".to_string(), |b| format!("{} GiB", gib(b))),
        bytes(outside)
    );
    outln!(
        out,
        "{:>4}  {:>12}  {:>22}  {:>5}  {:>6}  {:>8}  PYTORCH_CUDA_ALLOC_CONF",
        "rank",
        "peak reserved",
        "needs GiB [band]",
        "OOMs",
        "frag",
        "headroom"
    );
    for (i, r) in rows.iter().enumerate() {
        let c = &r.capacity;
        let need = match c.capacity_bytes {
            Some(p) => format!("{} [{}, {}]", gib(p), opt_gib(c.low_bytes), opt_gib(c.high_bytes)),
            None => "does not fit".to_string(),
        };
        let conf = crate::output::conf_label(r.conf);
        let share = 100.0 * headroom(r.peak_reserved) as f64 / r.peak_reserved.max(1) as f64;
        let share = format!("{share:.1}%");
        outln!(
            out,
            "{:>4}  {:>9} GiB  {:>22}  {:>5}  {:>5.1}%  {share:>8}  {conf}",
            i + 1,
            gib(r.peak_reserved),
            need,
            r.ooms,
            100.0 * r.fragmentation
        );
    }
    outln!(out, "  needs: smallest free memory at start without an OOM (docs/capacity.md);");
    outln!(out, "  frag: 1 - peak allocated / peak reserved; headroom: the share of peak reserved");
    outln!(out, "  above the most bytes live at once, in whole pages (`allocsim bound`). Replays");
    outln!(out, "  the recorded ops under each setting: a program that frees in an order that");
    outln!(out, "  depends on addresses may differ.");
    Ok(crate::Output::both(j, out))
}
