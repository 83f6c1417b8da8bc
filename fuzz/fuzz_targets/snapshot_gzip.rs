//! Bytes as a gzip stream, and gzipped again then damaged as its header's MTIME says → read
//! as the CLI reads a `.pickle.gz`, streamed and generic readers agreeing → as snapshot_file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = allocsim_testgen::targets::snapshot_gzip(data) {
        panic!("{failure}");
    }
});
