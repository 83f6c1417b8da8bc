//! Bytes → a generated op program (first byte picks the policy) → every oracle.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::program(data) {
        panic!("{failure}");
    }
});
