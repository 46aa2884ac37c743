//! How a command ends: the exit codes `run` documents, the error line, and the hint for a
//! config file that is not there.

use std::path::Path;
use std::process::ExitCode;

use hookgate::config::Config;

/// Exit code for a bad config or bad arguments (sysexits EX_USAGE); nothing was bound.
pub const EXIT_USAGE: u8 = 64;

/// Success, or the error printed and `code`.
pub fn finish(result: anyhow::Result<()>, code: u8) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// The config at `path`, or its error printed (with the hint) and the usage exit code.
pub fn load_config(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("error: {}", with_config_hint(path, &e.to_string()));
        ExitCode::from(EXIT_USAGE)
    })
}

/// `error` with a hint when the config file does not exist: the default path is relative
/// to the working directory, which outside the repository holds no `config/`.
pub fn with_config_hint(path: &Path, error: &str) -> String {
    if path.exists() {
        error.to_owned()
    } else {
        format!("{error} (give the config file with --config PATH or HOOKGATE_CONFIG)")
    }
}
