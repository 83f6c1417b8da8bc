//! Shrinking without proptest, for `allocsim fuzz` (seeded programs) and fuzzer finds: delete
//! runs of steps as delta debugging does, then simplify what is left (sizes, picks, streams,
//! settings), keeping each change only while the same oracle still fails. Valid at every
//! step, because steps name allocations by position ([`crate::program`]).

use crate::oracles::Failure;
use crate::program::{Program, Step};

/// How many candidate programs a shrink may try.
pub const MAX_ATTEMPTS: usize = 4000;

/// Smaller versions of a size, simplest first.
fn smaller_sizes(size: u64) -> Vec<u64> {
    let mut out = vec![1, 512, 1 << 20, 2 << 20, 20 << 20];
    if size > 1 {
        out.push(1u64 << (63 - size.leading_zeros()));
        out.push(size / 2);
        out.push(size & !511);
    }
    out.retain(|&s| s > 0 && s < size);
    out.dedup();
    out
}

/// Simpler versions of one step.
fn simpler(step: &Step) -> Vec<Step> {
    match *step {
        Step::Alloc { size, stream } => {
            let mut out: Vec<Step> =
                smaller_sizes(size).into_iter().map(|size| Step::Alloc { size, stream }).collect();
            if stream != 0 {
                out.push(Step::Alloc { size, stream: 0 });
            }
            out
        }
        Step::Free { pick } if pick != 0 => {
            vec![Step::Free { pick: 0 }, Step::Free { pick: pick / 2 }]
        }
        Step::RecordStream { pick, stream } if pick != 0 || stream > 1 => {
            vec![Step::RecordStream { pick: 0, stream }, Step::RecordStream { pick, stream: 1 }]
        }
        Step::Complete { pick } if pick != 0 => vec![Step::Complete { pick: 0 }],
        Step::Settings { ref conf } if !conf.is_empty() => {
            let parts: Vec<&str> = conf.split(',').collect();
            let mut out = vec![Step::Settings { conf: String::new() }];
            if parts.len() > 1 {
                for skip in 0..parts.len() {
                    let kept: Vec<&str> = parts
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| i != skip)
                        .map(|(_, p)| *p)
                        .collect();
                    out.push(Step::Settings { conf: kept.join(",") });
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Shrink `program`, which fails with `failure`, to a smaller program that fails the same
/// oracle. `fails` runs the oracles on a candidate.
pub fn shrink(
    program: &Program,
    failure: &Failure,
    fails: impl Fn(&Program) -> Option<Failure>,
) -> (Program, Failure) {
    let mut best = program.clone();
    let mut best_failure = failure.clone();
    let mut attempts = 0;
    let mut try_candidate =
        |candidate: Program, best: &mut Program, best_failure: &mut Failure| -> bool {
            if attempts >= MAX_ATTEMPTS {
                return false;
            }
            attempts += 1;
            match fails(&candidate) {
                Some(f) if f.oracle == failure.oracle && f.policy == failure.policy => {
                    *best = candidate;
                    *best_failure = f;
                    true
                }
                _ => false,
            }
        };
    // Delete runs of steps, halving the run length down to one step.
    let mut chunk = best.steps.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < best.steps.len() {
            let mut candidate = best.clone();
            let end = (start + chunk).min(candidate.steps.len());
            candidate.steps.drain(start..end);
            if !try_candidate(candidate, &mut best, &mut best_failure) {
                start += chunk;
            }
        }
        if chunk == 1 {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    // Whole-program simplifications.
    for edit in 0..3 {
        let mut candidate = best.clone();
        match edit {
            0 => candidate.drain = false,
            1 => candidate.memory_fraction = None,
            _ => candidate.alloc_conf.clear(),
        }
        if candidate != best {
            try_candidate(candidate, &mut best, &mut best_failure);
        }
    }
    // Simplify each step until nothing changes.
    let mut changed = true;
    while changed {
        changed = false;
        for i in 0..best.steps.len() {
            for step in simpler(&best.steps[i]) {
                let mut candidate = best.clone();
                candidate.steps[i] = step;
                if try_candidate(candidate, &mut best, &mut best_failure) {
                    changed = true;
                    break;
                }
            }
        }
    }
    (best, best_failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracles::Oracle;
    use crate::program::DeviceSpec;

    #[test]
    fn shrinks_to_the_steps_that_matter() {
        let mut steps: Vec<Step> =
            (0..50).map(|i| Step::Alloc { size: 1000 + i, stream: (i % 3) as u8 }).collect();
        steps.insert(30, Step::Alloc { size: 7_777_777, stream: 2 });
        let program = Program {
            device: DeviceSpec { total_bytes: 1 << 30, free_bytes: 1 << 30 },
            alloc_conf: "max_split_size_mb:40".into(),
            memory_fraction: Some(0.5),
            steps,
            drain: true,
        };
        // "Fails" while some allocation is at least 4 MiB.
        let fails = |p: &Program| {
            p.steps
                .iter()
                .any(|s| matches!(s, Step::Alloc { size, .. } if *size >= 4 << 20))
                .then(|| Failure::new(Oracle::Checker, "x", None, "big"))
        };
        let first = fails(&program).unwrap();
        let (small, _) = shrink(&program, &first, fails);
        assert_eq!(small.steps, vec![Step::Alloc { size: 4 << 20, stream: 0 }]);
        assert!(!small.drain && small.memory_fraction.is_none() && small.alloc_conf.is_empty());
    }
}
