//! Bytes as a PyTorch snapshot pickle → import → native round trip → replay under the checker.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::snapshot_import(data) {
        panic!("{failure}");
    }
});
