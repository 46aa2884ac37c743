//! Group commit: one thread owns every write to the spool's database. Requests queue while
//! a commit runs; the next commit takes all of them in one transaction and one
//! `fdatasync`, then answers each. A request is answered `Ok` only after that commit
//! returned, so a 200 that waits for it stands on synced data.
//!
//! After a commit meets an I/O error (a full disk, a failed `fdatasync`), redb refuses
//! every write until the database is opened again. The thread opens it again itself, at
//! most every [`REOPEN_PAUSE`], at the next request or while idle, so a disk that has room
//! again takes writes with no restart: the reopen makes the file durable as it reads
//! (pages a failed sync left in the page cache included), then one commit sets every entry
//! the failed commits touched back to what the last good commit left, which is what the
//! counts say (a failed push's reservation was taken back, a failed delete is retried by
//! its caller). Requests that arrive before the reopen succeeds are refused at once. Until
//! then a failed push is in doubt: a kill now would have the next process read it from
//! the page cache, so the guard key of each such push counts as held (later events of the
//! key go to the spool, which refuses them, rather than to the broker ahead of it).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::Database;
use tokio::sync::oneshot;

use crate::error::{Error, StoreFault};
use crate::ledger::Ledger;
use crate::locks::lock;
use crate::tables::{self, Area, Op, Slot, Tables};

/// Requests one commit takes at most: a commit of a burst stays a few megabytes.
const MAX_BATCH: usize = 1_024;

/// The least time between two reopens of a database that met an I/O error: each reads and
/// writes the whole file, and a disk that is still full would only be worked harder. The
/// unit and model tests reopen at once, so that a seed replays the same way.
#[cfg(not(test))]
pub(crate) const REOPEN_PAUSE: Duration = Duration::from_secs(1);
#[cfg(test)]
pub(crate) const REOPEN_PAUSE: Duration = Duration::ZERO;

/// Opens the spool's database again ([`crate::store::Store::reopen_spool`]).
pub(crate) type Reopen = Box<dyn Fn() -> Result<Arc<Database>, Error> + Send>;

/// Undoes what a request reserved in the counts, when its commit fails.
pub(crate) type Undo = Box<dyn FnOnce(&Ledger, Failed) + Send>;

/// Whether what a failed request wrote may still be read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// Not at all: nothing was written, or the database is set back durably.
    Settled,
    /// Its commit met an I/O error and the database is not set back yet: its pages may
    /// still be in the page cache, where a reopen or the next process reads them.
    InDoubt,
}

/// The answer to a request: `Ok` once its changes are on disk.
pub(crate) type Answer = oneshot::Receiver<Result<(), Error>>;

struct Request {
    ops: Vec<Op>,
    undo: Option<Undo>,
    reply: oneshot::Sender<Result<(), Error>>,
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
pub(crate) struct Writer {
    queue: Mutex<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
    ledger: Arc<Ledger>,
}

impl Writer {
    /// Starts the thread; entries pushed from now on are numbered from `next_seq`. With
    /// `no_room` (why), writes are refused until the database is opened again, once the
    /// disk has room.
    pub(crate) fn start(
        tables: Tables,
        reopen: Reopen,
        ledger: Arc<Ledger>,
        next_seq: u64,
        no_room: Option<String>,
    ) -> Result<Self, Error> {
        ledger
            .store_failing
            .store(no_room.is_some(), Ordering::SeqCst);
        ledger.reopening.store(no_room.is_some(), Ordering::SeqCst);
        let (sender, receiver) = mpsc::channel::<Request>();
        let thread_ledger = ledger.clone();
        let thread = std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || {
                Thread {
                    tables,
                    reopen,
                    ledger: thread_ledger,
                    failing: no_room.is_some(),
                    recovery: no_room.map(|error| Recovery {
                        before: HashMap::new(),
                        tried: None,
                        error,
                    }),
                }
                .run(&receiver)
            })
            .map_err(|e| {
                Error(StoreFault::Stopped(format!(
                    "cannot start the spool writer: {e}"
                )))
            })?;
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
    pub(crate) fn submit_numbered(
        &self,
        make: impl FnOnce(u64) -> Vec<Op>,
        undo: Option<Undo>,
    ) -> Result<(u64, Answer), Error> {
        let mut queue = lock(&self.queue);
        let seq = queue.next_seq;
        let answer = self.send(&queue, make(seq), undo)?;
        queue.next_seq += 1;
        Ok((seq, answer))
    }

    /// Queues `ops` for the next commit.
    pub(crate) fn submit(&self, ops: Vec<Op>) -> Result<Answer, Error> {
        let queue = lock(&self.queue);
        self.send(&queue, ops, None)
    }

    /// Queues `ops` and waits for their commit.
    pub(crate) async fn commit(&self, ops: Vec<Op>) -> Result<(), Error> {
        let answer = self.submit(ops)?;
        answer.await.map_err(|_| self.stopped())?
    }

    fn send(&self, queue: &Queue, ops: Vec<Op>, undo: Option<Undo>) -> Result<Answer, Error> {
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
                    undo(&self.ledger, Failed::Settled);
                }
                Err(self.stopped())
            }
            None => Err(self.stopped()),
        }
    }

    fn stopped(&self) -> Error {
        let reason = "the spool's writer thread has stopped";
        self.ledger.set_broken(reason.into());
        Error(StoreFault::Stopped(reason.into()))
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

/// What the thread keeps between batches.
struct Thread {
    tables: Tables,
    reopen: Reopen,
    ledger: Arc<Ledger>,
    /// Whether the last commit failed: its recovery is logged once.
    failing: bool,
    /// Set while the database refuses writes until it is opened again.
    recovery: Option<Recovery>,
}

/// A database to open again, and what to set back once it is.
struct Recovery {
    /// Each entry a failed commit touched, with its value before (`None`: absent); the
    /// first failure's value wins.
    before: HashMap<(Area, u64), Option<Vec<u8>>>,
    /// When the last reopen was tried.
    tried: Option<Instant>,
    /// Why writes are refused, for the requests refused meanwhile.
    error: String,
}

impl Thread {
    /// Takes what is queued, commits it in one transaction, answers each request; opens
    /// the database again when it needs it.
    fn run(mut self, receiver: &mpsc::Receiver<Request>) {
        loop {
            let first = if self.recovery.is_some() {
                match receiver.recv_timeout(REOPEN_PAUSE.max(Duration::from_millis(100))) {
                    Ok(request) => Some(request),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match receiver.recv() {
                    Ok(request) => Some(request),
                    Err(_) => return,
                }
            };
            *lock(&self.ledger.writing_since) = Some(Instant::now());
            self.reopen_if_due();
            *lock(&self.ledger.writing_since) = None;
            let Some(first) = first else { continue };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            *lock(&self.ledger.writing_since) = Some(Instant::now());
            let result = match &self.recovery {
                // Nothing is tried on a database that refuses writes.
                Some(recovery) => Err((
                    Error(StoreFault::Disk(recovery.error.clone().into())),
                    Failed::Settled,
                )),
                None => self.commit(&batch),
            };
            *lock(&self.ledger.writing_since) = None;
            for request in batch {
                let answer = match &result {
                    Ok(()) => Ok(()),
                    Err((error, failed)) => {
                        if let Some(undo) = request.undo {
                            undo(&self.ledger, *failed);
                        }
                        Err(copy_error(error))
                    }
                };
                let _ = request.reply.send(answer);
            }
        }
    }

    /// Commits the batch's changes; after an I/O error, notes what they touched for the
    /// recovery, and says whether they may still be read back.
    fn commit(&mut self, batch: &[Request]) -> Result<(), (Error, Failed)> {
        let db = self.tables.db();
        let ops = || batch.iter().flat_map(|r| r.ops.iter());
        let result = tables::commit(&db, ops());
        self.ledger
            .store_failing
            .store(result.is_err(), Ordering::SeqCst);
        let error = match result {
            Ok(()) => {
                if self.failing {
                    self.failing = false;
                    tracing::info!("the spool's database takes writes again");
                }
                return Ok(());
            }
            Err(error) => error,
        };
        if !self.failing {
            // Spooled events are refused (503) and drained ones wait for their deletes
            // until the disk takes writes again.
            tracing::error!(%error, "spool commit failed; spooling answers 503 until the disk takes writes again");
        }
        self.failing = true;
        // An error before any page was written (a table redb cannot open, say) leaves
        // nothing to read back.
        let mut failed = Failed::Settled;
        if tables::needs_reopen(&error) {
            // The last good commit is what this handle still reads: the failed one is in no
            // root it knows.
            match self.tables.before(ops()) {
                Ok(before) => {
                    self.recover(before, error.to_string());
                    // At once: until the entries are set back, a restart would find the
                    // failed commit's entries in the page cache, and publish them after
                    // events that came later.
                    self.reopen_if_due();
                    if self.recovery.is_some() {
                        failed = Failed::InDoubt;
                    }
                }
                Err(read) => {
                    self.ledger.set_broken(format!(
                        "the spool's database refuses writes after an I/O error ({error}), and what it held before cannot be read: {read}"
                    ));
                    // Never set back: only the restart settles what comes back.
                    failed = Failed::InDoubt;
                }
            }
        }
        Err((Error::from(error), failed))
    }

    /// Starts (or adds to) a recovery: the database is to be opened again, and these
    /// entries set back.
    fn recover(&mut self, before: Vec<Slot>, error: String) {
        let recovery = self.recovery.get_or_insert_with(|| Recovery {
            before: HashMap::new(),
            tried: None,
            error: String::new(),
        });
        recovery.error = error;
        self.ledger.reopening.store(true, Ordering::SeqCst);
        for (area, seq, value) in before {
            recovery.before.entry((area, seq)).or_insert(value);
        }
    }

    /// Opens the database again if a recovery waits and the pause since the last try is
    /// over; then sets back what failed commits touched, in one durable commit.
    fn reopen_if_due(&mut self) {
        let Some(recovery) = self.recovery.as_mut() else {
            return;
        };
        if recovery.tried.is_some_and(|t| t.elapsed() < REOPEN_PAUSE) {
            return;
        }
        recovery.tried = Some(Instant::now());
        let db = match (self.reopen)() {
            Ok(db) => db,
            Err(error) => {
                recovery.error = error.to_string();
                return;
            }
        };
        let ops: Vec<Op> = recovery
            .before
            .iter()
            .map(|(&(area, seq), value)| match value {
                Some(value) => Op::Put {
                    area,
                    seq,
                    value: value.clone(),
                },
                None => Op::Remove { area, seq },
            })
            .collect();
        if let Err(error) = tables::commit(&db, &ops) {
            recovery.error = error.to_string();
            if !tables::needs_reopen(&error) {
                self.ledger.set_broken(format!(
                    "the spool's database, opened again, cannot set back what a failed commit touched: {error}"
                ));
            }
            return;
        }
        self.tables.replace(db);
        self.recovery = None;
        self.ledger.settle_doubts();
        self.failing = false;
        self.ledger.store_failing.store(false, Ordering::SeqCst);
        self.ledger.reopening.store(false, Ordering::SeqCst);
        tracing::info!("the spool's database is open again and takes writes");
    }
}

/// A [`Error`] for each request a failed commit answers.
fn copy_error(error: &Error) -> Error {
    match error {
        Error(StoreFault::Corrupt(cause)) => Error(StoreFault::Corrupt(cause.to_string().into())),
        Error(StoreFault::Disk(cause)) => Error(StoreFault::Disk(cause.to_string().into())),
        other => Error(StoreFault::Disk(other.to_string().into())),
    }
}
