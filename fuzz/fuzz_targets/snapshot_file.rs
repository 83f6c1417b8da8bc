//! Bytes as a snapshot file, plain and gzipped → read as the CLI reads it (record streamer,
//! then the generic reader) and by the generic reader alone → the same trace or the same
//! error → native round trip → replay under the checker.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::snapshot_file(data) {
        panic!("{failure}");
    }
});
