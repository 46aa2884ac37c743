//! The worst case of memory before authentication, for bench/rss-unverified.sh (figures in
//! BENCHMARKS.md): `--connections` HTTP/2 connections (prior knowledge, plain TCP), each
//! with `--streams` requests whose bodies declare `--body-bytes` and send all but the last
//! byte slowly, with a signature that can never match, then hold them open for `--hold`.
//! Connections are spread over the loopback addresses 127.0.0.2… so no single peer stands
//! out. Prints how many streams were opened and how each ended.
//!
//! ```sh
//! cargo run --release --example unverified_flood -- --addr 127.0.0.1:8080 \
//!     --connections 256 --streams 16 --body-bytes 65535 --hold 20s
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Parser, Debug)]
#[command(about = "Slow unverified HTTP/2 bodies against hookgate")]
struct Cli {
    /// The gateway's webhook address (plain HTTP).
    #[arg(long)]
    addr: SocketAddr,
    /// Route path.
    #[arg(long, default_value = "/webhooks/botix")]
    path: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Streams per connection (the server's limit caps what is open at once).
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// Declared body size; all but the last byte is sent.
    #[arg(long, default_value_t = 65535)]
    body_bytes: usize,
    /// Bytes per piece of a body.
    #[arg(long, default_value_t = 4096)]
    piece: usize,
    /// Pause between pieces.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// How long the bodies are held once sent.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    hold: Duration,
}

/// The body of one stream: `len` bytes in pieces, then nothing, never ending.
fn slow_body(
    len: usize,
    piece: usize,
    pause: Duration,
) -> http_body_util::combinators::BoxBody<Bytes, Infallible> {
    let pieces = (0..len)
        .step_by(piece.max(1))
        .map(move |at| piece.min(len - at));
    let stream = futures_util::stream::iter(pieces)
        .then(move |n| async move {
            tokio::time::sleep(pause).await;
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'a'; n])))
        })
        .chain(futures_util::stream::pending());
    BodyExt::boxed(StreamBody::new(stream))
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut tasks = Vec::new();
    for c in 0..cli.connections {
        // 127.0.0.2 … 127.0.255.254: many peers, none of them the sender's 127.0.0.1.
        let host = 2 + c as u32 % 65_000;
        let from = IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | host));
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0)).context("bind")?;
        let tcp = socket.connect(cli.addr).await.context("connect")?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .context("h2 handshake")?;
        tokio::spawn(conn);
        for _ in 0..cli.streams {
            let mut send = send.clone();
            let req = http::Request::post(format!("http://{}{}", cli.addr, cli.path))
                .header("content-length", cli.body_bytes)
                .header("x-botix-signature", format!("sha256={}", "0".repeat(64)))
                .body(slow_body(cli.body_bytes - 1, cli.piece, cli.pause))?;
            tasks.push(tokio::spawn(async move {
                send.ready().await.ok()?;
                send.send_request(req)
                    .await
                    .ok()
                    .map(|r| r.status().as_u16())
            }));
        }
    }
    println!(
        "opened {} streams on {} connections",
        tasks.len(),
        cli.connections
    );
    tokio::time::sleep(cli.hold).await;
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for t in tasks {
        let end = if !t.is_finished() {
            t.abort();
            "still open".to_owned()
        } else {
            match t.await {
                Ok(Some(status)) => status.to_string(),
                Ok(None) => "reset".to_owned(),
                Err(_) => "panicked".to_owned(),
            }
        };
        *ends.entry(end).or_default() += 1;
    }
    println!("ends: {ends:?}");
    Ok(())
}
