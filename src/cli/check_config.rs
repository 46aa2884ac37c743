//! `hookgate check-config`: the config checked as `run` checks it, short of opening the
//! store and binding ports, and printed with secrets redacted.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::cli::exit::{load_config, EXIT_USAGE};

/// `hookgate check-config`'s arguments.
#[derive(Args)]
pub struct CheckConfigArgs {
    /// Read no environment variable, secret file or TLS file (for CI on manifests).
    #[arg(long)]
    offline: bool,
}

/// Checks the config at `path`; exit codes as `run`.
pub fn command(path: &Path, args: &CheckConfigArgs) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    for deprecation in config.deprecations() {
        eprintln!("warning: {deprecation}");
    }
    let lookups = if args.offline {
        hookgate::app::Lookups::Offline
    } else {
        hookgate::app::Lookups::Resolve
    };
    match hookgate::app::check(config, lookups) {
        Ok(effective) => {
            print!("{}", effective.redacted_yaml());
            if args.offline {
                eprintln!(
                    "config {} is valid (offline: environment variables, secret files and TLS files not read)",
                    path.display()
                );
            } else {
                eprintln!("config {} is valid", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_config() { EXIT_USAGE } else { 1 })
        }
    }
}
