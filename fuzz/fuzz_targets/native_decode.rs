//! Bytes as a native binary and a native JSON trace → decode → re-encode round trip → replay.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::native_decode(data) {
        panic!("{failure}");
    }
});
