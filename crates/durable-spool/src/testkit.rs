//! Test parts for the spool's unit and model tests: a spool on the simulated disk, and a
//! broker stand-in that acknowledges or refuses each publish as the test says.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;

use disk_seam::sim::SimDisk;
use disk_seam::{Disk, DiskFile};

use crate::error::Error;
use crate::options::Options;
use crate::record::SpooledMessage;
use crate::report::{Counts, Report, Unreported};
use crate::sink::{Sink, SinkError};
use crate::spool::Spool;
use crate::store::Store;

/// How the stand-in answers a publish.
pub(crate) type Answerer = dyn Fn(&SpooledMessage<'_>) -> Result<(), SinkError> + Send + Sync;

/// A broker stand-in: answers through `answer`, and records the ids it acknowledged.
#[derive(Clone)]
pub(crate) struct TestSink {
    answer: Arc<Answerer>,
    acked: Arc<Mutex<Vec<String>>>,
}

impl TestSink {
    pub(crate) fn new(
        answer: impl Fn(&SpooledMessage<'_>) -> Result<(), SinkError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            answer: Arc::new(answer),
            acked: Arc::default(),
        }
    }

    /// A broker that acknowledges everything.
    pub(crate) fn acking() -> Self {
        Self::new(|_| Ok(()))
    }

    /// The ids acknowledged, in order, duplicates included.
    pub(crate) fn acked(&self) -> Vec<String> {
        self.acked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Sink for TestSink {
    fn is_connected(&self) -> bool {
        true
    }

    async fn wait_connected(&self) {}

    fn publish<'a>(
        &'a self,
        _exchange: &'a str,
        msg: &'a SpooledMessage<'a>,
    ) -> impl std::future::Future<Output = Result<(), SinkError>> + Send + 'a {
        let result = (self.answer)(msg);
        if result.is_ok() {
            self.acked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(msg.message_id.to_string());
        }
        std::future::ready(result)
    }
}

/// The spool's options in these tests: enabled, 64 MiB.
pub(crate) fn options() -> Options {
    Options {
        enabled: true,
        max_bytes: 64 << 20,
        stall_after: Duration::from_secs(30),
    }
}

/// A report that keeps the last counts.
#[derive(Default)]
pub(crate) struct Recorded(Mutex<Option<Counts>>);

impl Recorded {
    pub(crate) fn counts(&self) -> Counts {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expect("counts reported")
    }
}

impl Report for Recorded {
    fn counts(&self, counts: Counts) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(counts);
    }
    fn drainer_restarted(&self) {}
}

/// Opens a spool on `disk` as a process starting on it would.
pub(crate) fn open_on(disk: &SimDisk) -> Result<Spool, Error> {
    open_caching(disk, 1 << 20)
}

/// Opens a spool on `disk` whose database caches `cache_bytes` of its pages: with none,
/// every read goes to the disk and sees what is there now (a bit flipped since, say).
pub(crate) fn open_caching(disk: &SimDisk, cache_bytes: u64) -> Result<Spool, Error> {
    let store = Store::open_on(disk.handle(), Path::new("/store"), cache_bytes)?;
    Spool::open(&store, &options(), Arc::new(Unreported))
}

/// A power cut: the spool's process is gone, and the disk keeps what was synced and, as
/// its seed says, a torn prefix of the rest. Returns the disk and the spool reopened.
pub(crate) fn power_cut(disk: &SimDisk, spool: Spool) -> (SimDisk, Spool) {
    let next = disk.crash();
    drop(spool);
    let spool = open_on(&next).expect("reopen after the power cut");
    (next, spool)
}

/// A process restart that is no power cut: the page cache stays, so the next process
/// reads what was written, synced or not. Returns the disk and the spool reopened.
pub(crate) fn restart(disk: &SimDisk, spool: Spool) -> (SimDisk, Spool) {
    let next = disk.restart();
    drop(spool);
    let spool = open_on(&next).expect("reopen after the restart");
    (next, spool)
}

/// A message with event id `id` and guard key `key`.
pub(crate) fn event(id: &str, key: Option<&str>) -> SpooledMessage<'static> {
    SpooledMessage {
        routing_key: "k".into(),
        message_id: id.to_owned().into(),
        timestamp_secs: 100,
        request_id: format!("r-{id}").into(),
        event_type: "t".into(),
        attempt: None,
        route: "botix".into(),
        received_at: "2026-11-29T10:00:00Z".into(),
        order_key: key.map(|k| k.to_owned().into()),
        body: bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}")),
        content_type: None,
        traceparent: None,
        tracestate: None,
    }
}

/// Opens a spool on `disk` whose `n`th file sync after the open (1: the next) runs `arm` on the
/// simulated disk just before it, so that a fault `arm` schedules meets that sync and not
/// an earlier one: a commit syncs twice (its pages, then the header that points at them),
/// and failing the second leaves a whole commit in the page cache.
pub(crate) fn open_arming_sync(
    disk: &SimDisk,
    n: u64,
    arm: impl Fn(&SimDisk) + Send + Sync + 'static,
) -> Result<Spool, Error> {
    let armed = Arc::new(Armed {
        disk: disk.clone(),
        left: std::sync::atomic::AtomicU64::new(0),
        arm: Box::new(arm),
    });
    let store = Store::open_on(
        Arc::new(Arming(armed.clone())),
        Path::new("/store"),
        1 << 20,
    )?;
    let spool = Spool::open(&store, &options(), Arc::new(Unreported))?;
    armed.left.store(n, SeqCst);
    Ok(spool)
}

/// The disk of [`open_arming_sync`]: the simulated disk, its files' syncs counted.
struct Arming(Arc<Armed>);

struct Armed {
    disk: SimDisk,
    /// File syncs before the one `arm` runs before; 0 once it ran.
    left: std::sync::atomic::AtomicU64,
    arm: Box<dyn Fn(&SimDisk) + Send + Sync>,
}

impl Arming {
    fn wrap(&self, file: Arc<dyn DiskFile>) -> Arc<dyn DiskFile> {
        Arc::new(ArmingFile {
            armed: self.0.clone(),
            file,
        })
    }
}

impl Disk for Arming {
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn DiskFile>> {
        Ok(self.wrap(self.0.disk.open(path)?))
    }
    fn open_rw(&self, path: &Path) -> std::io::Result<Arc<dyn DiskFile>> {
        Ok(self.wrap(self.0.disk.open_rw(path)?))
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn DiskFile>> {
        Ok(self.wrap(self.0.disk.create(path)?))
    }
    fn create_dir(&self, path: &Path) -> std::io::Result<()> {
        self.0.disk.create_dir(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.0.disk.is_dir(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.0.disk.list(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.0.disk.sync_dir(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.0.disk.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.0.disk.remove(path)
    }
}

struct ArmingFile {
    armed: Arc<Armed>,
    file: Arc<dyn DiskFile>,
}

impl ArmingFile {
    fn count_sync(&self) {
        let left = &self.armed.left;
        let before = left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
        if before == Ok(1) {
            (self.armed.arm)(&self.armed.disk);
        }
    }
}

impl DiskFile for ArmingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<usize> {
        self.file.write_at(buf, offset)
    }
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn data_ranges(&self) -> std::io::Result<Vec<std::ops::Range<u64>>> {
        self.file.data_ranges()
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.count_sync();
        self.file.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.count_sync();
        self.file.sync_all()
    }
}
