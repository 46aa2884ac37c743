//! The `hookgate` binary as a command: for the subcommands that run to completion
//! (`check-config`, `run` refusing its config).

use std::process::{Command, Stdio};
use std::time::Duration;

use super::send_signal;

/// The binary under test, with piped output and no standard input.
pub fn hookgate() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookgate"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs to completion, killing the process if it outlives `timeout`.
pub async fn run_bounded(mut cmd: Command, timeout: Duration) -> std::process::Output {
    let child = cmd.spawn().expect("spawn hookgate");
    let pid = child.id();
    let waited = tokio::time::timeout(
        timeout,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    match waited {
        Ok(out) => out.expect("join").expect("output"),
        Err(_) => {
            send_signal(pid, "KILL");
            panic!("hookgate did not exit within {timeout:?}");
        }
    }
}
