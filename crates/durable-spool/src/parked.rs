//! The parked area: the drainer's parking of an entry it failed on, and an operator's list,
//! republish and delete of parked entries (their record: [`crate::parked_record`]).

use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::error::{Error, SpoolError, StoreFault};
use crate::parked_record::{decode_parked, describe_parked, ParkedEntry};
use crate::record;
use crate::spool::Spool;
use crate::tables::{Area, Op};

/// Entries read at once when parked entries are listed.
const PAGE: usize = 1_000;

impl Spool {
    /// Parked entries, oldest first.
    pub fn parked_entries(&self) -> Result<Vec<ParkedEntry>, Error> {
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
        answer.await.map_err(|_| {
            Error(StoreFault::Stopped(
                "the spool's writer thread has stopped".into(),
            ))
        })??;
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
    pub(crate) async fn park_entry(
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
    pub(crate) fn parked_depth(&self) -> u64 {
        self.ledger.parked_depth.load(Ordering::SeqCst)
    }
}
