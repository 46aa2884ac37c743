//! The file seam: every file operation of the stores goes through a [`Disk`], so a test can
//! put a simulated disk ([`sim::SimDisk`]) that loses what was not synced at a power cut
//! where production uses the real file system ([`real`]).
//!
//! The seam is a trait object (`Arc<dyn Disk>`, `Arc<dyn DiskFile>`), not a type parameter:
//! each call is one indirect call in front of a system call that costs a thousand times
//! more, and the stores' types (and everything that holds them) stay free of a parameter
//! that only tests change.
//!
//! The methods mirror the system calls they stand for (`pread`, `pwrite`, `ftruncate`,
//! `fdatasync`, `fsync`, `lseek` with `SEEK_DATA` and `SEEK_HOLE`, `rename`, `unlink`,
//! `mkdir`, `readdir`, and `fsync` of a directory),
//! with the same durability contract: data written is durable once its file is synced; a
//! directory entry (a file created, renamed or removed, a directory made) is durable once
//! its directory is synced.
//!
//! [`StoreFault`] is what a store on disk fails with, by the kind of fault; the stores'
//! errors are it or wrap it.

mod fault;
pub mod sim;

use std::fs::OpenOptions;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use fault::{Cause, StoreFault};

/// A file system: directories, names and open files.
pub trait Disk: Send + Sync {
    /// Opens an existing file for reading only.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>>;
    /// Opens a file for reading and writing, created empty if absent, kept as it is if not.
    fn open_rw(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>>;
    /// Creates a file for reading and writing, emptied if it exists.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>>;
    /// Makes one directory; its parent must exist. An error of kind `AlreadyExists` if it
    /// does.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Whether `path` names a directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// The names in a directory, sorted.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Makes the directory's entries durable: files created, renamed into or removed from
    /// it, and directories made in it.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file's name; open handles still read it.
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// An open file. Reads and writes take an offset, so one handle serves several threads.
pub trait DiskFile: Send + Sync {
    /// Reads at `offset` into `buf`; returns the bytes read (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes `buf` at `offset`; returns the bytes written.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Cuts the file to `len` bytes, or extends it with zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
    /// The byte ranges that hold data, in order, within the file's length (`SEEK_DATA`,
    /// `SEEK_HOLE`). The rest are holes: they read as zeros and hold no block of the disk,
    /// so writing into one needs room. In blocks of the file system: a range may hold
    /// zeros.
    fn data_ranges(&self) -> io::Result<Vec<Range<u64>>>;

    /// Fills `buf` from `offset`; an error of kind `UnexpectedEof` if the file ends first.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at the file's end.
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let end = self.len()?;
        self.write_all_at(buf, end)
    }

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// The real file system.
pub fn real() -> Arc<dyn Disk> {
    Arc::new(RealDisk)
}

/// Reads a whole file.
pub fn read(disk: &dyn Disk, path: &Path) -> io::Result<Vec<u8>> {
    let file = disk.open(path)?;
    let len =
        usize::try_from(file.len()?).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// Makes `dir` and every missing parent, each made durable by a sync of the directory that
/// holds it: a store whose folder a power cut takes back would lose every file in it.
pub fn create_dir_all(disk: &dyn Disk, dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || disk.is_dir(dir) {
        return Ok(());
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_all(disk, parent)?;
    }
    match disk.create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && disk.is_dir(dir) => return Ok(()),
        other => other?,
    }
    disk.sync_dir(parent.unwrap_or(Path::new(".")))
}

/// Bytes [`rewrite_as_read`] moves at once.
const REWRITE_CHUNK: usize = 1 << 20;

/// Writes the data of `file` again, as it reads now, and syncs it: what a process reads
/// is then what a power cut keeps. After a failed `fdatasync` Linux may keep the failed
/// pages in the page cache, marked clean, so a process restarted without a power cut reads
/// what a power cut would take away; a write makes them dirty again. The holes read as
/// zeros from no block and are not written (that would need room, which a full disk does
/// not have), unless they read otherwise. The cost is one pass over the file.
pub fn rewrite_as_read(file: &dyn DiskFile) -> io::Result<()> {
    let len = file.len()?;
    let mut buf = vec![0; REWRITE_CHUNK];
    let mut at = 0;
    for data in file
        .data_ranges()?
        .into_iter()
        .chain(std::iter::once(len..len))
    {
        rewrite_span(file, &mut buf, at..data.start, true)?;
        rewrite_span(file, &mut buf, data.clone(), false)?;
        at = data.end;
    }
    file.sync_data()
}

/// Writes the bytes of `span` again as they read, in chunks of `buf`'s size; in a `hole`,
/// only the chunks that do not read as zeros.
fn rewrite_span(
    file: &dyn DiskFile,
    buf: &mut [u8],
    span: Range<u64>,
    hole: bool,
) -> io::Result<()> {
    let mut at = span.start;
    while at < span.end {
        let n = usize::try_from(span.end - at).map_or(buf.len(), |left| left.min(buf.len()));
        file.read_exact_at(&mut buf[..n], at)?;
        if !hole || buf[..n].iter().any(|&b| b != 0) {
            file.write_all_at(&buf[..n], at)?;
        }
        at += n as u64;
    }
    Ok(())
}

/// Reads a file from an offset on, for `std::io::Read` users (a buffered reader).
pub struct Reader {
    file: Arc<dyn DiskFile>,
    at: u64,
}

impl Reader {
    /// Reads `file` from `at`.
    pub fn new(file: Arc<dyn DiskFile>, at: u64) -> Self {
        Self { file, at }
    }
}

impl io::Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Writes a file from an offset on, for `std::io::Write` users (a buffered writer).
pub struct Writer {
    file: Arc<dyn DiskFile>,
    at: u64,
}

impl Writer {
    /// Writes `file` from `at`.
    pub fn new(file: Arc<dyn DiskFile>, at: u64) -> Self {
        Self { file, at }
    }

    /// The file written.
    pub fn file(&self) -> &Arc<dyn DiskFile> {
        &self.file
    }
}

impl io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// [`Disk`] over `std::fs`.
struct RealDisk;

/// [`DiskFile`] over a `std::fs::File`.
struct RealFile(std::fs::File);

impl Disk for RealDisk {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        Ok(Arc::new(RealFile(std::fs::File::open(path)?)))
    }

    fn open_rw(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            // A name that is not UTF-8 is none of the stores' files.
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort_unstable();
        Ok(names)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

impl DiskFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(&self.0, buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn data_ranges(&self) -> io::Result<Vec<Range<u64>>> {
        use rustix::fs::{seek, SeekFrom};
        let len = self.len()?;
        let mut ranges = Vec::new();
        let mut at = 0;
        while at < len {
            let start = match seek(&self.0, SeekFrom::Data(at)) {
                Ok(start) => start,
                // No data at or after `at`.
                Err(rustix::io::Errno::NXIO) => break,
                // A file system that cannot tell: all of the file is data to it.
                Err(rustix::io::Errno::INVAL) if at == 0 => {
                    return Ok(std::iter::once(0..len).collect());
                }
                Err(e) => return Err(e.into()),
            };
            let end = seek(&self.0, SeekFrom::Hole(start))?.min(len);
            if end <= start {
                break;
            }
            ranges.push(start..end);
            at = end;
        }
        Ok(ranges)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, offset)
    }
}

/// Makes a store's folder `dir` ([`create_dir_all`]) and syncs its own entry into its
/// parent: a power cut that takes the folder back takes everything in it, and a sync of
/// that entry that failed in an earlier run must not stay failed. A parent the process may
/// not read (a mount point's) cannot be synced by it; the store worked there before and
/// keeps working, so that refusal is handed back (`Ok(Some(error))`) for the caller to
/// report.
pub fn create_store_folder(disk: &dyn Disk, dir: &Path) -> io::Result<Option<io::Error>> {
    create_dir_all(disk, dir)?;
    match disk.sync_dir(&parent_of(dir)) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(Some(e)),
        synced => synced.map(|()| None),
    }
}

/// `path`'s directory, for a sync of the entry `path` names.
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
// A file's data ranges are compared as lists, often of one range.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[test]
    fn the_real_disk_does_what_std_fs_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = real();
        let nested = dir.path().join("a/b");
        create_dir_all(&*disk, &nested).expect("mkdir -p");
        create_dir_all(&*disk, &nested).expect("again");
        assert!(disk.is_dir(&nested));
        let path = nested.join("f");
        let file = disk.create(&path).expect("create");
        file.write_all_at(b"hello", 0).expect("write");
        file.append(b" world").expect("append");
        file.sync_all().expect("sync");
        assert_eq!(read(&*disk, &path).expect("read"), b"hello world");
        file.set_len(5).expect("truncate");
        assert_eq!(file.len().expect("len"), 5);
        disk.rename(&path, &nested.join("g")).expect("rename");
        disk.sync_dir(&nested).expect("sync dir");
        assert_eq!(disk.list(&nested).expect("list"), ["g"]);
        assert_eq!(file.data_ranges().expect("data"), [0..5]);
        let rw = disk.open_rw(&nested.join("g")).expect("open rw");
        assert_eq!(rw.len().expect("len"), 5, "not truncated");
        disk.remove(&nested.join("g")).expect("remove");
        let mut buf = [0; 5];
        file.read_exact_at(&mut buf, 0)
            .expect("an open handle still reads a removed file");
        assert_eq!(&buf, b"hello");
        assert!(disk.list(&nested).expect("list").is_empty());
        assert!(disk.open(&nested.join("g")).is_err());
    }

    #[test]
    fn a_real_sparse_file_shows_its_holes_and_its_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = real().create(&dir.path().join("sparse")).expect("create");
        assert_eq!(file.data_ranges().expect("empty"), []);
        let mib = 1 << 20;
        file.set_len(4 * mib).expect("extend");
        assert_eq!(file.data_ranges().expect("a hole"), []);
        file.write_all_at(b"x", mib + 10).expect("write");
        file.sync_data().expect("sync");
        let data = file.data_ranges().expect("data");
        assert_eq!(data.len(), 1, "{data:?}");
        assert!(data[0].contains(&(mib + 10)), "{data:?}");
        assert!(
            data[0].start >= mib - 64 * 1024 && data[0].end <= mib + 64 * 1024,
            "no more than the blocks written: {data:?}"
        );
    }
}
