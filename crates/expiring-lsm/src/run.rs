//! One run: an immutable file of state records sorted by key digest, with the first key of
//! each page and a membership filter held in memory. A lookup is at most one page read
//! (`pread`), and none when the filter says the key is absent.
//!
//! Layout, little-endian:
//! - header ([`HEADER_BYTES`]): magic, the run's span of flushes (`first`, `last`), level,
//!   generation, entries, latest expiry, the journal point it covers, when it is due for a rewrite, page
//!   count, filter size;
//! - pages of records (16-byte digest, `expires_ms` i64, value length u32, value), a new
//!   page started once a page reaches [`PAGE_BYTES`];
//! - the index: per page, the first 8 bytes of its first digest (big-endian, so numbers
//!   sort as digests do) and the page's offset;
//! - the filter's words.
//!
//! A run is written to a temporary name, synced, then renamed: a run file under its final
//! name is whole.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bloom::Bloom;
use crate::Digest;
use crate::Error;
use disk_seam::{Disk, DiskFile, Reader, Writer};

const MAGIC: [u8; 8] = *b"hgrun\0\0\x01";
const HEADER_BYTES: u64 = 80;
/// A page is read whole for a lookup: one read from the OS page cache or the disk. Each
/// page costs an index entry in memory: larger pages, less memory, longer reads.
const PAGE_BYTES: usize = 8192;
/// Bytes of a record before its value.
const RECORD_HEAD: usize = 16 + 8 + 4;
/// Bytes of one index entry.
const INDEX_ENTRY: u64 = 16;
/// A run being written is synced every this many bytes. Left to the kernel, a large
/// merge's dirty pages are written back all at once, and the journal's fsync, which
/// requests wait for, waits behind them.
const SYNC_EVERY: u64 = 8 << 20;

/// A stored value with the time it may be forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Digest,
    pub expires_ms: i64,
    pub value: Vec<u8>,
}

/// What a run's header says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunInfo {
    /// The first and last flush the run holds: runs are ordered by them, and a run whose
    /// span lies inside another's was merged into it.
    pub first: u64,
    pub last: u64,
    /// 0 for a flush of the hot set; one more than its sources for a merge.
    pub level: u32,
    /// How many times the span was rewritten alone: a rewrite keeps its source's span, and
    /// this tells the two apart (in the file name, and at open when a crash left both).
    /// Runs written before the field existed read 0 (it was padding).
    pub generation: u32,
    pub entries: u64,
    /// The latest expiry of any record: after it the whole run may go.
    pub max_expires_ms: i64,
    /// Journal batches below this are held by runs and need no replay.
    pub journal_below: u64,
    /// When the run is rewritten alone to drop expired records that long-lived ones keep.
    pub rewrite_after_ms: i64,
}

/// A run file's header: the run's facts and the sizes of its index and filter.
struct Header {
    info: RunInfo,
    pages: u64,
    bloom_words: u64,
}

impl Header {
    /// Reads the header of the run file at `path`, `len` bytes long.
    fn read(file: &dyn DiskFile, len: u64, path: &Path) -> Result<Self, Error> {
        let mut header = [0u8; HEADER_BYTES as usize];
        if len < HEADER_BYTES {
            return Err(corrupt(path, "shorter than its header"));
        }
        file.read_exact_at(&mut header, 0)?;
        let mut at = 0;
        let mut take = |n: usize| {
            let part = &header[at..at + n];
            at += n;
            part
        };
        if take(8) != MAGIC {
            return Err(corrupt(path, "not a run file of this version"));
        }
        let (first, last, level) = (u64_at(take(8)), u64_at(take(8)), u32_at(take(4)));
        let generation = u32_at(take(4));
        let info = RunInfo {
            first,
            last,
            level,
            generation,
            entries: u64_at(take(8)),
            max_expires_ms: u64_at(take(8)) as i64,
            journal_below: u64_at(take(8)),
            rewrite_after_ms: u64_at(take(8)) as i64,
        };
        Ok(Self {
            info,
            pages: u64_at(take(8)),
            bloom_words: u64_at(take(8)),
        })
    }

    /// Where the index starts in a file of `len` bytes: the index and the filter end it.
    /// `None` if they do not fit after the header.
    fn index_at(&self, len: u64) -> Option<u64> {
        let tail = self
            .pages
            .checked_mul(INDEX_ENTRY)
            .and_then(|i| {
                self.bloom_words
                    .checked_mul(8)
                    .and_then(|b| i.checked_add(b))
            })
            .filter(|tail| HEADER_BYTES + tail <= len)?;
        Some(len - tail)
    }
}

/// The run file at `path` is not readable in its format: `what` says why.
fn corrupt(path: &Path, what: &str) -> Error {
    Error::Corrupt(format!("state run {}: {what}", path.display()).into())
}

/// Reads the index of `pages` pages: the first 8 bytes of each page's first digest, and the
/// page offsets followed by the index's own (`index_at`), where the last page ends.
fn read_index(
    reader: &mut impl Read,
    pages: u64,
    index_at: u64,
) -> Result<(Vec<u64>, Vec<u64>), Error> {
    let mut firsts = Vec::with_capacity(pages as usize);
    let mut offsets = Vec::with_capacity(pages as usize + 1);
    for _ in 0..pages {
        firsts.push(read_u64(reader)?);
        offsets.push(read_u64(reader)?);
    }
    offsets.push(index_at);
    Ok((firsts, offsets))
}

/// Reads a little-endian u64.
fn read_u64(reader: &mut impl Read) -> Result<u64, Error> {
    let mut word = [0u8; 8];
    reader.read_exact(&mut word)?;
    Ok(u64::from_le_bytes(word))
}

/// An open run.
pub struct Run {
    info: RunInfo,
    path: PathBuf,
    file: Arc<dyn DiskFile>,
    /// First 8 bytes of each page's first digest, as a big-endian number.
    firsts: Vec<u64>,
    /// Offset of each page, and of the end of the last one.
    offsets: Vec<u64>,
    bloom: Bloom,
}

impl Run {
    /// Opens a run file, reading its index and filter into memory.
    pub fn open(disk: &dyn Disk, path: &Path) -> Result<Self, Error> {
        let file = disk.open(path)?;
        let len = file.len()?;
        let header = Header::read(&*file, len, path)?;
        let index_at = header
            .index_at(len)
            .ok_or_else(|| corrupt(path, "index and filter do not fit the file"))?;
        let mut reader = BufReader::new(Reader::new(file.clone(), index_at));
        let (firsts, offsets) = read_index(&mut reader, header.pages, index_at)?;
        if offsets.windows(2).any(|w| w[0] > w[1]) || offsets[0] < HEADER_BYTES {
            return Err(corrupt(path, "page offsets out of order"));
        }
        let mut words = Vec::with_capacity(header.bloom_words as usize);
        for _ in 0..header.bloom_words {
            words.push(read_u64(&mut reader)?);
        }
        let bloom = Bloom::from_words(words).ok_or_else(|| corrupt(path, "filter malformed"))?;
        drop(reader);
        Ok(Self {
            info: header.info,
            path: path.to_owned(),
            file,
            firsts,
            offsets,
            bloom,
        })
    }

    /// The header's facts.
    pub fn info(&self) -> &RunInfo {
        &self.info
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the run may hold `key` (the filter alone; no disk read).
    pub fn may_contain(&self, key: &Digest) -> bool {
        self.bloom.may_contain(key)
    }

    /// Bytes of memory the run holds (index and filter).
    pub fn memory_bytes(&self) -> usize {
        (self.firsts.len() + self.offsets.len() + self.bloom.words().len()) * 8
    }

    /// The record of `key`, if the run holds one: the filter first, then the one page (two
    /// when the key's first 8 bytes also start the next page) that can hold it.
    pub fn get(&self, key: &Digest) -> Result<Option<Record>, Error> {
        if !self.bloom.may_contain(key) {
            return Ok(None);
        }
        let prefix = prefix_of(key);
        let from = self
            .firsts
            .partition_point(|f| *f < prefix)
            .saturating_sub(1);
        let to = self.firsts.partition_point(|f| *f <= prefix);
        for page in from..to {
            let (start, end) = (self.offsets[page], self.offsets[page + 1]);
            let mut bytes = vec![0u8; (end - start) as usize];
            self.file.read_exact_at(&mut bytes, start)?;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let record = split_record(&mut rest).ok_or_else(|| {
                    Error::Corrupt(
                        format!("state run {}: page cut short", self.path.display()).into(),
                    )
                })?;
                if record.0 == *key {
                    return Ok(Some(Record {
                        key: record.0,
                        expires_ms: record.1,
                        value: record.2.to_vec(),
                    }));
                }
            }
        }
        Ok(None)
    }

    /// Reads the run's records in key order (for a merge).
    pub fn records(&self) -> Result<RunRecords, Error> {
        let file = Reader::new(self.file.clone(), self.offsets[0]);
        Ok(RunRecords {
            reader: BufReader::with_capacity(64 * 1024, file),
            left: self.offsets[self.offsets.len() - 1] - self.offsets[0],
        })
    }
}

/// The records of a run in key order.
pub struct RunRecords {
    reader: BufReader<Reader>,
    left: u64,
}

impl Iterator for RunRecords {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let mut head = [0u8; RECORD_HEAD];
        let left = self.left;
        let read = self.reader.read_exact(&mut head).and_then(|()| {
            let len = u32::from_le_bytes([head[24], head[25], head[26], head[27]]) as usize;
            // A damaged length must not become a huge allocation.
            if (RECORD_HEAD + len) as u64 > left {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "state run record longer than its run",
                ));
            }
            let mut value = vec![0u8; len];
            self.reader.read_exact(&mut value)?;
            Ok(value)
        });
        Some(match read {
            Ok(value) => {
                self.left = self.left.saturating_sub((RECORD_HEAD + value.len()) as u64);
                let mut key = [0u8; 16];
                key.copy_from_slice(&head[..16]);
                let mut expires = [0u8; 8];
                expires.copy_from_slice(&head[16..24]);
                Ok(Record {
                    key: Digest(key),
                    expires_ms: i64::from_le_bytes(expires),
                    value,
                })
            }
            Err(e) => {
                self.left = 0;
                Err(e.into())
            }
        })
    }
}

/// Writes a run: records in ascending key order, then [`RunWriter::finish`].
pub struct RunWriter {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    tmp: PathBuf,
    out: BufWriter<Writer>,
    at: u64,
    page_start: Option<u64>,
    firsts: Vec<u64>,
    offsets: Vec<u64>,
    bloom: Bloom,
    entries: u64,
    max_expires_ms: i64,
    last_key: Option<Digest>,
    synced_at: u64,
}

impl RunWriter {
    /// Starts a run in `dir` that will hold at most `capacity` records (its filter's size).
    pub fn create(
        disk: Arc<dyn Disk>,
        dir: &Path,
        name: &str,
        capacity: u64,
    ) -> Result<Self, Error> {
        let tmp = dir.join(format!("{name}.tmp"));
        let file = disk.create(&tmp)?;
        // The header's place; `finish` writes the header there.
        let out = BufWriter::with_capacity(256 * 1024, Writer::new(file, HEADER_BYTES));
        Ok(Self {
            disk,
            dir: dir.to_owned(),
            tmp,
            out,
            at: HEADER_BYTES,
            page_start: None,
            firsts: Vec::new(),
            offsets: Vec::new(),
            bloom: Bloom::with_capacity(capacity),
            entries: 0,
            max_expires_ms: i64::MIN,
            last_key: None,
            synced_at: HEADER_BYTES,
        })
    }

    /// Appends a record; keys must ascend.
    pub fn push(&mut self, record: &Record) -> Result<(), Error> {
        self.push_parts(&record.key, record.expires_ms, &record.value)
    }

    /// Appends a record given by its parts; keys must ascend.
    pub fn push_parts(&mut self, key: &Digest, expires_ms: i64, value: &[u8]) -> Result<(), Error> {
        if self.last_key.is_some_and(|k| k.0 >= key.0) {
            return Err(Error::Corrupt("state run records out of order".into()));
        }
        self.last_key = Some(*key);
        let len = RECORD_HEAD + value.len();
        let full = self
            .page_start
            .is_none_or(|start| (self.at - start) as usize + len > PAGE_BYTES);
        if full {
            self.page_start = Some(self.at);
            self.firsts.push(prefix_of(key));
            self.offsets.push(self.at);
        }
        self.out.write_all(&key.0)?;
        self.out.write_all(&expires_ms.to_le_bytes())?;
        let value_len = u32::try_from(value.len())
            .map_err(|_| Error::Corrupt("state value over 4 GiB".into()))?;
        self.out.write_all(&value_len.to_le_bytes())?;
        self.out.write_all(value)?;
        self.at += len as u64;
        if self.at - self.synced_at >= SYNC_EVERY {
            self.out.flush()?;
            self.out.get_ref().file().sync_data()?;
            self.synced_at = self.at;
        }
        self.bloom.insert(key);
        self.entries += 1;
        self.max_expires_ms = self.max_expires_ms.max(expires_ms);
        Ok(())
    }

    /// Deletes the unfinished run.
    pub fn abandon(self) -> Result<(), Error> {
        // What is still buffered is dropped, not written.
        let _ = self.out.into_parts();
        self.disk.remove(&self.tmp)?;
        Ok(())
    }

    /// Deletes the unfinished run after a failure (which the caller reports): a run or a
    /// merge that keeps failing must not leave a file a try, which on a full disk would
    /// hold the space the runs need.
    pub fn discard(self) {
        let (disk, tmp) = (self.disk.clone(), self.tmp.clone());
        let _ = self.out.into_parts();
        remove_unfinished(&*disk, &tmp);
    }

    /// Records pushed so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Writes the index, the filter and the header, syncs the file and gives it its final
    /// name; returns the path. `info`'s entry count and latest expiry are the writer's own.
    pub fn finish(self, info: RunInfo) -> Result<PathBuf, Error> {
        let (disk, tmp) = (self.disk.clone(), self.tmp.clone());
        let finished = self.write_tail(info);
        if finished.is_err() {
            remove_unfinished(&*disk, &tmp);
        }
        finished
    }

    fn write_tail(mut self, mut info: RunInfo) -> Result<PathBuf, Error> {
        info.entries = self.entries;
        info.max_expires_ms = self.max_expires_ms;
        for (first, offset) in self.firsts.iter().zip(&self.offsets) {
            self.out.write_all(&first.to_le_bytes())?;
            self.out.write_all(&offset.to_le_bytes())?;
        }
        for word in self.bloom.words() {
            self.out.write_all(&word.to_le_bytes())?;
        }
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&info.first.to_le_bytes());
        header.extend_from_slice(&info.last.to_le_bytes());
        header.extend_from_slice(&info.level.to_le_bytes());
        header.extend_from_slice(&info.generation.to_le_bytes());
        header.extend_from_slice(&info.entries.to_le_bytes());
        header.extend_from_slice(&info.max_expires_ms.to_le_bytes());
        header.extend_from_slice(&info.journal_below.to_le_bytes());
        header.extend_from_slice(&info.rewrite_after_ms.to_le_bytes());
        header.extend_from_slice(&(self.firsts.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.bloom.words().len() as u64).to_le_bytes());
        let out = self.out.into_inner().map_err(|e| e.into_error())?;
        let file = out.file();
        file.write_all_at(&header, 0)?;
        file.sync_all()?;
        let path = self.dir.join(file_name(&info));
        // A rename replaces its target: a run named as one that exists would delete that
        // run's records (and the caller would then delete its own).
        match self.disk.open(&path) {
            Ok(_) => {
                return Err(Error::Corrupt(
                    format!("state run {} exists already", path.display()).into(),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.disk.rename(&self.tmp, &path)?;
        self.disk.sync_dir(&self.dir)?;
        Ok(path)
    }
}

/// Removes an unfinished run's file; gone already (renamed, or never made) is fine.
fn remove_unfinished(disk: &dyn Disk, tmp: &Path) {
    match disk.remove(tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            // Open deletes it at the next start.
            tracing::warn!(error = %e, path = %tmp.display(), "unfinished state run not removed");
        }
        _ => {}
    }
}

/// A run's file name: its span of flushes, so a listing sorts runs oldest first, and its
/// generation, so a rewrite never takes its source's name.
pub fn file_name(info: &RunInfo) -> String {
    format!(
        "run-{:016x}-{:016x}-{:08x}.run",
        info.first, info.last, info.generation
    )
}

fn prefix_of(key: &Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&key.0[..8]);
    u64::from_be_bytes(first)
}

fn u64_at(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

fn u32_at(bytes: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(bytes);
    u32::from_le_bytes(b)
}

/// Splits the first record off `rest`: key, expiry, value.
fn split_record<'a>(rest: &mut &'a [u8]) -> Option<(Digest, i64, &'a [u8])> {
    let head = rest.get(..RECORD_HEAD)?;
    let len = u32::from_le_bytes(head[24..28].try_into().ok()?) as usize;
    let value = rest.get(RECORD_HEAD..RECORD_HEAD + len)?;
    let key = Digest(head[..16].try_into().ok()?);
    let expires_ms = i64::from_le_bytes(head[16..24].try_into().ok()?);
    *rest = &rest[RECORD_HEAD + len..];
    Some((key, expires_ms, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(first: u64) -> RunInfo {
        RunInfo {
            first,
            last: first,
            level: 0,
            generation: 2,
            entries: 0,
            max_expires_ms: 0,
            journal_below: 7,
            rewrite_after_ms: 99,
        }
    }

    fn sorted_records(n: u32, value_len: usize) -> Vec<Record> {
        let mut records: Vec<Record> = (0..n)
            .map(|i| Record {
                key: Digest::of(&i.to_le_bytes()),
                expires_ms: i64::from(i),
                value: vec![(i % 251) as u8; value_len],
            })
            .collect();
        records.sort_by_key(|r| r.key.0);
        records
    }

    #[test]
    fn every_record_is_found_and_absent_keys_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = sorted_records(20_000, 17);
        let mut writer =
            RunWriter::create(disk_seam::real(), dir.path(), "r", records.len() as u64)
                .expect("create");
        for r in &records {
            writer.push(r).expect("push");
        }
        let path = writer.finish(info(3)).expect("finish");
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some(file_name(&info(3)).as_str())
        );
        let run = Run::open(&*disk_seam::real(), &path).expect("open");
        assert_eq!(run.info().entries, 20_000);
        assert_eq!(run.info().max_expires_ms, 19_999);
        assert_eq!(
            (
                run.info().journal_below,
                run.info().rewrite_after_ms,
                run.info().generation
            ),
            (7, 99, 2)
        );
        for r in &records {
            assert_eq!(run.get(&r.key).expect("get").as_ref(), Some(r));
        }
        for i in 20_000u32..21_000 {
            assert_eq!(run.get(&Digest::of(&i.to_le_bytes())).expect("get"), None);
        }
        let read: Vec<Record> = run
            .records()
            .expect("records")
            .map(|r| r.expect("record"))
            .collect();
        assert_eq!(read, records);
    }

    #[test]
    fn a_value_larger_than_a_page_gets_a_page_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = sorted_records(40, 9000);
        let mut writer = RunWriter::create(disk_seam::real(), dir.path(), "r", 40).expect("create");
        for r in &records {
            writer.push(r).expect("push");
        }
        let run = Run::open(
            &*disk_seam::real(),
            &writer.finish(info(1)).expect("finish"),
        )
        .expect("open");
        for r in &records {
            assert_eq!(run.get(&r.key).expect("get").as_ref(), Some(r));
        }
    }

    #[test]
    fn a_damaged_record_length_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = sorted_records(2, 17);
        let mut writer = RunWriter::create(disk_seam::real(), dir.path(), "r", 2).expect("create");
        for r in &records {
            writer.push(r).expect("push");
        }
        let path = writer.finish(info(1)).expect("finish");
        let mut bytes = std::fs::read(&path).expect("read");
        let at = HEADER_BYTES as usize + 24;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let run =
            Run::open(&*disk_seam::real(), &path).expect("header, index and filter are intact");
        let first = run.records().expect("records").next().expect("an item");
        assert!(first.is_err(), "{first:?}");
        assert!(matches!(run.get(&records[1].key), Err(Error::Corrupt(_))));
    }

    #[test]
    fn out_of_order_records_and_damaged_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = sorted_records(2, 1);
        let mut writer = RunWriter::create(disk_seam::real(), dir.path(), "r", 2).expect("create");
        writer.push(&records[1]).expect("push");
        assert!(writer.push(&records[0]).is_err());
        let path = writer.finish(info(1)).expect("finish");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..40]).expect("truncate");
        assert!(matches!(
            Run::open(&*disk_seam::real(), &path),
            Err(Error::Corrupt(_))
        ));
        std::fs::write(
            &path,
            b"not a run file at all, but long enough to hold a header.........................",
        )
        .expect("write");
        assert!(matches!(
            Run::open(&*disk_seam::real(), &path),
            Err(Error::Corrupt(_))
        ));
    }
}
