//! A job: the per-rank recordings of one distributed run (DDP, FSDP, pipeline parallel), read
//! as one input. Memory problems at scale are per rank: the rank that holds the most OOMs
//! first and decides the card. Every command that takes a trace takes a job where it takes a
//! trace, in three forms: several paths, a directory (its trace files), or a pattern whose
//! file name holds `*` or `?` (for a shell that did not expand it). One trace file is not a
//! job: the command answers as it always has.
//!
//! Each rank's number is its sidecar's `meta.rank`, else the `N` of a `rankN` in its file name
//! (`fsdp2_rank1.pickle.gz`), else its position in the sorted list. A job runs each rank as
//! the single-trace command runs it (the traces read once, in parallel) and adds the job's
//! answer: which rank decides, and the spread between the ranks.

use crate::{Context, Loaded};
use allocsim_core::text::quoted;
use anyhow::{bail, Context as _};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most ranks a job reads: a pattern that matches a whole folder of unrelated traces should
/// be refused, not read.
pub const MAX_RANKS: usize = 4096;

/// One rank of a job.
#[derive(Debug, Clone)]
pub struct Rank {
    pub rank: u32,
    pub path: PathBuf,
    /// Where the number came from: `sidecar`, `file name` or `position`.
    pub numbered_by: &'static str,
}

/// The ranks of a job, by rank number, and the context that holds their traces.
#[derive(Debug)]
pub struct Job {
    pub ranks: Vec<Rank>,
    /// The ranks the recordings say the job had (`meta.world_size`), if they say.
    pub world_size: Option<u32>,
    /// The caller's context with every rank's trace loaded.
    pub cx: Context,
}

/// The trace files `first` and `more` name when they name a job (several paths, a directory
/// with trace files, a pattern); `None` for one trace file or workload (or a lone folder of
/// none), which the commands read as before.
pub fn paths(first: &Path, more: &[PathBuf]) -> anyhow::Result<Option<Vec<PathBuf>>> {
    let single = more.is_empty()
        && (first.to_string_lossy().starts_with(crate::WORKLOAD_PREFIX)
            || !(first.is_dir() || is_pattern(first)));
    // A folder without trace files, alone, is what it always was: not a trace, refused by
    // the reader as not a regular file.
    let empty_folder = || first.is_dir() && traces_in(first, |_| true).is_ok_and(|t| t.is_empty());
    if single || (more.is_empty() && empty_folder()) {
        return Ok(None);
    }
    let mut all = Vec::new();
    for input in std::iter::once(first).chain(more.iter().map(PathBuf::as_path)) {
        if input.is_dir() {
            let found = traces_in(input, |_| true)?;
            if found.is_empty() {
                bail!(
                    "{}: no trace files (.pickle.gz, .pickle, .allocsim, .csv) in this folder",
                    input.display()
                );
            }
            all.extend(found);
        } else if is_pattern(input) && !input.exists() {
            all.extend(expand(input)?);
        } else {
            all.push(input.to_path_buf());
        }
    }
    if all.len() > MAX_RANKS {
        bail!("{}: {} traces, more than a job's {MAX_RANKS} ranks", first.display(), all.len());
    }
    Ok(Some(all))
}

fn is_pattern(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.contains(['*', '?']) && !path.to_string_lossy().starts_with(crate::WORKLOAD_PREFIX)
}

/// Whether `path` is a trace by its name (a sidecar `NAME.json` is not).
fn is_trace(path: &Path) -> bool {
    path.is_file() && allocsim_trace::Format::from_path(path).is_some()
}

/// The trace files in `dir` whose names `keep` takes, sorted by name.
fn traces_in(dir: &Path, keep: impl Fn(&str) -> bool) -> anyhow::Result<Vec<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("reading the folder {}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading the folder {}", dir.display()))?;
        let path = entry.path();
        if is_trace(&path) && keep(&entry.file_name().to_string_lossy()) {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// The trace files a pattern names. Wildcards (`*`: any run of characters, `?`: one) are
/// taken in the file name only, which is all a job's `run/trace_rank*.pickle.gz` needs: a
/// matcher of a dozen lines instead of a dependency.
fn expand(pattern: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let name = pattern.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = match pattern.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if is_pattern(dir) || dir.to_string_lossy().contains(['*', '?']) {
        bail!("{}: wildcards are taken in the file name only", pattern.display());
    }
    let matched = traces_in(dir, |n| matches(name.as_bytes(), n.as_bytes()))?;
    if matched.is_empty() {
        bail!("{}: no trace file matches the pattern", pattern.display());
    }
    Ok(matched)
}

/// Whether `text` matches `pattern` (`*` any run, `?` any one byte).
fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            (p, t) = (p + 1, t + 1);
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            (p, t) = (sp + 1, st + 1);
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The `N` of a `rankN` in a file name (`fsdp2_rank1.pickle.gz`: 1).
fn rank_in_name(path: &Path) -> Option<u32> {
    let name = crate::trace_name(path).to_ascii_lowercase();
    let at = name.rfind("rank")?;
    let digits: String = name[at + 4..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Read every rank of `paths` (in parallel) into a [`Job`]: numbered, checked (no duplicate
/// rank, one allocator setting) and sorted by rank.
pub fn load(paths: &[PathBuf], cx: &Context) -> anyhow::Result<Job> {
    if paths.is_empty() {
        bail!("a job of no traces: name the ranks' trace files, their folder or a pattern");
    }
    let loaded: Vec<Arc<Loaded>> = paths
        .par_iter()
        .map(|p| cx.trace(p).map(|t| Arc::new(Loaded { path: p.clone(), trace: t.into_owned() })))
        .collect::<anyhow::Result<_>>()?;
    let mut ranks: Vec<Rank> = Vec::with_capacity(paths.len());
    for (i, l) in loaded.iter().enumerate() {
        let (rank, numbered_by) = match (l.trace.meta.rank, rank_in_name(&l.path)) {
            (Some(r), _) => (r, "sidecar"),
            (None, Some(r)) => (r, "file name"),
            (None, None) => (i as u32, "position"),
        };
        if let Some(other) = ranks.iter().find(|r| r.rank == rank) {
            bail!(
                "rank {rank} twice in the job: {} (numbered by {}) and {} (numbered by {}): \
                 give each rank's trace once",
                other.path.display(),
                other.numbered_by,
                l.path.display(),
                numbered_by
            );
        }
        ranks.push(Rank { rank, path: l.path.clone(), numbered_by });
    }
    check_settings(&loaded)?;
    ranks.sort_by_key(|r| r.rank);
    let world_size = loaded.iter().find_map(|l| l.trace.meta.world_size);
    let mut cx = cx.clone();
    cx.loaded.extend(loaded);
    Ok(Job { ranks, world_size, cx })
}

/// The ranks of a job run one setting: recordings made under different allocator settings
/// (or formats) are two jobs, and are refused naming the first two that differ.
fn check_settings(loaded: &[Arc<Loaded>]) -> anyhow::Result<()> {
    let first = &loaded[0];
    let setting = |l: &Loaded| {
        (l.trace.meta.alloc_conf.clone().unwrap_or_default(), l.trace.meta.source_format.clone())
    };
    for l in &loaded[1..] {
        let (a, b) = (setting(first), setting(l));
        if a != b {
            bail!(
                "the job's ranks were recorded under different allocator settings: {} has {} \
                 ({}), {} has {} ({}); a job's ranks run one setting",
                first.path.display(),
                quoted(&a.0),
                a.1,
                l.path.display(),
                quoted(&b.0),
                b.1
            );
        }
    }
    Ok(())
}

impl Job {
    /// `f` on every rank's path (in parallel), in rank order, with the job's context.
    pub fn each<T: Send>(
        &self,
        f: impl Fn(&Rank, &Context) -> anyhow::Result<T> + Sync,
    ) -> anyhow::Result<Vec<T>> {
        self.ranks.par_iter().map(|r| f(r, &self.cx)).collect()
    }

    /// The job's line under a command's title: `2 ranks (of 2) from ...`.
    pub fn heading(&self) -> String {
        let of = self.world_size.map_or(String::new(), |w| format!(" of {w}"));
        format!("job of {} ranks{of}", self.ranks.len())
    }

    /// The ranks as JSON rows: number, path and where the number came from.
    pub fn rank_json(&self, i: usize) -> serde_json::Value {
        let r = &self.ranks[i];
        serde_json::json!({
            "rank": r.rank,
            "trace": r.path.display().to_string(),
            "rank_from": r.numbered_by,
        })
    }
}

/// Which rank holds the most of a figure, and how far the ranks spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The rank with the largest value (the first such, by rank).
    pub top_rank: u32,
    pub top_bytes: u64,
    pub least_rank: u32,
    pub least_bytes: u64,
}

impl Spread {
    /// Over `(rank, value)` pairs; `None` for none.
    pub fn of(values: impl IntoIterator<Item = (u32, u64)>) -> Option<Spread> {
        let mut s: Option<Spread> = None;
        for (rank, v) in values {
            let s = s.get_or_insert(Spread {
                top_rank: rank,
                top_bytes: v,
                least_rank: rank,
                least_bytes: v,
            });
            if v > s.top_bytes {
                (s.top_rank, s.top_bytes) = (rank, v);
            }
            if v < s.least_bytes {
                (s.least_rank, s.least_bytes) = (rank, v);
            }
        }
        s
    }

    pub fn bytes(&self) -> u64 {
        self.top_bytes - self.least_bytes
    }

    /// The spread as a percentage of the least rank's value: how much more the top rank
    /// holds.
    pub fn percent(&self) -> f64 {
        100.0 * self.bytes() as f64 / self.least_bytes.max(1) as f64
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "top_rank": self.top_rank,
            "top_bytes": self.top_bytes,
            "least_rank": self.least_rank,
            "least_bytes": self.least_bytes,
            "spread_bytes": self.bytes(),
            "spread_percent": self.percent(),
        })
    }

    /// `rank 1 needs 1.2 GiB more than rank 0 (+3.40 %)`, with `verb` for `needs`.
    pub fn text(&self, verb: &str) -> String {
        format!(
            "rank {} {verb} {} more than rank {} (+{:.2} %)",
            self.top_rank,
            crate::output::bytes(self.bytes()),
            self.least_rank,
            self.percent()
        )
    }
}

/// Each line of `text` indented by two spaces, for a rank's section of a job's text.
pub fn indented(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_a_shell_would() {
        assert!(matches(b"fsdp2_rank*.pickle.gz", b"fsdp2_rank10.pickle.gz"));
        assert!(matches(b"*", b""));
        assert!(matches(b"a?c*", b"abcdef"));
        assert!(!matches(b"a?c", b"ac"));
        assert!(!matches(b"*rank*.gz", b"ddp_rank0.json"));
        assert!(matches(b"*a*b", b"xaxxab"));
    }

    #[test]
    fn a_rank_is_read_from_the_file_name() {
        assert_eq!(rank_in_name(Path::new("x/ddp_rank12.pickle.gz")), Some(12));
        assert_eq!(rank_in_name(Path::new("x/ddp_rank.pickle.gz")), None);
        assert_eq!(rank_in_name(Path::new("x/train.pickle.gz")), None);
    }

    #[test]
    fn the_spread_names_the_top_and_least_ranks() {
        let s = Spread::of([(0, 100), (1, 150), (2, 150)]).unwrap();
        assert_eq!((s.top_rank, s.least_rank, s.bytes()), (1, 0, 50));
        assert!((s.percent() - 50.0).abs() < 1e-9);
        assert_eq!(Spread::of([]), None);
    }
}
