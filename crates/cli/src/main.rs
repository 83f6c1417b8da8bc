//! `allocsim`: the command-line front end. The only crate that prints, reads the environment
//! or uses `anyhow`; every command is a thin layer over the library crates.

mod convert;
mod fidelity;
mod info;
mod output;
mod replay;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Simulate GPU memory allocators and replay recorded allocation traces through them.
#[derive(Debug, Parser)]
#[command(name = "allocsim", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise a trace: events by action, streams, peak live bytes, settings, warnings.
    Info(info::Args),
    /// Replay a trace through a policy on a device and report statistics and metrics.
    Replay(replay::Args),
    /// Replay a PyTorch recording in lockstep with itself and report "exact" or where it parts.
    Fidelity(fidelity::Args),
    /// Convert a trace between formats, chosen by extension (.pickle[.gz], .csv, .allocsim,
    /// .allocsim.json).
    Convert(convert::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Fidelity(args) => fidelity::run(args),
        Command::Convert(args) => convert::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
