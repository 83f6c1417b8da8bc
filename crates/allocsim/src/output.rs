//! Human-readable rendering shared by the commands: byte sizes, the `memory_summary` table,
//! the comparison with recorded statistics.

use allocsim_core::text::quoted;
use allocsim_core::{MemoryStats, Stat, StatArray};
use allocsim_run::{RunReport, StartedFrom};
use std::path::Path;

/// A size as flags take it: bytes (`42949672960`, `4e10`), or a number with a unit, decimal
/// (`kB`, `MB`, `GB`, `TB`) or binary (`KiB`, `MiB`, `GiB`, `TiB`), as in `40GiB`, `40 GB` or
/// `1.5GiB`; units in any case. Written by hand: two lines of arithmetic on a float, where a
/// crate would bring its own unit spellings.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split =
        t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => {
            return Err(format!(
                "{}: unknown unit {} (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)",
                quoted(text),
                quoted(unit)
            ))
        }
    };
    // Whole numbers exactly (a float holds 53 bits), refused past u64::MAX.
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(scale as u64)
            .ok_or_else(|| format!("{}: not a size in bytes (0 to 2^64 - 1)", quoted(text)));
    }
    let value: f64 = number.parse().map_err(|_| {
        format!("{}: expected a size such as 42949672960, 4e10, 40GB or 40GiB", quoted(text))
    })?;
    let bytes = (value * scale).round();
    // 2^64 is the first float `as u64` would quietly make u64::MAX; `-0.4` rounds to zero.
    if value.is_sign_negative() || !(0.0..18_446_744_073_709_551_616.0).contains(&bytes) {
        return Err(format!("{}: not a size in bytes (0 to 2^64 - 1)", quoted(text)));
    }
    Ok(bytes as u64)
}

/// A probability, from 0 to 1 (`--fail-random`): NaN and infinities are no probability.
pub fn parse_probability(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{}: expected a probability from 0 to 1", quoted(text))),
    }
}

/// A 1-based count (`--fail-nth-malloc`): the first call is 1, and 0 would never fail.
pub fn parse_nth(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{}: expected N of 1 or more (the first call is 1)", quoted(text))),
    }
}

/// Fail now, before any work, if `path` cannot be written: its folder must exist and take a new
/// file, `path` must not be a folder, and it must not be one of `inputs` (links followed): a
/// command never writes over what it reads. The error names `path` as the user gave it.
pub fn check_output(path: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    let shown = path.display();
    if let Some(input) = inputs.iter().find(|i| allocsim_trace::atomic::same_file(path, i)) {
        anyhow::bail!("cannot write {shown}: it is the input {}", input.display());
    }
    if path.is_dir() {
        anyhow::bail!("cannot write {shown}: it is a directory");
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        anyhow::bail!("cannot write {shown}: there is no directory {}", parent.display());
    }
    // Create and drop a file beside it, as the atomic writer will.
    allocsim_trace::atomic::AtomicFile::create(path)
        .map_err(|e| anyhow::anyhow!("cannot write {shown}: {e}"))?;
    Ok(())
}

/// [`check_output`] for a trace file, whose extension picks the format.
pub fn check_trace_output(path: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    if allocsim_trace::Format::from_path(path).is_none() {
        anyhow::bail!(
            "cannot write {}: the extension picks the format (.pickle, .pickle.gz, .csv, \
             .allocsim, .allocsim.json)",
            path.display()
        );
    }
    check_output(path, inputs)
}

/// A size for people: `7.19 GiB (7719616512 B)`; bytes alone below 1 KiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {} ({n} B)", UNITS[unit])
    }
}

/// PyTorch's `_format_size(sz, pref_sz)`: the unit is chosen by `pref` (the `all` row's
/// value), so the pool rows line up with it; whole units, rounded down.
fn format_size(n: i64, pref: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut n, mut pref, mut unit) = (n, pref as f64, 0);
    while unit + 1 < UNITS.len() && pref >= 768.0 * 1024.0 {
        n = n.div_euclid(1024);
        pref /= 1024.0;
        unit += 1;
    }
    format!("{n:>6} {}", UNITS[unit])
}

/// PyTorch's `_format_count(cnt, pref_cnt)`.
fn format_count(n: i64, pref: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let (mut n, mut pref, mut unit) = (n, pref as f64, 0);
    while unit + 1 < UNITS.len() && pref >= 750.0 * 1000.0 {
        n = n.div_euclid(1000);
        pref /= 1000.0;
        unit += 1;
    }
    format!("{n:>7} {} ", UNITS[unit])
}

/// `n` and the noun, singular for one: `1 OOM`, `2 OOMs`.
pub fn counted(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `torch.cuda.memory_summary(device)`'s table, character for character, from our statistics.
pub fn memory_summary(stats: &MemoryStats, device: u32) -> String {
    let rule = |c: &str| c.repeat(75);
    let mut lines = vec![
        rule("="),
        format!(" {:16} PyTorch CUDA memory summary, device ID {device:<17} ", ""),
        rule("-"),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        rule("="),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    type Row<'a> = (&'a str, &'a StatArray, fn(i64, i64) -> String);
    let rows: [Row; 9] = [
        ("Allocated memory", &stats.allocated_bytes, format_size),
        ("Active memory", &stats.active_bytes, format_size),
        ("Requested memory", &stats.requested_bytes, format_size),
        ("GPU reserved memory", &stats.reserved_bytes, format_size),
        ("Non-releasable memory", &stats.inactive_split_bytes, format_size),
        ("Allocations", &stats.allocation, format_count),
        ("Active allocs", &stats.active, format_count),
        ("GPU reserved segments", &stats.segment, format_count),
        ("Non-releasable allocs", &stats.inactive_split, format_count),
    ];
    let line = |label: &str, s: &Stat, pref: &Stat, fmt: fn(i64, i64) -> String| {
        format!(
            " {label:<21} | {} | {} | {} | {} ",
            fmt(s.current, pref.current),
            fmt(s.peak, pref.peak),
            fmt(s.allocated, pref.allocated),
            fmt(s.freed, pref.freed)
        )
    };
    for (name, array, fmt) in rows {
        lines.push(rule("-"));
        lines.push(line(name, &array.all, &array.all, fmt));
        lines.push(line("      from large pool", &array.large_pool, &array.all, fmt));
        lines.push(line("      from small pool", &array.small_pool, &array.all, fmt));
    }
    for (name, stat) in [
        ("Oversize allocations", &stats.oversize_allocations),
        ("Oversize GPU segments", &stats.oversize_segments),
    ] {
        lines.push(rule("-"));
        lines.push(line(name, stat, stat, format_count));
    }
    lines.push(rule("="));
    format!("|{}|", lines.join("|\n|"))
}

/// Keys whose simulated value differs from the recorded one: `(key, recorded, simulated)`.
/// A key missing on either side counts as a difference, but for a statistic of a PyTorch
/// release after the clone's that counted nothing
/// ([`allocsim_policies::pytorch::versions::LATER_STATS`]).
pub fn stat_differences(
    simulated: &MemoryStats,
    expected: &[(String, i64)],
) -> Vec<(String, Option<i64>, Option<i64>)> {
    let ours: std::collections::BTreeMap<String, i64> = simulated.flat().into_iter().collect();
    let theirs: std::collections::BTreeMap<&str, i64> =
        expected.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let mut keys: Vec<&str> =
        ours.keys().map(String::as_str).chain(theirs.keys().copied()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let (a, b) = (theirs.get(k).copied(), ours.get(k).copied());
            // A later release's statistic that counted nothing (`num_oom_rejections`: 0) is
            // what the clone, without it, did.
            let later = b.is_none()
                && a.is_some_and(|v| allocsim_policies::pytorch::versions::later_stat_agrees(k, v));
            (a != b && !later).then(|| (k.to_string(), a, b))
        })
        .collect()
}

/// Whether a run can be held to every recorded statistic, or only to the `current` values:
/// a run that started mid-run without the statistics of that moment counts cumulative values
/// since the history began, and they differ from the recording's by what came before.
pub fn compares_cumulative(report: &RunReport) -> bool {
    !matches!(
        report.start,
        StartedFrom::Seeded { stats_known: false } | StartedFrom::LaidOut { .. }
    )
}

/// Whether the run is held to the recorded statistic `key` ([`compares_cumulative`]).
fn held_to(report: &RunReport) -> impl Fn(&str) -> bool {
    let all = compares_cumulative(report);
    move |key| all || key.ends_with(".current")
}

/// The recorded statistics the run is held to.
pub fn comparable<'e>(
    report: &RunReport,
    expected: &'e [(String, i64)],
) -> impl Iterator<Item = &'e (String, i64)> {
    let held = held_to(report);
    expected.iter().filter(move |(k, _)| held(k))
}

/// [`stat_differences`] over the [`comparable`] statistics.
pub fn recorded_differences(
    report: &RunReport,
    expected: &[(String, i64)],
) -> Vec<(String, Option<i64>, Option<i64>)> {
    let held = held_to(report);
    let mut d = stat_differences(&report.stats, expected);
    d.retain(|(k, _, _)| held(k));
    d
}

/// `torch.cuda.memory_stats()` from a JSON file: the flat dict, or an object with a
/// `memory_stats` member (a sidecar).
pub fn read_stats_json(path: &Path) -> anyhow::Result<Vec<(String, i64)>> {
    use anyhow::{bail, Context};
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as JSON", path.display()))?;
    let stats = json.get("memory_stats").unwrap_or(&json);
    let Some(map) = stats.as_object() else {
        bail!("{}: expected an object of memory_stats keys", path.display());
    };
    map.iter()
        .map(|(k, v)| match v.as_i64() {
            Some(n) => Ok((k.clone(), n)),
            None => bail!("{}: memory_stats key {} is not an integer", path.display(), quoted(k)),
        })
        .collect()
}

/// `writeln!` into a `String` report: commands build their whole text, which the front end
/// prints (the CLI in one write, so a closed pipe, `allocsim ... | head`, ends it quietly).
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}
pub(crate) use outln;

/// Device calls by kind as JSON: `{"malloc": {"calls", "failed", "time_ns"}, ...}`.
pub fn device_calls_json(calls: &allocsim_core::DeviceCalls) -> serde_json::Value {
    let by_kind: serde_json::Map<String, serde_json::Value> = allocsim_core::CallKind::ALL
        .iter()
        .map(|&k| {
            let c = calls.get(k);
            let entry =
                serde_json::json!({"calls": c.calls, "failed": c.failed, "time_ns": c.time_ns});
            (k.name().to_string(), entry)
        })
        .collect();
    by_kind.into()
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string as tables show it: the empty one is `(default)`.
pub fn conf_label(conf: &str) -> &str {
    if conf.is_empty() {
        "(default)"
    } else {
        conf
    }
}

#[cfg(test)]
mod size_tests {
    use super::{parse_nth, parse_probability, parse_size};

    /// Issue 50: `--fail-random nan` and `--fail-nth-malloc 0` were taken and did nothing.
    #[test]
    fn probabilities_and_counts_are_checked() {
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert_eq!(parse_probability("1"), Ok(1.0));
        for bad in ["nan", "NaN", "-0.1", "1.5", "inf", "x"] {
            assert!(parse_probability(bad).unwrap_err().contains("probability"), "{bad}");
        }
        assert_eq!(parse_nth("3"), Ok(3));
        for bad in ["0", "-1", "x"] {
            assert!(parse_nth(bad).unwrap_err().contains("1 or more"), "{bad}");
        }
    }

    #[test]
    fn sizes_in_bytes_units_and_exponents() {
        let gib = 1u64 << 30;
        for (text, want) in [
            ("42949672960", 40 * gib),
            ("4e10", 40_000_000_000),
            ("40GiB", 40 * gib),
            ("40 gib", 40 * gib),
            ("40GB", 40_000_000_000),
            ("1.5GiB", 3 * gib / 2),
            ("512KiB", 512 << 10),
            ("7 B", 7),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("1152921504606846977"), Ok((1 << 60) + 1));
        // Issue 50: 2^64 became u64::MAX, -0.4 became 0.
        for bad in [
            "",
            "forty",
            "40XB",
            "-1GB",
            "1e30",
            "18446744073709551616",
            "1.8446744073709552e19",
            "16777216TiB",
            "-0.4",
            "-0",
            "nan",
            "inf",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod summary_tests {
    use super::{counted, format_count, format_size, memory_summary};

    /// PyTorch's rule: the `all` row picks the unit once it reaches 768 of the next one;
    /// counts switch at 750 thousand; values round down.
    #[test]
    fn sizes_and_counts_as_pytorch_formats_them() {
        let mib = 1 << 20;
        assert_eq!(format_size(7364 * mib + 5, 7364 * mib), "  7364 MiB");
        assert_eq!(format_size(767 * 1024, 767 * 1024), "785408 B  ");
        assert_eq!(format_size(768 * 1024, 768 * 1024), "   768 KiB");
        // A pool row takes the unit of its `all` row.
        assert_eq!(format_size(1024, 7364 * mib), "     0 MiB");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(1_500_000, 1_500_000), "   1500 K ");
        assert_eq!(
            (counted(1u64, "OOM", "OOMs"), counted(2u64, "OOM", "OOMs")),
            ("1 OOM".into(), "2 OOMs".into())
        );
    }

    #[test]
    fn the_table_has_pytorchs_title_and_width() {
        let table = memory_summary(&Default::default(), 3);
        assert!(table
            .lines()
            .nth(1)
            .unwrap()
            .contains("PyTorch CUDA memory summary, device ID 3 "));
        assert!(table.lines().all(|l| l.chars().count() == 77), "{table}");
    }
}

#[cfg(test)]
mod difference_tests {
    use super::stat_differences;
    use allocsim_core::MemoryStats;

    /// A 2.12+ sidecar has `num_oom_rejections`; counting nothing, it is what the clone (2.11,
    /// without the mechanism) did; counting rejections, it is a difference.
    #[test]
    fn a_later_release_stat_that_counted_nothing_is_no_difference() {
        let ours = MemoryStats::default();
        let mut theirs = ours.flat();
        theirs.push(("num_oom_rejections".into(), 0));
        assert_eq!(stat_differences(&ours, &theirs), vec![]);
        theirs.last_mut().unwrap().1 = 2;
        assert_eq!(
            stat_differences(&ours, &theirs),
            vec![("num_oom_rejections".into(), Some(2), None)]
        );
        theirs.pop();
        theirs.push(("num_new_thing".into(), 0));
        assert_eq!(stat_differences(&ours, &theirs), vec![("num_new_thing".into(), Some(0), None)]);
    }
}
