//! Helpers shared by the benchmarks and the trace generator: where the bundled traces are, and
//! long native traces made by repeating a real one.
//!
//! The speed claims live in `benches/` (criterion, one file per subject) and in `README.md`,
//! with the commands and numbers; tests carry correctness.

use allocsim_core::{AllocId, Op, Trace};
use allocsim_trace::native::NativeWriter;
use allocsim_trace::TraceError;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A bundled recording by file name, e.g. `pytorch-2.11-h100/gpt2_train.pickle.gz`.
pub fn bundled(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces").join(name)
}

/// The 242,706-entry Llama generate recording (161,777 ops).
pub const LLAMA: &str = "pytorch-2.11-h100-extra/llama_generate_varlen.pickle.gz";

/// One copy of a trace's ops made self-contained: what is still live at its end is freed
/// there (deferred frees completed), so copies can follow one another forever.
#[derive(Debug, Clone)]
pub struct Copyable {
    ops: Vec<Op>,
    /// Ids span `0..id_span`: copy `k` adds `k * id_span`.
    id_span: u64,
}

impl Copyable {
    pub fn new(trace: &Trace) -> Copyable {
        #[derive(PartialEq)]
        enum Life {
            Live,
            /// Used on another stream and freed: waits for `FreeCompleted`.
            Pending,
        }
        let mut ops = trace.ops.clone();
        let mut life: HashMap<u64, Life> = HashMap::new();
        let mut order = Vec::new();
        let mut recorded_use = HashMap::new();
        let mut id_span = 0;
        for op in &trace.ops {
            match *op {
                Op::Alloc { id, .. } => {
                    id_span = id_span.max(id.0 + 1);
                    life.insert(id.0, Life::Live);
                    order.push(id.0);
                }
                Op::RecordStream { id, .. } => {
                    recorded_use.insert(id.0, ());
                }
                Op::FreeRequested { id } => {
                    if recorded_use.remove(&id.0).is_some() {
                        life.insert(id.0, Life::Pending);
                    } else {
                        life.remove(&id.0);
                    }
                }
                Op::FreeCompleted { id } => {
                    life.remove(&id.0);
                }
                _ => {}
            }
        }
        for id in order {
            match life.remove(&id) {
                Some(Life::Live) => ops.push(Op::FreeRequested { id: AllocId(id) }),
                Some(Life::Pending) => ops.push(Op::FreeCompleted { id: AllocId(id) }),
                None => {}
            }
        }
        Copyable { ops, id_span }
    }

    /// Ops per copy.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The ops of copy `k`.
    pub fn copy(&self, k: u64) -> impl Iterator<Item = Op> + '_ {
        let shift = k * self.id_span;
        self.ops.iter().map(move |op| {
            let mut op = op.clone();
            match &mut op {
                Op::Alloc { id, .. }
                | Op::FreeRequested { id }
                | Op::FreeCompleted { id }
                | Op::RecordStream { id, .. } => id.0 += shift,
                _ => {}
            }
            op
        })
    }
}

/// Write `copies` copies of `source`'s ops as a native trace, streaming (never more than one
/// copy in memory), with `source`'s settings and device but not its recording (whose addresses
/// a second copy would not repeat). Returns the number of ops written.
pub fn write_repeated<W: Write>(
    source: &Trace,
    copies: u64,
    out: W,
    path: &Path,
) -> Result<u64, TraceError> {
    let copyable = Copyable::new(source);
    let ops = copyable.len() as u64 * copies;
    let head = Trace {
        meta: source.meta.clone(),
        warnings: vec![format!(
            "{copies} copies of the {} ops of a {} trace, each freeing what it left live",
            copyable.len(),
            source.meta.source_format
        )],
        ..Trace::default()
    };
    let mut w = NativeWriter::new(out, &head, ops, path)?;
    for k in 0..copies {
        for op in copyable.copy(k) {
            w.op(&op)?;
        }
    }
    w.finish()?;
    Ok(ops)
}
