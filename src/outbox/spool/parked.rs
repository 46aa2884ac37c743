//! The parked area: the record an entry is parked in, the drainer's parking of an entry it
//! failed on, and an operator's list, republish and delete of parked entries.

use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use crate::outbox::record;
use crate::store::StoreError;

use super::changes::Changes;
use super::tables::{Area, Op};
use super::{ParkedEntry, Spool, SpoolError};

/// Version byte of a parked record.
const PARKED_V1: u8 = 1;

/// Entries read at once when parked entries are listed.
const PAGE: usize = 1_000;

impl Spool {
    /// Parked entries, oldest first.
    pub fn parked_entries(&self) -> Result<Vec<ParkedEntry>, StoreError> {
        let mut out = Vec::new();
        self.tables.for_each(Area::Parked, PAGE, |seq, v| {
            out.push(describe_parked(seq, v));
        })?;
        Ok(out)
    }

    /// Puts parked entry `id` back at the tail of the ordered spool, for the drainer to
    /// publish (or park again, if it still cannot be published). The entry leaves parked
    /// and enters main in one commit.
    pub async fn republish(&self, id: u64) -> Result<(), SpoolError> {
        let _one_at_a_time = self.admin.lock().await;
        let parked = self
            .tables
            .get(Area::Parked, id)?
            .ok_or(SpoolError::NotParked(id))?;
        let entry = decode_parked(&parked)
            .map(|(_, _, entry)| entry)
            .filter(|entry| record::decode(entry).is_ok())
            .ok_or(SpoolError::Undecodable(id))?
            .to_vec();
        let size = entry.len() as u64;
        let (_, answer) = self.writer.submit_numbered(
            |seq| {
                vec![
                    Op::Remove {
                        area: Area::Parked,
                        seq: id,
                    },
                    Op::Put {
                        area: Area::Main,
                        seq,
                        value: entry,
                    },
                ]
            },
            None,
        )?;
        answer
            .await
            .map_err(|_| StoreError::Stopped("the spool's writer thread has stopped".into()))??;
        self.ledger.sub(Area::Parked, 0);
        self.ledger.add(Area::Main, size);
        self.refresh_oldest()?;
        self.ledger.publish_gauges();
        self.added.notify_one();
        Ok(())
    }

    /// Deletes parked entry `id` for good.
    pub async fn delete_parked(&self, id: u64) -> Result<(), SpoolError> {
        let _one_at_a_time = self.admin.lock().await;
        if self.tables.get(Area::Parked, id)?.is_none() {
            return Err(SpoolError::NotParked(id));
        }
        self.writer
            .commit(vec![Op::Remove {
                area: Area::Parked,
                seq: id,
            }])
            .await?;
        self.ledger.sub(Area::Parked, 0);
        self.ledger.publish_gauges();
        Ok(())
    }

    /// Parks entry `seq` of `area`, if it is still there: the drainer's way with an entry
    /// it failed on twice.
    pub(super) async fn park_entry(
        &self,
        area: Area,
        seq: u64,
        reason: &str,
        stop: &CancellationToken,
    ) {
        match self.tables.get(area, seq) {
            Ok(Some(value)) => {
                let order_key = record::decode(&value)
                    .ok()
                    .and_then(|m| m.order_key.map(|k| k.into_owned()));
                let mut changes = Changes::default();
                changes.parked(area, seq, &value, order_key.as_deref(), reason);
                self.commit_changes(changes, stop).await;
            }
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "cannot read a spool entry to park it"),
        }
    }

    /// Entries parked, as counted.
    pub(super) fn parked_depth(&self) -> u64 {
        self.ledger.parked_depth.load(Ordering::SeqCst)
    }
}

/// Parked record: version byte, parked-at (u64 big-endian Unix seconds), reason length
/// (u16 big-endian), reason (UTF-8), then the entry as it was.
pub(super) fn encode_parked(reason: &str, parked_at: u64, entry: &[u8]) -> Vec<u8> {
    let mut end = reason.len().min(u16::MAX as usize);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason.as_bytes()[..end];
    let mut out = Vec::with_capacity(11 + reason.len() + entry.len());
    out.push(PARKED_V1);
    out.extend_from_slice(&parked_at.to_be_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    out.extend_from_slice(reason);
    out.extend_from_slice(entry);
    out
}

pub(super) fn decode_parked(record: &[u8]) -> Option<(u64, String, &[u8])> {
    if *record.first()? != PARKED_V1 {
        return None;
    }
    let parked_at = u64::from_be_bytes(record.get(1..9)?.try_into().ok()?);
    let len = u16::from_be_bytes(record.get(9..11)?.try_into().ok()?) as usize;
    let reason = String::from_utf8_lossy(record.get(11..11 + len)?).into_owned();
    Some((parked_at, reason, record.get(11 + len..)?))
}

pub(super) fn describe_parked(id: u64, parked: &[u8]) -> ParkedEntry {
    let (parked_at_secs, reason, entry) = decode_parked(parked).unwrap_or((
        0,
        "the parked record cannot be decoded".to_owned(),
        parked,
    ));
    let msg = record::decode(entry).ok();
    ParkedEntry {
        id,
        parked_at_secs,
        reason,
        event_id: msg.as_ref().map(|m| m.message_id.to_string()),
        routing_key: msg.as_ref().map(|m| m.routing_key.to_string()),
        route: msg.as_ref().map(|m| m.route.to_string()),
        bytes: entry.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_records_round_trip() {
        let record = encode_parked("why", 7, b"entry");
        assert_eq!(
            decode_parked(&record),
            Some((7, "why".to_owned(), &b"entry"[..]))
        );
        assert_eq!(decode_parked(b"\x02rest"), None);
        let listed = describe_parked(5, &record);
        assert_eq!(listed.id, 5);
        assert_eq!(listed.event_id, None, "the entry itself is not decodable");
    }
}
