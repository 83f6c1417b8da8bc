//! Bytes as a trace with strings → `allocsim report`'s page → its data element holds no markup
//! and reads back to the title and frames it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::report_page(data) {
        panic!("{failure}");
    }
});
