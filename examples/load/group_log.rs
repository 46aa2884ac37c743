//! The durable ceiling's log: one record per accepted delivery, made durable by a group
//! commit, one `fdatasync` for every record queued while the previous one ran.
//!
//! This is the least a gateway that answers only after its state is on disk must pay on
//! this machine: one write and one `fdatasync` shared by whatever arrived meanwhile, with
//! one thread hand-off each way. hookgate's journal does the same plus its own keeping.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::mpsc;

use tokio::sync::oneshot;

type Waiter = oneshot::Sender<io::Result<()>>;

/// The log's writer thread, fed through a channel.
pub struct GroupLog {
    queue: mpsc::Sender<(Vec<u8>, Waiter)>,
}

impl GroupLog {
    /// Creates (or appends to) the log at `path` and starts its writer thread.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let (queue, records) = mpsc::channel();
        std::thread::Builder::new()
            .name("group-log".into())
            .spawn(move || write_groups(file, records))?;
        Ok(Self { queue })
    }

    /// Returns once `record` is written and synced with its group.
    pub async fn append(&self, record: Vec<u8>) -> io::Result<()> {
        let (done, synced) = oneshot::channel();
        self.queue
            .send((record, done))
            .map_err(|_| io::Error::other("the log's writer is gone"))?;
        synced
            .await
            .map_err(|_| io::Error::other("the log's writer is gone"))?
    }
}

/// Takes the first record queued, then every other one already waiting, writes them with
/// one `write` and one `fdatasync`, and answers each waiter.
fn write_groups(mut file: File, records: mpsc::Receiver<(Vec<u8>, Waiter)>) {
    let mut buffer = Vec::new();
    let mut waiters = Vec::new();
    while let Ok(first) = records.recv() {
        buffer.clear();
        for (record, waiter) in std::iter::once(first).chain(records.try_iter()) {
            buffer.extend_from_slice(&record);
            waiters.push(waiter);
        }
        let result = file.write_all(&buffer).and_then(|()| file.sync_data());
        for waiter in waiters.drain(..) {
            let _ = waiter.send(match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
            });
        }
    }
}
