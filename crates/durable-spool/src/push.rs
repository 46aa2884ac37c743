//! Pushes: an entry counted (and its guard key marked held) before its commit, so events
//! that arrive meanwhile queue behind it; answered once that commit returned, or refused
//! with its reservation taken back.

use std::sync::atomic::Ordering;

use crate::error::{Error, SpoolError, StoreFault};
use crate::ledger::Ledger;
use crate::record::{self, SpooledMessage};
use crate::spool::{Spool, FLUSH_TIMEOUT};
use crate::tables::{Area, Op};
use crate::writer::{self, Failed};

impl Spool {
    /// Appends the message to the ordered spool; returns once its commit is on disk.
    pub async fn push(&self, msg: &SpooledMessage<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Main, msg).await
    }

    /// Appends the message to the held area (it is unroutable, or its guard key has
    /// entries there); returns once its commit is on disk.
    pub async fn push_held(&self, msg: &SpooledMessage<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Held, msg).await
    }

    async fn push_to(&self, area: Area, msg: &SpooledMessage<'_>) -> Result<(), SpoolError> {
        if !self.enabled {
            return Err(SpoolError::Disabled);
        }
        let entry = record::encode(msg)?;
        let size = entry.len() as u64;
        let l = &self.ledger;
        let before = l.bytes.fetch_add(size, Ordering::SeqCst);
        if before + size > self.max_bytes {
            l.bytes.fetch_sub(size, Ordering::SeqCst);
            l.refused.store(true, Ordering::SeqCst);
            return Err(SpoolError::Full {
                bytes: before,
                max: self.max_bytes,
            });
        }
        let order_key = msg.order_key.as_deref().map(str::to_owned);
        // Counted (and its key marked held) before it is committed, so an event of the same
        // key, or any event while main is not empty, goes behind it meanwhile.
        if area == Area::Held {
            l.hold_key(order_key.as_deref());
        }
        l.depth_of(area).fetch_add(1, Ordering::SeqCst);
        if area == Area::Main {
            let _ = l.oldest_secs.compare_exchange(
                -1,
                msg.timestamp_secs as i64,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        l.publish_gauges();
        // Run by the writer if the commit fails, even when this request has given up.
        let undo: writer::Undo = Box::new(move |l: &Ledger, failed: Failed| {
            if failed == Failed::InDoubt {
                // Before the counts go, so that an event of its key that finds main empty
                // finds the key held.
                l.doubt_key(order_key.as_deref());
            }
            l.sub(area, size);
            if area == Area::Held {
                l.release_key(order_key.as_deref());
            }
            if area == Area::Main && l.depth.load(Ordering::SeqCst) == 0 {
                l.oldest_secs.store(-1, Ordering::SeqCst);
            }
            l.publish_gauges();
        });
        let (_, answer) = self.writer.submit_numbered(
            |seq| {
                vec![Op::Put {
                    area,
                    seq,
                    value: entry,
                }]
            },
            Some(undo),
        )?;
        // The 200 promises the event survives a power cut: its commit must have returned.
        // An entry whose commit is late may still commit (the sender's retry may then be
        // published twice, which consumers dedup on message_id), but its sender gets a 503.
        match tokio::time::timeout(FLUSH_TIMEOUT, answer).await {
            Ok(Ok(Ok(()))) => {
                self.added.notify_one();
                Ok(())
            }
            Ok(Ok(Err(error))) => Err(error.into()),
            Ok(Err(_)) => Err(Error(StoreFault::Stopped(
                "the spool's writer thread has stopped".into(),
            ))
            .into()),
            Err(_) => Err(Error(StoreFault::NotDurable(format!(
                "the spool's commit took longer than {FLUSH_TIMEOUT:?}"
            )))
            .into()),
        }
    }
}
