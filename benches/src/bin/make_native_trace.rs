//! Make a long native trace by repeating a real one:
//!
//! `cargo run --release -p allocsim-benches --bin make-native-trace -- SOURCE OUT.allocsim [OPS]`
//!
//! SOURCE is any trace (default: the bundled Llama generate recording); OPS the number of ops
//! wanted (default 10,000,000), rounded up to whole copies. The file streams out, so memory
//! stays at one copy of the source. Replay it with `allocsim replay OUT.allocsim`.

use allocsim_benches::{bundled, write_repeated, Copyable, LLAMA};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (source, out, ops): (PathBuf, PathBuf, u64) = match args.as_slice() {
        [out] => (bundled(LLAMA), PathBuf::from(out), 10_000_000),
        [source, out] => (PathBuf::from(source), PathBuf::from(out), 10_000_000),
        [source, out, ops] => match ops.replace('_', "").parse() {
            Ok(n) => (PathBuf::from(source), PathBuf::from(out), n),
            Err(e) => {
                eprintln!("error: OPS {ops:?}: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => {
            eprintln!("usage: make-native-trace [SOURCE] OUT.allocsim [OPS]");
            return ExitCode::FAILURE;
        }
    };
    let run = || -> Result<u64, String> {
        let trace = allocsim_trace::read_trace(&source).map_err(|e| e.to_string())?;
        let per_copy = Copyable::new(&trace).len() as u64;
        if per_copy == 0 {
            return Err(format!("{} has no ops", source.display()));
        }
        let copies = ops.div_ceil(per_copy).max(1);
        let file = std::fs::File::create(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let n = write_repeated(&trace, copies, &mut w, &out).map_err(|e| e.to_string())?;
        w.flush().map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(n)
    };
    match run() {
        Ok(n) => {
            eprintln!("wrote {} ({n} ops)", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
