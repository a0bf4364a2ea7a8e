//! The `stallscope` binary: parses the command line and runs the library's pipeline.
//! Exit status: 0 no stall over the threshold, 1 stalls found, 2 error.

use clap::{CommandFactory, Parser};
use stallscope::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Analyze(args) => stallscope::run::analyze(&args),
        Command::Attach(args) => stallscope::app::attach::run(&args),
        Command::Watch(args) => stallscope::watch::run_watch(&args),
        Command::Completions { shell } => {
            stallscope::run::completions(Cli::command(), shell).map(|_| 0)
        }
        Command::Man { dir } => stallscope::run::man(Cli::command(), dir.as_deref()).map(|_| 0),
    };
    match result {
        Ok(stalls) => std::process::exit(if stalls > 0 { 1 } else { 0 }),
        Err(e) => {
            if stallscope::run::is_broken_pipe(&e) {
                std::process::exit(0);
            }
            eprintln!("stallscope: error: {e:#}");
            std::process::exit(2);
        }
    }
}
