//! Bytes as a program whose stacks, annotations and warnings are text → every file writer
//! (native, snapshot, event log) → read back and compared.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::writers(data) {
        panic!("{failure}");
    }
});
