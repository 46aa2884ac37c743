//! A route's walk position in the state store (the embedded store, or Redis with
//! `dedup.backend: redis`), as a versioned record of its own; and the lease that lets one
//! replica walk a route at a time.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::keys::StoreKey;
use crate::state::{LeaseHolder, StateStore};
use crate::store_error::StoreError;

/// The record version [`encode`] writes.
const VERSION: u32 = 1;

/// Where a route's walks stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// The walk underway, if one was left unfinished.
    pub walk: Option<Walk>,
    /// When the last walk (complete or not) started, Unix ms.
    pub last_try_start_ms: Option<i64>,
    /// When the last complete walk started, Unix ms.
    pub last_complete_start_ms: Option<i64>,
    /// When the last complete walk ended, Unix ms.
    pub last_complete_end_ms: Option<i64>,
}

/// A walk underway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// Its `since`, Unix ms.
    pub since_ms: i64,
    /// The cursor of the next page; `None` for the first.
    pub cursor: Option<String>,
    /// When it started, Unix ms.
    pub started_ms: i64,
}

/// The record on disk. Its names are pinned: renaming a field of [`Position`] must not
/// make stored positions unreadable.
#[derive(Serialize, Deserialize)]
struct RecordV1 {
    #[serde(rename = "v")]
    version: u32,
    #[serde(rename = "since_ms", default)]
    since_ms: Option<i64>,
    #[serde(rename = "cursor", default)]
    cursor: Option<String>,
    #[serde(rename = "walk_started_ms", default)]
    walk_started_ms: Option<i64>,
    #[serde(rename = "last_try_start_ms", default)]
    last_try_start_ms: Option<i64>,
    #[serde(rename = "last_complete_start_ms", default)]
    last_complete_start_ms: Option<i64>,
    #[serde(rename = "last_complete_end_ms", default)]
    last_complete_end_ms: Option<i64>,
}

/// A position as its record.
pub fn encode(p: &Position) -> Vec<u8> {
    let record = RecordV1 {
        version: VERSION,
        since_ms: p.walk.as_ref().map(|w| w.since_ms),
        cursor: p.walk.as_ref().and_then(|w| w.cursor.clone()),
        walk_started_ms: p.walk.as_ref().map(|w| w.started_ms),
        last_try_start_ms: p.last_try_start_ms,
        last_complete_start_ms: p.last_complete_start_ms,
        last_complete_end_ms: p.last_complete_end_ms,
    };
    serde_json::to_vec(&record).unwrap_or_default()
}

/// A record that cannot be read as a position.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("position record is not readable: {0}")]
    Unreadable(String),
    #[error("position record version {0} is unknown to this hookgate")]
    UnknownVersion(u32),
}

/// The position a record holds.
pub fn decode(bytes: &[u8]) -> Result<Position, DecodeError> {
    let r: RecordV1 =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::Unreadable(e.to_string()))?;
    if r.version != VERSION {
        return Err(DecodeError::UnknownVersion(r.version));
    }
    let walk = match (r.since_ms, r.walk_started_ms) {
        (Some(since_ms), Some(started_ms)) => Some(Walk {
            since_ms,
            cursor: r.cursor,
            started_ms,
        }),
        _ => None,
    };
    Ok(Position {
        walk,
        last_try_start_ms: r.last_try_start_ms,
        last_complete_start_ms: r.last_complete_start_ms,
        last_complete_end_ms: r.last_complete_end_ms,
    })
}

/// How long a walker's lease lasts without renewal: a replica that dies hands the route
/// to another after this.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// One route's position and lease in the state store.
pub struct Positions {
    state: Arc<StateStore>,
    /// The position's key and this process's token of its lease: one key in two spaces, so
    /// a write can check the lease in the same step (a Redis Cluster keeps both in one slot).
    holder: LeaseHolder,
}

impl Positions {
    /// The position of `route`.
    pub fn new(state: Arc<StateStore>, route: &str) -> Self {
        Self {
            state,
            holder: LeaseHolder {
                key: StoreKey::guard(route, "reconcile", &["position"]),
                token: rand::random(),
            },
        }
    }

    /// The stored position; none stored is the default. A record that cannot be read is
    /// logged and read as none: the next walk reaches back `lookback`, and dedup knows
    /// what it lists again.
    pub async fn load(&self, route: &str) -> Result<Position, StoreError> {
        match self.state.get(&self.holder.key).await? {
            None => Ok(Position::default()),
            Some(bytes) => Ok(decode(&bytes).unwrap_or_else(|error| {
                tracing::warn!(route, %error, "reconciliation position unreadable; walking from lookback");
                Position::default()
            })),
        }
    }

    /// Stores `position` and waits until it is durable; only while this process holds the
    /// lease ([`StoreError::LeaseLost`] otherwise), so a walker paused past its lease cannot
    /// move back the position its successor saved.
    pub async fn save(&self, position: &Position, now_ms: i64) -> Result<(), StoreError> {
        self.state
            .put_leased(&self.holder, &encode(position), now_ms)
            .await?;
        self.state.sync().await
    }

    /// Takes or renews this process's lease of the route's walk.
    pub async fn lease(&self) -> Result<bool, StoreError> {
        self.state.lease(&self.holder, LEASE_TTL).await
    }

    /// Ends this process's lease.
    pub async fn end_lease(&self) {
        if let Err(error) = self.state.end_lease(&self.holder).await {
            tracing::warn!(%error, "reconciliation lease not ended; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip() {
        let p = Position {
            walk: Some(Walk {
                since_ms: 1,
                cursor: Some("c".into()),
                started_ms: 2,
            }),
            last_try_start_ms: Some(2),
            last_complete_start_ms: Some(0),
            last_complete_end_ms: None,
        };
        assert_eq!(decode(&encode(&p)).expect("decode"), p);
        assert_eq!(
            decode(&encode(&Position::default())).expect("decode"),
            Position::default()
        );
    }

    #[test]
    fn the_record_layout_is_pinned() {
        let text = r#"{"v":1,"since_ms":10,"cursor":"abc","walk_started_ms":20,"last_try_start_ms":20,"last_complete_start_ms":5,"last_complete_end_ms":6}"#;
        let p = decode(text.as_bytes()).expect("decode");
        assert_eq!(
            p.walk.as_ref().and_then(|w| w.cursor.as_deref()),
            Some("abc")
        );
        assert_eq!(p.last_complete_end_ms, Some(6));
        assert_eq!(String::from_utf8(encode(&p)).expect("utf8"), text);
    }

    #[test]
    fn unknown_versions_and_garbage_are_errors() {
        assert!(matches!(
            decode(br#"{"v":2}"#),
            Err(DecodeError::UnknownVersion(2))
        ));
        assert!(matches!(decode(b"\x00"), Err(DecodeError::Unreadable(_))));
    }
}
