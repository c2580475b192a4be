//! The `sandboxd` binary: the daemon, and (with a hidden first argument) the
//! single-threaded sandbox helper it starts for every run.

use clap::Parser;
use sandboxd::{config, daemon, isolate};

fn main() {
    // The helper must decide before anything starts a thread.
    if std::env::args_os().nth(1).is_some_and(|a| a == isolate::HELPER_ARG) {
        isolate::slot::main();
    }
    let settings = config::Settings::parse();
    let print = settings.print_config;
    let config = match config::Config::load(settings) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandboxd: {e}");
            std::process::exit(2);
        }
    };
    if print {
        print!("{}", config.to_toml());
        return;
    }
    if let Err(e) = daemon::run(config) {
        eprintln!("sandboxd: {e}");
        std::process::exit(1);
    }
}
