//! Every workload replays under the `uncached` policy with balanced allocs and frees, sensible
//! peaks, and the same ops for the same seed.

use crate::{build, names, trace, CnnTrain, LlmInference, TransformerTrain};
use allocsim_core::{Allocator, Env, MemoryStats, Op, GIB};
use allocsim_policies::uncached::Uncached;
use allocsim_sim::SimDevice;
use std::collections::BTreeSet;

/// Replay `ops` under `uncached`, checking the op stream's own bookkeeping on the way.
fn replay_uncached(ops: &[Op]) -> MemoryStats {
    let mut policy = Uncached::from_conf("").unwrap();
    let mut device = SimDevice::for_tests(1 << 50);
    let mut events = Vec::new();
    let mut live = BTreeSet::new();
    for op in ops {
        let mut env = Env::new(&mut device, &mut events);
        match *op {
            Op::Alloc { id, size, stream } => {
                assert!(live.insert(id), "{id:?} allocated twice");
                assert!(size > 0);
                policy.malloc(&mut env, id, size, stream).expect("uncached never OOMs here");
            }
            Op::FreeRequested { id } => {
                assert!(live.remove(&id), "{id:?} freed but not live");
                policy.free(&mut env, id);
            }
            ref other => panic!("workloads emit only allocs and frees, got {other:?}"),
        }
        events.clear();
    }
    assert!(live.is_empty(), "{} allocations never freed", live.len());
    policy.stats()
}

fn check_balanced(stats: &MemoryStats) {
    assert_eq!(stats.allocation.all.current, 0);
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(stats.reserved_bytes.all.current, 0);
    assert_eq!(stats.allocation.all.allocated, stats.allocation.all.freed);
    assert_eq!(stats.num_device_alloc, stats.num_device_free);
}

#[test]
fn transformer_train_is_balanced_with_a_sensible_peak() {
    let w = TransformerTrain {
        layers: 4,
        hidden: 256,
        heads: 4,
        batch: 2,
        seq: 128,
        vocab: 8192,
        ..Default::default()
    };
    let stats = replay_uncached(&w.ops());
    check_balanced(&stats);
    let params = w.param_bytes_total();
    let peak = stats.requested_bytes.all.peak as u64;
    // Weights + grads + AdamW's two moments at least; activations and temporaries add to it.
    assert!(peak >= 4 * params, "peak {peak} below 4x params {params}");
    let activations =
        w.layers * w.batch * w.seq * w.hidden * w.bytes * 16 + w.batch * w.seq * w.vocab * 12;
    assert!(peak <= 6 * params + activations, "peak {peak} implausibly high");
}

#[test]
fn transformer_math_attention_keeps_the_softmax() {
    let base = TransformerTrain {
        layers: 2,
        hidden: 128,
        heads: 4,
        batch: 2,
        seq: 256,
        vocab: 1024,
        steps: 1,
        ..Default::default()
    };
    let flash = replay_uncached(&base.ops()).requested_bytes.all.peak;
    let math = replay_uncached(&TransformerTrain { flash: 0, ..base.clone() }.ops())
        .requested_bytes
        .all
        .peak;
    let scores = (base.batch * base.heads * base.seq * base.seq * base.bytes) as i64;
    assert!(math >= flash + scores, "math {math} vs flash {flash}: softmax of {scores} not kept");
}

#[test]
fn llm_inference_is_balanced_and_its_cache_grows() {
    let w = LlmInference {
        layers: 2,
        hidden: 128,
        vocab: 1024,
        max_batch: 8,
        steps: 64,
        prompt: 64,
        gen: 32,
        ..Default::default()
    };
    let ops = w.ops();
    let stats = replay_uncached(&ops);
    check_balanced(&stats);
    let peak = stats.requested_bytes.all.peak as u64;
    assert!(peak > w.weight_bytes(), "the KV cache adds nothing to the weights");
    let max_cache =
        w.max_batch * 2 * w.layers * (w.prompt + w.gen + w.kv_chunk) * w.hidden * w.bytes;
    assert!(peak < w.weight_bytes() + 2 * max_cache + (16 << 20), "peak {peak} implausibly high");
    // Caches regrow: some allocation is exactly one chunk bigger than another cache-sized one.
    let chunk = w.kv_chunk * w.hidden * w.bytes;
    let sizes: BTreeSet<u64> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc { size, .. } => Some(*size),
            _ => None,
        })
        .collect();
    assert!(sizes.iter().any(|s| s % chunk == 0 && sizes.contains(&(s + chunk))));
}

#[test]
fn cnn_train_is_balanced_with_a_sensible_peak() {
    let w = CnnTrain { batch: 4, image: 64, width: 16, ..Default::default() };
    let stats = replay_uncached(&w.ops());
    check_balanced(&stats);
    let peak = stats.requested_bytes.all.peak as u64;
    let params = w.param_bytes_total();
    assert!(peak >= 3 * params, "weights + grads + momentum not all live at the peak");
    assert!(peak < 3 * params + GIB, "peak {peak} implausibly high");
}

#[test]
fn every_named_workload_builds_with_defaults_and_is_deterministic() {
    for (name, _) in names() {
        let a = build(name).unwrap();
        assert!(a.len() > 1000, "{name}: only {} ops", a.len());
        assert_eq!(a, build(name).unwrap(), "{name} is not deterministic");
        let other_seed = build(&format!("{name}?seed=7")).unwrap();
        assert!(!other_seed.is_empty());
        check_balanced(&replay_uncached(&a));
    }
}

#[test]
fn seeds_change_the_stream() {
    assert_ne!(
        build("llm-inference?seed=1&steps=32").unwrap(),
        build("llm-inference?seed=2&steps=32").unwrap()
    );
}

#[test]
fn specs_wrap_into_traces_and_refuse_nonsense() {
    let t = trace("cnn-train?batch=2&image=32&steps=1").unwrap();
    assert_eq!(t.meta.source_format, crate::SOURCE_FORMAT);
    assert!(t.recorded.is_empty());
    assert!(build("resnet?x=1").unwrap_err().to_string().contains("transformer-train"));
    assert!(build("cnn-train?batchsize=2").unwrap_err().to_string().contains("batch"));
    assert!(build("cnn-train?batch=0").is_err());
}
