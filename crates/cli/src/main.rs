//! The `allocsim` binary: parses the command line and runs it ([`allocsim_cli::execute`]).

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match allocsim_cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => allocsim_cli::usage_exit(e),
    };
    allocsim_cli::process_ends_with_command();
    // Ctrl-C, SIGTERM and SIGHUP (the `termination` feature) leave no half-written file: the
    // writes in progress remove their temporary files.
    let _ = ctrlc::set_handler(|| {
        allocsim_trace::atomic::remove_temporaries();
        std::process::exit(130);
    });
    match allocsim_cli::execute(cli) {
        Ok(code) => code,
        Err(e) => {
            // The message may quote a file's strings: a terminal sees them escaped.
            eprintln!("error: {}", allocsim_core::text::terminal_safe(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
