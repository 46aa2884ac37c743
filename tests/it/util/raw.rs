//! Raw-socket readers, for answers a well-behaved client library would hide (a 408, a
//! closed connection, a 100-continue).

use std::time::Duration;

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::POLL_DEADLINE;

/// Reads until the peer closes (EOF or reset); `None` if it is still open at the deadline.
pub async fn read_until_closed(stream: &mut TcpStream, timeout: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(timeout, read).await.ok()?;
    Some(out)
}

/// Reads until `needle` has arrived; panics on EOF or at the deadline.
pub async fn read_until(stream: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !out.windows(needle.len()).any(|w| w == needle) {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(needle));
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(POLL_DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("no {:?} in time", String::from_utf8_lossy(needle)));
    out
}

/// Whether `needle` arrives before the peer closes (bounded).
pub async fn read_until_closed_or(stream: &mut TcpStream, needle: &[u8]) -> bool {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if out.windows(needle.len()).any(|w| w == needle) {
                return true;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or(false)
}

/// Sends `request` on a fresh connection to `addr` and returns everything the server sent
/// until it closed, as text. Raw, because a client library would not send a body slower than
/// the limit, a lying Content-Length or a head over the limit.
pub async fn raw_exchange(addr: SocketAddr, request: impl AsRef<[u8]>) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_ref()).await.expect("write");
    let answer = read_until_closed(&mut s, POLL_DEADLINE)
        .await
        .expect("the server neither answered nor closed");
    String::from_utf8_lossy(&answer).into_owned()
}
