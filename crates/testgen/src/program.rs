//! A generated workload and how it becomes ops.
//!
//! Steps name allocations by position, not by id: `Free { pick }` frees the live allocation at
//! `pick % live`, as talc's and bumpalo's fuzz actions do. So every step sequence is a valid
//! program, and a shrinker may delete any step or shrink any number and still have one. Ids
//! are assigned when the program is turned into ops ([`Program::ops`]), in allocation order.
//!
//! Deferred free completion follows PyTorch's `record_stream`: a free of an allocation used on
//! another stream stays pending (`FreeRequested` now) until a later `Complete` step completes
//! it (`FreeCompleted`). Whether an allocation succeeds is the policy's business, not the
//! program's: the engine skips frees of allocations that failed with OOM, as it must for real
//! traces of programs that catch OOM.

use allocsim_core::{AllocId, MemPoolId, Op, PoolAction, StreamId, Trace, TraceMeta};
use std::fmt;

/// The stream handles a program can use, by index. Index 0 is the legacy default stream; the
/// others are not in numeric order, so that a policy that orders by anything but the handle's
/// value (PyTorch orders free blocks by `(stream, size, address)`) shows it.
pub const STREAMS: [StreamId; 4] =
    [StreamId(0), StreamId(0x5a00_0200), StreamId(0x5a00_0100), StreamId(0x5a00_0300)];

/// The source format name generated traces carry.
pub const SOURCE_FORMAT: &str = "allocsim-testgen";

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Allocate `size` bytes on stream `STREAMS[stream % 4]`.
    Alloc {
        size: u64,
        stream: u8,
    },
    /// Free the live allocation at `pick % live`. If it was used on another stream, the free
    /// stays pending until a `Complete`.
    Free {
        pick: u32,
    },
    /// Record a use of the live allocation at `pick % live` on `STREAMS[stream % 4]`.
    RecordStream {
        pick: u32,
        stream: u8,
    },
    /// The other streams' work on the pending free at `pick % pending` has finished.
    Complete {
        pick: u32,
    },
    EmptyCache,
    SetFraction {
        fraction: f64,
    },
    Settings {
        conf: String,
    },
    /// Enter (`action` 0), leave (1) or release (2) private pool `(0, 1 + pool % 2)`. Steps
    /// PyTorch would refuse (entering a pool already entered, leaving one not entered,
    /// releasing one twice) produce no op.
    Pool {
        pool: u8,
        action: u8,
    },
}

/// The device a program runs on: part of the case, because sizes only mean something
/// against a capacity, and the OOM paths are where allocators hide their bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpec {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// A whole generated case: device, starting settings and steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub device: DeviceSpec,
    /// The settings string in force from the start (the trace's `alloc_conf`); PyTorch syntax,
    /// so only the `pytorch` policy reads it.
    pub alloc_conf: String,
    pub memory_fraction: Option<f64>,
    pub steps: Vec<Step>,
    /// Free everything still live, complete every pending free and empty the cache at the end,
    /// so that the end state must be empty.
    pub drain: bool,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    id: AllocId,
    stream: StreamId,
    used_elsewhere: bool,
}

/// What the steps refer to while a program is turned into ops.
#[derive(Debug, Default)]
struct Names {
    live: Vec<Live>,
    pending: Vec<AllocId>,
    next_id: u64,
    /// Private pools in a context now, and those made and not released.
    entered: Vec<MemPoolId>,
    made: Vec<MemPoolId>,
}

impl Names {
    fn free(&mut self, index: usize, ops: &mut Vec<Op>) {
        let l = self.live.remove(index);
        ops.push(Op::FreeRequested { id: l.id });
        if l.used_elsewhere {
            self.pending.push(l.id);
        }
    }
}

impl Program {
    /// The ops this program stands for. Steps that name nothing (a free with nothing live)
    /// produce no op, so op indices can differ from step indices.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = Vec::with_capacity(self.steps.len() + 8);
        let mut n = Names::default();
        for step in &self.steps {
            match *step {
                Step::Alloc { size, stream } => {
                    let id = AllocId(n.next_id);
                    n.next_id += 1;
                    let stream = stream_of(stream);
                    ops.push(Op::Alloc { id, size, stream });
                    n.live.push(Live { id, stream, used_elsewhere: false });
                }
                Step::Free { pick } if !n.live.is_empty() => {
                    let index = pick as usize % n.live.len();
                    n.free(index, &mut ops);
                }
                Step::RecordStream { pick, stream } if !n.live.is_empty() => {
                    let index = pick as usize % n.live.len();
                    let l = &mut n.live[index];
                    let stream = stream_of(stream);
                    l.used_elsewhere |= stream != l.stream;
                    ops.push(Op::RecordStream { id: l.id, stream });
                }
                Step::Complete { pick } if !n.pending.is_empty() => {
                    let index = pick as usize % n.pending.len();
                    ops.push(Op::FreeCompleted { id: n.pending.remove(index) });
                }
                Step::EmptyCache => ops.push(Op::EmptyCache),
                Step::SetFraction { fraction } => ops.push(Op::SetMemoryFraction { fraction }),
                Step::Settings { ref conf } => {
                    ops.push(Op::SetAllocatorSettings { conf: conf.clone() })
                }
                Step::Pool { pool, action } => {
                    let pool = MemPoolId(0, 1 + u64::from(pool % 2));
                    let (entered, made) = (n.entered.contains(&pool), n.made.contains(&pool));
                    let action = match action % 3 {
                        0 if !entered => {
                            n.entered.push(pool);
                            if !made {
                                n.made.push(pool);
                            }
                            PoolAction::BeginAllocate
                        }
                        1 if entered => {
                            n.entered.retain(|&p| p != pool);
                            PoolAction::EndAllocate
                        }
                        2 if made && !entered => {
                            n.made.retain(|&p| p != pool);
                            PoolAction::Release
                        }
                        _ => continue,
                    };
                    ops.push(Op::Pool { pool, action });
                }
                Step::Free { .. } | Step::RecordStream { .. } | Step::Complete { .. } => {}
            }
        }
        if self.drain {
            while !n.live.is_empty() {
                n.free(0, &mut ops);
            }
            for id in n.pending.drain(..) {
                ops.push(Op::FreeCompleted { id });
            }
            for pool in n.entered.drain(..) {
                ops.push(Op::Pool { pool, action: PoolAction::EndAllocate });
            }
            for pool in n.made.drain(..) {
                ops.push(Op::Pool { pool, action: PoolAction::Release });
            }
            ops.push(Op::EmptyCache);
        }
        ops
    }

    /// The program as a trace: what gets written to a `.allocsim.json` file for
    /// `allocsim replay FILE --policy P --check` to reproduce a failure.
    pub fn trace(&self) -> Trace {
        Trace {
            meta: TraceMeta {
                source_format: SOURCE_FORMAT.to_string(),
                alloc_conf: (!self.alloc_conf.is_empty()).then(|| self.alloc_conf.clone()),
                memory_fraction: self.memory_fraction,
                device_total_bytes: Some(self.device.total_bytes),
                device_free_bytes: Some(self.device.free_bytes),
                ..TraceMeta::default()
            },
            ops: self.ops(),
            ..Trace::default()
        }
    }

    /// Whether any settings this program applies turn expandable segments on.
    pub fn uses_expandable_segments(&self) -> bool {
        let on = |s: &str| s.contains("expandable_segments:True");
        on(&self.alloc_conf)
            || self.steps.iter().any(|s| matches!(s, Step::Settings { conf } if on(conf)))
    }
}

fn stream_of(index: u8) -> StreamId {
    STREAMS[usize::from(index) % STREAMS.len()]
}

/// One op as a line: the listing printed with every failure.
pub fn format_op(op: &Op) -> String {
    match op {
        Op::Alloc { id, size, stream } => {
            format!("alloc id={} size={size} stream={:#x}", id.0, stream.0)
        }
        Op::FreeRequested { id } => format!("free_requested id={}", id.0),
        Op::FreeCompleted { id } => format!("free_completed id={}", id.0),
        Op::RecordStream { id, stream } => {
            format!("record_stream id={} stream={:#x}", id.0, stream.0)
        }
        Op::EmptyCache => "empty_cache".to_string(),
        Op::SetMemoryFraction { fraction } => format!("set_memory_fraction {fraction}"),
        Op::SetAllocatorSettings { conf } => format!("set_allocator_settings {conf:?}"),
        Op::Pool { pool, action } => format!("{} {pool}", action.name()),
        Op::AllocAt { id, size, stream, addr } => {
            format!("alloc_at id={} size={size} stream={:#x} addr={addr:#x}", id.0, stream.0)
        }
    }
}

impl fmt::Display for Program {
    /// The device, settings and ops, one per line with its op index.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "device {} bytes total, {} free; alloc_conf {:?}; memory fraction {:?}",
            self.device.total_bytes, self.device.free_bytes, self.alloc_conf, self.memory_fraction
        )?;
        for (i, op) in self.ops().iter().enumerate() {
            writeln!(f, "  op {i}: {}", format_op(op))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(steps: Vec<Step>, drain: bool) -> Program {
        Program {
            device: DeviceSpec { total_bytes: 1 << 30, free_bytes: 1 << 30 },
            alloc_conf: String::new(),
            memory_fraction: None,
            steps,
            drain,
        }
    }

    #[test]
    fn picks_wrap_and_pending_frees_wait_for_completion() {
        let p = program(
            vec![
                Step::Free { pick: 3 },
                Step::Alloc { size: 10, stream: 0 },
                Step::Alloc { size: 20, stream: 1 },
                Step::RecordStream { pick: 2, stream: 2 },
                Step::Free { pick: 4 },
                Step::Complete { pick: 9 },
                Step::Complete { pick: 0 },
            ],
            true,
        );
        let ops = p.ops();
        assert_eq!(
            ops,
            vec![
                Op::Alloc { id: AllocId(0), size: 10, stream: STREAMS[0] },
                Op::Alloc { id: AllocId(1), size: 20, stream: STREAMS[1] },
                Op::RecordStream { id: AllocId(0), stream: STREAMS[2] },
                Op::FreeRequested { id: AllocId(0) },
                Op::FreeCompleted { id: AllocId(0) },
                Op::FreeRequested { id: AllocId(1) },
                Op::EmptyCache,
            ]
        );
    }

    #[test]
    fn listing_names_every_op() {
        let p = program(vec![Step::Alloc { size: 512, stream: 3 }], false);
        let text = p.to_string();
        assert!(text.contains("op 0: alloc id=0 size=512 stream=0x5a000300"), "{text}");
    }
}
