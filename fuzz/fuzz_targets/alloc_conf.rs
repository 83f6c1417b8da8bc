//! Bytes as a policy and its settings string → taken, or refused by a short message with no
//! control character; a string taken runs a program under the checked run's oracles.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::alloc_conf(data) {
        panic!("{failure}");
    }
});
