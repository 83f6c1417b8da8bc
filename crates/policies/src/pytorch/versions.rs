//! Which PyTorch the clone is, and what the caching allocator changed in the releases after
//! it: the clone follows one release ([`CLONE_VERSION`]); a recording made under another says
//! so once, naming the changes that lie between ([`recorded_version_note`]). The table is data
//! read from PyTorch's release notes and source (docs/pytorch-versions.md gives the sources),
//! so a later release's behaviour can be written beside 2.11's against a named version.

use allocsim_core::text::quoted;
use std::fmt;

/// A PyTorch release as `major.minor`: what the allocator's behaviour follows (patch releases
/// do not change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

/// The release the clone follows, function by function.
pub const CLONE_VERSION: Version = Version { major: 2, minor: 11 };

impl Version {
    /// The release of a `torch.__version__` string: `2.13.0+cu130`, `2.14.0a0+git4fdf77b`,
    /// `2.12`. `None` when it does not start with `major.minor`.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
        Some(Version { major, minor: minor.parse().ok()? })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One change to the allocator's behaviour, settings or statistics in a release after the
/// clone's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The first release that has it; when `pinned` is false, the earliest it can be in.
    pub version: Version,
    /// Whether the release notes name the release; otherwise only the source shows it.
    pub pinned: bool,
    /// What changed, in a phrase.
    pub what: &'static str,
    /// Where it is written: a pull request of pytorch/pytorch.
    pub source: &'static str,
}

const fn v(major: u32, minor: u32) -> Version {
    Version { major, minor }
}

/// What changed after 2.11, oldest first. None of it is modelled: the clone is 2.11's.
pub const CHANGES: &[Change] = &[
    Change {
        version: v(2, 12),
        pinned: true,
        what: "throw_on_cudamalloc_oom (with per_process_memory_fraction) rejects a request \
               that would pass the fraction before calling cudaMalloc, counted in a new \
               num_oom_rejections stat",
        source: "pytorch/pytorch#179473",
    },
    Change {
        version: v(2, 12),
        pinned: true,
        what: "cuBLAS takes 32 MiB workspaces on Blackwell GPUs (what programs request, not \
               the allocator)",
        source: "pytorch/pytorch#175344",
    },
    Change {
        version: v(2, 13),
        pinned: true,
        what: "the per-process memory fraction's cap is rounded, which moves where a run \
               under a fraction runs out",
        source: "pytorch/pytorch#179444",
    },
    Change {
        version: v(2, 12),
        pinned: false,
        what: "large_segment_size_mb sets the segment of 1-10 MiB requests and the expandable \
               large page (20 MiB before)",
        source: "c10/core/AllocatorConfig.h (in a 2.14.0a0 build; the release is not pinned)",
    },
    Change {
        version: v(2, 14),
        pinned: false,
        what: "expandable_segments_reserve and expandable_segments_reserve_by_class size an \
               expandable segment's address range (9/8 of the device before)",
        source: "pytorch/pytorch#192269 (the release is not pinned)",
    },
];

/// `torch.cuda.memory_stats()` keys that releases after the clone's added, with the release.
/// The clone has none of them; where a recording counts 0, the clone did the same by not
/// having the mechanism.
pub const LATER_STATS: &[(&str, Version)] = &[("num_oom_rejections", v(2, 12))];

/// Whether `key` is a statistic of a later release whose recorded `value` the clone agrees
/// with by not having it (it counts nothing).
pub fn later_stat_agrees(key: &str, value: i64) -> bool {
    value == 0 && LATER_STATS.iter().any(|(k, _)| *k == key)
}

/// The changes after `from` up to and including `to` (either order), oldest first.
pub fn changes_between(from: Version, to: Version) -> Vec<&'static Change> {
    let (lo, hi) = if from <= to { (from, to) } else { (to, from) };
    let mut changes: Vec<_> =
        CHANGES.iter().filter(|c| c.version > lo && c.version <= hi).collect();
    changes.sort_by_key(|c| c.version);
    changes
}

/// What a recording made with `torch.__version__ == recorded` should say about the clone:
/// `None` when it is the clone's release, else one sentence naming the changes between.
pub fn recorded_version_note(recorded: &str) -> Option<String> {
    let Some(version) = Version::parse(recorded) else {
        return Some(format!(
            "recorded with PyTorch {}, a version allocsim cannot read; the clone is \
             PyTorch {CLONE_VERSION}",
            quoted(recorded)
        ));
    };
    if version == CLONE_VERSION {
        return None;
    }
    let head =
        format!("recorded with PyTorch {}, the clone is PyTorch {CLONE_VERSION}", quoted(recorded));
    if version < CLONE_VERSION {
        return Some(format!(
            "{head}: the changes before {CLONE_VERSION} are not listed \
             (docs/pytorch-caching-allocator.md §14 has the older ones)"
        ));
    }
    let changes = changes_between(CLONE_VERSION, version);
    if changes.is_empty() {
        return Some(format!("{head}: no allocator change between them is known"));
    }
    let listed: Vec<String> = changes
        .iter()
        .map(|c| {
            let since = if c.pinned { c.version.to_string() } else { format!("{}?", c.version) };
            format!("{since}: {} ({})", c.what, c.source)
        })
        .collect();
    Some(format!("{head}, which does not model these changes between them: {}", listed.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_torch_writes_them() {
        assert_eq!(Version::parse("2.13.0+cu130"), Some(v(2, 13)));
        assert_eq!(Version::parse("2.14.0a0+git4fdf77b"), Some(v(2, 14)));
        assert_eq!(Version::parse("2.11"), Some(v(2, 11)));
        assert_eq!(Version::parse("nightly"), None);
        assert_eq!(Version::parse("2"), None);
    }

    #[test]
    fn the_clone_release_says_nothing_and_a_later_one_names_its_changes() {
        assert_eq!(recorded_version_note("2.11.0+cu130"), None);
        let note = recorded_version_note("2.13.0").unwrap();
        assert!(note.starts_with("recorded with PyTorch \"2.13.0\", the clone is PyTorch 2.11"));
        assert!(note.contains("throw_on_cudamalloc_oom") && note.contains("#179444"), "{note}");
        assert!(!note.contains("expandable_segments_reserve"), "2.14's is not 2.13's: {note}");
        let later = recorded_version_note("2.15.0").unwrap();
        assert!(later.contains("2.14?: expandable_segments_reserve"), "{later}");
    }

    #[test]
    fn an_older_or_unreadable_version_says_what_is_not_known() {
        let older = recorded_version_note("2.9.1").unwrap();
        assert!(older.contains("not listed"), "{older}");
        let odd = recorded_version_note("main\u{1b}[31m").unwrap();
        assert!(odd.contains("cannot read") && !odd.contains('\u{1b}'), "{odd}");
    }

    #[test]
    fn a_later_stat_agrees_only_when_it_counted_nothing() {
        assert!(later_stat_agrees("num_oom_rejections", 0));
        assert!(!later_stat_agrees("num_oom_rejections", 3));
        assert!(!later_stat_agrees("num_ooms", 0));
    }

    #[test]
    fn changes_between_is_symmetric_and_ordered() {
        let up = changes_between(v(2, 11), v(2, 15));
        assert_eq!(up, changes_between(v(2, 15), v(2, 11)));
        assert_eq!(up.len(), CHANGES.len());
        assert!(up.windows(2).all(|w| w[0].version <= w[1].version));
        assert!(changes_between(v(2, 11), v(2, 11)).is_empty());
    }
}
