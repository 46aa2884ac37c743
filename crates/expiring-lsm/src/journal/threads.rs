//! The journal's threads: the writer, which group-commits the open batch, the flush and
//! merge threads, which run at a lower priority and take work from [`Asked`], and the
//! watchdog, which gives up on waits for a journal that makes no progress. Each
//! reports its early end through `Settings::needs_restart`. Dropping the journal stops
//! them, then writes what is left.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backoff::Doubling;

use super::progress::SyncPoint;
use super::shared::{lock, Asked, Shared};
use super::Journal;
use crate::Error;

/// After a failed write or flush the writer waits this long before it tries again, so a
/// full disk is not retried in a busy loop.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long records nobody waits for stay in the open batch before the writer commits
/// them anyway (a request always waits for its own, and asks for the commit as it does).
const UNASKED_WAIT: Duration = Duration::from_millis(5);
/// How long after its last commit the writer keeps waking every `UNASKED_WAIT` instead of
/// idling: under traffic a batch's first record then costs no wake-up of the writer, and
/// an idle gateway's writer still sleeps until something arrives.
const IDLE_AFTER: Duration = Duration::from_millis(200);
/// After a failed run flush or merge, the background thread waits this long.
const BACKGROUND_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two merges that keep failing (see [`merge_backoff`]).
const BACKGROUND_RETRY_MAX: Duration = Duration::from_secs(300);
/// Nice value of the flush and merge threads: a large merge at the requests' priority
/// would show in their latency; the journal's writer, which requests wait for, keeps the
/// normal priority.
const BACKGROUND_NICE: i32 = 10;
/// While the hot set is full and none of it is on disk (the journal cannot be written),
/// the flush thread waits this long before it looks again: each look locks every map.
pub(super) const NOTHING_TO_FLUSH_PAUSE: Duration = Duration::from_millis(100);

/// Starts the writer, flush and merge threads, if the settings want them (see
/// `Settings::background`: without them the caller does their work).
pub(super) fn start(shared: &Arc<Shared>) -> Result<Vec<JoinHandle<()>>, Error> {
    if !shared.settings.background {
        return Ok(Vec::new());
    }
    [
        ("state-journal", write_loop as fn(&Shared)),
        ("state-flush", flush_loop),
        ("state-merge", merge_loop),
        ("state-watch", watch_loop),
    ]
    .into_iter()
    .map(|(name, work)| spawn_watched(name, shared, work))
    .collect()
}

impl Shared {
    /// Sets a task for the background threads and wakes them.
    pub(super) fn ask(&self, task: impl FnOnce(&mut Asked)) {
        task(&mut lock(&self.asked));
        self.asked_wake.notify_all();
    }

    /// Asks for a flush if the hot set is full (and none is asked already).
    pub(super) fn ask_flush_if_full(&self) {
        if self.hot_count.load(Ordering::Relaxed) >= self.settings.hot_entries {
            let mut asked = lock(&self.asked);
            if !asked.flush {
                asked.flush = true;
                self.asked_wake.notify_all();
            }
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits `pause`, or less if the journal stops meanwhile.
    pub(super) fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause;
        let mut asked = lock(&self.asked);
        while !self.stopping() {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return;
            };
            asked = self
                .asked_wake
                .wait_timeout(asked, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until `take` finds work (it clears what it takes), or the journal stops.
    fn wait_for_task<T>(&self, take: impl Fn(&mut Asked) -> Option<T>) -> Option<T> {
        let mut asked = lock(&self.asked);
        loop {
            if self.stopping() {
                return None;
            }
            if let Some(task) = take(&mut asked) {
                return Some(task);
            }
            asked = self
                .asked_wake
                .wait(asked)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Starts a thread of the journal. Should it end before the journal is dropped (a panic),
/// the process is marked as needing a restart: the journal cannot work without it.
pub(super) fn spawn_watched(
    name: &'static str,
    shared: &Arc<Shared>,
    work: fn(&Shared),
) -> Result<JoinHandle<()>, Error> {
    /// Reports the thread's end when dropped, by a return or by unwinding.
    struct Watch(Arc<Shared>, &'static str);
    impl Drop for Watch {
        fn drop(&mut self) {
            if !self.0.stopping() {
                (self.0.settings.needs_restart)(format!(
                    "the state store's {} thread ended",
                    self.1
                ));
            }
        }
    }
    let watch = Watch(shared.clone(), name);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(&watch.0))
        .map_err(|e| Error::Stopped(format!("cannot start {name}: {e}")))
}

/// The writer thread: sleeps until a caller waits for the open batch (or its records have
/// waited `UNASKED_WAIT`); then writes and syncs everything appended so far at once, no
/// sooner than the commit interval after the last commit started (records that arrive
/// meanwhile share the commit). Ends when the journal is dropped.
fn write_loop(shared: &Shared) {
    let interval = shared.settings.commit_interval;
    let mut last_start: Option<Instant> = None;
    while !shared.stopping() {
        if !wait_for_commit(shared, last_start) {
            return;
        }
        if let Some(pause) =
            last_start.and_then(|s| (s + interval).checked_duration_since(Instant::now()))
        {
            std::thread::sleep(pause);
        }
        last_start = Some(Instant::now());
        *lock(&shared.writing_since) = last_start;
        let written = shared.write_now();
        *lock(&shared.writing_since) = None;
        // A failure is logged (once), reported to the waiters, and retried by the next round.
        if written.is_err() {
            std::thread::sleep(RETRY_PAUSE);
        }
    }
}

/// How many looks the watchdog takes per durable wait: a stalled wait gives up between
/// `durable_wait` and a fifth of it later than the journal's last progress.
const WATCH_LOOKS_PER_WAIT: u32 = 5;

/// The watchdog: gives up on the waits of [`Journal::durable`] when the journal has made
/// no progress for `Settings::durable_wait` while some point was waited for (the writer's
/// `fdatasync` hangs, or the writer ended), so that those requests answer 503 instead of
/// hanging. One look per fifth of the wait, instead of a timer for every wait. It never
/// touches the disk, so a hung disk cannot hold it up.
fn watch_loop(shared: &Shared) {
    let wait = shared.settings.durable_wait;
    let look_every = (wait / WATCH_LOOKS_PER_WAIT).max(Duration::from_millis(1));
    let mut last_progress = (shared.progress.get().durable_below, Instant::now());
    while !shared.stopping() {
        shared.pause(look_every);
        let progress = shared.progress.get();
        let waited = SyncPoint(shared.waited_below.load(Ordering::SeqCst));
        if progress.durable_below != last_progress.0 || progress.settles(waited) {
            last_progress = (progress.durable_below, Instant::now());
        } else if last_progress.1.elapsed() >= wait {
            shared.progress.stalled(waited.0);
        }
    }
}

/// Sleeps until the open batch is to be committed: a caller waits for it, or its records
/// have waited `UNASKED_WAIT` with nobody asking. Within `IDLE_AFTER` of the last commit
/// (`last_commit`) it sleeps `UNASKED_WAIT` at a time even with nothing to write, so the
/// next batch's first record need not wake it; later it idles until woken. False once the
/// journal stops.
fn wait_for_commit(shared: &Shared, last_commit: Option<Instant>) -> bool {
    let mut open = shared.lock_open();
    loop {
        if shared.stopping() {
            return false;
        }
        if open.asked {
            return true;
        }
        let idle = open.is_empty() && last_commit.is_none_or(|t| t.elapsed() >= IDLE_AFTER);
        shared.writer_sleeps.store(true, Ordering::Relaxed);
        shared.writer_idles.store(idle, Ordering::Relaxed);
        let timed_out = if idle {
            open = shared
                .wake
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
            false
        } else {
            let (guard, waited) = shared
                .wake
                .wait_timeout(open, UNASKED_WAIT)
                .unwrap_or_else(PoisonError::into_inner);
            open = guard;
            waited.timed_out()
        };
        shared.writer_sleeps.store(false, Ordering::Relaxed);
        shared.writer_idles.store(false, Ordering::Relaxed);
        if timed_out && !open.is_empty() {
            return true;
        }
    }
}

/// Lets the calling thread yield the CPU to the request threads.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    if let Err(error) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), BACKGROUND_NICE)
    {
        tracing::debug!(%error, "background thread keeps its priority");
    }
}

/// The flush thread: makes up for what the open could not write, prepares the journal's
/// next segment when its spare was used, and writes a run whenever the hot set is full.
fn flush_loop(shared: &Shared) {
    lower_priority();
    let take = |a: &mut Asked| {
        let spare = std::mem::take(&mut a.spare);
        let flush = std::mem::take(&mut a.flush);
        let recover = std::mem::take(&mut a.recover);
        (spare || flush || recover).then_some((spare, flush, recover))
    };
    while let Some((spare, flush, recover)) = shared.wait_for_task(take) {
        if recover && !shared.recover() {
            shared.pause(BACKGROUND_RETRY);
            shared.ask(|a| a.recover = true);
        }
        if spare {
            if let Err(error) = shared.prepare_spare() {
                // The writer makes its next segment itself then.
                tracing::warn!(%error, "state journal segment not prepared");
            }
        }
        if flush {
            flush_once(shared);
            shared.ask_flush_if_full();
        }
    }
}

/// One flush of the flush thread: a failure is logged once and retried after a pause.
fn flush_once(shared: &Shared) {
    #[cfg(test)]
    shared.flush_passes.fetch_add(1, Ordering::SeqCst);
    let flushed = shared.flush_to_run();
    let failed_before = shared
        .flush_failing
        .swap(flushed.is_err(), Ordering::Relaxed);
    match flushed {
        Err(error) => {
            // Said once; the retries and their recovery are logged below ERROR.
            if failed_before {
                tracing::debug!(%error, "state run still not written");
            } else {
                tracing::error!(%error, "state run not written; the hot set keeps it and retries every second");
            }
            shared.pause(BACKGROUND_RETRY);
        }
        Ok(written) => {
            if failed_before {
                tracing::info!("state runs written again");
            }
            // Nothing in the full hot set is on disk yet (the journal cannot be written,
            // or has not caught up): looking again at once would lock every map in a loop.
            if written == 0 {
                shared.pause(NOTHING_TO_FLUSH_PAUSE);
            }
        }
    }
}

/// The merge thread: merges and deletes runs after each flush and sweep.
fn merge_loop(shared: &Shared) {
    lower_priority();
    let mut retry = merge_backoff();
    while shared
        .wait_for_task(|a| std::mem::take(&mut a.merge).then_some(()))
        .is_some()
    {
        match shared.merge_due() {
            Ok(()) => retry.reset(),
            Err(_) if shared.stopping() => return,
            Err(error @ Error::Damaged { .. }) => {
                // Said once: merges leave that run from now on, and the others go on.
                tracing::error!(%error, "state run damaged; merges leave it from now on");
                shared.ask(|a| a.merge = true);
            }
            Err(error) => {
                let pause = retry.next_pause();
                tracing::error!(%error, retry_in = ?pause, "state runs not merged; retrying");
                shared.pause(pause);
                shared.ask(|a| a.merge = true);
            }
        }
    }
}

/// The waits between tries of a merge that keeps failing. A run that cannot be read fails
/// every merge that takes it in, and each try reads it up to the damage: doubling the wait
/// spares the disk and the log, and a merge that succeeds starts it over.
pub(super) fn merge_backoff() -> Doubling {
    Doubling::new(BACKGROUND_RETRY, BACKGROUND_RETRY_MAX)
}

impl Drop for Journal {
    fn drop(&mut self) {
        {
            // Set under the locks the threads check it under, so no wake-up is missed.
            let _open = self.shared.lock_open();
            let _asked = lock(&self.shared.asked);
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.wake.notify_all();
            self.shared.asked_wake.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Err(error) = self.shared.write_now() {
            tracing::error!(%error, "state journal not written at shutdown");
        }
    }
}
