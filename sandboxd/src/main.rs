//! The `sandboxd` binary: the daemon, and (with a hidden first argument) the
//! single-threaded sandbox helper it starts for every run, or the benchmarks of
//! loading the seccomp filter and of each isolation mechanism.

use clap::Parser;
use sandboxd::{check, config, daemon, isolate};

fn main() {
    // The helper must decide before anything starts a thread.
    if std::env::args_os().nth(1).is_some_and(|a| a == isolate::HELPER_ARG) {
        isolate::slot::main();
    }
    // bench/bench.py: what each isolation mechanism costs, apart.
    if std::env::args_os().nth(1).is_some_and(|a| a == isolate::cost::COST_ARG) {
        isolate::cost::cost_main();
    }
    // bench/bench.py: what loading the seccomp filter costs a process.
    if std::env::args_os().nth(1).is_some_and(|a| a == isolate::seccomp::BENCH_ARG) {
        isolate::seccomp::bench_main();
    }
    let settings = config::Settings::parse_from(subcommand_last(std::env::args_os().collect()));
    let print = settings.print_config;
    let command = settings.command.clone();
    let config = match config::Config::load(settings) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandboxd: {e}");
            std::process::exit(2);
        }
    };
    if let Some(config::Command::Check) = command {
        let report = check::Facts::gather(&check::Inputs::of(&config)).report();
        print!("{}", report.render());
        std::process::exit(if report.ok { 0 } else { 1 });
    }
    if print {
        print!("{}", config.to_toml());
        return;
    }
    if let Err(e) = daemon::run(config) {
        eprintln!("sandboxd: {e}");
        std::process::exit(1);
    }
}

/// `sandboxd check --state-dir X` as `sandboxd --state-dir X check`: the daemon's
/// flags are the top-level command's, and `check` takes them too.
fn subcommand_last(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if args.len() > 2 && args[1] == "check" {
        let sub = args.remove(1);
        args.push(sub);
    }
    args
}
