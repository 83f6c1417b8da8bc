//! The `NAME.json` written next to `NAME.pickle.gz` by the capture script: the run's settings
//! and device facts (`meta`) and `torch.cuda.memory_stats()` at its end (`memory_stats`), which
//! the snapshot itself does not carry. Optional; when present its fields are checked.

use super::calls::{Call, CallKind};
use crate::error::{quoted, TraceError};
use allocsim_core::TraceMeta;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// `X.json` for `X.pickle.gz` or `X.pickle`; `None` for other names.
pub fn sidecar_path(snapshot: &Path) -> Option<PathBuf> {
    let name = snapshot.file_name()?.to_str()?;
    let stem = name.strip_suffix(".pickle.gz").or_else(|| name.strip_suffix(".pickle"))?;
    Some(snapshot.with_file_name(format!("{stem}.json")))
}

/// What a sidecar has besides `meta`'s fields, for the reader to place on the ops.
#[derive(Debug, Default)]
pub struct Applied {
    /// The calls it recorded (`meta.calls`, written by `allocsim.capture`), if it has them.
    pub calls: Option<Vec<Call>>,
    /// `meta.outside_profile` (`validation/fit.py`): `(time_us, bytes)`, the memory outside
    /// the allocator taken by the end of each step.
    pub outside_profile: Vec<(i64, u64)>,
}

/// Fill `meta` from the sidecar of `snapshot` if there is one.
pub fn apply(snapshot: &Path, meta: &mut TraceMeta) -> Result<Applied, TraceError> {
    let Some(path) = sidecar_path(snapshot) else {
        return Ok(Applied::default());
    };
    let file = match crate::error::open_regular(&path) {
        Ok(f) => f,
        Err(TraceError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Applied::default())
        }
        Err(e) => return Err(e),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut { file }, &mut text)
        .map_err(|e| TraceError::io(&path, e))?;
    let json: Json = serde_json::from_str(&text)
        .map_err(|error| TraceError::Json { path: path.clone(), error })?;
    let err = |place: &str, message: String| TraceError::Sidecar {
        path: path.clone(),
        place: place.to_string(),
        message,
    };
    let got = |v: &Json| match v {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    };
    // A value as a message shows it: a number whole, a string quoted, anything else by kind.
    let shown = |v: &Json| match v {
        Json::Number(n) => n.to_string(),
        Json::String(s) => format!("the string {}", quoted(s)),
        other => got(other).to_string(),
    };
    let Json::Object(top) = &json else {
        return Err(err("top level", format!("expected an object, got {}", got(&json))));
    };
    let (mut calls, mut outside_profile) = (None, Vec::new());
    if let Some(m) = top.get("meta") {
        let Json::Object(m) = m else {
            return Err(err("meta", format!("expected an object, got {}", got(m))));
        };
        if let Some(v) = m.get("calls") {
            let Json::Array(list) = v else {
                return Err(err("meta.calls", format!("expected a list, got {}", got(v))));
            };
            let mut read = Vec::with_capacity(list.len());
            for (i, c) in list.iter().enumerate() {
                let place = format!("meta.calls[{i}]");
                let count = |key: &str| {
                    let v = c.get(key).unwrap_or(&Json::Null);
                    v.as_u64().ok_or_else(|| {
                        err(
                            &format!("{place}.{key}"),
                            format!("expected a count, got {}", shown(v)),
                        )
                    })
                };
                let kind = match c.get("call").and_then(Json::as_str) {
                    Some("empty_cache") => CallKind::EmptyCache,
                    Some("set_per_process_memory_fraction") => {
                        let v = c.get("fraction").unwrap_or(&Json::Null);
                        let f =
                            v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
                                err(
                                    &format!("{place}.fraction"),
                                    format!("expected a positive number, got {}", shown(v)),
                                )
                            })?;
                        CallKind::MemoryFraction(f)
                    }
                    _ => {
                        let v = c.get("call").unwrap_or(&Json::Null);
                        return Err(err(
                            &format!("{place}.call"),
                            format!(
                                "expected \"empty_cache\" or \"set_per_process_memory_fraction\", \
                                 got {}",
                                shown(v)
                            ),
                        ));
                    }
                };
                read.push(Call {
                    kind,
                    allocations: count("allocations")?,
                    frees: count("frees")?,
                });
            }
            meta.calls_recorded = true;
            calls = Some(read);
        }
        let field = |key: &str| m.get(key).filter(|v| !v.is_null());
        if let Some(v) = field("alloc_conf") {
            let s = v.as_str().ok_or_else(|| {
                err("meta.alloc_conf", format!("expected a string, got {}", got(v)))
            })?;
            meta.alloc_conf = Some(s.to_string());
        }
        if let Some(v) = field("torch") {
            let s = v.as_str().ok_or_else(|| {
                err("meta.torch", format!("expected a version string, got {}", got(v)))
            })?;
            meta.recorded_with = Some(s.to_string());
        }
        if let Some(v) = field("memory_fraction") {
            let f = v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
                err("meta.memory_fraction", format!("expected a positive number, got {}", shown(v)))
            })?;
            meta.memory_fraction = Some(f);
        }
        for (key, slot) in [
            ("total_memory", &mut meta.device_total_bytes),
            ("free_at_start", &mut meta.device_free_bytes),
            ("outside_allocator_bytes", &mut meta.outside_allocator_bytes),
        ] {
            if let Some(v) = field(key) {
                let n = v.as_u64().ok_or_else(|| {
                    err(&format!("meta.{key}"), format!("expected a byte count, got {}", shown(v)))
                })?;
                *slot = Some(n);
            }
        }
        if let Some(v) = field("outside_profile") {
            let point = |p: &Json| match p.as_array().map(Vec::as_slice) {
                Some([t, b]) => t.as_i64().zip(b.as_u64()),
                _ => None,
            };
            let profile = v.as_array().map(|ps| ps.iter().map(point).collect::<Option<Vec<_>>>());
            outside_profile = profile.flatten().ok_or_else(|| {
                let expected = "expected a list of [time_us, bytes] pairs";
                err("meta.outside_profile", format!("{expected}, got {}", shown(v)))
            })?;
        }
        for (key, slot) in [("rank", &mut meta.rank), ("world_size", &mut meta.world_size)] {
            if let Some(v) = field(key) {
                let n = v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    err(&format!("meta.{key}"), format!("expected a rank number, got {}", shown(v)))
                })?;
                *slot = Some(n);
            }
        }
    }
    let stats = |value: &Json, place: &str| -> Result<Vec<(String, i64)>, TraceError> {
        let Json::Object(s) = value else {
            return Err(err(place, format!("expected an object, got {}", got(value))));
        };
        let mut stats = Vec::with_capacity(s.len());
        for (k, v) in s {
            let n = v.as_i64().ok_or_else(|| {
                err(
                    &format!("{place}[{}]", quoted(k)),
                    format!("expected an integer, got {}", shown(v)),
                )
            })?;
            stats.push((k.clone(), n));
        }
        stats.sort();
        Ok(stats)
    };
    if let Some(s) = top.get("memory_stats") {
        meta.expected_stats = Some(stats(s, "memory_stats")?);
    }
    let at_start = top.get("meta").and_then(|m| m.get("memory_stats_at_history_start"));
    if let Some(s) = at_start.filter(|s| !s.is_null()) {
        meta.stats_at_start = Some(stats(s, "meta.memory_stats_at_history_start")?);
    }
    Ok(Applied { calls, outside_profile })
}
