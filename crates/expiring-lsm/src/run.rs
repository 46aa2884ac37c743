//! One run: an immutable file of state records sorted by key digest, with the first key of
//! each page and a membership filter held in memory. A lookup is at most one page read
//! (`pread`), and none when the filter says the key is absent.
//!
//! Layout, little-endian (format 2; the magic's last byte is the format):
//! - header ([`HEADER_V2`]): magic, the run's span of flushes (`first`, `last`), level,
//!   generation, entries, latest expiry, the journal point it covers, when it is due for a
//!   rewrite, page count, filter size; then the CRC-32 of the index and filter, and the
//!   CRC-32 of the header's bytes before it;
//! - pages of records (16-byte digest, `expires_ms` i64, value length u32, value), a new
//!   page started once a page reaches [`PAGE_BYTES`];
//! - the index: per page, the first 8 bytes of its first digest (big-endian, so numbers
//!   sort as digests do), the page's offset and the page's CRC-32;
//! - the filter's words.
//!
//! Every byte a lookup or a merge relies on is checked before it is used: the header, the
//! index and the filter when the run opens, a page each time it is read. Bytes that do not
//! check are [`Error::Damaged`], naming the file and the offset, never a wrong or a missing
//! record. Format 1 (an 80-byte header, 16-byte index entries, no checksums) is still read,
//! unchecked; merges and rewrites write format 2.
//!
//! A run is written to a temporary name, synced, then renamed: a run file under its final
//! name is whole.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bloom::Bloom;
use crate::Digest;
use crate::Error;
use disk_seam::{Disk, DiskFile, Writer};

const MAGIC_V1: [u8; 8] = *b"hgrun\0\0\x01";
const MAGIC_V2: [u8; 8] = *b"hgrun\0\0\x02";
/// Bytes of a run's facts, from the magic to the filter size: the whole header of format 1.
const FACTS_BYTES: usize = 80;
const HEADER_V1: u64 = FACTS_BYTES as u64;
/// The facts, the CRC-32 of the index and filter, and the CRC-32 of what precedes it.
const HEADER_V2: u64 = FACTS_BYTES as u64 + 8;
/// A page is read whole for a lookup: one read from the OS page cache or the disk. Each
/// page costs an index entry in memory: larger pages, less memory, longer reads.
const PAGE_BYTES: usize = 8192;
/// Bytes of a record before its value.
const RECORD_HEAD: usize = 16 + 8 + 4;
/// Bytes of one index entry: the first key's prefix, the offset and (format 2) the CRC.
const INDEX_V1: u64 = 16;
const INDEX_V2: u64 = 20;
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

/// A run file's header: its format, the run's facts and the sizes of its index and filter.
struct Header {
    checked: bool,
    info: RunInfo,
    pages: u64,
    bloom_words: u64,
    /// The CRC-32 of the index and filter (format 2).
    tail_crc: u32,
}

impl Header {
    /// Reads the header of the run file at `path`, `len` bytes long.
    fn read(file: &dyn DiskFile, len: u64, path: &Path) -> Result<Self, Error> {
        let short = || damaged(path, 0, "shorter than its header");
        if len < HEADER_V1 {
            return Err(short());
        }
        let mut magic = [0u8; 8];
        file.read_exact_at(&mut magic, 0)?;
        let checked = match magic {
            MAGIC_V1 => false,
            MAGIC_V2 => true,
            _ => return Err(damaged(path, 0, "not a run file of a known format")),
        };
        let mut bytes = [0u8; HEADER_V2 as usize];
        let size = if checked { HEADER_V2 } else { HEADER_V1 };
        if len < size {
            return Err(short());
        }
        let header = &mut bytes[..size as usize];
        file.read_exact_at(header, 0)?;
        let mut tail_crc = 0;
        if checked {
            let crc = u32_at(&header[FACTS_BYTES + 4..]);
            if crc32fast::hash(&header[..FACTS_BYTES + 4]) != crc {
                return Err(damaged(path, 0, "header fails its checksum"));
            }
            tail_crc = u32_at(&header[FACTS_BYTES..]);
        }
        let mut at = 8;
        let mut take = |n: usize| {
            let part = &header[at..at + n];
            at += n;
            part
        };
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
            checked,
            info,
            pages: u64_at(take(8)),
            bloom_words: u64_at(take(8)),
            tail_crc,
        })
    }

    fn size(&self) -> u64 {
        if self.checked {
            HEADER_V2
        } else {
            HEADER_V1
        }
    }

    fn index_entry(&self) -> u64 {
        if self.checked {
            INDEX_V2
        } else {
            INDEX_V1
        }
    }

    /// Where the index starts in a file of `len` bytes: the index and the filter end it.
    /// `None` if they do not fit after the header.
    fn index_at(&self, len: u64) -> Option<u64> {
        let tail = self
            .pages
            .checked_mul(self.index_entry())
            .and_then(|i| {
                self.bloom_words
                    .checked_mul(8)
                    .and_then(|b| i.checked_add(b))
            })
            .filter(|tail| self.size() + tail <= len)?;
        Some(len - tail)
    }
}

/// The run file at `path` does not check at byte `offset`: `what` says how.
fn damaged(path: &Path, offset: u64, what: &str) -> Error {
    Error::Damaged {
        file: path.to_owned(),
        offset,
        what: what.to_owned(),
    }
}

/// The index of a run: per page, the first 8 bytes of its first digest, its offset (and
/// where the last page ends) and its CRC-32 (`None` in format 1).
struct Index {
    firsts: Vec<u64>,
    offsets: Vec<u64>,
    crcs: Option<Vec<u32>>,
}

impl Index {
    /// Parses the index from `bytes`, the tail of the file that starts at `index_at`.
    fn parse(bytes: &[u8], header: &Header, index_at: u64) -> Self {
        let pages = header.pages as usize;
        let entry = header.index_entry() as usize;
        let mut index = Index {
            firsts: Vec::with_capacity(pages),
            offsets: Vec::with_capacity(pages + 1),
            crcs: header.checked.then(|| Vec::with_capacity(pages)),
        };
        for part in bytes.chunks_exact(entry).take(pages) {
            index.firsts.push(u64_at(&part[..8]));
            index.offsets.push(u64_at(&part[8..16]));
            if let Some(crcs) = &mut index.crcs {
                crcs.push(u32_at(&part[16..20]));
            }
        }
        index.offsets.push(index_at);
        index
    }
}

/// An open run.
pub struct Run {
    info: RunInfo,
    path: PathBuf,
    file: Arc<dyn DiskFile>,
    index: Arc<Index>,
    bloom: Bloom,
}

impl Run {
    /// Opens a run file, reading its index and filter into memory, checked in format 2.
    pub fn open(disk: &dyn Disk, path: &Path) -> Result<Self, Error> {
        let file = disk.open(path)?;
        let len = file.len()?;
        let header = Header::read(&*file, len, path)?;
        let index_at = header
            .index_at(len)
            .ok_or_else(|| damaged(path, 0, "index and filter do not fit the file"))?;
        let mut tail = vec![0u8; (len - index_at) as usize];
        file.read_exact_at(&mut tail, index_at)?;
        if header.checked && crc32fast::hash(&tail) != header.tail_crc {
            return Err(damaged(
                path,
                index_at,
                "index or filter fails its checksum",
            ));
        }
        let index = Index::parse(&tail, &header, index_at);
        let offsets = &index.offsets;
        if offsets.windows(2).any(|w| w[0] > w[1]) || offsets[0] < header.size() {
            return Err(damaged(path, index_at, "page offsets out of order"));
        }
        let filter_at = (header.pages * header.index_entry()) as usize;
        let words = tail[filter_at..].chunks_exact(8).map(u64_at).collect();
        let bloom = Bloom::from_words(words)
            .ok_or_else(|| damaged(path, index_at + filter_at as u64, "filter malformed"))?;
        Ok(Self {
            info: header.info,
            path: path.to_owned(),
            file,
            index: Arc::new(index),
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
        let index = &self.index;
        let crcs = index.crcs.as_ref().map_or(0, Vec::len) * 4;
        (index.firsts.len() + index.offsets.len() + self.bloom.words().len()) * 8 + crcs
    }

    /// The record of `key`, if the run holds one: the filter first, then the one page (two
    /// when the key's first 8 bytes also start the next page) that can hold it.
    pub fn get(&self, key: &Digest) -> Result<Option<Record>, Error> {
        if !self.bloom.may_contain(key) {
            return Ok(None);
        }
        let prefix = prefix_of(key);
        let firsts = &self.index.firsts;
        let from = firsts.partition_point(|f| *f < prefix).saturating_sub(1);
        let to = firsts.partition_point(|f| *f <= prefix);
        for page in from..to {
            let bytes = read_page(&*self.file, &self.path, &self.index, page)?;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let record = split_record(&mut rest).ok_or_else(|| {
                    damaged(&self.path, self.index.offsets[page], "page cut short")
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

    /// Reads the run's records in key order (for a merge), each page checked as it is read.
    pub fn records(&self) -> Result<RunRecords, Error> {
        Ok(RunRecords {
            file: self.file.clone(),
            path: self.path.clone(),
            index: self.index.clone(),
            next_page: 0,
            page: Vec::new(),
            at: 0,
        })
    }
}

/// Reads page `page` of a run whole, checked against its CRC-32 in format 2.
fn read_page(
    file: &dyn DiskFile,
    path: &Path,
    index: &Index,
    page: usize,
) -> Result<Vec<u8>, Error> {
    let (start, end) = (index.offsets[page], index.offsets[page + 1]);
    let mut bytes = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut bytes, start)?;
    let expected = index.crcs.as_ref().and_then(|crcs| crcs.get(page));
    if expected.is_some_and(|crc| crc32fast::hash(&bytes) != *crc) {
        let what = format!("page {page} fails its checksum");
        return Err(damaged(path, start, &what));
    }
    Ok(bytes)
}

/// The records of a run in key order, read a page at a time.
pub struct RunRecords {
    file: Arc<dyn DiskFile>,
    path: PathBuf,
    index: Arc<Index>,
    /// The page read next.
    next_page: usize,
    /// The page being read, and where its next record starts.
    page: Vec<u8>,
    at: usize,
}

impl RunRecords {
    fn next_record(&mut self) -> Result<Option<Record>, Error> {
        while self.at == self.page.len() {
            if self.next_page == self.index.firsts.len() {
                return Ok(None);
            }
            self.page = read_page(&*self.file, &self.path, &self.index, self.next_page)?;
            self.at = 0;
            self.next_page += 1;
        }
        let mut rest = &self.page[self.at..];
        let (key, expires_ms, value) = split_record(&mut rest).ok_or_else(|| {
            let page = self.next_page - 1;
            damaged(&self.path, self.index.offsets[page], "page cut short")
        })?;
        let record = Record {
            key,
            expires_ms,
            value: value.to_vec(),
        };
        self.at = self.page.len() - rest.len();
        Ok(Some(record))
    }
}

impl Iterator for RunRecords {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Ok(record) => record.map(Ok),
            Err(e) => {
                // Nothing after an error: a merge stops at it.
                self.next_page = self.index.firsts.len();
                self.page.clear();
                self.at = 0;
                Some(Err(e))
            }
        }
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
    /// The CRC-32 of each finished page, and of the page being written.
    crcs: Vec<u32>,
    page_crc: crc32fast::Hasher,
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
        let out = BufWriter::with_capacity(256 * 1024, Writer::new(file, HEADER_V2));
        Ok(Self {
            disk,
            dir: dir.to_owned(),
            tmp,
            out,
            at: HEADER_V2,
            page_start: None,
            firsts: Vec::new(),
            offsets: Vec::new(),
            crcs: Vec::new(),
            page_crc: crc32fast::Hasher::new(),
            bloom: Bloom::with_capacity(capacity),
            entries: 0,
            max_expires_ms: i64::MIN,
            last_key: None,
            synced_at: HEADER_V2,
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
        let value_len = u32::try_from(value.len())
            .map_err(|_| Error::Corrupt("state value over 4 GiB".into()))?;
        if full {
            if self.page_start.is_some() {
                self.end_page();
            }
            self.page_start = Some(self.at);
            self.firsts.push(prefix_of(key));
            self.offsets.push(self.at);
        }
        for part in [
            &key.0[..],
            &expires_ms.to_le_bytes(),
            &value_len.to_le_bytes(),
            value,
        ] {
            self.out.write_all(part)?;
            self.page_crc.update(part);
        }
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

    /// Notes the CRC-32 of the page written so far.
    fn end_page(&mut self) {
        let page = std::mem::replace(&mut self.page_crc, crc32fast::Hasher::new());
        self.crcs.push(page.finalize());
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
        if self.page_start.is_some() {
            self.end_page();
        }
        let mut tail = Vec::with_capacity(
            self.firsts.len() * INDEX_V2 as usize + self.bloom.words().len() * 8,
        );
        for ((first, offset), crc) in self.firsts.iter().zip(&self.offsets).zip(&self.crcs) {
            tail.extend_from_slice(&first.to_le_bytes());
            tail.extend_from_slice(&offset.to_le_bytes());
            tail.extend_from_slice(&crc.to_le_bytes());
        }
        for word in self.bloom.words() {
            tail.extend_from_slice(&word.to_le_bytes());
        }
        self.out.write_all(&tail)?;
        let header = self.header(&info, crc32fast::hash(&tail));
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

impl RunWriter {
    /// The header of format 2: the facts, the CRC-32 of the tail, the header's CRC-32.
    fn header(&self, info: &RunInfo, tail_crc: u32) -> Vec<u8> {
        let mut header = Vec::with_capacity(HEADER_V2 as usize);
        header.extend_from_slice(&MAGIC_V2);
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
        header.extend_from_slice(&tail_crc.to_le_bytes());
        let crc = crc32fast::hash(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        header
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

/// The little-endian u64 that `bytes` starts with.
fn u64_at(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

/// The little-endian u32 that `bytes` starts with.
fn u32_at(bytes: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[..4]);
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
        assert_reads_exactly(&run, &records);
        for i in 20_000u32..21_000 {
            assert_eq!(run.get(&Digest::of(&i.to_le_bytes())).expect("get"), None);
        }
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

    /// That `run` answers each of `records` by its key and reads back exactly `records`.
    fn assert_reads_exactly(run: &Run, records: &[Record]) {
        for r in records {
            assert_eq!(run.get(&r.key).expect("get").as_ref(), Some(r));
        }
        let read: Vec<Record> = run
            .records()
            .expect("records")
            .map(|r| r.expect("record"))
            .collect();
        assert_eq!(read, records);
    }

    /// A run of `records` written on `disk` in `/runs`; its path.
    fn write_run(disk: &disk_seam::sim::SimDisk, records: &[Record]) -> PathBuf {
        let dir = Path::new("/runs");
        disk_seam::create_dir_all(disk, dir).expect("mkdir");
        let mut writer =
            RunWriter::create(disk.handle(), dir, "r", records.len() as u64).expect("create");
        for r in records {
            writer.push(r).expect("push");
        }
        writer.finish(info(1)).expect("finish")
    }

    /// What a run file of `bytes` answers: an error at open, or each key's answer and the
    /// records a merge reads.
    type Answers = Result<
        (
            Vec<Result<Option<Record>, Error>>,
            Result<Vec<Record>, Error>,
        ),
        Error,
    >;

    fn answers(bytes: &[u8], keys: &[Digest]) -> Answers {
        let disk = disk_seam::sim::SimDisk::new(1);
        let path = Path::new("/f.run");
        disk.create(path)
            .and_then(|f| f.write_all_at(bytes, 0))
            .expect("write");
        let run = Run::open(&disk, path)?;
        let gets = keys.iter().map(|k| run.get(k)).collect();
        Ok((gets, run.records()?.collect()))
    }

    fn is_damage(error: &Error) -> bool {
        matches!(error, Error::Damaged { file, .. } if file == Path::new("/f.run"))
    }

    #[test]
    fn a_bit_flipped_anywhere_in_a_run_is_damage_never_a_wrong_or_missing_record() {
        let disk = disk_seam::sim::SimDisk::new(1);
        let records = sorted_records(400, 23);
        let bytes = disk_seam::read(&disk, &write_run(&disk, &records)).expect("read");
        // Every few keys, and keys it lacks: a damaged page fails the keys it holds alike.
        let mut keys: Vec<Digest> = records.iter().step_by(5).map(|r| r.key).collect();
        let present = keys.len();
        keys.extend((5000u32..5020).map(|i| Digest::of(&i.to_le_bytes())));
        let expected = |i: usize| (i < present).then(|| records[i * 5].clone());
        let mut rng = disk_seam::sim::Rng::new(3);
        // Every byte of the header, of the index and of the filter; bytes of the pages.
        let tail = bytes.len() - 700;
        let pages = (0..60).map(|_| HEADER_V2 as usize + rng.below(tail as u64) as usize);
        let spots: Vec<usize> = (0..HEADER_V2 as usize)
            .chain(pages)
            .chain(tail..bytes.len())
            .collect();
        for at in spots {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1 << rng.below(8);
            match answers(&damaged, &keys) {
                Err(e) => assert!(is_damage(&e), "byte {at}: {e}"),
                Ok((gets, all)) => {
                    for (i, got) in gets.into_iter().enumerate() {
                        match got {
                            Ok(got) => assert_eq!(got, expected(i), "byte {at}, key {i}"),
                            Err(e) => assert!(is_damage(&e), "byte {at}, key {i}: {e}"),
                        }
                    }
                    match all {
                        Ok(all) => {
                            assert!(all == records, "byte {at}: a merge reads other records")
                        }
                        Err(e) => assert!(is_damage(&e), "byte {at}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_damaged_page_names_the_file_and_its_offset_and_a_merge_stops_at_it() {
        let disk = disk_seam::sim::SimDisk::new(1);
        let records = sorted_records(2000, 17);
        let bytes = disk_seam::read(&disk, &write_run(&disk, &records)).expect("read");
        let mut damaged = bytes.clone();
        let at = HEADER_V2 as usize + PAGE_BYTES + 100;
        damaged[at] ^= 0x10;
        let keys: Vec<Digest> = records.iter().map(|r| r.key).collect();
        let (gets, all) = answers(&damaged, &keys).expect("header, index and filter check");
        let errors: Vec<String> = gets
            .iter()
            .filter_map(|g| g.as_ref().err().map(ToString::to_string))
            .collect();
        assert!(!errors.is_empty());
        assert!(errors.len() < keys.len(), "only the keys of one page");
        assert!(
            errors[0].contains("/f.run") && errors[0].contains("page 1 fails its checksum"),
            "{}",
            errors[0]
        );
        let first_error = gets.iter().find_map(|g| g.as_ref().err());
        let Some(Error::Damaged { offset, .. }) = first_error else {
            panic!("{first_error:?}");
        };
        assert!(*offset > HEADER_V2 + PAGE_BYTES as u64 / 2 && *offset <= at as u64);
        assert!(matches!(all, Err(Error::Damaged { .. })));
    }

    /// A run file in format 1 (no checksums), as runs were written before format 2.
    fn format_1(records: &[Record], info: &RunInfo) -> Vec<u8> {
        let mut pages: Vec<Vec<u8>> = Vec::new();
        let mut firsts = Vec::new();
        for r in records {
            let mut bytes = r.key.0.to_vec();
            bytes.extend_from_slice(&r.expires_ms.to_le_bytes());
            bytes.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&r.value);
            match pages.last_mut() {
                Some(page) if page.len() + bytes.len() <= PAGE_BYTES => page.extend(bytes),
                _ => {
                    firsts.push(prefix_of(&r.key));
                    pages.push(bytes);
                }
            }
        }
        let mut bloom = Bloom::with_capacity(records.len() as u64);
        records.iter().for_each(|r| bloom.insert(&r.key));
        let mut out = MAGIC_V1.to_vec();
        for n in [info.first, info.last] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&info.level.to_le_bytes());
        out.extend_from_slice(&info.generation.to_le_bytes());
        out.extend_from_slice(&(records.len() as u64).to_le_bytes());
        for n in [19_999i64, info.journal_below as i64, info.rewrite_after_ms] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&(pages.len() as u64).to_le_bytes());
        out.extend_from_slice(&(bloom.words().len() as u64).to_le_bytes());
        let mut offsets = Vec::new();
        for page in &pages {
            offsets.push(out.len() as u64);
            out.extend_from_slice(page);
        }
        for (first, offset) in firsts.iter().zip(&offsets) {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        bloom
            .words()
            .iter()
            .for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        out
    }

    #[test]
    fn a_run_written_in_format_1_opens_and_reads_unchecked() {
        let records = sorted_records(20_000, 17);
        let bytes = format_1(&records, &info(3));
        let disk = disk_seam::sim::SimDisk::new(1);
        let path = Path::new("/old.run");
        disk.create(path)
            .and_then(|f| f.write_all_at(&bytes, 0))
            .expect("write");
        let run = Run::open(&disk, path).expect("format 1 opens");
        assert_eq!(run.info().entries, 20_000);
        assert_eq!((run.info().journal_below, run.info().generation), (7, 2));
        assert_reads_exactly(&run, &records);
        assert_eq!(run.get(&Digest::of(b"absent")).expect("get"), None);
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
        let at = HEADER_V2 as usize + 24;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let run =
            Run::open(&*disk_seam::real(), &path).expect("header, index and filter are intact");
        let first = run.records().expect("records").next().expect("an item");
        assert!(matches!(first, Err(Error::Damaged { .. })), "{first:?}");
        assert!(matches!(
            run.get(&records[1].key),
            Err(Error::Damaged { .. })
        ));
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
            Err(Error::Damaged { offset: 0, .. })
        ));
        std::fs::write(
            &path,
            b"not a run file at all, but long enough to hold a header.........................",
        )
        .expect("write");
        assert!(matches!(
            Run::open(&*disk_seam::real(), &path),
            Err(Error::Damaged { offset: 0, .. })
        ));
    }
}
