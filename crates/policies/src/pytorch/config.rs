//! `PYTORCH_CUDA_ALLOC_CONF`, parsed as PyTorch 2.11 parses it.
//!
//! PyTorch splits the settings between two parsers that both walk the whole string:
//! `AcceleratorAllocatorConfig::parseArgs` (c10/core/AllocatorConfig.cpp) owns the
//! device-independent keys and runs first; `CUDAAllocatorConfig::parseArgs` owns the CUDA keys
//! and rejects anything neither knows. We keep that two-pass shape because it decides which
//! error a string with several mistakes reports, and because each pass writes into the live
//! config as it goes: a string that fails half-way leaves the keys before the mistake applied,
//! as it does in PyTorch.
//!
//! Every parse first resets `max_split_size`, `max_non_split_rounding`,
//! `roundup_power2_divisions` and `garbage_collection_threshold` to their defaults; the other
//! keys keep their previous values unless the string sets them (docs/pytorch-caching-allocator.md §11.1).
//!
//! Keys that later releases added (`throw_on_cudamalloc_oom`, `large_segment_size_mb`,
//! `expandable_segments_reserve[_by_class]`) are parsed with their grammar so a later release's
//! string reads, kept in [`Config::later_keys`] when not at their default, and named by
//! [`Config::notes`] as not modelled (docs/pytorch-versions.md).

use allocsim_core::text::quoted;
use allocsim_core::ConfigError;

/// PyTorch's size constants (`CUDACachingAllocator.cpp`) start here; `rounding` applies them.
pub const MB: u64 = 1 << 20;
/// `kMinBlockSize`: every size is rounded to at least this.
pub const K_MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: the largest request served by the small pool.
pub const K_SMALL_SIZE: u64 = MB;
/// `kSmallBuffer`: small-pool segment size, and the expandable small-pool page.
pub const K_SMALL_BUFFER: u64 = 2 * MB;
/// `kLargeBuffer` (`large_segment_size()` in 2.11): segment for 1–10 MiB requests, and the
/// expandable large-pool page.
pub const K_LARGE_BUFFER: u64 = 20 * MB;
/// `kMinLargeAlloc`: from here on segments are the request rounded to `K_ROUND_LARGE`.
pub const K_MIN_LARGE_ALLOC: u64 = 10 * MB;
/// `kRoundLarge`.
pub const K_ROUND_LARGE: u64 = 2 * MB;
/// `kRoundUpPowerOfTwoIntervals`: 1 MiB .. 64 GiB.
pub const K_ROUNDUP_INTERVALS: usize = 16;

/// The allocator settings that PyTorch 2.11 keeps, with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Blocks and segments of at least this many bytes are never split. `u64::MAX`: unlimited.
    pub max_split_size: u64,
    /// An oversize block is handed to a request `r` only if it is smaller than `r` plus this.
    pub max_non_split_rounding_size: u64,
    /// Divisions per power-of-two interval, one slot per interval from 1 MiB (slot 0) up.
    pub roundup_power2_divisions: [u64; K_ROUNDUP_INTERVALS],
    /// Fraction of the allowed memory above which GC frees old cached segments; 0: off.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_use_background_threads: bool,
    pub pinned_reserve_segment_size_mb: u64,
    pub graph_capture_record_stream_reuse: bool,
    /// The initial per-process memory fraction (`per_process_memory_fraction`), 1.0 by default.
    pub per_process_memory_fraction: f64,
    /// The last settings string parsed (`allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`).
    pub last_allocator_settings: String,
    /// Keys of releases after the clone's ([`super::versions`]) set to other than their
    /// defaults, as `(key, value as written)`: read so a later release's string parses, not
    /// modelled, and said so by [`Config::notes`].
    pub later_keys: Vec<(&'static str, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: K_LARGE_BUFFER,
            roundup_power2_divisions: [0; K_ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            per_process_memory_fraction: 1.0,
            last_allocator_settings: String::new(),
            later_keys: Vec::new(),
        }
    }
}

/// `CUDAAllocatorConfig::pinned_max_register_threads()`.
const PINNED_MAX_REGISTER_THREADS: u64 = 128;

/// Keys the accelerator pass handles; the CUDA pass skips them.
const ACCELERATOR_KEYS: [&str; 7] = [
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
];

impl Config {
    /// The defaults with `conf` applied, as at process start with `PYTORCH_CUDA_ALLOC_CONF=conf`.
    pub fn parse(conf: &str) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        config.apply(conf)?;
        Ok(config)
    }

    /// `_set_allocator_settings(conf)`: reset the per-parse keys, then apply `conf`.
    /// On error, the keys before the mistake stay applied (PyTorch parses in place).
    pub fn apply(&mut self, conf: &str) -> Result<(), ConfigError> {
        self.max_split_size = u64::MAX;
        self.max_non_split_rounding_size = K_LARGE_BUFFER;
        self.roundup_power2_divisions = [0; K_ROUNDUP_INTERVALS];
        self.garbage_collection_threshold = 0.0;
        self.last_allocator_settings = conf.to_string();
        let tokens = Tokenizer::new(conf);
        let parsed =
            self.parse_accelerator_keys(&tokens).and_then(|()| self.parse_cuda_keys(&tokens));
        // PyTorch's own message, with what a valid string looks like beside it.
        parsed.map_err(|e| {
            ConfigError(format!(
                "PYTORCH_CUDA_ALLOC_CONF {}: {} (PyTorch's message); expected key:value \
                 pairs separated by commas, e.g. max_split_size_mb:128,expandable_segments:True",
                quoted(conf),
                e.0.trim_end()
            ))
        })
    }

    /// What the settings ask that the clone does not do: one line for each key of a later
    /// release set to other than its default.
    pub fn notes(&self) -> Vec<String> {
        self.later_keys
            .iter()
            .map(|(key, value)| {
                format!(
                    "the settings set {key} to {}, which PyTorch {} does not have and the \
                     clone does not model (docs/pytorch-versions.md)",
                    quoted(value),
                    super::versions::CLONE_VERSION
                )
            })
            .collect()
    }

    /// Record (or, when `differs` is false, forget) later-release key `key`, whose value runs
    /// from token `i + 2` to the key's end; returns that end.
    fn set_later_key(
        &mut self,
        key: &'static str,
        differs: bool,
        t: &Tokenizer<'_>,
        i: usize,
    ) -> usize {
        let end = t.skip_key(i).unwrap_or(i + 2);
        self.later_keys.retain(|(k, _)| *k != key);
        if differs {
            let value = t.tokens[i + 2..=end.min(t.len() - 1)].concat();
            self.later_keys.push((key, value));
        }
        end
    }

    /// The division count for a request of `size` bytes
    /// (`AcceleratorAllocatorConfig::roundup_power2_divisions(size)`).
    #[inline]
    pub fn roundup_divisions_for(&self, size: u64) -> u64 {
        let log_size = 63 - u64::from(size.max(1).leading_zeros());
        let index = log_size.saturating_sub(20).min(K_ROUNDUP_INTERVALS as u64 - 1);
        self.roundup_power2_divisions[index as usize]
    }

    /// The `max_split_size` stat as PyTorch reports it: -1 when unlimited.
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == u64::MAX {
            -1
        } else {
            self.max_split_size as i64
        }
    }

    /// `AcceleratorAllocatorConfig::parseArgs`.
    fn parse_accelerator_keys(&mut self, t: &Tokenizer<'_>) -> Result<(), ConfigError> {
        let mut i = 0;
        while i < t.len() {
            i = match t.get(i)? {
                "max_split_size_mb" => {
                    let (i, mb) = parse_mb(t, i, "max_split_size_mb")?;
                    self.max_split_size = mb * MB;
                    i
                }
                "max_non_split_rounding_mb" => {
                    let (i, mb) = parse_mb(t, i, "max_non_split_rounding_mb")?;
                    self.max_non_split_rounding_size = mb * MB;
                    i
                }
                "garbage_collection_threshold" => {
                    t.check(i + 1, ":")?;
                    let value = t.to_f64(i + 2)?;
                    if !(value > 0.0 && value < 1.0) {
                        return Err(err(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                        ));
                    }
                    self.garbage_collection_threshold = value;
                    i + 2
                }
                "roundup_power2_divisions" => self.parse_roundup(t, i)?,
                "large_segment_size_mb" => {
                    // Later releases' key; 20 is the clone's fixed `kLargeBuffer`.
                    t.check(i + 1, ":")?;
                    let mb = t.to_u64(i + 2)?;
                    self.set_later_key("large_segment_size_mb", mb != K_LARGE_BUFFER / MB, t, i)
                }
                "expandable_segments" => parse_bool(t, i, &mut self.expandable_segments)?,
                "pinned_use_background_threads" => {
                    parse_bool(t, i, &mut self.pinned_use_background_threads)?
                }
                _ => t.skip_key(i)?,
            };
            i = t.expect_separator(i)?;
        }
        Ok(())
    }

    /// `CUDAAllocatorConfig::parseArgs`.
    fn parse_cuda_keys(&mut self, t: &Tokenizer<'_>) -> Result<(), ConfigError> {
        let mut i = 0;
        while i < t.len() {
            let key = t.get(i)?;
            i = match key {
                "backend" => parse_backend(t, i)?,
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    parse_bool(t, i, &mut self.release_lock_on_cudamalloc)?
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    parse_bool(t, i, &mut self.pinned_use_cuda_host_register)?
                }
                "pinned_num_register_threads" => {
                    t.check(i + 1, ":")?;
                    let n = t.to_u64(i + 2)?;
                    if !n.is_power_of_two() {
                        return Err(err("Number of register threads has to be power of 2 "));
                    }
                    if n > PINNED_MAX_REGISTER_THREADS {
                        return Err(ConfigError(format!(
                            "Number of register threads should be less than or equal to {PINNED_MAX_REGISTER_THREADS}"
                        )));
                    }
                    self.pinned_num_register_threads = n;
                    i + 2
                }
                "pinned_reserve_segment_size_mb" => {
                    t.check(i + 1, ":")?;
                    let n = t.to_u64(i + 2)?;
                    if n == 0 {
                        return Err(err("Pinned reserve segment size has to be greater than 0 "));
                    }
                    self.pinned_reserve_segment_size_mb = n;
                    i + 2
                }
                "graph_capture_record_stream_reuse" => {
                    parse_bool(t, i, &mut self.graph_capture_record_stream_reuse)?
                }
                "pinned_free_catch_all" => {
                    let mut ignored = false;
                    parse_bool(t, i, &mut ignored)?
                }
                "per_process_memory_fraction" => {
                    t.check(i + 1, ":")?;
                    let value = t.to_f64(i + 2)?;
                    if !(0.0..=1.0).contains(&value) {
                        return Err(err(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        ));
                    }
                    self.per_process_memory_fraction = value;
                    i + 2
                }
                "throw_on_cudamalloc_oom" => {
                    let mut on = false;
                    let end = parse_bool(t, i, &mut on)?;
                    self.set_later_key("throw_on_cudamalloc_oom", on, t, i);
                    end
                }
                // PyTorch warns about a malformed value and keeps its default; the clone
                // models neither, so any value is taken as written.
                "expandable_segments_reserve" => {
                    t.check(i + 1, ":")?;
                    t.get(i + 2)?;
                    self.set_later_key("expandable_segments_reserve", true, t, i)
                }
                "expandable_segments_reserve_by_class" => {
                    t.check(i + 1, ":")?;
                    t.check(i + 2, "[")?;
                    let end = t.skip_key(i)?;
                    t.check(end, "]")?;
                    self.set_later_key("expandable_segments_reserve_by_class", end > i + 3, t, i);
                    end
                }
                _ if ACCELERATOR_KEYS.contains(&key) => t.skip_key(i)?,
                _ => {
                    return Err(ConfigError(format!(
                        "Unrecognized key {} in CUDA allocator config",
                        quoted(key)
                    )))
                }
            };
            i = t.expect_separator(i)?;
        }
        Ok(())
    }

    /// `AcceleratorAllocatorConfig::parseRoundUpPower2Divisions`, with 2.8+ `>` semantics
    /// (fill the slots *after* the last explicit one).
    fn parse_roundup(&mut self, t: &Tokenizer<'_>, mut i: usize) -> Result<usize, ConfigError> {
        t.check(i + 1, ":")?;
        i += 2;
        if t.get(i)? != "[" {
            let value = t.to_u64(i)?;
            if !value.is_power_of_two() {
                return Err(err("For roundups, the divisions has to be power of 2 "));
            }
            self.roundup_power2_divisions = [value; K_ROUNDUP_INTERVALS];
            return Ok(i);
        }
        let mut first_value = true;
        let mut last_index = 0usize;
        loop {
            i += 1;
            if i >= t.len() || t.get(i)? == "]" {
                break;
            }
            let boundary_index = i;
            t.check(i + 1, ":")?;
            i += 2;
            let value = t.to_u64(i)?;
            if value != 0 && !value.is_power_of_two() {
                return Err(err(
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup ",
                ));
            }
            if t.get(boundary_index)? == ">" {
                for slot in self.roundup_power2_divisions.iter_mut().skip(last_index + 1) {
                    *slot = value;
                }
            } else {
                let boundary = t.to_u64(boundary_index)?;
                if !boundary.is_power_of_two() {
                    return Err(err("For roundups, the intervals have to be power of 2 "));
                }
                let index = (boundary.trailing_zeros() as usize).min(K_ROUNDUP_INTERVALS - 1);
                if first_value {
                    self.roundup_power2_divisions[..index].fill(value);
                    first_value = false;
                }
                self.roundup_power2_divisions[index] = value;
                last_index = index;
            }
            if t.get(i + 1)? != "]" {
                t.check(i + 1, ",")?;
                i += 1;
            }
        }
        if i >= t.len() {
            return Err(err(
                "Expected closing bracket ']' in ConfigTokenizer but reached end of config",
            ));
        }
        Ok(i)
    }
}

fn err(msg: &str) -> ConfigError {
    ConfigError(msg.to_string())
}

/// `parseMaxSplitSize` / `parseMaxNonSplitRoundingSize`: a MiB count of at least 20.
fn parse_mb(t: &Tokenizer<'_>, i: usize, key: &str) -> Result<(usize, u64), ConfigError> {
    t.check(i + 1, ":")?;
    let min_mb = K_LARGE_BUFFER / MB;
    let value = t.to_u64(i + 2)?;
    if value < min_mb {
        return Err(ConfigError(format!(
            "CachingAllocator option {key} too small, must be >= {min_mb}"
        )));
    }
    Ok((i + 2, value.min(u64::MAX / MB)))
}

/// `key:True|False`.
fn parse_bool(t: &Tokenizer<'_>, i: usize, out: &mut bool) -> Result<usize, ConfigError> {
    t.check(i + 1, ":")?;
    *out = t.to_bool(i + 2)?;
    Ok(i + 2)
}

/// `CUDAAllocatorConfig::parseAllocatorConfig`: only the native backend is simulated.
fn parse_backend(t: &Tokenizer<'_>, i: usize) -> Result<usize, ConfigError> {
    t.check(i + 1, ":")?;
    match t.get(i + 2)? {
        "native" => Ok(i + 2),
        "cudaMallocAsync" => Err(err(
            "Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native",
        )),
        _ => Err(err("Unknown allocator backend, options are native and cudaMallocAsync")),
    }
}

/// `c10::CachingAllocator::ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own,
/// whitespace is dropped, everything else accumulates into words.
#[derive(Debug)]
struct Tokenizer<'a> {
    tokens: Vec<&'a str>,
}

impl<'a> Tokenizer<'a> {
    fn new(conf: &'a str) -> Self {
        let mut tokens = Vec::new();
        let mut start: Option<usize> = None;
        for (pos, ch) in conf.char_indices() {
            let separator = matches!(ch, ',' | ':' | '[' | ']');
            if separator || ch.is_ascii_whitespace() {
                if let Some(s) = start.take() {
                    tokens.push(&conf[s..pos]);
                }
                if separator {
                    tokens.push(&conf[pos..pos + 1]);
                }
            } else if start.is_none() {
                start = Some(pos);
            }
        }
        if let Some(s) = start {
            tokens.push(&conf[s..]);
        }
        Tokenizer { tokens }
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn get(&self, i: usize) -> Result<&'a str, ConfigError> {
        self.tokens.get(i).copied().ok_or_else(|| err("Index out of bounds in ConfigTokenizer"))
    }

    /// `checkToken`.
    fn check(&self, i: usize, expected: &str) -> Result<(), ConfigError> {
        let got = self.get(i)?;
        if got == expected {
            Ok(())
        } else {
            Err(ConfigError(format!(
                "Expected '{expected}' at index {i} in ConfigTokenizer but got {}",
                quoted(got)
            )))
        }
    }

    /// After a key's value: a `,` must follow unless the string ends. Returns the next key index.
    fn expect_separator(&self, i: usize) -> Result<usize, ConfigError> {
        if i + 1 < self.len() {
            self.check(i + 1, ",")?;
        }
        Ok(i + 2)
    }

    /// `skipKey`: a key owned by the other pass; step over `: value` or `: [ ... ]`.
    fn skip_key(&self, i: usize) -> Result<usize, ConfigError> {
        self.check(i + 1, ":")?;
        let mut j = i + 2;
        if self.get(j)? == "[" {
            while j < self.len() && self.tokens[j] != "]" {
                j += 1;
            }
        }
        Ok(j.min(self.len().saturating_sub(1)))
    }

    /// `toBool`: exactly `True` or `False`.
    fn to_bool(&self, i: usize) -> Result<bool, ConfigError> {
        match self.get(i)? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(ConfigError(format!(
                "Expected 'True' or 'False' at index {i} in ConfigTokenizer but got {}",
                quoted(other)
            ))),
        }
    }

    /// `toSizeT`, i.e. `std::stoull`: an optional sign, decimal digits, trailing text ignored,
    /// a minus wraps around as in C.
    fn to_u64(&self, i: usize) -> Result<u64, ConfigError> {
        let token = self.get(i)?;
        stoull(token)
            .ok_or_else(|| ConfigError(format!("stoull: invalid integer {}", quoted(token))))
    }

    /// `toDouble`, i.e. `std::stod`: the longest numeric prefix.
    fn to_f64(&self, i: usize) -> Result<f64, ConfigError> {
        let token = self.get(i)?;
        stod(token).ok_or_else(|| ConfigError(format!("stod: invalid number {}", quoted(token))))
    }
}

/// `std::stoull(s, nullptr, 10)`: `None` where it throws.
fn stoull(s: &str) -> Option<u64> {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let value: u64 = digits[..end].parse().ok()?;
    Some(if negative { value.wrapping_neg() } else { value })
}

/// `std::stod`: the longest prefix that is a decimal float, `inf`/`infinity` or `nan`.
fn stod(s: &str) -> Option<f64> {
    let bytes = s.as_bytes();
    let mut end = usize::from(matches!(bytes.first(), Some(b'-' | b'+')));
    let rest = s[end..].to_ascii_lowercase();
    for word in ["infinity", "inf", "nan"] {
        if rest.starts_with(word) {
            return s[..end + word.len()].parse().ok();
        }
    }
    let mantissa_start = end;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    if end < bytes.len() && bytes[end] == b'.' {
        end += 1;
        while end < bytes.len() && bytes[end].is_ascii_digit() {
            end += 1;
        }
    }
    if !s[mantissa_start..end].bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    if end < bytes.len() && matches!(bytes[end], b'e' | b'E') {
        let mut e = end + 1;
        if e < bytes.len() && matches!(bytes[e], b'-' | b'+') {
            e += 1;
        }
        let digits_start = e;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        if e > digits_start {
            end = e;
        }
    }
    s[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pytorch() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.max_split_size_stat(), -1);
        assert_eq!(c.max_non_split_rounding_size, 20 * MB);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert!(!c.expandable_segments);
    }

    #[test]
    fn roundup_list_uses_28_semantics() {
        let c = Config::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let mut want = [1u64; 16];
        want[9] = 2;
        want[10] = 4;
        want[11..].fill(8);
        assert_eq!(c.roundup_power2_divisions, want);
        let c =
            Config::parse("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]").unwrap();
        let mut want = [8u64; 16];
        want[7..10].fill(2);
        want[10..].fill(1);
        assert_eq!(c.roundup_power2_divisions, want);
        let c = Config::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
    }

    #[test]
    fn whitespace_and_many_keys() {
        let c = Config::parse(
            " max_split_size_mb : 40 , expandable_segments:True,garbage_collection_threshold:0.5",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 40 * MB);
        assert!(c.expandable_segments);
        assert_eq!(c.garbage_collection_threshold, 0.5);
    }

    #[test]
    fn apply_resets_only_the_per_parse_keys() {
        let mut c = Config::parse(
            "expandable_segments:True,max_split_size_mb:40,roundup_power2_divisions:4",
        )
        .unwrap();
        c.apply("release_lock_on_cudamalloc:True").unwrap();
        assert!(c.expandable_segments);
        assert!(c.release_lock_on_cudamalloc);
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
    }

    #[test]
    fn invalid_strings_from_test_allocator_settings() {
        for bad in [
            "foo:1,bar:2",
            "garbage_collection_threshold:1.2",
            "max_split_size_mb:2",
            "release_lock_on_cudamalloc:none",
            "pinned_use_cuda_host_register:none",
            "pinned_num_register_threads:none",
            "pinned_num_register_threads:1024",
        ] {
            assert!(Config::parse(bad).is_err(), "{bad} should be refused");
        }
        let e = Config::parse("foo:1,bar:2").unwrap_err();
        assert!(
            e.0.starts_with(
                "PYTORCH_CUDA_ALLOC_CONF \"foo:1,bar:2\": Unrecognized key \"foo\" in CUDA \
                 allocator config (PyTorch's message); expected key:value pairs"
            ),
            "{}",
            e.0
        );
    }

    #[test]
    fn malformed_strings_never_panic() {
        for bad in [
            ":",
            ",",
            "[",
            "]",
            "max_split_size_mb",
            "max_split_size_mb:",
            "roundup_power2_divisions:[",
            "roundup_power2_divisions:[64",
            "roundup_power2_divisions:[64:",
            "roundup_power2_divisions:[64:3]",
            "roundup_power2_divisions:[3:4]",
            "expandable_segments:True:",
            "backend:cudaMallocAsync",
            "garbage_collection_threshold:nan",
            "per_process_memory_fraction:1.1",
            "max_split_size_mb:20x,",
            "pinned_reserve_segment_size_mb:0",
            "foo:[1,2]",
        ] {
            let _ = Config::parse(bad);
        }
        assert!(Config::parse("max_split_size_mb:20").is_ok());
        assert!(Config::parse("backend:native").is_ok());
        assert!(Config::parse(
            "per_process_memory_fraction:0.5,pinned_use_background_threads:True"
        )
        .is_ok());
    }

    #[test]
    fn later_releases_keys_parse_and_are_noted_not_modelled() {
        let c = Config::parse(
            "expandable_segments:True,throw_on_cudamalloc_oom:True,per_process_memory_fraction:0.5,\
             large_segment_size_mb:12,expandable_segments_reserve:40G,\
             expandable_segments_reserve_by_class:[kv:0.5,act:8G]",
        )
        .unwrap();
        // The keys 2.11 has still take effect.
        assert!(c.expandable_segments);
        assert_eq!(c.per_process_memory_fraction, 0.5);
        assert_eq!(
            c.later_keys,
            vec![
                ("large_segment_size_mb", "12".to_string()),
                ("throw_on_cudamalloc_oom", "True".to_string()),
                ("expandable_segments_reserve", "40G".to_string()),
                ("expandable_segments_reserve_by_class", "[kv:0.5,act:8G]".to_string()),
            ]
        );
        let notes = c.notes();
        assert_eq!(notes.len(), 4);
        assert_eq!(
            notes[1],
            "the settings set throw_on_cudamalloc_oom to \"True\", which PyTorch 2.11 does not \
             have and the clone does not model (docs/pytorch-versions.md)"
        );
    }

    #[test]
    fn later_keys_at_their_defaults_are_the_clone_and_say_nothing() {
        let mut c = Config::parse(
            "large_segment_size_mb:20,throw_on_cudamalloc_oom:False,\
             expandable_segments_reserve_by_class:[]",
        )
        .unwrap();
        assert_eq!(c.later_keys, vec![]);
        assert!(c.notes().is_empty());
        // A later string that sets one again is noted; one that resets it forgets it.
        c.apply("throw_on_cudamalloc_oom:True").unwrap();
        assert_eq!(c.notes().len(), 1);
        c.apply("throw_on_cudamalloc_oom:False").unwrap();
        assert!(c.notes().is_empty());
        // Their values are checked as PyTorch checks them.
        for bad in [
            "throw_on_cudamalloc_oom:yes",
            "large_segment_size_mb:x",
            "expandable_segments_reserve_by_class:kv",
            "expandable_segments_reserve_by_class:[kv:0.5",
            "expandable_segments_reserve",
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn c_number_parsing() {
        assert_eq!(stoull("12abc"), Some(12));
        assert_eq!(stoull("abc"), None);
        assert_eq!(stoull("-1"), Some(u64::MAX));
        assert_eq!(stod("0.5x"), Some(0.5));
        assert_eq!(stod("1e-1"), Some(0.1));
        assert_eq!(stod(".5"), Some(0.5));
        assert_eq!(stod("x"), None);
    }
}
