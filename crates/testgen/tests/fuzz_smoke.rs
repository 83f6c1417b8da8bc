//! The fuzz targets' oracles as plain tests (CI has no cargo-fuzz): each target's body runs
//! on its committed corpus (`fuzz/corpus/TARGET/`), on seeded random bytes, and on seeded
//! mutations of the corpus (bit flips, truncations, splices), a few hundred inputs each.

use allocsim_testgen::targets::TARGETS;
use allocsim_testgen::{Entropy, SeededEntropy};
use std::path::PathBuf;

const RANDOM_INPUTS: u64 = if cfg!(debug_assertions) { 48 } else { 300 };
const MUTATIONS_PER_FILE: u64 = if cfg!(debug_assertions) { 4 } else { 24 };

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.expect("corpus entry").path()).collect(),
        Err(_) => return Vec::new(),
    };
    files.sort();
    files
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).expect("reading a corpus file")))
        .collect()
}

fn mutate(e: &mut SeededEntropy, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    match e.below(4) {
        0 if !out.is_empty() => {
            for _ in 0..1 + e.below(8) {
                let i = e.below(out.len() as u64) as usize;
                out[i] ^= 1 << e.below(8);
            }
        }
        1 => out.truncate(e.below(out.len() as u64 + 1) as usize),
        2 if !out.is_empty() => {
            let i = e.below(out.len() as u64) as usize;
            out[i] = *e.pick(&[0, 1, 0x7f, 0x80, 0xff]);
        }
        _ => {
            let cut = e.below(out.len() as u64 + 1) as usize;
            let from = e.below(other.len() as u64 + 1) as usize;
            out.truncate(cut);
            out.extend_from_slice(&other[from..]);
        }
    }
    out
}

#[test]
fn fuzz_targets_smoke() {
    let mut failures = Vec::new();
    for (name, target) in TARGETS {
        let files = corpus(name);
        let mut e = SeededEntropy::new(0x5eed ^ name.len() as u64);
        let mut inputs: Vec<(String, Vec<u8>)> =
            files.iter().map(|(p, b)| (p.display().to_string(), b.clone())).collect();
        for i in 0..RANDOM_INPUTS {
            let len = e.below(512) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| e.below(256) as u8).collect();
            inputs.push((format!("random input {i}"), bytes));
        }
        for (p, b) in &files {
            for m in 0..MUTATIONS_PER_FILE {
                let other = &files[e.below(files.len() as u64) as usize].1;
                inputs.push((format!("mutation {m} of {}", p.display()), mutate(&mut e, b, other)));
            }
        }
        for (what, bytes) in &inputs {
            if let Err(f) = target(bytes) {
                failures.push(format!("{name} on {what}: {f}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
