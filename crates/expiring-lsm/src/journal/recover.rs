//! What an open on a disk that takes no writes (a full one) leaves owed, made up for once
//! the disk takes them again: the journal's next segment. Until then the journal counts as
//! failing, so readiness says so before any request is refused.

use std::sync::atomic::Ordering;

use super::shared::{lock, Shared};

impl Shared {
    /// Whether the open left the journal without a segment to write to.
    pub(super) fn owes(&self) -> bool {
        !lock(&self.writer).wal.can_write()
    }

    /// Prepares the segment the open could not make (the flush thread tries every second).
    /// True once there is one, and the journal no longer counts as failing: readiness
    /// returns without waiting for a request.
    pub(super) fn recover(&self) -> bool {
        match self.prepare_spare() {
            Ok(()) => {
                if self.failing.swap(false, Ordering::SeqCst) {
                    tracing::info!("state journal can be written again");
                }
                true
            }
            Err(error) => {
                tracing::debug!(%error, "state journal still cannot be written");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use disk_seam::sim::{Fault, OpKind, SimDisk};

    use super::super::batch::EMPTY_BATCH;
    use super::super::tests::{get, on_sim, open_with, put, temp_store, wait_until, MemStore};
    use super::super::{Journal, Settings, JOURNAL_DIR};
    use crate::wal::FRAME_HEAD;
    use crate::Digest;

    #[tokio::test]
    async fn a_store_opened_without_room_for_its_replay_run_makes_the_replay_durable_where_it_is() {
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(11);
        let dir = Path::new("/store");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        put(&j, b"stop", b"forever", i64::MAX, 0);
        // The commit's fdatasync fails, and so does the write when the journal closes: the
        // batch is in the page cache only, where a power cut loses it.
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(j.write_now().is_err());
        disk.fail_next(OpKind::Sync, Fault::Io);
        drop(j);

        // The restart reads it back, and the disk has no room for the run.
        disk.fail_next_matching(OpKind::Rename, Fault::NoSpace, "state-runs");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(j.runs(), 0, "no run was written");
        let stop = Digest::of(b"stop");
        j.durable(j.point_of(&[&stop]))
            .await
            .expect("answered from at once");
        let disk = disk.crash();
        drop(j);
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(
            get(&j, b"stop").as_deref(),
            Some(&b"forever"[..]),
            "a value the restart answered from was lost at the power cut"
        );
    }

    /// [`whole_frames`] of the synced segment at `path`.
    fn frames(disk: &SimDisk, path: &Path) -> (Vec<u64>, u64) {
        whole_frames(&disk.synced_data(path).expect("segment"))
    }

    /// Where each whole frame of segment `bytes` starts, and where its frames end.
    fn whole_frames(bytes: &[u8]) -> (Vec<u64>, u64) {
        let mut at = 8;
        let mut starts = Vec::new();
        while let Some(head) = bytes.get(at..at + FRAME_HEAD) {
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if len == 0 {
                break;
            }
            starts.push(at as u64);
            at += FRAME_HEAD + len;
        }
        (starts, at as u64)
    }

    #[test]
    fn damage_to_the_last_batch_a_full_disk_open_kept_in_its_segment_is_refused() {
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(13);
        let dir = Path::new("/store");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        put(&j, b"first", b"1", i64::MAX, 0);
        j.write_now().expect("commit");
        put(&j, b"second", b"2", i64::MAX, 0);
        j.write_now().expect("commit");
        drop(j);

        // No room for the replay's run: its batches stay in their segment, the only
        // copy of them on disk, and the restart answers from them.
        disk.fail_next_matching(OpKind::Rename, Fault::NoSpace, "state-runs");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(j.runs(), 0, "no run was written");
        assert_eq!(get(&j, b"second").as_deref(), Some(&b"2"[..]));
        drop(j);

        // The batch read last rots. No later batch follows it, unless the open wrote one.
        let segment = dir.join(JOURNAL_DIR).join("0000000000000000.wal");
        let (starts, _) = frames(&disk, &segment);
        assert!(starts.len() >= 2, "{starts:?}");
        disk.flip_synced_bit_in(&segment, starts[1] + FRAME_HEAD as u64..starts[1] + 40)
            .expect("flipped");
        let disk = disk.restart();
        let opened = Journal::open(
            store.tree("state").expect("tree"),
            dir,
            0,
            on_sim(&disk, 4096),
        );
        match opened {
            Err(error) => assert!(
                error.to_string().contains("0000000000000000.wal"),
                "{error}"
            ),
            Ok(j) => panic!(
                "opened without the acknowledged batch: second reads {:?}",
                get(&j, b"second")
            ),
        }
    }

    /// A journal on `disk` whose `kept` is in a run.
    fn kept_in_a_run(store: &MemStore, disk: &SimDisk, dir: &Path) -> Arc<Journal> {
        let j = open_with(store, dir, 0, on_sim(disk, 4096));
        put(&j, b"kept", b"1", i64::MAX, 0);
        j.write_now().expect("commit");
        j.flush_to_run().expect("flush");
        j
    }

    /// Closes `j` after a batch whose values expire soon: its fdatasync fails, and so
    /// does the write when the journal closes, so it reads back from the page cache only.
    fn close_with_a_brief_batch_in_the_page_cache(j: Arc<Journal>, disk: &SimDisk) {
        put(&j, b"brief", b"2", 100, 0);
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(j.write_now().is_err());
        disk.fail_next(OpKind::Sync, Fault::Io);
        drop(j);
    }

    /// The store on `disk` after the power cut holds `kept` and `later`.
    fn opens_with_kept_and_later(store: &MemStore, disk: &SimDisk, dir: &Path) {
        let j = Journal::open(
            store.tree("state").expect("tree"),
            dir,
            1_000,
            on_sim(disk, 4096),
        )
        .expect("the store opens after the power cut");
        assert_eq!(get(&j, b"kept").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&j, b"later").as_deref(), Some(&b"3"[..]));
    }

    #[test]
    fn a_batch_replayed_from_the_page_cache_is_made_durable_though_nothing_in_it_is_kept() {
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(14);
        let dir = Path::new("/store");
        let segment = dir.join(JOURNAL_DIR).join("0000000000000000.wal");
        let j = kept_in_a_run(&store, &disk, dir);
        // Bytes that are no frame where the next batch goes, as a write torn by an
        // earlier power cut leaves them.
        let (_, end) = frames(&disk, &segment);
        disk.flip_synced_bit_in(&segment, end..end + 4)
            .expect("flipped");
        close_with_a_brief_batch_in_the_page_cache(j, &disk);

        // The restart replays that batch and forgets its values, expired: nothing is left
        // for a run to hold, yet the next batch is numbered after it.
        let disk = disk.restart();
        let j = open_with(&store, dir, 1_000, on_sim(&disk, 4096));
        assert_eq!(j.hot_len(), 0, "the replayed value expired");
        put(&j, b"later", b"3", i64::MAX, 1_000);
        j.write_now().expect("commit");
        let disk = disk.crash();
        drop(j);

        // Had the power cut taken the replayed batch, the next segment would start past
        // a batch the damaged bytes may have held: an open that must refuse.
        opens_with_kept_and_later(&store, &disk, dir);
    }

    #[test]
    fn a_replay_is_made_durable_though_bytes_after_its_last_batch_read_as_damage() {
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(10);
        let dir = Path::new("/store");
        let segment = dir.join(JOURNAL_DIR).join("0000000000000000.wal");
        close_with_a_brief_batch_in_the_page_cache(kept_in_a_run(&store, &disk, dir), &disk);
        // Bytes that are no frame where the next batch goes and past where it ends: a
        // write torn by an earlier power cut.
        let cached = disk_seam::read(&*disk.handle(), &segment).expect("segment");
        let mark_at = whole_frames(&cached).1;
        let mark_end = mark_at + EMPTY_BATCH as u64;
        for at in [mark_at, mark_end] {
            disk.flip_synced_bit_in(&segment, at..at + 4)
                .expect("flipped");
        }

        // The restart replays the batch and writes a mark after it, but zeroing the torn
        // bytes after the mark fails: the open fails, after making the next segment.
        let disk = disk.restart();
        disk.fail_next_matching(OpKind::Write, Fault::Io, &format!(" at {mark_end}, "));
        let opened = Journal::open(
            store.tree("state").expect("tree"),
            dir,
            1_000,
            on_sim(&disk, 4096),
        );
        assert!(opened.is_err(), "the zeroing failed");
        drop(opened);

        // The next restart reads the mark from the page cache, then the torn bytes, in a
        // segment no longer the last: they read as damage, and the mark is made durable
        // all the same.
        let disk = disk.restart();
        let j = open_with(&store, dir, 1_000, on_sim(&disk, 4096));
        put(&j, b"later", b"3", i64::MAX, 1_000);
        j.write_now().expect("commit");
        // This seed's power cut keeps none of the bytes written after the last sync of
        // the first segment.
        let disk = disk.crash();
        drop(j);
        opens_with_kept_and_later(&store, &disk, dir);
    }

    #[tokio::test]
    async fn a_store_opened_without_room_for_a_segment_makes_one_once_there_is_room() {
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(12);
        let dir = Path::new("/store");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        put(&j, b"kept", b"1", i64::MAX, 0);
        j.write_now().expect("commit");
        drop(j);

        disk.fail_next_matching(OpKind::Rename, Fault::NoSpace, "state-journal");
        let settings = Settings {
            background: true,
            page_reads: crate::journal::read_here,
            ..on_sim(&disk, 4096)
        };
        let j = open_with(&store, dir, 0, settings);
        assert_eq!(
            j.journal_segments(),
            0,
            "the one read went to a run, and no segment was made"
        );
        // The flush thread makes the segment, with no request to wait for.
        wait_until("the journal can be written again", || !j.is_failing());
        put(&j, b"new", b"2", i64::MAX, 0);
        j.durable(j.sync_point()).await.expect("committed");
        drop(j);
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(get(&j, b"kept").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&j, b"new").as_deref(), Some(&b"2"[..]));
    }
}
