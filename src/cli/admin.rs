//! Requests to the running gateway's admin listener, for the commands that work through it
//! (`spool`, `reconcile`).

use std::io::{Read, Write};

use anyhow::Context;
use hookgate::config::Config;
use hookgate::http::token::AdminToken;

/// The admin address to call: the configured one, on loopback when it listens on all
/// addresses.
pub fn address(config: &Config) -> std::net::SocketAddr {
    let mut addr = config.admin.addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    addr
}

/// The admin token of `admin.token_file`, for the requests that change the spool or ask
/// for a walk; `None` when the config names no file (the gateway then refuses them).
pub fn token(config: &Config) -> anyhow::Result<Option<AdminToken>> {
    Ok(config
        .admin
        .token_file
        .as_deref()
        .map(AdminToken::read)
        .transpose()?)
}

/// An admin request that must answer 200; its body.
pub fn ok(addr: std::net::SocketAddr, method: &str, path: &str) -> anyhow::Result<String> {
    authorized(addr, method, path, None)
}

/// [`ok`] presenting `token` (changes to the spool and walks need it).
pub fn authorized(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&AdminToken>,
) -> anyhow::Result<String> {
    let (status, body) = send(addr, method, path, token)?;
    anyhow::ensure!(
        status == 200,
        "the gateway answered {status}: {}",
        body.trim()
    );
    Ok(body)
}

/// One request to the admin listener: (status, body).
pub fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    send(addr, method, path, None)
}

/// One request, with the token as a bearer credential when given: (status, body).
pub fn send(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&AdminToken>,
) -> anyhow::Result<(u16, String)> {
    let timeout = std::time::Duration::from_secs(3);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let authorization = token.map_or_else(String::new, |t| {
        format!("Authorization: Bearer {}\r\n", t.expose())
    });
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{authorization}Content-Length: 0\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .with_context(|| {
            format!(
                "malformed HTTP answer: {}",
                head.lines().next().unwrap_or("")
            )
        })?;
    Ok((status, body.to_owned()))
}
