//! The `iota` binary: parses the command line and dispatches to [`iota::cmd`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = iota::cmd::Cli::parse();
    iota::cmd::init_tracing(cli.verbose, cli.log_format);
    match iota::cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("iota: {err:#}");
            ExitCode::FAILURE
        }
    }
}
