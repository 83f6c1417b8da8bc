//! Live tensor workloads as op streams: what a framework asks of its allocator while it trains
//! a transformer, serves an LLM with a growing KV cache, or trains a CNN.
//!
//! Each workload is a plain struct of sizes (layers, hidden size, batch, ...) with defaults,
//! built from a spec string such as `transformer-train?layers=12&hidden=768&batch=8&seq=512`,
//! and turns into a `Vec<Op>` with the lifetimes a framework gives its tensors: weights live for
//! the whole run, activations saved for backward live until the backward of their layer,
//! gradients until the next `zero_grad`, optimizer state from the first step on, temporaries
//! for one operation. The same op stream runs on the simulated device and on a GPU, and wraps
//! into a [`Trace`] (`source_format = "allocsim-workload"`) that every command takes.
//!
//! **Architecture Invariant:** the op stream depends only on the parameters and the seed
//! (ChaCha8): the same spec gives the same ops on every machine. Every stream is balanced: each
//! allocation is freed exactly once before the end, so a replay ends with nothing allocated.

mod cnn;
mod inference;
mod program;
mod spec;
mod transformer;

pub use cnn::CnnTrain;
pub use inference::LlmInference;
pub use spec::{Params, WorkloadError};
pub use transformer::TransformerTrain;

use allocsim_core::{Op, Trace, TraceMeta};

/// The value of `TraceMeta::source_format` for a trace made from a workload.
pub const SOURCE_FORMAT: &str = "allocsim-workload";

/// Every workload name [`build`] accepts, with a line on what it is.
pub fn names() -> &'static [(&'static str, &'static str)] {
    &[
        (
            TransformerTrain::NAME,
            "GPT-style training steps: weights, saved activations, gradients, AdamW state (2x params), temporaries",
        ),
        (
            LlmInference::NAME,
            "LLM serving: prefill and decode with a per-request KV cache that grows in chunks, batch size changing over time",
        ),
        (CnnTrain::NAME, "ResNet-style CNN training steps with cuDNN-like workspaces and SGD momentum"),
    ]
}

/// The parameters a workload takes, with their defaults, for `--help`-style listings.
pub fn parameters(name: &str) -> Option<Vec<(&'static str, u64)>> {
    match name {
        TransformerTrain::NAME => Some(TransformerTrain::default().parameters()),
        LlmInference::NAME => Some(LlmInference::default().parameters()),
        CnnTrain::NAME => Some(CnnTrain::default().parameters()),
        _ => None,
    }
}

/// The op stream of the workload a spec names (`NAME` or `NAME?key=value&key=value`).
pub fn build(spec: &str) -> Result<Vec<Op>, WorkloadError> {
    let (name, mut params) = spec::parse(spec)?;
    let ops = match name {
        TransformerTrain::NAME => TransformerTrain::from_params(&mut params)?.ops(),
        LlmInference::NAME => LlmInference::from_params(&mut params)?.ops(),
        CnnTrain::NAME => CnnTrain::from_params(&mut params)?.ops(),
        other => {
            let known: Vec<&str> = names().iter().map(|(n, _)| *n).collect();
            return Err(WorkloadError(format!(
                "unknown workload {}; known workloads: {}",
                allocsim_core::text::quoted(other),
                known.join(", ")
            )));
        }
    };
    params.finish(name)?;
    Ok(ops)
}

/// The workload a spec names, wrapped as a trace: ops only, no recording.
pub fn trace(spec: &str) -> Result<Trace, WorkloadError> {
    let ops = build(spec)?;
    Ok(Trace {
        meta: TraceMeta { source_format: SOURCE_FORMAT.to_string(), ..TraceMeta::default() },
        ops,
        ..Trace::default()
    })
}

#[cfg(test)]
mod tests;
