//! Which blocks of a simulated file hold data and which are holes, as `SEEK_DATA` and
//! `SEEK_HOLE` report them. A write takes the blocks it touches, a length change frees
//! those past the new end, and a hole reads as zeros. A file keeps two sets, as it keeps
//! two copies of its bytes: the one reads see, and the one a power cut keeps, changed by
//! the same writes as the bytes of each.

use std::collections::BTreeSet;
use std::ops::Range;

use super::change::{Landing, Pending};

/// Bytes of a block of the simulated file system, the unit a file holds data in.
pub(super) const BLOCK: u64 = 4096;

/// The blocks of a file that hold data.
#[derive(Clone, Default)]
pub(super) struct Blocks(BTreeSet<u64>);

impl Blocks {
    /// Takes the blocks of `len` bytes at `offset`.
    pub(super) fn take(&mut self, offset: u64, len: u64) {
        if len > 0 {
            self.0
                .extend(offset / BLOCK..(offset + len).div_ceil(BLOCK));
        }
    }

    /// Whether the byte at `offset` is in a block that holds data.
    pub(super) fn holds(&self, offset: u64) -> bool {
        self.0.contains(&(offset / BLOCK))
    }

    /// Frees the blocks wholly at or past `len`.
    fn cut(&mut self, len: u64) {
        self.0.split_off(&len.div_ceil(BLOCK));
    }

    /// Follows a change to the bytes reads see.
    pub(super) fn follow(&mut self, change: &Pending) {
        match change {
            Pending::Write { offset, bytes, .. } => self.take(*offset, bytes.len() as u64),
            Pending::SetLen(len) => self.cut(*len),
        }
    }

    /// Follows a change as it reaches the platter: the file system allocated the blocks
    /// it aimed at, and a write the device put elsewhere made data of the blocks it hit.
    pub(super) fn land(&mut self, change: &Pending) {
        self.follow(change);
        if let Pending::Write {
            bytes,
            lands: Landing::At(elsewhere),
            ..
        } = change
        {
            self.take(*elsewhere, bytes.len() as u64);
        }
    }

    /// The ranges of a file of `len` bytes that hold data, each as long as it can be.
    pub(super) fn ranges(&self, len: u64) -> Vec<Range<u64>> {
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for block in &self.0 {
            let (start, end) = (block * BLOCK, ((block + 1) * BLOCK).min(len));
            if start >= end {
                break;
            }
            match ranges.last_mut() {
                Some(last) if last.end == start => last.end = end,
                _ => ranges.push(start..end),
            }
        }
        ranges
    }
}

// A file's data ranges are compared as lists, often of one range.
#[allow(clippy::single_range_in_vec_init)]
#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::BLOCK;
    use crate::sim::{Fault, OpKind, SimDisk};
    use crate::Disk;

    /// A file of four blocks, all holes but the one written at `at`, with its name synced.
    fn sparse(disk: &SimDisk, at: u64) -> std::sync::Arc<dyn crate::DiskFile> {
        let file = disk.create(Path::new("/f")).expect("create");
        file.set_len(4 * BLOCK).expect("extend");
        file.write_all_at(b"data", at).expect("write");
        disk.sync_dir(Path::new("/")).expect("sync dir");
        file
    }

    #[test]
    fn a_file_holds_data_in_the_blocks_written_and_holes_elsewhere() {
        let disk = SimDisk::new(1);
        let file = sparse(&disk, BLOCK + 10);
        assert_eq!(file.data_ranges().expect("ranges"), [BLOCK..2 * BLOCK]);
        // A write across a block boundary takes both blocks; one past the end extends.
        file.write_all_at(b"xy", 3 * BLOCK - 1).expect("write");
        file.write_all_at(b"z", 5 * BLOCK + 1).expect("write");
        assert_eq!(
            file.data_ranges().expect("ranges"),
            [BLOCK..4 * BLOCK, 5 * BLOCK..5 * BLOCK + 2]
        );
        // A cut frees the blocks past it and keeps the one it ends in.
        file.set_len(BLOCK + 20).expect("cut");
        assert_eq!(file.data_ranges().expect("ranges"), [BLOCK..BLOCK + 20]);
    }

    #[test]
    fn a_power_cut_keeps_the_blocks_of_synced_writes_and_of_unsynced_ones_it_kept() {
        for seed in 0..50 {
            let disk = SimDisk::new(seed);
            let file = sparse(&disk, 0);
            file.sync_data().expect("sync");
            file.write_all_at(b"late", 2 * BLOCK).expect("write");
            let disk = disk.crash();
            let file = disk.open(Path::new("/f")).expect("open");
            let mut late = [0; 4];
            file.read_exact_at(&mut late, 2 * BLOCK).expect("read");
            let ranges = file.data_ranges().expect("ranges");
            assert_eq!(ranges[0], 0..BLOCK, "seed {seed}");
            assert_eq!(
                ranges.len() == 2,
                late != [0; 4],
                "seed {seed}: a block is data exactly where the write landed: {ranges:?}"
            );
        }
    }

    #[test]
    fn what_a_failed_sync_left_is_data_until_a_power_cut_takes_it() {
        let disk = SimDisk::new(2);
        let file = sparse(&disk, 0);
        file.sync_data().expect("sync");
        file.write_all_at(b"lost", 3 * BLOCK).expect("write");
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(file.sync_data().is_err());
        let disk = disk.restart();
        let file = disk.open(Path::new("/f")).expect("open");
        assert_eq!(
            file.data_ranges().expect("ranges"),
            [0..BLOCK, 3 * BLOCK..4 * BLOCK],
            "the page cache still holds it"
        );
        let disk = disk.crash();
        let file = disk.open(Path::new("/f")).expect("open");
        assert_eq!(file.data_ranges().expect("ranges"), [0..BLOCK]);
    }
}
