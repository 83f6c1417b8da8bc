//! Bytes as an RMM log → import → native round trip → replay under the checker.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::rmm_import(data) {
        panic!("{failure}");
    }
});
