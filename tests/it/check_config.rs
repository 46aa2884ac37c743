//! `hookgate check-config` refuses what `run` refuses (secrets, TLS files, URLs), with the
//! same exit code and message, and `--offline` checks a manifest's config without them.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::util::*;

const DEADLINE: Duration = Duration::from_secs(20);
/// The environment variables `config/production.yaml` names.
const AMQP_URL_ENV: &str = "HOOKGATE_AMQP_URL";
const SECRET_ENV: &str = "BOTIX_WEBHOOK_SECRET";

fn production_yaml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/production.yaml")
}

/// Runs `hookgate <command> --config <config>` with exactly `env` of the variables above.
async fn hookgate_with(command: &[&str], config: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = hookgate();
    cmd.args(command)
        .arg("--config")
        .arg(config)
        .arg("--log-format")
        .arg("text")
        .env_remove(AMQP_URL_ENV)
        .env_remove(SECRET_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, DEADLINE).await
}

/// The `error: …` line hookgate printed.
fn error_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn check_config_refuses_what_run_refuses_with_the_same_exit_code() {
    let production = production_yaml();
    let url = "amqp://hookgate:pw@127.0.0.1:5672/%2f";
    // Each case fixes the previous one's fault and meets the next one: the AMQP URL's
    // variable, the signing secret's variable, the previous secret's file, a URL that is
    // no AMQP URL.
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[], AMQP_URL_ENV),
        (&[(AMQP_URL_ENV, url)], SECRET_ENV),
        (
            &[(AMQP_URL_ENV, url), (SECRET_ENV, "s")],
            "/etc/hookgate/secrets/botix-previous",
        ),
        (
            &[(AMQP_URL_ENV, "http://hookgate:pw@x/"), (SECRET_ENV, "s")],
            "amqp.url",
        ),
    ];
    for (env, named) in cases {
        let check = hookgate_with(&["check-config"], &production, env).await;
        let line = error_line(&check);
        assert_eq!(check.status.code(), Some(64), "{env:?}: {line}");
        assert!(line.contains(named), "{env:?}: names {named}: {line}");
        assert!(!line.contains(":pw@"), "a password was printed: {line}");
        // `run` stops at the same fault, before it opens the store or binds a port.
        let run = hookgate_with(&["run"], &production, env).await;
        assert_eq!(run.status.code(), Some(64), "{env:?}: run");
        assert_eq!(
            error_line(&run),
            line,
            "{env:?}: run and check-config disagree"
        );
    }
}

#[tokio::test]
async fn check_config_loads_tls_files_and_passes_a_config_run_would_start_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = TestCert::generate(dir.path());
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.secrets = format!("      - secret_env: {SECRET_ENV}\n");
    cfg.tls = Some((cert.cert_path.clone(), cert.key_path.clone()));
    let path = dir.path().join("hookgate.yaml");
    std::fs::write(&path, cfg.yaml()).expect("write");

    let ok = hookgate_with(&["check-config"], &path, &[(SECRET_ENV, "s")]).await;
    let stderr = String::from_utf8_lossy(&ok.stderr);
    assert_eq!(ok.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is valid"), "{stderr}");

    // A key file that is not a key: refused, naming the file.
    std::fs::write(&cert.key_path, "not a key\n").expect("write");
    let bad = hookgate_with(&["check-config"], &path, &[(SECRET_ENV, "s")]).await;
    let line = error_line(&bad);
    assert_eq!(bad.status.code(), Some(64), "{line}");
    assert!(line.contains("tls.key"), "{line}");
    // No store was opened: a running gateway holds it, and check-config must not need it.
    assert!(!cfg.store.exists(), "check-config opened the store");
}

#[tokio::test]
async fn offline_check_reads_no_environment_and_prints_durations_as_written() {
    let out = hookgate_with(&["check-config", "--offline"], &production_yaml(), &[]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("offline"), "{stderr}");
    for written in [
        "ttl: 72h",
        "retention: 7d",
        "help_window: 60s",
        "shutdown_grace: 25s",
    ] {
        assert!(stdout.contains(written), "{written} missing:\n{stdout}");
    }
    assert!(!stdout.contains("days"), "{stdout}");

    // Offline still checks what needs no look-up: a URL written in the file.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.amqp_url = "amqp://guest:guest@[::1:5672/%2f".into();
    let path = dir.path().join("bad-url.yaml");
    std::fs::write(&path, cfg.yaml()).expect("write");
    let bad = hookgate_with(&["check-config", "--offline"], &path, &[]).await;
    let line = error_line(&bad);
    assert_eq!(bad.status.code(), Some(64), "{line}");
    assert!(line.contains("amqp.url"), "{line}");
    assert!(!line.contains("guest:guest"), "{line}");

    // And the Redis URL the redis backend would use.
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.extra = "dedup: {backend: redis}\nredis: {url: 'http://cache.example:6379'}\n".into();
    std::fs::write(&path, cfg.yaml()).expect("write");
    let bad = hookgate_with(&["check-config", "--offline"], &path, &[]).await;
    let line = error_line(&bad);
    assert_eq!(bad.status.code(), Some(64), "{line}");
    assert!(
        line.contains("redis.url: must start with redis://"),
        "{line}"
    );
}

#[tokio::test]
async fn check_config_validates_without_printing_secrets() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/hookgate.yaml");
    let shipped_text = std::fs::read_to_string(&shipped).expect("shipped config");
    assert!(
        shipped_text.contains("dev-secret-change-me"),
        "fixture changed"
    );
    let mut cmd = hookgate();
    cmd.arg("check-config").arg("--config").arg(&shipped);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("/webhooks/botix"),
        "prints the config: {stdout}"
    );
    assert!(
        !stdout.contains("dev-secret-change-me") && !stderr.contains("dev-secret-change-me"),
        "a secret was printed: {stdout}{stderr}"
    );
    assert!(
        !stdout.contains("guest:guest"),
        "the AMQP password was printed"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        GatewayConfig::new(dir.path(), "x").yaml() + "limits:\n  max_body_byts: 1KiB\n",
    )
    .expect("write");
    let mut cmd = hookgate();
    cmd.arg("check-config").arg("--config").arg(&typo);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("limits.max_body_byts"), "{stderr}");
}

#[tokio::test]
async fn run_with_a_missing_secret_env_exits_64_before_binding() {
    const VAR: &str = "HOOKGATE_OPS_TEST_SURELY_UNSET_SECRET";
    let dir = tempfile::tempdir().expect("tempdir");
    // Hold the ports the config names: a gateway that bound before loading its secrets
    // would fail with "cannot bind" and exit 1 instead.
    let held: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.secrets = format!("      - secret_env: {VAR}\n");
    let mut yaml = cfg.yaml();
    for l in &held {
        let addr = l.local_addr().expect("addr");
        yaml = yaml.replacen("addr: 127.0.0.1:0", &format!("addr: {addr}"), 1);
        assert!(yaml.contains(&addr.to_string()));
    }
    let path = dir.path().join("missing-env.yaml");
    std::fs::write(&path, yaml).expect("write");
    let mut cmd = hookgate();
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .arg("--log-format")
        .arg("text")
        .env_remove(VAR);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(VAR), "names the variable: {stderr}");
    assert!(!stderr.contains("cannot bind"), "{stderr}");
    assert!(
        !dir.path().join("store").exists(),
        "nothing was opened before the config failed"
    );
    drop(held);
}

/// `hookgate <args>` in `dir` (so the default `config/hookgate.yaml` is missing), with
/// `env` and neither HOOKGATE_CONFIG nor HOOKGATE_LOG_FORMAT inherited.
async fn hookgate_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = hookgate();
    cmd.current_dir(dir)
        .args(args)
        .env_remove("HOOKGATE_CONFIG")
        .env_remove("HOOKGATE_LOG_FORMAT")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(cmd, DEADLINE).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_missing_config_is_logged_as_json_off_a_terminal_and_names_the_way_to_give_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    // stderr is a pipe here, as in a container.
    let (code, stderr) = hookgate_in(dir.path(), &["run"], &[]).await;
    assert_eq!(code, Some(64), "{stderr}");
    let logged: serde_json::Value = stderr
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in:\n{stderr}"));
    assert_eq!(logged["level"], "ERROR", "{logged}");
    assert_eq!(logged["message"], "invalid config", "{logged}");
    let error = logged["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("config/hookgate.yaml")
            && error.contains("--config")
            && error.contains("HOOKGATE_CONFIG"),
        "{error}"
    );
    for command in [&["check-config"][..], &["spool", "status"]] {
        let (code, stderr) = hookgate_in(dir.path(), command, &[]).await;
        assert_eq!(code, Some(64), "{command:?}: {stderr}");
        assert!(
            stderr.contains("--config PATH or HOOKGATE_CONFIG"),
            "{command:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn hookgate_log_format_chooses_the_format_and_text_has_no_colour_off_a_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, stderr) =
        hookgate_in(dir.path(), &["run"], &[("HOOKGATE_LOG_FORMAT", "text")]).await;
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()),
        "text asked for: {stderr}"
    );
    assert!(
        stderr.contains("ERROR") && stderr.contains("invalid config"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "escape codes in a pipe: {stderr:?}"
    );
    // The flag wins over the variable.
    let (_, stderr) = hookgate_in(
        dir.path(),
        &["run", "--log-format", "json"],
        &[("HOOKGATE_LOG_FORMAT", "text")],
    )
    .await;
    assert!(
        stderr
            .lines()
            .any(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "{stderr}"
    );
}
