//! Workload specs: `NAME?key=value&key=value`, every value a non-negative integer.

use allocsim_core::text::quoted;
use std::collections::BTreeMap;
use std::fmt;

/// A spec the workloads refuse, with what was wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadError(pub String);

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WorkloadError {}

/// The `key=value` pairs of a spec. Workloads take the keys they know; whatever is left over
/// is an error, so a misspelt key never silently falls back to a default.
#[derive(Debug, Clone, Default)]
pub struct Params {
    values: BTreeMap<String, u64>,
    known: Vec<&'static str>,
}

impl Params {
    /// The value of `key`, or `default` when the spec does not set it.
    pub fn take(&mut self, key: &'static str, default: u64) -> u64 {
        self.known.push(key);
        self.values.remove(key).unwrap_or(default)
    }

    /// Like [`Params::take`], but the value must lie in `min..=max`.
    pub fn take_in(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, WorkloadError> {
        let v = self.take(key, default);
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(WorkloadError(format!("{key}={v} is out of range: must be in {min}..={max}")))
        }
    }

    /// Error on keys no workload parameter took.
    pub fn finish(self, workload: &str) -> Result<(), WorkloadError> {
        match self.values.keys().next() {
            None => Ok(()),
            Some(key) => Err(WorkloadError(format!(
                "workload {workload} has no parameter {}; it takes: {}",
                quoted(key),
                self.known.join(", ")
            ))),
        }
    }
}

/// Split `NAME?k=v&k=v` into the name and its parameters.
pub fn parse(spec: &str) -> Result<(&str, Params), WorkloadError> {
    let (name, query) = spec.split_once('?').unwrap_or((spec, ""));
    let mut params = Params::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            WorkloadError(format!(
                "{} in workload spec {} is not key=value",
                quoted(pair),
                quoted(spec)
            ))
        })?;
        let value = parse_value(value).ok_or_else(|| {
            WorkloadError(format!(
                "{}={} in workload spec {}: expected a non-negative integer \
                 (suffixes k, m, g for 1000s are accepted)",
                quoted(key),
                quoted(value),
                quoted(spec)
            ))
        })?;
        if params.values.insert(key.to_string(), value).is_some() {
            return Err(WorkloadError(format!(
                "{} is given twice in workload spec {}",
                quoted(key),
                quoted(spec)
            )));
        }
    }
    Ok((name, params))
}

fn parse_value(s: &str) -> Option<u64> {
    let (digits, scale) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1_000),
        b'm' | b'M' => (&s[..s.len() - 1], 1_000_000),
        b'g' | b'G' => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_pairs() {
        let (name, mut p) = parse("transformer-train?layers=2&hidden=1k").unwrap();
        assert_eq!(name, "transformer-train");
        assert_eq!(p.take("layers", 12), 2);
        assert_eq!(p.take("hidden", 768), 1000);
        assert_eq!(p.take("batch", 8), 8);
        p.finish(name).unwrap();
    }

    #[test]
    fn refuses_bad_specs() {
        assert!(parse("x?layers").is_err());
        assert!(parse("x?layers=-1").is_err());
        assert!(parse("x?a=1&a=2").is_err());
        let (name, mut p) = parse("x?layrs=3").unwrap();
        p.take("layers", 1);
        let err = p.finish(name).unwrap_err().to_string();
        assert!(err.contains("layrs") && err.contains("layers"), "{err}");
    }
}
