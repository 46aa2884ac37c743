//! The state journal's files: batches appended to segment files and made durable with one
//! `fdatasync` per group commit.
//!
//! A segment is `<number, 16 hex digits>.wal`: an 8-byte magic, then frames, then zeros up
//! to its size. A frame is `len (u32) | crc32 (u32) | seq (u64) | batch (len bytes)`,
//! little-endian, the checksum over `seq | batch`. A segment is zero-filled and synced
//! before its first frame is written, so a commit overwrites blocks that already exist: the
//! `fdatasync` writes data and no file system metadata, which makes a commit cheaper than
//! an append to a growing file.
//!
//! Reading a segment stops at the first frame that is zero (its end, unless a whole frame
//! follows), cut short, fails its checksum or does not carry the previous one's sequence
//! number plus one. In the last
//! segment that is a write a crash cut short (never acknowledged, since the commit's
//! `fdatasync` did not return). After a failed write or `fdatasync` a segment holding
//! acknowledged frames is not written again (a failed `fsync` may have dropped pages that
//! later read back as written): the batches are written again to a new segment. A segment
//! no commit succeeded in is written again from its start instead, so an outage adds one
//! segment, however often it retries. A later segment may so repeat batches of an earlier
//! one; replaying every segment in order gives the same state.
//!
//! Damage is what leaves acknowledged batches unread: a sealed segment whose reading
//! stopped early (at its first frame too), with no later segment starting at or before the
//! first batch it lost; or the last segment stopped early with a whole frame after the stop
//! (a torn last write is followed by zeros only, since a segment is zero-filled and a
//! commit appends). [`Wal::open`] refuses such a journal, naming the segment and the byte,
//! and leaves the file as it is, rather than start without opt-outs it acknowledged or give
//! their sequence numbers to new batches. A gap after a segment read whole to its end is not
//! damage: batches whose write or sync failed (answered with an error) and that a crash
//! kept from their retry leave it; it is logged at ERROR. An operator who accepts the loss
//! renames that segment to `<name>.wal.damaged`: it is then read up to the damage and the
//! gap after it is passed over (logged at ERROR at every start until the file is removed).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Error;
use disk_seam::{Disk, DiskFile};

const MAGIC: [u8; 8] = *b"hgwal\0\0\x01";
/// Bytes before a frame's batch: length, checksum, sequence number.
pub const FRAME_HEAD: usize = 16;
/// A segment being filled has this suffix until it is renamed to its number.
const FILLING: &str = ".tmp";
/// Added by an operator to a damaged segment's name: its loss is accepted.
pub const DAMAGED: &str = ".damaged";
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// A batch ready to be written: a frame whose head [`seal`] fills.
pub struct Frame<'a> {
    /// The frame's sequence number.
    pub seq: u64,
    /// The frame: [`FRAME_HEAD`] bytes, then the batch.
    pub bytes: &'a mut [u8],
}

/// The segment being written.
struct Active {
    number: u64,
    /// `None` until the segment is made: an open on a full disk leaves it to the first
    /// commit.
    file: Option<Arc<dyn DiskFile>>,
    /// Where the next frame goes.
    offset: u64,
    /// The last sequence number written to it, if any.
    last_seq: Option<u64>,
    /// A write or `fdatasync` to it failed: the next commit goes to a new segment, or,
    /// if no commit to it ever succeeded, writes its frames again from its start.
    broken: bool,
    /// Whether a commit to it succeeded: its frames are acknowledged.
    acked: bool,
}

/// A segment that is no longer written.
struct Sealed {
    number: u64,
    /// The highest sequence number it may hold: of a damaged one, that of the last whole
    /// frame after the damage, if one is.
    last_seq: Option<u64>,
    /// The byte after its last whole frame read or written.
    end: u64,
    /// The open found damage in it: no batch is appended to it, and an open's rewrite
    /// writes it only as it reads.
    damaged: bool,
}

/// The journal's segment files.
pub struct Wal {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    segment_bytes: u64,
    active: Active,
    /// Oldest first.
    sealed: VecDeque<Sealed>,
    /// A prepared segment for the next rotation.
    spare: Option<Spare>,
    /// Whether the open read a segment whose damage an operator accepted.
    read_accepted: bool,
}

/// A zero-filled segment file under a temporary name, ready to be the next segment.
pub struct Spare {
    path: PathBuf,
    file: Arc<dyn DiskFile>,
}

impl Wal {
    /// Opens the segments in `dir` (created if absent), hands every readable batch to
    /// `replay` in order, with its sequence number, and starts a new segment. Returns the
    /// journal and the highest sequence number read. Batches below `needed_from` are held
    /// elsewhere (by runs); losing any other batch to damage is an error naming the
    /// segment and the byte where its reading stopped. A new segment the disk has no room
    /// for is left to the first commit ([`Wal::can_write`] tells).
    pub fn open(
        disk: Arc<dyn Disk>,
        dir: &Path,
        segment_bytes: u64,
        needed_from: u64,
        mut replay: impl FnMut(u64, &[u8]),
    ) -> Result<(Self, Option<u64>), Error> {
        disk_seam::create_dir_all(&*disk, dir)?;
        // Segments installed by a rename whose folder's sync failed: what is replayed from
        // them must not vanish at a power cut after the open.
        disk.sync_dir(dir)?;
        let numbers = list_segments(&*disk, dir)?;
        let mut reading = Reading {
            needed_from,
            highest: None,
            before: None,
            sealed: VecDeque::new(),
            owed: None,
        };
        for (i, &(number, accepted)) in numbers.iter().enumerate() {
            let last = i + 1 == numbers.len();
            reading.segment(&*disk, dir, number, accepted, last, &mut replay)?;
        }
        reading.settle()?;
        // Past every number in the folder, a damaged one kept by the operator included.
        let next_number = numbers.last().map_or(0, |(n, _)| n + 1);
        let file = match create_segment(&*disk, dir, next_number, segment_bytes) {
            Ok(file) => Some(file),
            Err(Error::Disk(error)) => {
                tracing::warn!(%error, "state journal segment not made; the first commit makes it");
                None
            }
            Err(other) => return Err(other),
        };
        let active = Active::new(next_number, file);
        let wal = Self {
            disk,
            dir: dir.to_owned(),
            segment_bytes,
            active,
            sealed: reading.sealed,
            spare: None,
            read_accepted: numbers.iter().any(|(_, accepted)| *accepted),
        };
        Ok((wal, reading.highest))
    }

    /// Writes `frames` (in sequence order) and makes them durable with one `fdatasync`.
    /// After an error none of them counts as written: the caller passes them again, and
    /// they go to a new segment.
    pub fn commit(&mut self, frames: &mut [Frame<'_>]) -> Result<(), Error> {
        let written = self.write_and_sync(frames);
        if written.is_err() {
            self.active.broken = true;
        }
        written
    }

    fn write_and_sync(&mut self, frames: &mut [Frame<'_>]) -> Result<(), Error> {
        if frames.is_empty() {
            return Ok(());
        }
        if self.active.broken {
            if self.active.acked {
                self.rotate()?;
            } else {
                // Nothing in it was acknowledged: the frames are written again over the
                // failed ones, which makes their pages dirty again, so the next
                // `fdatasync` writes them (one new segment per outage, not one per retry).
                self.active.offset = MAGIC.len() as u64;
                self.active.last_seq = None;
                self.active.broken = false;
            }
        }
        let mut file = self.active_file()?;
        for frame in frames.iter_mut() {
            seal(frame);
            let len = frame.bytes.len() as u64;
            if self.active.offset + len > self.segment_bytes && self.active.last_seq.is_some() {
                // What is written so far is synced before the next segment is used.
                file.sync_data()?;
                self.rotate()?;
                file = self.active_file()?;
            }
            // Counted before the write: a segment a failed write may have reached is kept
            // until a run holds this batch.
            self.active.last_seq = Some(frame.seq);
            file.write_all_at(frame.bytes, self.active.offset)?;
            self.active.offset += len;
        }
        file.sync_data()?;
        self.active.acked = true;
        Ok(())
    }

    /// The active segment's file, made now if the open could not make it.
    fn active_file(&mut self) -> Result<Arc<dyn DiskFile>, Error> {
        if let Some(file) = &self.active.file {
            return Ok(file.clone());
        }
        let file = self.next_segment(self.active.number)?;
        self.active.file = Some(file.clone());
        Ok(file)
    }

    /// Writes each sealed segment again as it reads and syncs it
    /// ([`disk_seam::rewrite_as_read`]): what the open replayed from them is then on the
    /// disk, pages a failed sync left in the page cache included. Needs no room, since a
    /// segment's blocks exist. A damaged segment is written as it reads too, its damage
    /// included: a later open then finds the same batches and the same damage, where a
    /// power cut could otherwise take a batch the page cache alone held and leave a gap
    /// that reads as a loss. Then writes `mark` (a batch of no records, numbered after
    /// every batch read) after the newest segment's last whole frame, zeroes what a commit
    /// a crash cut short left after it, and syncs: damage to the last batch read would
    /// otherwise read, at a later open, as such a commit, and the open would go on without
    /// a batch it answered from; with a batch after it, it is damage that names the
    /// segment. If that segment is damaged (the mark would cover what follows the damage),
    /// has no room for `mark`, or if its number does not follow that segment's last,
    /// `mark` is committed to the segment being written. False, writing nothing, if the
    /// open read a segment whose damage an operator accepted: that one is never written.
    pub fn rewrite_sealed(&mut self, mark: &mut Frame<'_>) -> Result<bool, Error> {
        if self.read_accepted {
            return Ok(false);
        }
        for sealed in &self.sealed {
            let file = self.disk.open_rw(&segment_path(&self.dir, sealed.number))?;
            disk_seam::rewrite_as_read(&*file)?;
        }
        // Written after the batches before it are synced: a mark a power cut kept without
        // them would make their loss look like damage.
        let len = mark.bytes.len() as u64;
        match self.sealed.back_mut() {
            // A frame follows the one before it in its segment, or reads as damage.
            Some(newest)
                if !newest.damaged
                    && newest.end + len <= self.segment_bytes
                    && newest.last_seq.and_then(|l| l.checked_add(1)) == Some(mark.seq) =>
            {
                seal(mark);
                let file = self.disk.open_rw(&segment_path(&self.dir, newest.number))?;
                file.write_all_at(mark.bytes, newest.end)?;
                zero_from(&*file, newest.end + len)?;
                file.sync_data()?;
                newest.end += len;
                newest.last_seq = Some(mark.seq);
            }
            _ => self.commit(std::slice::from_mut(mark))?,
        }
        Ok(true)
    }

    /// Whether a commit has a segment to write to, or a spare to make one of, without
    /// filling a new one.
    pub fn can_write(&self) -> bool {
        self.active.file.is_some() || self.spare.is_some()
    }

    /// Deletes the sealed segments whose batches all lie below `seq` (a run holds them). A
    /// damaged one counts the frames after its damage: it is kept until a run holds every
    /// batch it may have held.
    pub fn forget_below(&mut self, seq: u64) -> Result<(), Error> {
        let mut removed = false;
        while let Some(oldest) = self.sealed.front() {
            if oldest.last_seq.is_some_and(|last| last >= seq) {
                break;
            }
            match self.disk.remove(&segment_path(&self.dir, oldest.number)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            self.sealed.pop_front();
            removed = true;
        }
        if removed {
            // A removal a power cut undoes only costs space, but the next open would read
            // the segment again for nothing.
            self.disk.sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Whether the next rotation would have to create its segment itself.
    pub fn wants_spare(&self) -> bool {
        self.spare.is_none()
    }

    /// Keeps a segment made by [`Wal::prepare_spare`] for the next rotation (or deletes
    /// it if one is kept already).
    pub fn adopt_spare(&mut self, spare: Spare) -> Result<(), Error> {
        if self.spare.is_some() {
            self.disk.remove(&spare.path)?;
        } else {
            self.spare = Some(spare);
        }
        Ok(())
    }

    /// Makes a segment, zero-filled and synced, under the temporary name `name` (unique
    /// to this call): slow work for a background thread, which then gives it to
    /// [`Wal::adopt_spare`].
    pub fn prepare_spare(
        disk: &dyn Disk,
        dir: &Path,
        segment_bytes: u64,
        name: &str,
    ) -> Result<Spare, Error> {
        let path = dir.join(format!("{name}{FILLING}"));
        let file = disk.create(&path)?;
        if let Err(error) = fill(&*file, segment_bytes) {
            // Each try has a name of its own: on a full disk, the tries left behind would
            // hold the space the next one needs.
            if let Err(e) = disk.remove(&path) {
                tracing::warn!(error = %e, path = %path.display(), "unfinished segment not removed");
            }
            return Err(error);
        }
        Ok(Spare { path, file })
    }

    /// The disk the segments are on.
    pub fn disk(&self) -> &Arc<dyn Disk> {
        &self.disk
    }

    /// The directory of the segments.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segment size.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Segment files on disk, the one being written included.
    pub fn segments(&self) -> usize {
        self.sealed.len() + usize::from(self.active.file.is_some())
    }

    /// Seals the active segment and starts the next.
    fn rotate(&mut self) -> Result<(), Error> {
        let number = self.active.number + 1;
        let file = self.next_segment(number)?;
        let next = Active::new(number, Some(file));
        let done = std::mem::replace(&mut self.active, next);
        self.sealed.push_back(Sealed {
            number: done.number,
            last_seq: done.last_seq,
            end: done.offset,
            damaged: false,
        });
        Ok(())
    }

    /// Makes segment `number`, from the spare if one is ready.
    fn next_segment(&mut self, number: u64) -> Result<Arc<dyn DiskFile>, Error> {
        let spare = match self.spare.take() {
            Some(spare) => spare,
            None => Wal::prepare_spare(
                &*self.disk,
                &self.dir,
                self.segment_bytes,
                &segment_name(number),
            )?,
        };
        install(&*self.disk, spare, &self.dir, number)
    }
}

impl Active {
    fn new(number: u64, file: Option<Arc<dyn DiskFile>>) -> Self {
        Self {
            number,
            file,
            offset: MAGIC.len() as u64,
            last_seq: None,
            broken: false,
            acked: false,
        }
    }
}

/// The number of a segment file's name, if it is one.
fn segment_number(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn segment_name(number: u64) -> String {
    format!("{number:016x}")
}

fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{}.wal", segment_name(number)))
}

/// Creates segment `number`.
fn create_segment(
    disk: &dyn Disk,
    dir: &Path,
    number: u64,
    segment_bytes: u64,
) -> Result<Arc<dyn DiskFile>, Error> {
    let spare = Wal::prepare_spare(disk, dir, segment_bytes, &segment_name(number))?;
    install(disk, spare, dir, number)
}

/// Renames a filled segment to `number` and syncs the directory, so a segment that exists
/// under its number is whole.
fn install(
    disk: &dyn Disk,
    spare: Spare,
    dir: &Path,
    number: u64,
) -> Result<Arc<dyn DiskFile>, Error> {
    disk.rename(&spare.path, &segment_path(dir, number))?;
    disk.sync_dir(dir)?;
    Ok(spare.file)
}

/// Writes the magic and zeros up to `segment_bytes`, and syncs.
fn fill(file: &dyn DiskFile, segment_bytes: u64) -> Result<(), Error> {
    file.write_all_at(&MAGIC, 0)?;
    let mut at = MAGIC.len() as u64;
    while at < segment_bytes {
        let n = (segment_bytes - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    Ok(())
}

/// Writes zeros over the bytes of `file` from `at` to its end that are not zeros (what a
/// commit a crash cut short left there). Needs no room: a segment's blocks exist.
fn zero_from(file: &dyn DiskFile, mut at: u64) -> Result<(), Error> {
    let len = file.len()?;
    let mut buf = vec![0; ZEROS.len()];
    while at < len {
        let n = (len - at).min(ZEROS.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|b| *b != 0) {
            file.write_all_at(&ZEROS[..n], at)?;
        }
        at += n as u64;
    }
    Ok(())
}

/// Fills a frame's head: the batch's length, the checksum and the sequence number.
fn seal(frame: &mut Frame<'_>) {
    let len = (frame.bytes.len() - FRAME_HEAD) as u32;
    frame.bytes[8..16].copy_from_slice(&frame.seq.to_le_bytes());
    let crc = crc32fast::hash(&frame.bytes[8..]);
    frame.bytes[..4].copy_from_slice(&len.to_le_bytes());
    frame.bytes[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Hands every readable batch of the segments in `dir` to `replay`, in order, without
/// changing anything in the folder: a read-only look at a stopped store. A segment is read
/// up to its first damaged frame; unfinished segments are skipped.
pub fn read_only(
    disk: &dyn Disk,
    dir: &Path,
    mut replay: impl FnMut(u64, &[u8]),
) -> Result<(), Error> {
    if !disk.is_dir(dir) {
        return Ok(());
    }
    let mut paths: Vec<(u64, PathBuf)> = Vec::new();
    for name in disk.list(dir)? {
        let number =
            segment_number(&name).or_else(|| name.strip_suffix(DAMAGED).and_then(segment_number));
        if let Some(number) = number {
            paths.push((number, dir.join(name)));
        }
    }
    paths.sort_unstable();
    for (_, path) in paths {
        let bytes = disk_seam::read(disk, &path)?;
        read_frames(&bytes, &mut replay).map_err(|reason| Error::Open { path, reason })?;
    }
    Ok(())
}

/// The segments in `dir`, by number, each with whether an operator accepted its damage;
/// the unfinished segments a stop left are removed.
fn list_segments(disk: &dyn Disk, dir: &Path) -> Result<Vec<(u64, bool)>, Error> {
    let mut numbers = Vec::new();
    for name in disk.list(dir)? {
        if name.ends_with(FILLING) {
            // A segment or spare whose filling a stop cut short.
            disk.remove(&dir.join(&name))?;
        } else if let Some(number) = segment_number(&name) {
            numbers.push((number, false));
        } else if let Some(number) = name.strip_suffix(DAMAGED).and_then(segment_number) {
            numbers.push((number, true));
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// The replay of the segments at open, carried from one segment to the next.
struct Reading {
    /// Batches below it are held by runs: their loss is no damage.
    needed_from: u64,
    /// The highest sequence number read so far.
    highest: Option<u64>,
    /// The last segment that held batches or damage: its path, the byte where its reading
    /// stopped early (if it did), and whether its loss is accepted. Checked against the
    /// next segment's first batch.
    before: Option<(PathBuf, Option<u64>, bool)>,
    /// The segments kept, oldest first.
    sealed: VecDeque<Sealed>,
    /// A sealed segment's damage with a whole frame after it: its path, the byte, and the
    /// highest number after the damage. Batches up to that number were written, so a later
    /// segment must hold those the damage took, even if none follows to show a gap.
    owed: Option<(PathBuf, u64, u64)>,
}

impl Reading {
    /// Replays segment `number` (`last`: the highest number in the folder, the one being
    /// written at the last stop), checks that no batch went missing before it or inside it,
    /// and keeps it (or removes it if it holds nothing and no damage).
    fn segment(
        &mut self,
        disk: &dyn Disk,
        dir: &Path,
        number: u64,
        accepted: bool,
        last: bool,
        replay: &mut impl FnMut(u64, &[u8]),
    ) -> Result<(), Error> {
        let mut path = segment_path(dir, number);
        if accepted {
            path.as_mut_os_string().push(DAMAGED);
        }
        let bytes = disk_seam::read(disk, &path)?;
        let read = read_frames(&bytes, replay).map_err(|reason| Error::Open {
            path: path.clone(),
            reason,
        })?;
        if let Some(first) = read.first {
            match self.highest {
                Some(high) => self.check_gap(high + 1, first)?,
                // Nothing read before: whatever the runs do not hold, up to this segment's
                // first batch, was in the damaged segment before it, if one is. A commit
                // that failed in a segment's first frame is written again over it, never
                // to the next segment (only a segment holding an acknowledged batch is
                // left), so batches the next one starts past are a loss, even when no
                // whole frame after the damage shows them.
                None => self.check_gap(self.needed_from, first)?,
            }
        }
        self.highest = self.highest.max(read.last);
        let damaged = read.stopped_at.is_some() && (read.later.is_some() || !last);
        if read.last.is_some() || damaged {
            self.before = Some((path.clone(), read.stopped_at, accepted));
        }
        if let (false, false, Some(at), Some(later)) = (last, accepted, read.stopped_at, read.later)
        {
            if self.owed.as_ref().is_none_or(|(_, _, owed)| *owed < later) {
                self.owed = Some((path.clone(), at, later));
            }
        }
        if let (true, Some(later)) = (last, read.later) {
            // No later segment can hold what lies between the damage and a whole frame
            // after it: a commit after the damaged one acknowledged it.
            let next = self.highest.map_or(self.needed_from, |h| h + 1);
            self.check_gap(next, later + 1)?;
            // Numbers a commit used are never used again, even for a loss accepted.
            self.highest = self.highest.max(Some(later));
        }
        if accepted {
            // Left for the operator to remove; never written again.
            return Ok(());
        }
        if read.last.is_none() && !damaged {
            // Nothing in it: a segment started just before a stop, or one whose first
            // commit the stop cut short (never acknowledged: no whole frame follows).
            disk.remove(&path)?;
            return Ok(());
        }
        self.sealed.push_back(Sealed {
            number,
            last_seq: read.last.max(read.later),
            end: read.end,
            damaged,
        });
        Ok(())
    }

    /// After every segment is read: the batches a sealed segment's damage took, up to a
    /// whole frame after it, are in a later segment or held by runs.
    fn settle(&self) -> Result<(), Error> {
        let Some((path, at, later)) = &self.owed else {
            return Ok(());
        };
        let lost_from = self.highest.map_or(0, |h| h + 1).max(self.needed_from);
        if lost_from > *later {
            return Ok(());
        }
        Err(Error::Open {
            path: path.clone(),
            reason: format!("damaged at byte {at}: batches {lost_from}..={later}, acknowledged, are in no later segment; see \"A damaged state journal segment\" in docs/guarantees.md"),
        })
    }

    /// Judges the batches from `next` (the one after the last read) to the next one found
    /// (`first`): none missing, a loss the operator accepted or a failed write left (logged),
    /// or damage (an error).
    fn check_gap(&self, next: u64, first: u64) -> Result<(), Error> {
        let lost_from = next.max(self.needed_from);
        if lost_from >= first {
            return Ok(());
        }
        let lost = format!("batches {lost_from}..={}", first - 1);
        match &self.before {
            Some((damaged, _, true)) => tracing::error!(
                segment = %damaged.display(),
                lost,
                "state journal starts without batches of a damaged segment, as its name accepts"
            ),
            Some((damaged, Some(at), false)) => {
                return Err(Error::Open {
                    path: damaged.clone(),
                    reason: format!("damaged at byte {at}: {lost}, acknowledged, are in no later segment; see \"A damaged state journal segment\" in docs/guarantees.md"),
                });
            }
            Some((after, None, false)) => {
                // Every frame of the earlier segment is whole: the batches between were
                // never written whole anywhere, as when a write or sync failed and a power
                // cut or a crash came before the retry. Their callers had an error, not a
                // 200.
                tracing::error!(
                    segment = %after.display(),
                    lost,
                    "state journal has a gap after a whole segment: batches a failed write never made durable"
                );
            }
            None => {}
        }
        Ok(())
    }
}

/// What reading a segment found.
struct SegmentRead {
    first: Option<u64>,
    last: Option<u64>,
    /// The byte after the last whole frame read.
    end: u64,
    /// The byte where reading stopped before the segment's end: a frame cut short, failing
    /// its checksum or out of sequence, or zeros with a whole frame after them.
    stopped_at: Option<u64>,
    /// The highest sequence number of a whole frame after that byte: a torn last write is
    /// followed by zeros only, so such a frame shows batches lost to damage.
    later: Option<u64>,
}

/// Hands each frame of a segment's `bytes` to `replay`. An error only if the file is not
/// a segment.
fn read_frames(bytes: &[u8], replay: &mut impl FnMut(u64, &[u8])) -> Result<SegmentRead, String> {
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err("not a hookgate state journal segment".into());
    }
    let mut rest = &bytes[MAGIC.len()..];
    let mut read = SegmentRead {
        first: None,
        last: None,
        end: MAGIC.len() as u64,
        stopped_at: None,
        later: None,
    };
    while let Some(head) = rest.get(..FRAME_HEAD) {
        let at = (bytes.len() - rest.len()) as u64;
        if head.iter().all(|b| *b == 0) {
            // The zeros after the last frame, unless a whole frame follows them: then a
            // frame's write landed elsewhere, or not at all, and later ones were written.
            read.later = last_whole_frame(bytes, at as usize + 1, read.last);
            read.stopped_at = read.later.map(|_| at);
            break;
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let mut seq_bytes = [0; 8];
        seq_bytes.copy_from_slice(&head[8..16]);
        let seq = u64::from_le_bytes(seq_bytes);
        // Within a segment each batch follows the previous one: a gap is damage.
        let follows = read.last.is_none_or(|l| l.checked_add(1) == Some(seq));
        let whole = rest
            .get(..FRAME_HEAD + len)
            .filter(|frame| len > 0 && crc32fast::hash(&frame[8..]) == crc);
        let Some(frame) = whole.filter(|_| follows) else {
            read.stopped_at = Some(at);
            read.later = last_whole_frame(bytes, at as usize + 1, read.last);
            break;
        };
        replay(seq, &frame[FRAME_HEAD..]);
        read.first = read.first.or(Some(seq));
        read.last = Some(seq);
        rest = &rest[FRAME_HEAD + len..];
        read.end = (bytes.len() - rest.len()) as u64;
    }
    Ok(read)
}

/// Sequence numbers a whole frame after a stop may carry above the last one read: more is
/// taken as chance, not a frame (it saves a checksum over most of the random bytes a
/// damaged region holds).
const LATER_SEQ_SPAN: u64 = 1 << 32;

/// The highest sequence number of a whole frame (its checksum holds, its number above
/// `after`) starting at or after byte `from`, looked for at every byte: the damaged frame's
/// length cannot be trusted to find the next one.
fn last_whole_frame(bytes: &[u8], from: usize, after: Option<u64>) -> Option<u64> {
    let floor = after.map_or(0, |a| a + 1);
    let mut found = None;
    let mut at = from;
    while at + FRAME_HEAD <= bytes.len() {
        // A frame's head holds a non-zero length in its first four bytes: skip zeros fast.
        let Some(nonzero) = bytes[at..].iter().position(|b| *b != 0) else {
            break;
        };
        let start = at.max((at + nonzero).saturating_sub(3));
        for candidate in start..=at + nonzero {
            if let Some(seq) = whole_frame_at(bytes, candidate, floor) {
                found = found.max(Some(seq));
            }
        }
        at += nonzero + 1;
    }
    found
}

/// The sequence number of a whole frame at byte `at`, if one starts there with a number in
/// `floor..floor + LATER_SEQ_SPAN`.
fn whole_frame_at(bytes: &[u8], at: usize, floor: u64) -> Option<u64> {
    let head = bytes.get(at..at + FRAME_HEAD)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let mut seq_bytes = [0; 8];
    seq_bytes.copy_from_slice(&head[8..16]);
    let seq = u64::from_le_bytes(seq_bytes);
    if len == 0 || seq < floor || seq - floor >= LATER_SEQ_SPAN {
        return None;
    }
    let frame = bytes.get(at..at + FRAME_HEAD + len)?;
    (crc32fast::hash(&frame[8..]) == crc).then_some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame holding `payload`.
    fn frame_bytes(payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0; FRAME_HEAD];
        bytes.extend_from_slice(payload);
        bytes
    }

    fn commit(wal: &mut Wal, batches: &[(u64, &[u8])]) {
        let mut owned: Vec<(u64, Vec<u8>)> =
            batches.iter().map(|(s, p)| (*s, frame_bytes(p))).collect();
        let mut frames: Vec<Frame<'_>> = owned
            .iter_mut()
            .map(|(seq, bytes)| Frame { seq: *seq, bytes })
            .collect();
        wal.commit(&mut frames).expect("commit");
    }

    fn reopen(dir: &Path, segment_bytes: u64) -> (Wal, Vec<(u64, Vec<u8>)>) {
        let mut read = Vec::new();
        let (wal, _) = Wal::open(disk_seam::real(), dir, segment_bytes, 0, |seq, batch| {
            read.push((seq, batch.to_vec()))
        })
        .expect("open");
        (wal, read)
    }

    #[test]
    fn batches_come_back_in_order_across_segments_and_reopens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, read) = reopen(dir.path(), 4096);
        assert!(read.is_empty());
        let payload = [7u8; 1000];
        for seq in 0..10 {
            commit(&mut wal, &[(seq, &payload)]);
        }
        assert!(wal.segments() >= 3, "1,000-byte batches in 4 KiB segments");
        drop(wal);
        let (mut wal, read) = reopen(dir.path(), 4096);
        let seqs: Vec<u64> = read.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>());
        assert!(read.iter().all(|(_, b)| b[..] == payload[..]));
        commit(&mut wal, &[(10, b"after"), (11, b"more")]);
        drop(wal);
        let (_, read) = reopen(dir.path(), 4096);
        assert_eq!(read.len(), 12);
        assert_eq!(read[11], (11, b"more".to_vec()));
    }

    #[test]
    fn a_frame_cut_short_or_damaged_ends_its_segment_and_later_segments_still_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        commit(&mut wal, &[(1, b"one"), (2, b"two"), (3, b"three")]);
        let path = segment_path(dir.path(), wal.active.number);
        drop(wal);
        // Damage the third frame's batch, as a write a crash cut short would.
        let mut bytes = std::fs::read(&path).expect("read");
        let third = MAGIC.len() + 2 * FRAME_HEAD + 3 + 3 + FRAME_HEAD;
        bytes[third] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let (mut wal, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2]);
        commit(&mut wal, &[(3, b"three again")]);
        drop(wal);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(read[2].1, b"three again");
    }

    #[test]
    fn a_broken_segment_is_left_and_its_batches_are_written_again_to_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        commit(&mut wal, &[(1, b"a")]);
        let first = wal.active.number;
        wal.active.broken = true;
        commit(&mut wal, &[(2, b"b"), (3, b"c")]);
        assert_ne!(wal.active.number, first, "a new segment after a failure");
        drop(wal);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn only_sealed_segments_wholly_below_a_run_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 2048);
        for seq in 0..6 {
            commit(&mut wal, &[(seq, &[1u8; 900])]);
        }
        let before = wal.segments();
        assert!(before >= 3);
        wal.forget_below(2).expect("forget");
        assert_eq!(
            wal.segments(),
            before - 1,
            "the segment of batches 0 and 1 only"
        );
        wal.forget_below(u64::MAX).expect("forget");
        assert_eq!(wal.segments(), 1, "the active segment stays");
        drop(wal);
        let (_, read) = reopen(dir.path(), 2048);
        assert!(read.iter().all(|(s, _)| *s >= 4), "{read:?}");
    }

    #[test]
    fn a_spare_becomes_the_next_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 2048);
        assert!(wal.wants_spare());
        let spare = Wal::prepare_spare(&**wal.disk(), wal.dir(), wal.segment_bytes(), "spare-1")
            .expect("spare");
        wal.adopt_spare(spare).expect("adopt");
        assert!(!wal.wants_spare());
        let second = Wal::prepare_spare(&**wal.disk(), wal.dir(), wal.segment_bytes(), "spare-2")
            .expect("spare");
        wal.adopt_spare(second).expect("adopt");
        assert!(
            !dir.path().join("spare-2.tmp").exists(),
            "one spare is kept"
        );
        for seq in 0..3 {
            commit(&mut wal, &[(seq, &[2u8; 900])]);
        }
        assert!(wal.wants_spare(), "used by the rotation");
        assert!(!dir.path().join("spare-1.tmp").exists());
        drop(wal);
        let (_, read) = reopen(dir.path(), 2048);
        assert_eq!(read.len(), 3);
    }

    /// Flips a byte of the frame of `seq`'s batch in segment `number` (frames of one
    /// byte-long batch each, seq 1 first).
    fn damage(dir: &Path, number: u64, nth_frame: usize) {
        let path = segment_path(dir, number);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[MAGIC.len() + nth_frame * (FRAME_HEAD + 1) + FRAME_HEAD] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
    }

    /// The error of an open of `dir` that must refuse to start (no batch is held by runs);
    /// `why` says what opening would have lost.
    fn refusal(dir: &Path, why: &str) -> String {
        match Wal::open(disk_seam::real(), dir, 1 << 16, 0, |_, _| {}) {
            Ok(_) => panic!("opened: {why}"),
            Err(error) => error.to_string(),
        }
    }

    /// A folder whose first segment, sealed, holds batches 1 to 3 and whose next holds
    /// batch 4; and the first segment's number.
    fn sealed_then_one_more() -> (tempfile::TempDir, u64) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b"), (3, b"c")]);
        wal.rotate().expect("rotate");
        commit(&mut wal, &[(4, b"d")]);
        drop(wal);
        (dir, first)
    }

    #[test]
    fn damage_inside_a_sealed_segment_is_an_error_naming_it_and_the_offset() {
        let (dir, first) = sealed_then_one_more();
        // Batch 2 of the sealed segment rots: 2 and 3 were acknowledged, and no later
        // segment holds them.
        damage(dir.path(), first, 1);
        let error = refusal(dir.path(), "acknowledged batches would be lost");
        assert!(error.contains(&segment_name(first)), "{error}");
        assert!(
            error.contains(&format!("byte {}", MAGIC.len() + FRAME_HEAD + 1)),
            "{error}"
        );
        assert!(error.contains("2..=3"), "{error}");
        // Batches the runs hold already are not needed: the same damage is harmless then.
        let (_, read) = {
            let mut read = Vec::new();
            let (wal, _) = Wal::open(disk_seam::real(), dir.path(), 1 << 16, 4, |seq, _| {
                read.push(seq)
            })
            .expect("opens when the runs hold what was lost");
            (wal, read)
        };
        assert_eq!(read, [1, 4]);
    }

    #[test]
    fn damage_that_hides_every_batch_of_a_sealed_segment_is_an_error_naming_it() {
        // The runs hold the batches below 1; the first segment holds 1 to 3, the next 4.
        let (dir, first) = sealed_then_one_more();
        // Every frame rots: no batch read before the damage and no whole frame after it
        // shows which batches the segment held, but the runs and the next segment do.
        for frame in 0..3 {
            damage(dir.path(), first, frame);
        }
        let error = match Wal::open(disk_seam::real(), dir.path(), 1 << 16, 1, |_, _| {}) {
            Ok(_) => panic!("opened without batches 1 to 3"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(&segment_name(first)), "{error}");
        assert!(error.contains("1..=3"), "{error}");
    }

    #[test]
    fn damage_inside_the_segment_written_last_is_an_error_and_no_number_is_used_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let last = wal.active.number;
        commit(&mut wal, &[(1, b"a")]);
        commit(&mut wal, &[(2, b"b")]);
        commit(&mut wal, &[(3, b"c")]);
        drop(wal);
        // Batch 2 rots in the segment that was being written at the stop: 3 was
        // acknowledged after it, and is whole.
        damage(dir.path(), last, 1);
        let error = refusal(dir.path(), "without batch 3");
        assert!(error.contains(&segment_name(last)), "{error}");
        assert!(
            error.contains(&format!("byte {}", MAGIC.len() + FRAME_HEAD + 1)),
            "{error}"
        );
        assert!(error.contains("2..=3"), "{error}");
        let again = Wal::open(disk_seam::real(), dir.path(), 1 << 16, 0, |_, _| {});
        assert!(again.is_err(), "refused at every open, not once");
    }

    #[test]
    fn damage_to_the_first_frame_of_a_sealed_segment_keeps_the_file_and_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b")]);
        wal.rotate().expect("rotate");
        commit(&mut wal, &[(3, b"c")]);
        drop(wal);
        damage(dir.path(), first, 0);
        let error = refusal(dir.path(), "acknowledged batches would be lost");
        assert!(error.contains(&segment_name(first)), "{error}");
        assert!(error.contains(&format!("byte {}", MAGIC.len())), "{error}");
        // The damaged frame's number cannot be trusted: the loss reaches from what the
        // runs hold up to the batch before the next segment's first.
        assert!(error.contains("0..=2"), "{error}");
        assert!(
            segment_path(dir.path(), first).exists(),
            "the damaged segment is kept for the operator"
        );
    }

    #[test]
    fn a_damaged_segment_is_kept_until_a_run_holds_every_batch_it_may_have_held() {
        // Batch 2's frame in the first segment is damaged, batch 3 after it is whole; the
        // next segment holds both again (a retry), so the open goes on.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b"), (3, b"c")]);
        wal.rotate().expect("rotate");
        commit(&mut wal, &[(2, b"b"), (3, b"c")]);
        drop(wal);
        damage(dir.path(), first, 1);
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        wal.forget_below(2).expect("forget");
        assert!(
            segment_path(dir.path(), first).exists(),
            "the damage hid batches no run holds"
        );
        wal.forget_below(4).expect("forget");
        assert!(!segment_path(dir.path(), first).exists());
    }

    /// Rewrites the sealed segments of a reopened journal with a mark numbered `seq`.
    fn rewrite_with_mark(wal: &mut Wal, seq: u64) {
        let mut bytes = frame_bytes(b"mark");
        let mut mark = Frame {
            seq,
            bytes: &mut bytes,
        };
        assert!(wal.rewrite_sealed(&mut mark).expect("rewrite"));
    }

    #[test]
    fn the_mark_after_a_rewrite_makes_damage_to_the_last_batch_an_error() {
        // A segment with room left: the mark goes after its last batch, over the torn
        // write a crash left there.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b")]);
        drop(wal);
        let path = segment_path(dir.path(), first);
        let mut bytes = std::fs::read(&path).expect("read");
        let torn = MAGIC.len() + 2 * (FRAME_HEAD + 1);
        bytes[torn..torn + 40].fill(0xa5);
        std::fs::write(&path, &bytes).expect("write");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        rewrite_with_mark(&mut wal, 3);
        drop(wal);
        let bytes = std::fs::read(&path).expect("read");
        let after_mark = torn + FRAME_HEAD + 4;
        assert!(
            bytes[after_mark..].iter().all(|b| *b == 0),
            "torn write left"
        );
        damage(dir.path(), first, 1);
        let error = refusal(dir.path(), "without batch 2, which the open answered from");
        assert!(error.contains(&segment_name(first)), "{error}");

        // A segment with no room left: the mark goes to the segment being written.
        let dir = tempfile::tempdir().expect("tempdir");
        let segment_bytes = (MAGIC.len() + 2 * (FRAME_HEAD + 1) + 4) as u64;
        let (mut wal, _) = reopen(dir.path(), segment_bytes);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b")]);
        drop(wal);
        let (mut wal, _) = reopen(dir.path(), segment_bytes);
        rewrite_with_mark(&mut wal, 3);
        drop(wal);
        damage(dir.path(), first, 1);
        let error = Wal::open(disk_seam::real(), dir.path(), segment_bytes, 0, |_, _| {})
            .err()
            .expect("refused: batch 2 lost")
            .to_string();
        assert!(error.contains(&segment_name(first)), "{error}");
    }

    /// Zeroes the frame of `nth_frame` in segment `number` (frames of one byte-long batch
    /// each), as a write that landed elsewhere leaves it.
    fn zero_frame(dir: &Path, number: u64, nth_frame: usize) {
        let path = segment_path(dir, number);
        let mut bytes = std::fs::read(&path).expect("read");
        let at = MAGIC.len() + nth_frame * (FRAME_HEAD + 1);
        bytes[at..at + FRAME_HEAD + 1].fill(0);
        std::fs::write(&path, &bytes).expect("write");
    }

    #[test]
    fn a_frame_gone_to_zeros_with_whole_frames_after_it_is_damage() {
        // The segment written last: batch 3 was acknowledged after batch 2, whose write
        // went elsewhere (its place still holds the zeros the segment was filled with).
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let last = wal.active.number;
        for seq in 1..=3 {
            commit(&mut wal, &[(seq, b"x")]);
        }
        drop(wal);
        zero_frame(dir.path(), last, 1);
        let error = refusal(dir.path(), "without batches 2 and 3");
        assert!(error.contains(&segment_name(last)), "{error}");
        assert!(
            error.contains(&format!("byte {}", MAGIC.len() + FRAME_HEAD + 1)),
            "{error}"
        );
        assert!(error.contains("2..=3"), "{error}");
        // A sealed segment: no later segment holds batches 2 and 3.
        let (dir, first) = sealed_then_one_more();
        zero_frame(dir.path(), first, 1);
        let error = refusal(dir.path(), "acknowledged batches would be lost");
        assert!(error.contains(&segment_name(first)), "{error}");
        assert!(error.contains("2..=3"), "{error}");
    }

    #[test]
    fn damage_in_a_sealed_segment_with_whole_frames_after_it_and_an_empty_next_is_an_error() {
        // Batches 2 and 3 were acknowledged; the segment after it holds nothing yet (a
        // rotation, or a commit a crash cut short there), so no later batch shows the gap.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b"), (3, b"c")]);
        wal.rotate().expect("rotate");
        drop(wal);
        damage(dir.path(), first, 1);
        let error = refusal(dir.path(), "without batches 2 and 3");
        assert!(error.contains(&segment_name(first)), "{error}");
        assert!(
            error.contains(&format!("byte {}", MAGIC.len() + FRAME_HEAD + 1)),
            "{error}"
        );
        assert!(error.contains("2..=3"), "{error}");
        // Held by runs, the same batches are no loss.
        assert!(Wal::open(disk_seam::real(), dir.path(), 1 << 16, 4, |_, _| {}).is_ok());
    }

    #[test]
    fn a_torn_last_write_is_no_damage() {
        // A crash cut the last commit short: its frame is torn and only zeros follow.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let last = wal.active.number;
        commit(&mut wal, &[(1, b"a"), (2, b"b")]);
        drop(wal);
        damage(dir.path(), last, 1);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1]);
        // A segment holding a torn first commit only is removed.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let last = wal.active.number;
        commit(&mut wal, &[(1, b"a")]);
        drop(wal);
        damage(dir.path(), last, 0);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert!(read.is_empty());
        assert!(!segment_path(dir.path(), last).exists());
    }

    #[test]
    fn a_sequence_gap_inside_a_segment_is_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        let first = wal.active.number;
        // Batch 2 is missing, yet every frame is whole.
        commit(&mut wal, &[(1, b"a"), (3, b"c")]);
        wal.rotate().expect("rotate");
        commit(&mut wal, &[(4, b"d")]);
        drop(wal);
        let error = refusal(dir.path(), "acknowledged batches would be lost");
        assert!(error.contains(&segment_name(first)), "{error}");
    }

    #[test]
    fn a_gap_after_a_segment_read_whole_is_passed_over() {
        // Batch 3 failed and a crash came before its retry: its callers had an error, and
        // the segment before the gap is whole to its end.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = reopen(dir.path(), 1 << 16);
        commit(&mut wal, &[(1, b"a"), (2, b"b")]);
        wal.rotate().expect("rotate");
        commit(&mut wal, &[(4, b"d")]);
        drop(wal);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 4]);
    }

    #[test]
    fn a_damaged_segment_renamed_by_the_operator_is_read_up_to_the_damage() {
        let (dir, first) = sealed_then_one_more();
        damage(dir.path(), first, 1);
        let path = segment_path(dir.path(), first);
        let mut accepted = path.clone().into_os_string();
        accepted.push(DAMAGED);
        std::fs::rename(&path, &accepted).expect("rename");
        let (mut wal, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 4]);
        commit(&mut wal, &[(5, b"e")]);
        drop(wal);
        let (_, read) = reopen(dir.path(), 1 << 16);
        assert_eq!(read.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 4, 5]);
    }

    #[test]
    fn a_file_that_is_not_a_segment_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(segment_path(dir.path(), 3), b"something else").expect("write");
        let error = Wal::open(disk_seam::real(), dir.path(), 4096, 0, |_, _| {})
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("0000000000000003.wal"), "{error}");
    }
}
