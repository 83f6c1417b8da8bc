//! Proptest strategies for the same programs `crate::swarm` draws from entropy, built from
//! proptest's own combinators so that a failing case shrinks: steps are deleted, picks shrink
//! toward the first live allocation, sizes toward one byte, settings toward none.

use crate::conf::{
    AllocConf, Roundup, ALL_DIVISIONS, DIVISIONS, GC_THRESHOLDS, INVALID,
    MAX_NON_SPLIT_ROUNDING_MB, MAX_SPLIT_MB,
};
use crate::program::{DeviceSpec, Program, Step, STREAMS};
use crate::swarm::{align, Limits, Shape, ABSURD_BYTES, BOUNDARY_SIZES, DEVICE_BYTES, FRACTIONS};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::{BoxedStrategy, Union};

/// Log-uniform sizes below `2^max_log2` (see [`crate::swarm::log_uniform`]).
pub fn log_uniform(max_log2: u32) -> impl Strategy<Value = u64> + Clone {
    (0..max_log2.max(1), any::<u64>()).prop_map(|(k, r)| (1u64 << k) + r % (1u64 << k))
}

fn roundup() -> impl Strategy<Value = Roundup> {
    prop_oneof![
        select(ALL_DIVISIONS.to_vec()).prop_map(Roundup::All),
        (
            0u32..3,
            vec((1u32..4, select(DIVISIONS.to_vec())), 1..4),
            option::of(select(DIVISIONS.to_vec()))
        )
            .prop_map(|(first, steps, rest)| {
                let mut boundary = 1u32 << first;
                let mut entries = Vec::new();
                for (shift, d) in steps {
                    entries.push((boundary, d));
                    boundary <<= shift;
                }
                Roundup::List { entries, rest }
            }),
    ]
}

/// Valid settings strings, keys in any order; `expandable` allows `expandable_segments:True`.
pub fn alloc_conf(expandable: bool) -> impl Strategy<Value = AllocConf> {
    (
        option::weighted(0.5, select(MAX_SPLIT_MB.to_vec())),
        option::weighted(0.15, select(MAX_NON_SPLIT_ROUNDING_MB.to_vec())),
        option::weighted(0.5, roundup()),
        option::weighted(0.3, select(GC_THRESHOLDS.to_vec())),
        option::weighted(0.3, any::<bool>().prop_map(move |b| b && expandable)),
        option::weighted(0.1, any::<bool>()),
        Just((0u8..6).collect::<Vec<u8>>()).prop_shuffle(),
    )
        .prop_map(|(split, rounding, roundup, gc, expandable, lock, order)| AllocConf {
            max_split_size_mb: split,
            max_non_split_rounding_mb: rounding,
            roundup_power2_divisions: roundup,
            garbage_collection_threshold: gc,
            expandable_segments: expandable,
            release_lock_on_cudamalloc: lock,
            order,
        })
}

fn settings(limits: Limits) -> impl Strategy<Value = String> {
    let invalid = if limits.invalid_settings { 1 } else { 0 };
    let arms: Vec<(u32, BoxedStrategy<String>)> = vec![
        (14, alloc_conf(limits.expandable).prop_map(|c| c.to_string()).boxed()),
        (1, Just(String::new()).boxed()),
        (invalid, select(INVALID.to_vec()).prop_map(str::to_string).boxed()),
    ];
    Union::new_weighted(arms.into_iter().filter(|(w, _)| *w > 0).collect())
}

/// A case's shape: switched-off kinds, weights, device, hot sizes, starting settings.
pub fn shape(limits: Limits) -> impl Strategy<Value = Shape> {
    let weight = |off: u32, on: u32, max: u32| prop_oneof![off => Just(0u32), on => 1..=max];
    let weights = (
        1u32..=16,
        weight(1, 7, 16),
        weight(1, 1, 16),
        weight(1, 1, 16),
        weight(2, 1, 2),
        weight(2, 1, 2),
        weight(2, 1, 2),
        weight(2, 1, 4),
    )
        .prop_map(|(a, b, c, d, e, f, g, h)| [a, b, c, d, e, f, g, h]);
    let device = (select(DEVICE_BYTES.to_vec()), any::<bool>()).prop_map(|(total_bytes, tight)| {
        DeviceSpec {
            total_bytes,
            free_bytes: if tight { total_bytes - total_bytes / 64 } else { total_bytes },
        }
    });
    (
        weights,
        device,
        vec(log_uniform(27), 1..=6),
        (
            0u64..=90,
            0u64..=10,
            0u32..8,
            1u8..=STREAMS.len() as u8,
            prop_oneof![3 => Just(0u64), 1 => 1u64..=20],
        ),
        option::weighted(0.5, alloc_conf(limits.expandable)),
        option::weighted(0.25, select(FRACTIONS[..8].to_vec())),
        any::<bool>(),
    )
        .prop_map(
            move |(
                weights,
                device,
                hot_sizes,
                (hot, boundary, below, streams, huge),
                conf,
                fraction,
                drain,
            )| {
                Shape {
                    weights,
                    device,
                    hot_sizes,
                    hot_percent: hot,
                    boundary_percent: boundary,
                    huge_permille: huge,
                    absurd_sizes: limits.absurd_sizes,
                    max_log2: (64 - device.total_bytes.leading_zeros())
                        .saturating_sub(below)
                        .max(1),
                    streams,
                    alloc_conf: conf.map(|c| c.to_string()).unwrap_or_default(),
                    memory_fraction: fraction,
                    drain,
                }
            },
        )
}

fn size(shape: &Shape) -> BoxedStrategy<u64> {
    let log = (log_uniform(shape.max_log2), 0u64..8).prop_map(|(s, how)| align(s, how));
    let mut arms: Vec<(u32, BoxedStrategy<u64>)> =
        vec![((100 - shape.hot_percent - shape.boundary_percent).max(1) as u32, log.boxed())];
    if shape.hot_percent > 0 {
        arms.push((shape.hot_percent as u32, select(shape.hot_sizes.clone()).boxed()));
    }
    if shape.boundary_percent > 0 {
        arms.push((shape.boundary_percent as u32, select(BOUNDARY_SIZES.to_vec()).boxed()));
    }
    if shape.huge_permille > 0 {
        // Weights are percent elsewhere: scale the others by ten instead of losing precision.
        for arm in &mut arms {
            arm.0 *= 10;
        }
        let far = (36u32..60, any::<u64>()).prop_map(|(k, r)| (1u64 << k) + r % (1u64 << k));
        let far = if shape.absurd_sizes {
            prop_oneof![far, ABSURD_BYTES..=u64::MAX].boxed()
        } else {
            far.boxed()
        };
        arms.push((shape.huge_permille as u32, far));
    }
    Union::new_weighted(arms).boxed()
}

/// Steps drawn with a shape's weights.
pub fn step(shape: &Shape, limits: Limits) -> BoxedStrategy<Step> {
    let streams = shape.streams;
    let stream_count = STREAMS.len() as u8;
    let arms: [BoxedStrategy<Step>; 8] = [
        (size(shape), 0..streams).prop_map(|(size, stream)| Step::Alloc { size, stream }).boxed(),
        any::<u16>().prop_map(|p| Step::Free { pick: u32::from(p) }).boxed(),
        (any::<u16>(), 0..stream_count)
            .prop_map(|(p, stream)| Step::RecordStream { pick: u32::from(p), stream })
            .boxed(),
        any::<u16>().prop_map(|p| Step::Complete { pick: u32::from(p) }).boxed(),
        Just(Step::EmptyCache).boxed(),
        select(FRACTIONS.to_vec()).prop_map(|fraction| Step::SetFraction { fraction }).boxed(),
        settings(limits).prop_map(|conf| Step::Settings { conf }).boxed(),
        (0u8..2, 0u8..3).prop_map(|(pool, action)| Step::Pool { pool, action }).boxed(),
    ];
    let weighted: Vec<(u32, BoxedStrategy<Step>)> =
        shape.weights.iter().copied().zip(arms).filter(|(w, _)| *w > 0).collect();
    Union::new_weighted(weighted).boxed()
}

/// Whole programs: a shape, then up to `limits.max_steps` steps drawn from it.
pub fn program(limits: Limits) -> impl Strategy<Value = Program> {
    shape(limits).prop_flat_map(move |shape| {
        let steps = vec(step(&shape, limits), 0..=limits.max_steps);
        (Just(shape), steps).prop_map(|(shape, steps)| Program {
            device: shape.device,
            alloc_conf: shape.alloc_conf,
            memory_fraction: shape.memory_fraction,
            steps,
            drain: shape.drain,
        })
    })
}

/// Programs of rounds as CUDA graph trees make them: a few allocations in the default pools,
/// a graph's inputs allocated in its private pool in one context, some frees, the capture's
/// allocations in the same pool in a second context, more frees. `empty_cache()` calls come
/// between the two contexts (`torch.cuda.graph` empties the cache before it begins the
/// capture) or, in a program of their own, inside the capture's context after one of its
/// allocations (a program's own call under `use_mem_pool`): not both kinds in one program,
/// since a recording does not tell which calls of a run of allocations into one pool were
/// which. The pool's segments stay alive to the end, where the snapshot names their pool.
pub fn graph_rounds() -> impl Strategy<Value = Program> {
    let size = || log_uniform(25);
    let round = (
        vec(size(), 0..3),
        vec(size(), 1..4),
        vec(any::<u32>(), 0..3),
        1usize..3,
        vec(size(), 2..5),
        vec(any::<u32>(), 0..4),
    );
    (any::<bool>(), any::<bool>(), 0u8..2, vec(round, 1..4)).prop_map(
        |(inside, expandable, stream, rounds)| {
            let mut steps = Vec::new();
            let pool = |action| Step::Pool { pool: 0, action };
            for (defaults, inputs, between, calls, capture, after) in rounds {
                steps.extend(defaults.into_iter().map(|size| Step::Alloc { size, stream: 0 }));
                steps.push(pool(0));
                steps.extend(inputs.into_iter().map(|size| Step::Alloc { size, stream }));
                steps.push(pool(1));
                steps.extend(between.into_iter().map(|pick| Step::Free { pick }));
                if !inside {
                    steps.extend(std::iter::repeat_n(Step::EmptyCache, calls));
                }
                steps.push(pool(0));
                for (i, size) in capture.into_iter().enumerate() {
                    steps.push(Step::Alloc { size, stream });
                    if inside && i == 0 {
                        steps.extend(std::iter::repeat_n(Step::EmptyCache, calls));
                    }
                }
                steps.push(pool(1));
                steps.extend(after.into_iter().map(|pick| Step::Free { pick }));
            }
            let total_bytes = allocsim_run::H100_TOTAL_BYTES;
            Program {
                device: DeviceSpec { total_bytes, free_bytes: total_bytes },
                alloc_conf: if expandable {
                    "expandable_segments:True".into()
                } else {
                    String::new()
                },
                memory_fraction: None,
                steps,
                drain: false,
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::INVALID;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn programs_are_valid_and_varied() {
        let mut runner = TestRunner::deterministic();
        let strategy = program(Limits::for_reference(50));
        let mut ops = 0;
        for _ in 0..50 {
            let p = strategy.new_tree(&mut runner).unwrap().current();
            assert!(!p.uses_expandable_segments(), "{p}");
            for s in &p.steps {
                if let Step::Settings { conf } = s {
                    assert!(!INVALID.contains(&conf.as_str()), "{conf}");
                }
            }
            ops += p.ops().len();
        }
        assert!(ops > 100);
    }
}
