//! The simulated disk against its promises: what a power cut keeps, what a failed sync
//! drops, what injected faults and damage do, and that a seed replays.

use std::path::Path;
use std::sync::Arc;

use super::{Fault, OpKind, SimDisk, WriteDamage, EIO, ENOSPC};
use crate::{create_dir_all, read, Disk, DiskFile};

fn write_file(disk: &SimDisk, path: &str, bytes: &[u8]) -> Arc<dyn DiskFile> {
    let file = disk.create(Path::new(path)).expect("create");
    file.write_all_at(bytes, 0).expect("write");
    file
}

#[test]
fn synced_data_and_synced_entries_survive_a_crash() {
    let disk = SimDisk::new(1);
    create_dir_all(&disk, Path::new("/d")).expect("mkdir");
    let file = write_file(&disk, "/d/f", b"durable");
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/d")).expect("sync dir");
    let disk = disk.crash();
    assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), b"durable");
    assert!(
        file.len().is_err(),
        "a handle from before the crash is dead"
    );
}

#[test]
fn an_entry_not_followed_by_a_sync_of_its_directory_is_undone() {
    let disk = SimDisk::new(2);
    create_dir_all(&disk, Path::new("/d")).expect("mkdir");
    write_file(&disk, "/d/old", b"x").sync_all().expect("sync");
    disk.sync_dir(Path::new("/d")).expect("sync dir");
    disk.rename(Path::new("/d/old"), Path::new("/d/new"))
        .expect("rename");
    write_file(&disk, "/d/created", b"y")
        .sync_all()
        .expect("sync");
    disk.create_dir(Path::new("/d/sub")).expect("mkdir");
    assert_eq!(
        disk.list(Path::new("/d")).expect("list"),
        ["created", "new", "sub"]
    );
    let disk = disk.crash();
    assert_eq!(disk.list(Path::new("/d")).expect("list"), ["old"]);
    assert_eq!(read(&disk, Path::new("/d/old")).expect("read"), b"x");
    // A removal is undone the same way.
    disk.remove(Path::new("/d/old")).expect("remove");
    let disk = disk.crash();
    assert_eq!(disk.list(Path::new("/d")).expect("list"), ["old"]);
    disk.remove(Path::new("/d/old")).expect("remove");
    disk.sync_dir(Path::new("/d")).expect("sync dir");
    let disk = disk.crash();
    assert!(disk.list(Path::new("/d")).expect("list").is_empty());
}

#[test]
fn a_directory_whose_parent_was_not_synced_is_lost_with_its_files() {
    let disk = SimDisk::new(3);
    disk.create_dir(Path::new("/a")).expect("mkdir");
    disk.create_dir(Path::new("/a/b")).expect("mkdir");
    write_file(&disk, "/a/b/f", b"z").sync_all().expect("sync");
    disk.sync_dir(Path::new("/a/b")).expect("sync b");
    disk.sync_dir(Path::new("/a")).expect("sync a");
    // `/a` itself is not durable in `/`.
    let disk = disk.crash();
    assert!(!disk.is_dir(Path::new("/a")));
    create_dir_all(&disk, Path::new("/a/b")).expect("mkdir -p syncs each parent");
    let disk = disk.crash();
    assert!(disk.is_dir(Path::new("/a/b")));
}

#[test]
fn unsynced_writes_survive_only_as_a_prefix() {
    // Over many seeds, every outcome is a prefix of the write sequence, and both the
    // whole and nothing occur.
    let (mut whole, mut none) = (false, false);
    for seed in 0..200 {
        let disk = SimDisk::new(seed);
        let file = disk.create(Path::new("/f")).expect("create");
        file.write_all_at(b"aaaa", 0).expect("write");
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/")).expect("sync dir");
        file.write_all_at(b"bbbb", 4).expect("write");
        file.write_all_at(b"cccc", 8).expect("write");
        let disk = disk.crash();
        let bytes = read(&disk, Path::new("/f")).expect("read");
        let full = b"aaaabbbbcccc";
        assert!(
            bytes.len() >= 4 && full.starts_with(&bytes),
            "seed {seed}: {bytes:?}"
        );
        whole |= bytes.len() == 12;
        none |= bytes.len() == 4;
    }
    assert!(whole && none);
}

#[test]
fn a_failed_sync_loses_the_data_at_a_crash_though_it_reads_back() {
    let disk = SimDisk::new(4);
    let file = write_file(&disk, "/f", b"first");
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/")).expect("sync dir");
    file.write_all_at(b"SECOND", 0).expect("write");
    disk.fail_next(OpKind::Sync, Fault::Io);
    let error = file.sync_data().expect_err("injected");
    assert_eq!(error.raw_os_error(), Some(EIO));
    assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"SECOND");
    file.sync_data()
        .expect("a later sync succeeds, but has nothing left to write");
    let disk = disk.crash();
    assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"first");
}

#[test]
fn a_length_a_failed_sync_left_is_written_by_the_next_sync() {
    let disk = SimDisk::new(5);
    let file = write_file(&disk, "/f", b"first");
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/")).expect("sync dir");
    file.set_len(4096).expect("grow");
    file.write_all_at(b"page", 1024).expect("write");
    disk.fail_next(OpKind::Sync, Fault::NoSpace);
    assert!(file.sync_data().is_err());
    file.sync_data().expect("a later sync succeeds");
    let disk = disk.crash();
    let bytes = read(&disk, Path::new("/f")).expect("read");
    assert_eq!(
        bytes.len(),
        4096,
        "the length is the inode's, kept to be written"
    );
    assert_eq!(
        &bytes[1024..1028],
        [0; 4],
        "the page a failed sync dropped is lost"
    );
}

#[test]
fn a_restart_keeps_what_a_failed_sync_left_until_a_power_cut() {
    let disk = SimDisk::new(8);
    let file = write_file(&disk, "/f", b"first");
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/")).expect("sync dir");
    file.write_all_at(b"SECOND", 0).expect("write");
    disk.fail_next(OpKind::Sync, Fault::Io);
    assert!(file.sync_data().is_err());
    write_file(&disk, "/unsynced", b"u");
    let disk = disk.restart();
    assert!(
        file.len().is_err(),
        "a handle from before the restart is dead"
    );
    assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"SECOND");
    assert_eq!(disk.list(Path::new("/")).expect("list"), ["f", "unsynced"]);
    let disk = disk.crash();
    assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"first");
    assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
}

#[test]
fn scheduled_faults_hit_their_kind_and_change_nothing() {
    let disk = SimDisk::new(5);
    disk.fail_next(OpKind::Write, Fault::NoSpace);
    disk.fail_next(OpKind::Rename, Fault::Io);
    disk.fail_next(OpKind::Remove, Fault::Io);
    let error = disk.create(Path::new("/f")).err().expect("ENOSPC");
    assert_eq!(error.raw_os_error(), Some(ENOSPC));
    assert!(disk.list(Path::new("/")).expect("list").is_empty());
    write_file(&disk, "/f", b"v");
    assert!(disk.rename(Path::new("/f"), Path::new("/g")).is_err());
    assert!(disk.remove(Path::new("/f")).is_err());
    assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
    assert_eq!(disk.faults_injected(), 3);
}

#[test]
fn after_the_power_cut_point_every_call_fails_until_the_crash() {
    let disk = SimDisk::new(6);
    let file = write_file(&disk, "/f", b"v");
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/")).expect("sync dir");
    disk.cut_power_after(2);
    disk.rename(Path::new("/f"), Path::new("/g"))
        .expect("the first still runs");
    assert!(disk.remove(Path::new("/g")).is_err(), "the second does not");
    assert!(disk.power_is_cut());
    assert!(
        disk.list(Path::new("/")).is_err(),
        "nor does anything after it"
    );
    let disk = disk.crash();
    assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
    assert!(disk
        .recent()
        .iter()
        .any(|l| l.contains("power cut before: remove /g")));
}

#[test]
fn random_faults_follow_the_seed() {
    let run = |seed| {
        let disk = SimDisk::new(seed);
        disk.fail_randomly(300_000);
        (0..50)
            .map(|i| disk.create(Path::new(&format!("/f{i}"))).is_ok())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert!(run(7).contains(&false) && run(7).contains(&true));
}

/// A synced file `/d/f` of `bytes` on a disk of `seed`.
fn synced(seed: u64, bytes: &[u8]) -> (SimDisk, Arc<dyn DiskFile>) {
    let disk = SimDisk::new(seed);
    create_dir_all(&disk, Path::new("/d")).expect("mkdir");
    let file = write_file(&disk, "/d/f", bytes);
    file.sync_data().expect("sync");
    disk.sync_dir(Path::new("/d")).expect("sync dir");
    (disk, file)
}

#[test]
fn a_flipped_bit_in_synced_data_reads_back_survives_a_power_cut_and_repairs() {
    let (disk, _file) = synced(11, &[0u8; 64]);
    let flip = disk
        .flip_synced_bit(Path::new("/d"))
        .expect("a byte to flip");
    assert_eq!(flip.path, Path::new("/d/f"));
    let differs = |bytes: Vec<u8>| {
        bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != 0)
            .map(|(i, b)| (i as u64, *b))
            .collect::<Vec<_>>()
    };
    let seen = differs(read(&disk, Path::new("/d/f")).expect("read"));
    assert_eq!(seen, [(flip.offset, flip.mask)], "reads see it at once");
    let disk = disk.crash();
    let kept = differs(read(&disk, Path::new("/d/f")).expect("read"));
    assert_eq!(kept, [(flip.offset, flip.mask)], "a power cut keeps it");
    assert_eq!(disk.repair_flips(), 1);
    assert!(differs(read(&disk, Path::new("/d/f")).expect("read")).is_empty());
    let again = synced(11, &[0u8; 64]).0.flip_synced_bit(Path::new("/d"));
    assert_eq!(again, Some(flip), "the seed picks the same bit");
    assert_eq!(SimDisk::new(1).flip_synced_bit(Path::new("/")), None);
    let within = disk.flip_synced_bit_in(Path::new("/d/f"), 10..12);
    assert!(within.is_some_and(|f| (10..12).contains(&f.offset)));
    assert_eq!(disk.flip_synced_bit_in(Path::new("/d/f"), 64..90), None);
    assert_eq!(disk.flip_synced_bit_in(Path::new("/d/g"), 0..9), None);
    let file = disk.open_rw(Path::new("/d/f")).expect("open");
    file.write_all_at(b"unsynced", 0).expect("write");
    let synced = disk.synced_data(Path::new("/d/f")).expect("a file");
    assert_eq!(synced.len(), 64);
    assert_ne!(&synced[..8], b"unsynced");
}

#[test]
fn a_bit_a_write_covered_since_is_not_undone() {
    let (disk, file) = synced(12, &[0u8; 8]);
    let flip = disk
        .flip_synced_bit(Path::new("/d"))
        .expect("a byte to flip");
    file.write_all_at(&[7u8; 8], 0).expect("write");
    assert_eq!(disk.repair_flips(), 0, "{flip:?}");
    assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), [7u8; 8]);
}

#[test]
fn a_torn_write_reads_whole_until_a_power_cut_keeps_only_a_prefix_though_synced() {
    let (disk, file) = synced(13, b"aaaaaaaa");
    disk.damage_next_write(WriteDamage::Tear, "/d/f");
    file.write_all_at(b"bbbbbbbb", 0).expect("write");
    file.sync_data().expect("the sync succeeds");
    assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), b"bbbbbbbb");
    let disk = disk.crash();
    let bytes = read(&disk, Path::new("/d/f")).expect("read");
    let kept = bytes.iter().take_while(|b| **b == b'b').count();
    assert!(kept < 8, "{bytes:?}");
    assert!(bytes[kept..].iter().all(|b| *b == b'a'), "{bytes:?}");
    assert!(disk.recent().iter().any(|l| l.contains("Tear injected")));
}

#[test]
fn a_misdirected_write_lands_at_another_offset_though_synced() {
    let (disk, file) = synced(14, &[b'a'; 32]);
    disk.damage_next_write(WriteDamage::Misdirect, "/d/");
    file.write_all_at(b"bbbb", 8).expect("write");
    file.sync_data().expect("the sync succeeds");
    let mut expected = vec![b'a'; 32];
    expected[8..12].copy_from_slice(b"bbbb");
    assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), expected);
    let disk = disk.crash();
    let bytes = read(&disk, Path::new("/d/f")).expect("read");
    assert_eq!(&bytes[8..12], b"aaaa", "not where it was aimed: {bytes:?}");
    let at = bytes
        .windows(4)
        .position(|w| w == b"bbbb")
        .expect("the bytes landed somewhere");
    assert_ne!(at, 8);
    // A write to another file is not the one damaged.
    let (disk, file) = synced(14, b"aaaa");
    disk.damage_next_write(WriteDamage::Misdirect, "/elsewhere");
    file.write_all_at(b"bb", 0).expect("write");
    file.sync_data().expect("sync");
    assert_eq!(
        read(&disk.crash(), Path::new("/d/f")).expect("read"),
        b"bbaa"
    );
}

#[test]
fn reordered_unsynced_writes_can_land_without_the_earlier_ones() {
    let outcome = |seed| {
        let (disk, file) = synced(seed, b"aaaaaaaa");
        file.write_all_at(b"bb", 0).expect("write");
        file.write_all_at(b"cc", 2).expect("write");
        file.write_all_at(b"dd", 4).expect("write");
        disk.reorder_at_next_power_cut();
        read(&disk.crash(), Path::new("/d/f")).expect("read")
    };
    let outcomes: Vec<Vec<u8>> = (0..64).map(outcome).collect();
    assert!(
        outcomes
            .iter()
            .any(|b| b == b"aaccaaaa" || b == b"aaaaddaa"),
        "a later write without the earlier: {outcomes:?}"
    );
    assert_eq!(outcome(5), outcome(5), "the seed decides");
    // Only the next power cut reorders: the one after it keeps a prefix again.
    for seed in 0..64 {
        let (disk, _) = synced(seed, b"aa");
        disk.reorder_at_next_power_cut();
        let disk = disk.crash();
        let file = disk.open_rw(Path::new("/d/f")).expect("open");
        file.write_all_at(b"b", 0).expect("write");
        file.write_all_at(b"c", 1).expect("write");
        let bytes = read(&disk.crash(), Path::new("/d/f")).expect("read");
        assert_ne!(bytes, b"ac", "seed {seed}");
    }
}
