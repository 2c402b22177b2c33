//! The `iota` binary: parses the command line and dispatches to [`iota::cmd`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    iota::cmd::subnormals::flush();
    let cli = iota::cmd::Cli::parse();
    // Before any thread starts (parsing starts none).
    if cli.command.tunes_allocator() {
        iota::cmd::allocator::tune();
    }
    iota::cmd::init_tracing(cli.verbose, cli.log_format);
    iota::cmd::hint::install_panic_hook();
    match iota::cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{}", iota::cmd::hint::error_line(&err));
            ExitCode::FAILURE
        }
    }
}
