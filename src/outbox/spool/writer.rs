//! Group commit: one thread owns every write to the spool's database. Requests queue while
//! a commit runs; the next commit takes all of them in one transaction and one
//! `fdatasync`, then answers each. A request is answered `Ok` only after that commit
//! returned, so a 200 that waits for it stands on synced data.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::Database;
use tokio::sync::oneshot;

use crate::store::StoreError;

use super::ledger::{lock, Ledger};
use super::tables::{self, Op};

/// Requests one commit takes at most: a commit of a burst stays a few megabytes.
const MAX_BATCH: usize = 1_024;

/// Undoes what a request reserved in the counts, when its commit fails.
pub(super) type Undo = Box<dyn FnOnce(&Ledger) + Send>;

/// The answer to a request: `Ok` once its changes are on disk.
pub(super) type Answer = oneshot::Receiver<Result<(), StoreError>>;

struct Request {
    ops: Vec<Op>,
    undo: Option<Undo>,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// The queue in front of the thread, and the next sequence number: numbers are given
/// under the same lock the request is queued under, so commits come in number order and
/// the drainer never sees a later entry before an earlier one.
struct Queue {
    next_seq: u64,
    sender: Option<mpsc::Sender<Request>>,
}

/// The writer thread's handle. Dropping it lets the thread finish the commits queued and
/// waits for it, so the database is closed when the spool is.
pub(super) struct Writer {
    queue: Mutex<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
    ledger: Arc<Ledger>,
}

impl Writer {
    /// Starts the thread; entries pushed from now on are numbered from `next_seq`.
    pub(super) fn start(
        db: Arc<Database>,
        ledger: Arc<Ledger>,
        next_seq: u64,
    ) -> Result<Self, StoreError> {
        let (sender, receiver) = mpsc::channel::<Request>();
        let thread_ledger = ledger.clone();
        let thread = std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || run(&db, &thread_ledger, &receiver))
            .map_err(|e| StoreError::Stopped(format!("cannot start the spool writer: {e}")))?;
        Ok(Self {
            queue: Mutex::new(Queue {
                next_seq,
                sender: Some(sender),
            }),
            thread: Mutex::new(Some(thread)),
            ledger,
        })
    }

    /// Queues the changes `make` builds for a new sequence number; returns the number and
    /// the answer to wait for. `undo` runs on the writer thread if the commit fails.
    pub(super) fn submit_numbered(
        &self,
        make: impl FnOnce(u64) -> Vec<Op>,
        undo: Option<Undo>,
    ) -> Result<(u64, Answer), StoreError> {
        let mut queue = lock(&self.queue);
        let seq = queue.next_seq;
        let answer = self.send(&queue, make(seq), undo)?;
        queue.next_seq += 1;
        Ok((seq, answer))
    }

    /// Queues `ops` for the next commit.
    pub(super) fn submit(&self, ops: Vec<Op>) -> Result<Answer, StoreError> {
        let queue = lock(&self.queue);
        self.send(&queue, ops, None)
    }

    /// Queues `ops` and waits for their commit.
    pub(super) async fn commit(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let answer = self.submit(ops)?;
        answer.await.map_err(|_| self.stopped())?
    }

    fn send(&self, queue: &Queue, ops: Vec<Op>, undo: Option<Undo>) -> Result<Answer, StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request { ops, undo, reply };
        let sent = queue
            .sender
            .as_ref()
            .map(|s| s.send(request).map_err(|e| e.0));
        match sent {
            Some(Ok(())) => Ok(answer),
            Some(Err(request)) => {
                if let Some(undo) = request.undo {
                    undo(&self.ledger);
                }
                Err(self.stopped())
            }
            None => Err(self.stopped()),
        }
    }

    fn stopped(&self) -> StoreError {
        let reason = "the spool's writer thread has stopped";
        self.ledger.set_broken(reason.into());
        StoreError::Stopped(reason.into())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(lock(&self.queue).sender.take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// The thread: takes what is queued, commits it in one transaction, answers each request.
fn run(db: &Database, ledger: &Ledger, receiver: &mpsc::Receiver<Request>) {
    let mut failing = false;
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let result = tables::commit(db, batch.iter().flat_map(|r| r.ops.iter()));
        ledger
            .store_failing
            .store(result.is_err(), Ordering::SeqCst);
        match &result {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the spool's database takes writes again");
            }
            Ok(()) => {}
            Err(error) => {
                if tables::needs_reopen(error) {
                    ledger.set_broken(format!(
                        "the spool's database refuses writes after an I/O error until it is opened again: {error}"
                    ));
                }
                if !failing {
                    // Spooled events are refused (503) and drained ones wait for their
                    // deletes: an operator must look at the disk.
                    tracing::error!(%error, "spool commit failed; spooling answers 503 until the disk takes writes again");
                }
                failing = true;
            }
        }
        for request in batch {
            let answer = match &result {
                Ok(()) => Ok(()),
                Err(error) => {
                    if let Some(undo) = request.undo {
                        undo(ledger);
                    }
                    Err(copy_error(error))
                }
            };
            let _ = request.reply.send(answer);
        }
    }
}

/// A [`StoreError`] for each request a failed commit answers.
fn copy_error(error: &redb::Error) -> StoreError {
    match error {
        redb::Error::Corrupted(_) => StoreError::Corrupt(error.to_string().into()),
        _ => StoreError::Disk(error.to_string().into()),
    }
}
