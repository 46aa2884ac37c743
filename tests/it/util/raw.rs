//! Raw-socket readers, for answers a well-behaved client library would hide (a 408, a
//! closed connection, a 100-continue).

use std::time::Duration;

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{sign, POLL_DEADLINE, SECRET};

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

/// A signed HTTP/1.1 delivery of `body` to the botix route, as raw bytes for a connection
/// the test holds itself (kept alive).
pub fn signed_request(body: &str) -> Vec<u8> {
    format!(
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Botix-Signature: {}\r\n\r\n{body}",
        body.len(),
        sign(SECRET, body.as_bytes()),
    )
    .into_bytes()
}

/// Reads one HTTP/1.1 answer (head, then a body of its Content-Length) off a connection the
/// test holds: its status and its body as JSON (or as a JSON string when it is not JSON).
/// Panics on EOF or at the deadline.
pub async fn read_answer(stream: &mut TcpStream) -> (u16, serde_json::Value) {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + length {
                    let status = head
                        .split(' ')
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| panic!("no status in {head:?}"));
                    let body =
                        String::from_utf8_lossy(&got[end + 4..end + 4 + length]).into_owned();
                    let body =
                        serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
                    return (status, body);
                }
            }
            let n = stream.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before a whole answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(POLL_DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("no whole answer in time"))
}

/// Delivers a fresh event `id` on a connection the test holds and asserts it was accepted.
pub async fn accept_on(stream: &mut TcpStream, id: &str) {
    stream
        .write_all(&signed_request(&super::event_body(id)))
        .await
        .expect("write");
    let (status, answer) = read_answer(stream).await;
    assert_eq!(
        (status, super::outcome(&answer)),
        (200, "accepted".to_owned()),
        "{id}: {answer}"
    );
}
