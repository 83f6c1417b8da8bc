//! Every policy on every bundled real trace, under the independent checker; the PyTorch clone
//! against the recorded runs; determinism; format round trips.

use allocsim_core::Trace;
use allocsim_replay::{EventLog, Observer};
use allocsim_run::{run_trace, DeviceChoice, RunOptions, StartedFrom};
use allocsim_tests::{bundled_traces, UNDETERMINED_STATS};

mod event_logs;

fn read(path: &std::path::Path) -> Trace {
    allocsim_trace::read_trace(path).unwrap_or_else(|e| panic!("{e}"))
}

fn name(path: &std::path::Path) -> String {
    path.file_name().unwrap().to_string_lossy().replace(".pickle.gz", "")
}

#[test]
fn every_policy_replays_every_trace_with_zero_checker_violations() {
    let traces = bundled_traces();
    assert_eq!(traces.len(), 38, "the bundled traces are missing");
    let mut failures = Vec::new();
    for path in &traces {
        let trace = read(path);
        for policy in allocsim_policies::names() {
            let opts = RunOptions {
                policy: policy.to_string(),
                device: DeviceChoice::Sim,
                check: true,
                ..RunOptions::default()
            };
            let report = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
            let check = report.check.unwrap();
            assert_eq!(report.ops_run, trace.ops.len() as u64);
            if check.total_violations() > 0 {
                failures.push(format!(
                    "{} under {policy}: {} violations, first: {}\n  reproduce: allocsim replay {} --policy {policy} --device sim --check",
                    name(path),
                    check.total_violations(),
                    check.violations()[0],
                    path.display()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--policy offline` on every bundled trace, under the checker: it reserves the offline
/// placement's arena (what `allocsim bound` reports) once and never gives it back, fails the
/// requests the recording shows failing and no other, and its statistics are PyTorch's
/// identities over its events (the checker compares them after every op). Where the trace's
/// memory fraction refuses the arena, it reserves nothing and every request fails.
#[test]
fn the_offline_policy_replays_every_trace_as_its_placement() {
    let mut failures = Vec::new();
    for path in bundled_traces() {
        let trace = read(&path);
        let opts = RunOptions {
            policy: allocsim_run::OFFLINE.into(),
            check: true,
            ..RunOptions::default()
        };
        let r = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
        let bound = allocsim_bound::bound(&trace);
        let requests = allocsim_bound::allocations(&trace).requests;
        let planned_failures = requests.iter().filter(|(_, lifetime)| lifetime.is_none()).count();
        let (m, s) = (&r.metrics, &r.stats);
        let arena = bound.offline.expect("every bundled trace is placed").0;
        let violations = r.check.as_ref().unwrap().total_violations();
        // Its blocks are active exactly over their lifetimes: the peak is the bound's.
        let ran_as_planned = m.peak_reserved_bytes == arena
            && m.peak_active_bytes == bound.peak_live_bytes
            && m.ooms.len() == planned_failures
            && s.num_device_alloc == 1;
        let refused = m.peak_reserved_bytes == 0 && m.ooms.len() == requests.len();
        let sane = s.num_device_free == 0
            && s.reserved_bytes.all.peak as u64 == m.peak_reserved_bytes
            && s.active_bytes.all.peak as u64 == m.peak_active_bytes;
        if violations > 0 || !(ran_as_planned || refused) || !sane {
            failures.push(format!(
                "{}: {violations} violations, peak reserved {} for an arena of {arena}, peak \
                 active {} for {} live at most, {} OOMs ({planned_failures} planned), stats {:?}",
                name(&path),
                m.peak_reserved_bytes,
                m.peak_active_bytes,
                bound.peak_live_bytes,
                m.ooms.len(),
                (s.num_device_alloc, s.num_device_free, s.reserved_bytes.all.peak)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The PyTorch clone, replayed on the device that follows each recording, reproduces every
/// recorded event (action, size, segment offset) and every `memory_stats()` key, and makes
/// every device call the recording shows, at its address: the device never falls back to
/// its model. A history that starts mid-run without the statistics of that moment is held to
/// the `current` values (its cumulative ones count from the history's start); the statistics
/// a recording cannot determine (`UNDETERMINED_STATS`) must differ, and no other.
#[test]
fn pytorch_reproduces_every_recording_exactly() {
    assert_exact(&bundled_traces(), &UNDETERMINED_STATS);
}

/// The same for the recordings made on an H200 with `allocsim.capture`: the patterns in
/// combination (`traces/pytorch-2.11-h200-combos/`: MemPools and CUDA graph pools under
/// expandable segments, histories that start mid-run, the calls a snapshot cannot show) and
/// the ranks of DDP and FSDP2 jobs (`traces/pytorch-2.11-h200-ranks/`).
#[test]
fn pytorch_reproduces_the_h200_recordings_exactly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut paths = Vec::new();
    for dir in ["pytorch-2.11-h200-combos", "pytorch-2.11-h200-ranks"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("the H200 recordings") {
            let path = entry.expect("a directory entry").path();
            if path.to_string_lossy().ends_with(".pickle.gz") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    assert_eq!(paths.len(), 15, "nine combinations of patterns, four ranks, two batch sizes");
    assert_exact(&paths, &[]);
}

/// Every recording in `paths` replays exactly, but for the statistics `undetermined` lists
/// (trace, key, why), which must differ.
fn assert_exact(paths: &[std::path::PathBuf], undetermined: &[(&str, &str, &str)]) {
    let mut failures = Vec::new();
    let mut determined = Vec::new();
    for path in paths {
        let trace = read(path);
        let opts = RunOptions { policy: "pytorch".into(), fidelity: true, ..RunOptions::default() };
        let report = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
        assert_eq!(report.device, "recorded", "{}", path.display());
        let mut problems = Vec::new();
        if !report.device_notes.iter().any(|n| n.starts_with("followed the recording for all")) {
            problems.push(format!("device: {}", report.device_notes.join("; ")));
        }
        match report.fidelity.unwrap() {
            Ok(n) => assert_eq!(n, trace.recorded.len() as u64),
            Err(d) => problems.push(format!("events part at {d:?}")),
        }
        let cumulative = report.start != StartedFrom::Seeded { stats_known: false };
        let expected =
            trace.meta.expected_stats.as_ref().expect("every bundled trace has its stats");
        let undetermined: Vec<&str> = (undetermined.iter())
            .filter(|(trace, _, _)| *trace == name(path))
            .map(|&(_, key, _)| key)
            .collect();
        let ours: Vec<(String, i64)> = report.stats.flat();
        let differ: Vec<_> = ours
            .iter()
            .filter(|(k, _)| cumulative || k.ends_with(".current"))
            .filter(|kv| !expected.contains(kv))
            .collect();
        let unexpected: Vec<_> =
            differ.iter().filter(|(k, _)| !undetermined.contains(&k.as_str())).take(5).collect();
        if !unexpected.is_empty() {
            problems.push(format!("memory_stats differ: {unexpected:?}"));
        }
        for key in undetermined {
            if !differ.iter().any(|(k, _)| k == key) {
                determined.push(format!("{} {key}", name(path)));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{}: {}", name(path), problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{}\nreproduce: allocsim fidelity TRACE", failures.join("\n"));
    assert!(determined.is_empty(), "now exact, take off the undetermined list: {determined:?}");
}

/// The same trace, policy and device give a byte-identical event log.
#[test]
fn replay_is_deterministic() {
    let path = &bundled_traces()[0];
    let trace = read(path);
    let log = |policy: &str| {
        let mut log = EventLog::new(Vec::new());
        let opts = RunOptions { policy: policy.into(), ..RunOptions::default() };
        let mut observers: [&mut dyn Observer; 1] = [&mut log];
        run_trace(&trace, &opts, &mut observers, |_| {}).unwrap();
        log.finish().unwrap()
    };
    for policy in allocsim_policies::names().into_iter().chain([allocsim_run::OFFLINE]) {
        let (a, b) = (log(policy), log(policy));
        assert!(!a.is_empty(), "{policy} logged no events");
        assert!(a == b, "{policy}: two runs of {} gave different event logs", path.display());
    }
}

/// The README's figures about the bundled traces and its list of policies are the project's.
#[test]
fn readme_claims_match_the_traces_and_the_policies() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let traces = bundled_traces();
    let total = traces.len();
    // Held to every key: no statistic the recording cannot determine, and not a history that
    // starts mid-run without the statistics of that moment (held to the `current` values).
    let exact = (traces.iter())
        .filter(|path| UNDETERMINED_STATS.iter().all(|(trace, _, _)| *trace != name(path)))
        .filter(|path| {
            let trace = read(path);
            trace.start.is_none() || trace.meta.stats_at_start.is_some()
        })
        .count();
    let claim = format!(
        "every event of all {total} bundled recordings, and all 122 `memory_stats()` keys of {exact}"
    );
    assert!(readme.contains(&claim), "the README should say {claim:?}");
    let policies: Vec<String> =
        allocsim_policies::names().iter().map(|p| format!("`{p}`")).collect();
    let listed = readme
        .split("Policies: ")
        .nth(1)
        .and_then(|rest| rest.split('.').next())
        .expect("a Policies: line");
    for p in &policies {
        assert!(listed.contains(p.as_str()), "the README's policy list lacks {p}");
    }
    assert_eq!(listed.matches('`').count(), 2 * policies.len(), "extra policies in {listed:?}");
}

/// One row of a capacity validation: a recording's prediction (under its own settings, or a
/// defaults' recording asked under `expandable_segments:True`) and the real brackets of the
/// row it predicts, as recorded and, for its own settings, under other chunk orders.
struct CapacityRow {
    name: String,
    outside: u64,
    point: u64,
    low: u64,
    high: u64,
    real: (u64, u64),
    other_orders: Vec<(u64, u64)>,
}

impl CapacityRow {
    /// The brackets the band misses.
    fn misses(&self) -> Vec<String> {
        let brackets = std::iter::once(&self.real).chain(&self.other_orders);
        let missed = brackets.filter(|&&(lo, hi)| self.low > hi || self.high < lo);
        missed
            .map(|(lo, hi)| format!("{self}: the real threshold ({lo}, {hi}] is outside it"))
            .collect()
    }

    /// The point's error against the middle of the real bracket, and the band's width over it.
    fn error_and_width(&self) -> (f64, f64) {
        let mid = (self.real.0 + self.real.1) as f64 / 2.0;
        (self.point as f64 / mid - 1.0, (self.high - self.low) as f64 / mid)
    }
}

impl std::fmt::Display for CapacityRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: point {}, band [{}, {}]", self.name, self.point, self.low, self.high)
    }
}

/// `capacity` of a recording with its sidecar as `allocsim capacity` asks it (the outside
/// memory the sidecar measured, the driver's floor of the recording's device, 16 jittered
/// placements), under `conf` or the recording's own settings; and the outside memory.
fn capacity_as_asked(trace: &Trace, conf: Option<&str>) -> (allocsim_run::Capacity, u64) {
    let opts = capacity_options(trace, conf);
    (allocsim_run::capacity(trace, &opts).unwrap(), opts.outside_bytes)
}

/// A chunk order of a workload: the recording's own (`None`) or `FIT_PERTURB`'s seed.
type Order = (String, Option<String>);

/// Every try in `DIR/tries.jsonl`, by workload and chunk order: `(free at start, fitted)`.
fn tries_in(dir: &std::path::Path) -> std::collections::BTreeMap<Order, Vec<(u64, bool)>> {
    let tries = std::fs::read_to_string(dir.join("tries.jsonl")).expect("tries.jsonl");
    let mut tried: std::collections::BTreeMap<Order, Vec<_>> = Default::default();
    for line in tries.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        if let (Some(name), Some(free)) = (v["workload"].as_str(), v["free_at_start"].as_u64()) {
            let order = v["perturb"].as_str().map(str::to_string);
            let fits = v["fits"].as_bool().expect("fits");
            tried.entry((name.to_string(), order)).or_default().push((free, fits));
        }
    }
    tried
}

/// The options of [`capacity_as_asked`].
fn capacity_options(trace: &Trace, conf: Option<&str>) -> allocsim_run::CapacityOptions {
    let outside = trace.meta.outside_allocator_bytes.expect("the sidecar measures it");
    let run = RunOptions {
        policy: "pytorch".into(),
        alloc_conf: conf.map(str::to_string),
        ..RunOptions::default()
    };
    let floor_bytes = allocsim_run::driver_floor_bytes(trace.meta.device_total_bytes);
    allocsim_run::CapacityOptions { run, outside_bytes: outside, floor_bytes, jitters: 16 }
}

/// The rows of `validation/DIR` (its recordings and `tries.jsonl`), each with its real
/// bracket from every try of the workload under the recording's chunk order or, with
/// `perturb`, another: from the most free memory a try failed with to the least above it a try
/// fitted with. Fitting is not monotonic in the free memory (`validation/README.md`), so this
/// is where every try with more fitted, wherever a bisection stopped. `cross` names the
/// workloads whose defaults' recordings are also asked under `expandable_segments:True`.
fn capacity_rows(dir: &str, cross: &[&str]) -> Vec<CapacityRow> {
    use std::collections::BTreeMap;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../validation").join(dir);
    let mut real = BTreeMap::new();
    let mut reordered: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for ((name, order), tries) in tries_in(&dir) {
        let Some(failed) = tries.iter().filter(|t| !t.1).map(|t| t.0).max() else { continue };
        let fitted = tries.iter().filter(|t| t.1 && t.0 > failed).map(|t| t.0).min();
        let bracket = (failed, fitted.expect("a try fitted with more than any failed"));
        match order {
            None => drop(real.insert(name, bracket)),
            Some(_) => reordered.entry(name).or_default().push(bracket),
        }
    }
    let mut rows: Vec<(String, String, Option<&str>)> =
        real.keys().map(|n| (n.clone(), n.clone(), None)).collect();
    for w in cross {
        let expandable = format!("{w}_expandable_segments-True");
        rows.push((w.to_string(), expandable, Some("expandable_segments:True")));
    }
    let row = |(recording, truth, conf): (String, String, Option<&str>)| {
        let trace = read(&dir.join(format!("{recording}.pickle.gz")));
        let (c, outside) = capacity_as_asked(&trace, conf);
        let own = recording == truth;
        CapacityRow {
            name: format!("{recording} -> {truth}"),
            outside,
            point: c.capacity_bytes.unwrap(),
            low: c.low_bytes.unwrap(),
            high: c.high_bytes.unwrap(),
            real: real[&truth],
            other_orders: if own {
                reordered.get(&truth).cloned().unwrap_or_default()
            } else {
                Vec::new()
            },
        }
    };
    rows.into_iter().map(row).collect()
}

/// `validation/`: for every row measured on the H100, the real threshold (the bracket between
/// the loosest failing and the tightest fitting try) lies in the predicted band, under the
/// chunk order of the recording and under every other one measured (`FIT_PERTURB`), and the
/// point is within 0.1 % of the recording's, as the README and `validation/README.md` say.
#[test]
fn capacity_holds_against_the_h100() {
    let rows = capacity_rows("h100-pytorch-2.11", &["llama_ft", "gpt2_train"]);
    assert_eq!(rows.len(), 8, "two workloads under three settings, two asked under another");
    assert!(rows.iter().any(|r| !r.other_orders.is_empty()), "the chunk orders measured");
    let mut failures = Vec::new();
    for row in &rows {
        let outside = row.outside;
        assert!(
            outside.abs_diff(allocsim_run::OUTSIDE_ALLOCATOR_BYTES) <= 8 << 20,
            "{row}: {outside}"
        );
        failures.extend(row.misses());
        let (error, _) = row.error_and_width();
        if error.abs() > 0.001 {
            failures.push(format!("{row}: point off by {:+.3} %", 100.0 * error));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `validation/estimate/`: `capacity` of the three programs estimated without a GPU whose
/// thresholds were bisected on an H200 lies inside the bisected bracket (more than the free
/// memory that failed, no more than what fitted), as the README says.
#[test]
fn capacity_of_estimates_holds_against_the_h200() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../validation/estimate");
    for program in ["gpt_amp", "convnet", "lora"] {
        let bisect = std::fs::read_to_string(dir.join(format!("recorded/{program}.bisect")));
        let last = bisect.expect("the bisection's tries").lines().last().unwrap().to_string();
        let summary: serde_json::Value = serde_json::from_str(&last).unwrap();
        let threshold = summary["threshold"].as_u64().expect("the summary line");
        let fails_at = summary["fails_at"].as_u64().expect("the summary line");
        let trace = read(&dir.join(format!("estimated/{program}.pickle.gz")));
        let point = capacity_as_asked(&trace, None).0.capacity_bytes.unwrap();
        assert!(
            fails_at < point && point <= threshold,
            "{program}: {point} outside ({fails_at}, {threshold}]"
        );
    }
}

/// The driver's floor on the H200 is what every fill of `validation/driver_floor.py` left free.
#[test]
fn the_h200_drivers_floor_is_what_the_fills_left() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../validation/h200-pytorch-2.11/driver_floor.jsonl");
    let fills = std::fs::read_to_string(path).expect("driver_floor.jsonl");
    let mut modes = std::collections::BTreeSet::new();
    for line in fills.lines() {
        let fill: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(fill["free_left"], allocsim_run::H200_DRIVER_FLOOR_BYTES, "{fill}");
        assert_eq!(fill["total"], allocsim_run::H200_TOTAL_BYTES, "{fill}");
        modes.insert(format!("{} {}", fill["mode"], fill["conf"]));
    }
    assert!(modes.len() >= 4, "cudaMalloc pages and small, PyTorch with and without expandable");
}

/// Programs held out from the model, recorded and bisected on an H200 (ViT, BERT, Llama
/// decoding and ResNet-50 after the band was set; ConvNeXt-T after the driver's floor entered
/// the model; T5 and GPT-2 decoding after the band's top was capped at what the run takes
/// unconstrained; BART decoding after the outside memory was taken step by step): under every
/// setting, as recorded and asked under `expandable_segments:True`, and under other chunk
/// orders, the real threshold lies in the band, the point within 0.3 % of it (or inside the
/// real bracket, where that is wider) and the band at most 1 % wide.
#[test]
fn capacity_holds_on_programs_held_out_from_the_model() {
    let cross = [
        "vit_train",
        "bert_mlm",
        "llama_generate",
        "resnet_train",
        "convnext_train",
        "t5_generate",
        "gpt2_generate",
        "bart_generate",
    ];
    let rows = capacity_rows("h200-pytorch-2.11/heldout", &cross);
    assert_eq!(rows.len(), 32, "eight programs under three settings, each asked under another");
    assert!(rows.iter().any(|r| !r.other_orders.is_empty()), "another chunk order measured");
    let mut failures = Vec::new();
    for row in &rows {
        failures.extend(row.misses());
        let (error, width) = row.error_and_width();
        let in_bracket = row.real.0 < row.point && row.point <= row.real.1;
        if error.abs() > 0.003 && !in_bracket {
            failures.push(format!("{row}: point off by {:+.3} %", 100.0 * error));
        }
        if width > 0.01 {
            failures.push(format!("{row}: band {:.2} % wide", 100.0 * width));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fitting is not monotonic in the free memory, and the model knows where: at every free
/// amount tried on the H200 near a held-out row's threshold (within 2 %, under the recording's
/// chunk order), the modelled run fits if and only if the real one did. GPT-2 decoding under
/// expandable segments fits with 1,064.4 and 1,066.5 MB and fails with 1,062.3 and 1,068.6 to
/// 1,083.3 MB: the model said so before those amounts were tried (`validation/README.md`).
/// Where real tries at one amount disagreed (run-to-run noise), either answer agrees. The
/// amounts where the model does not agree are [`TRIES_THE_MODEL_MISSES`].
#[test]
fn the_model_fits_where_the_real_tries_fitted() {
    use std::collections::BTreeMap;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../validation/h200-pytorch-2.11/heldout");
    let (mut compared, mut disagreements) = (0, Vec::new());
    for ((name, order), tries) in tries_in(&dir) {
        if order.is_some() {
            continue;
        }
        let mut at: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
        for (free, fits) in tries {
            at.entry(free).or_default().push(fits);
        }
        let trace = read(&dir.join(format!("{name}.pickle.gz")));
        let opts = capacity_options(&trace, None);
        let threshold = allocsim_run::capacity(&trace, &opts).unwrap().capacity_bytes.unwrap();
        for (&free, outcomes) in &at {
            if free.abs_diff(threshold) as f64 > 0.02 * threshold as f64 {
                continue;
            }
            compared += 1;
            let model = allocsim_run::fits_at(allocsim_run::Runs::Whole(&trace), &opts, free);
            let agrees = outcomes.contains(&model.unwrap());
            if agrees == TRIES_THE_MODEL_MISSES.contains(&(name.as_str(), free)) {
                let known = if agrees { "agrees, off TRIES_THE_MODEL_MISSES" } else { "disagrees" };
                disagreements.push(format!("{name} with {free} free: real {outcomes:?}, {known}"));
            }
        }
    }
    assert!(compared >= 120, "{compared} tries compared");
    assert!(disagreements.is_empty(), "{compared} compared:\n{}", disagreements.join("\n"));
}

/// The tries near a threshold whose outcome the model does not reproduce, as
/// `validation/README.md` says; each is checked to disagree still, so the list stays true.
/// ConvNeXt-T under `max_split` (cuDNN retried eight times in the fit): the model fails with
/// 4,008.8 to 4,015.1 MB, the real runs failed with 4,004.6 and fitted with 4,010.9. ResNet-50
/// under expandable segments fitted with 2,199.0 and 2,201.1 MB, where the model fails taking
/// the 2 MiB its profile took late at one end of the step or the other.
const TRIES_THE_MODEL_MISSES: [(&str, u64); 4] = [
    ("convnext_train_max_split_size_mb-128_roundup_power2_divisions-4", 4_004_642_816),
    ("convnext_train_max_split_size_mb-128_roundup_power2_divisions-4", 4_010_934_272),
    ("resnet_train_expandable_segments-True", 2_198_994_944),
    ("resnet_train_expandable_segments-True", 2_201_092_096),
];

/// What `docs/capacity.md` says of Llama decoding near its threshold on the H200: every try
/// there that failed, failed in cuDNN's attention with no allocator OOM, the allocator at the
/// peak of the unconstrained run, nothing but the driver's floor free and 2-4 MiB of its
/// memory outside the allocator not yet taken; the tightest try that fitted took all of it and
/// ended with the floor free too. A kernel module loaded that late gets none of the allocator's
/// cache.
#[test]
fn llama_decoding_fails_near_its_threshold_loading_kernels_beside_a_full_cache() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../validation/h200-pytorch-2.11/heldout/tries.jsonl");
    let tries: Vec<serde_json::Value> = std::fs::read_to_string(dir)
        .expect("tries.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .filter(|t: &serde_json::Value| t["workload"] == "llama_generate" && t["perturb"].is_null())
        .collect();
    let recording = tries.iter().find(|t| t["target_free"].is_null()).expect("the recording");
    let (peak, outside) =
        (&recording["peak_reserved"], recording["outside_allocator_bytes"].as_u64());
    let near = |t: &&serde_json::Value| {
        (850_000_000..860_000_000).contains(&t["free_at_start"].as_u64().unwrap())
    };
    let (mut failed, mut fitted) = (0, vec![]);
    for t in tries.iter().filter(near) {
        if t["fits"] == true {
            fitted.push(t["free_at_end"].as_u64().unwrap());
            continue;
        }
        failed += 1;
        assert!(t["failure"].as_str().unwrap().contains("mha_graph.execute"), "{t}");
        assert_eq!((&t["ooms"], &t["peak_reserved"]), (&serde_json::json!(0), peak), "{t}");
        assert_eq!(t["free_at_end"], allocsim_run::H200_DRIVER_FLOOR_BYTES, "{t}");
        assert!(t["outside_allocator_bytes"].as_u64() < outside, "{t}");
    }
    assert!(failed >= 10, "{failed} failing tries near the threshold");
    let floor = allocsim_run::H200_DRIVER_FLOOR_BYTES;
    assert_eq!(fitted.iter().min(), Some(&floor), "the tightest fit's free memory at its end");
}

/// The README shows `best_fit.rs` whole (its module doc aside): the example cannot drift.
#[test]
fn readme_shows_the_kit_example_as_it_is() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let shown = readme
        .split("`crates/policies/src/best_fit.rs`, whole:\n\n```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README shows best_fit.rs");
    let file = std::fs::read_to_string(format!("{root}/crates/policies/src/best_fit.rs")).unwrap();
    let code: String =
        file.lines().filter(|l| !l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    assert_eq!(shown.trim(), code.trim());
    assert!(code.lines().count() <= 50, "the example policy stays short");
}

/// Every arrow one way: in each source directory, no two sibling modules reach each other,
/// directly or through others (`crate::m` at a crate's root, `super::m` below it).
#[test]
fn modules_depend_on_each_other_one_way() {
    use std::collections::{BTreeMap, BTreeSet};
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../crates"));
    let mut dirs = vec![];
    for krate in std::fs::read_dir(root).unwrap() {
        let src = krate.unwrap().path().join("src");
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                }
            }
            dirs.push((dir.clone(), dir == src));
        }
    }
    let mut cycles = Vec::new();
    for (dir, at_root) in dirs {
        let files: BTreeMap<String, String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                let name = p.file_stem()?.to_str()?.to_string();
                let skip =
                    ["lib", "main", "mod"].contains(&name.as_str()) || name.ends_with("_tests");
                if p.extension()? != "rs" || skip {
                    return None;
                }
                // Comments name modules without depending on them.
                let code: String = std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect::<Vec<_>>()
                    .join("\n");
                Some((name, code))
            })
            .collect();
        let prefix = if at_root { "crate::" } else { "super::" };
        let edges: BTreeMap<&str, BTreeSet<&str>> = files
            .iter()
            .map(|(m, text)| {
                let to = files
                    .keys()
                    .filter(|n| *n != m)
                    .filter(|n| {
                        text.match_indices(&format!("{prefix}{n}")).any(|(i, s)| {
                            let after = text[i + s.len()..].chars().next();
                            let before = text[..i].chars().last();
                            !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                                && !before
                                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                        })
                    })
                    .map(String::as_str)
                    .collect();
                (m.as_str(), to)
            })
            .collect();
        // Reachability by depth-first search from every module.
        for &start in edges.keys() {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<&str> = edges[start].iter().copied().collect();
            while let Some(m) = stack.pop() {
                if m == start {
                    cycles.push(format!("{}: {start} reaches itself", dir.display()));
                    break;
                }
                if seen.insert(m) {
                    stack.extend(edges.get(m).into_iter().flatten().copied());
                }
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// ARCHITECTURE.md names every policy, and the README every live workload.
#[test]
fn docs_name_every_policy_and_workload() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let arch = std::fs::read_to_string(format!("{root}/ARCHITECTURE.md")).unwrap();
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    for p in allocsim_policies::names() {
        let named = arch.contains(&format!("`{p}`")) || arch.contains(&format!("`{p}/`"));
        assert!(named, "ARCHITECTURE.md does not name the policy {p}");
    }
    for (w, _) in allocsim_workloads::names() {
        assert!(readme.contains(&format!("`{w}`")), "the README does not name the workload {w}");
    }
}

/// The complete lab recordings: the shared ten, the four held out, and the `d_*` user ones.
fn lab_recordings() -> Vec<std::path::PathBuf> {
    let user =
        |p: &std::path::Path| p.parent().is_some_and(|d| d.ends_with("pytorch-2.11-h100-user"));
    bundled_traces().into_iter().filter(|p| !user(p) || name(p).starts_with("d_")).collect()
}

/// The lab recordings the PyTorch policy on the modelled device (the driver placement, no
/// recorded addresses) replays exactly, events and `memory_stats()`, are the ones
/// docs/capacity.md lists, no more and no fewer.
#[test]
fn the_driver_model_replays_these_recordings_exactly() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/capacity.md"))
        .expect("docs/capacity.md");
    let row = doc.lines().find(|l| l.starts_with("| `driver` |")).expect("the driver row");
    let listed: std::collections::BTreeSet<&str> = row.split('`').skip(3).step_by(2).collect();
    let labs = lab_recordings();
    assert_eq!(labs.len(), 21);
    let exact: std::collections::BTreeSet<String> = labs
        .iter()
        .filter(|path| {
            let trace = read(path);
            let opts = RunOptions {
                policy: "pytorch".into(),
                device: DeviceChoice::Sim,
                fidelity: true,
                ..RunOptions::default()
            };
            let report = run_trace(&trace, &opts, &mut [], |_| {}).unwrap();
            let expected = trace.meta.expected_stats.as_ref().expect("every lab trace has stats");
            report.fidelity == Some(Ok(trace.recorded.len() as u64))
                && report.stats.flat().iter().all(|kv| expected.contains(kv))
        })
        .map(|path| name(path))
        .collect();
    let exact: std::collections::BTreeSet<&str> = exact.iter().map(String::as_str).collect();
    assert_eq!(exact, listed, "reproduce: allocsim fidelity --model TRACE");
    assert!(row.contains(&format!("| {} of {} |", exact.len(), labs.len())), "{row}");
}

/// Every script a trace folder's README names (a backticked `*.py` or `*.sh`, relative to the
/// folder or to the repository's root) is in the repository: a reader can run what made the
/// recordings.
#[test]
fn the_trace_readmes_name_scripts_that_exist() {
    let traces = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../traces"));
    let mut missing = Vec::new();
    for folder in std::fs::read_dir(traces).expect("traces/") {
        let folder = folder.expect("a traces/ entry").path();
        let Ok(readme) = std::fs::read_to_string(folder.join("README.md")) else { continue };
        for (i, quoted) in readme.split('`').enumerate() {
            let script =
                quoted.split_whitespace().find(|w| w.ends_with(".py") || w.ends_with(".sh"));
            if let Some(script) = script.filter(|_| i % 2 == 1) {
                if !folder.join(script).exists() && !traces.join("..").join(script).exists() {
                    missing.push(format!("{}: {script}", folder.display()));
                }
            }
        }
    }
    assert!(missing.is_empty(), "scripts named but not there: {missing:?}");
}
