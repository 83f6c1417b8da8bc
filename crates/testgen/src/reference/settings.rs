//! The reference model's reading of `PYTORCH_CUDA_ALLOC_CONF` (spec §11), written from the
//! spec without looking at the policy's parser: a tokenizer that makes `,:[]` their own tokens,
//! then `key:value` pairs. A string is applied whole or not at all.

use allocsim_core::{ConfigError, MIB};

/// The values the reference model decides by.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `u64::MAX` when unlimited (PyTorch's `SIZE_MAX`).
    pub max_split_size: u64,
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per interval: slot `k` holds sizes in `[2^(20+k), 2^(21+k))`,
    /// slot 0 everything below 2 MiB, slot 15 everything from 32 GiB.
    pub divisions: [u64; 16],
    pub gc_threshold: f64,
    pub expandable_segments: bool,
}

/// The 20 MiB `large_segment_size`: the smallest `max_split_size_mb` PyTorch 2.11 accepts.
const MIN_SPLIT_MB: u64 = 20;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            divisions: [0; 16],
            gc_threshold: 0.0,
            expandable_segments: false,
        }
    }
}

fn tokens(conf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in conf.chars() {
        if c.is_whitespace() {
            continue;
        }
        if matches!(c, ',' | ':' | '[' | ']') {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            out.push(c.to_string());
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

fn number(tok: Option<&String>) -> Result<u64, ConfigError> {
    tok.and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| err(format!("expected a number, got {tok:?}")))
}

fn boolean(tok: Option<&String>) -> Result<bool, ConfigError> {
    match tok.map(String::as_str) {
        Some("True") => Ok(true),
        Some("False") => Ok(false),
        other => Err(err(format!("expected True or False, got {other:?}"))),
    }
}

impl Settings {
    /// Apply `conf` as a parse does: the keys every parse resets go back to their defaults
    /// first, the others keep their values unless named.
    pub fn apply(&self, conf: &str) -> Result<Settings, ConfigError> {
        let defaults = Settings::default();
        let mut s = Settings {
            max_split_size: defaults.max_split_size,
            max_non_split_rounding: defaults.max_non_split_rounding,
            divisions: defaults.divisions,
            gc_threshold: defaults.gc_threshold,
            ..self.clone()
        };
        let t = tokens(conf);
        let mut i = 0;
        while i < t.len() {
            let key = t[i].as_str();
            if t.get(i + 1).map(String::as_str) != Some(":") {
                return Err(err(format!("expected ':' after {key:?}")));
            }
            i += 2;
            match key {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb = number(t.get(i))?;
                    if mb < MIN_SPLIT_MB {
                        return Err(err(format!("{key} too small, must be >= {MIN_SPLIT_MB}")));
                    }
                    let bytes = mb.min(u64::MAX / MIB) * MIB;
                    if key == "max_split_size_mb" {
                        s.max_split_size = bytes;
                    } else {
                        s.max_non_split_rounding = bytes;
                    }
                    i += 1;
                }
                "garbage_collection_threshold" => {
                    let v: f64 = t
                        .get(i)
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| err("garbage_collection_threshold needs a number"))?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(err("garbage_collection_threshold must be in (0, 1)"));
                    }
                    s.gc_threshold = v;
                    i += 1;
                }
                "expandable_segments" => {
                    s.expandable_segments = boolean(t.get(i))?;
                    i += 1;
                }
                "release_lock_on_cudamalloc" => {
                    boolean(t.get(i))?;
                    i += 1;
                }
                "roundup_power2_divisions" => i = s.roundup(&t, i)?,
                other => return Err(err(format!("unrecognized key {other:?}"))),
            }
            match t.get(i).map(String::as_str) {
                None => {}
                Some(",") if i + 1 < t.len() => i += 1,
                Some(other) => return Err(err(format!("unexpected {other:?}"))),
            }
        }
        Ok(s)
    }

    /// `roundup_power2_divisions:D` or `[B:D,...,>:D]` starting at token `i`; returns the
    /// index after it.
    fn roundup(&mut self, t: &[String], mut i: usize) -> Result<usize, ConfigError> {
        if t.get(i).map(String::as_str) != Some("[") {
            let d = number(t.get(i))?;
            if !d.is_power_of_two() {
                return Err(err("divisions must be a power of 2"));
            }
            self.divisions = [d; 16];
            return Ok(i + 1);
        }
        i += 1;
        let mut first = true;
        let mut last_index = 0usize;
        loop {
            let bound = t.get(i).ok_or_else(|| err("unterminated list"))?.clone();
            if t.get(i + 1).map(String::as_str) != Some(":") {
                return Err(err("expected ':' in the divisions list"));
            }
            let d = number(t.get(i + 2))?;
            if d != 0 && !d.is_power_of_two() {
                return Err(err("divisions must be a power of 2 or 0"));
            }
            if bound == ">" {
                for slot in self.divisions.iter_mut().skip(last_index + 1) {
                    *slot = d;
                }
            } else {
                let b: u64 = bound.parse().map_err(|_| err("bad interval"))?;
                if !b.is_power_of_two() {
                    return Err(err("intervals must be powers of 2"));
                }
                let index = (63 - b.leading_zeros() as usize).min(15);
                if first {
                    for slot in &mut self.divisions[..index] {
                        *slot = d;
                    }
                    first = false;
                }
                self.divisions[index] = d;
                last_index = index;
            }
            i += 3;
            match t.get(i).map(String::as_str) {
                Some(",") => i += 1,
                Some("]") => return Ok(i + 1),
                _ => return Err(err("expected ',' or ']' in the divisions list")),
            }
        }
    }

    /// `roundup_power2_divisions(size)`: the slot is `floor(log2(size)) - 20`, clamped.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.max(1).leading_zeros());
        self.divisions[log.saturating_sub(20).min(15) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_examples() {
        let s = Settings::default()
            .apply("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
            .unwrap();
        assert_eq!(s.gc_threshold, 0.5);
        assert_eq!(s.divisions_for(84 * MIB), 8);
        assert_eq!(s.divisions_for(400 * MIB), 2);
        assert_eq!(s.divisions_for(MIB), 8, "the first entry fills the slots below it");
        for bad in crate::conf::INVALID {
            assert!(Settings::default().apply(bad).is_err(), "{bad} was accepted");
        }
        let s = Settings::default().apply("max_split_size_mb:40,expandable_segments:True").unwrap();
        let s = s.apply("").unwrap();
        assert_eq!(s.max_split_size, u64::MAX, "a parse resets max_split_size");
        assert!(s.expandable_segments, "but keeps expandable_segments");
    }
}
