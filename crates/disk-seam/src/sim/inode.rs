//! A file of the simulated disk, as the disk holds it: what reads see, what is synced, the
//! changes since, and bits flipped in its synced data. [`Inode::power_cut`] keeps what a
//! power cut keeps of it.

use super::blocks::Blocks;
use super::change::{land, write_bytes, Pending};
use super::rng::Rng;

/// A file's data and what a power cut keeps of it.
#[derive(Default)]
pub(super) struct Inode {
    /// What reads see.
    pub(super) data: Vec<u8>,
    /// What a power cut keeps for certain.
    pub(super) durable: Vec<u8>,
    /// Changes since the last sync, oldest first: a power cut keeps a prefix of them.
    pub(super) pending: Vec<Pending>,
    /// Bits flipped in synced data (offset, mask) that no write has covered since: what
    /// [`super::SimDisk::repair_flips`] can undo.
    pub(super) flipped: Vec<(u64, u8)>,
    /// The blocks of `data` that hold data; the rest are holes.
    pub(super) blocks: Blocks,
    /// The blocks of `durable` that hold data.
    pub(super) durable_blocks: Blocks,
}

impl Inode {
    /// Puts a change on the platter, as it lands.
    pub(super) fn land(&mut self, change: &Pending) {
        land(&mut self.durable, change);
        self.durable_blocks.land(change);
    }

    /// Keeps what a power cut keeps of the file: its synced data and a random prefix of
    /// the changes since, the next write possibly torn; with `reorder`, any subset of the
    /// changes since, in their order (the device wrote them back out of order).
    pub(super) fn power_cut(&mut self, rng: &mut Rng, reorder: bool) {
        let pending = std::mem::take(&mut self.pending);
        if reorder {
            for change in &pending {
                if rng.below(2) == 0 {
                    self.land(change);
                }
            }
        } else {
            let kept = rng.below(pending.len() as u64 + 1) as usize;
            for change in &pending[..kept] {
                self.land(change);
            }
            if let Some(Pending::Write { offset, bytes, .. }) = pending.get(kept) {
                // The next write torn: some of its bytes reached the platter.
                let torn = rng.below(bytes.len() as u64) as usize;
                write_bytes(&mut self.durable, *offset, &bytes[..torn]);
                self.durable_blocks.take(*offset, torn as u64);
            }
        }
        self.flipped
            .retain(|(at, _)| (*at as usize) < self.durable.len());
        self.data = self.durable.clone();
        self.blocks = self.durable_blocks.clone();
    }

    /// Forgets flipped bits a change to the cache covers: undoing them would damage it.
    pub(super) fn covered(&mut self, change: &Pending) {
        match change {
            Pending::Write { offset, bytes, .. } => {
                let end = offset + bytes.len() as u64;
                self.flipped.retain(|(at, _)| *at < *offset || *at >= end);
            }
            Pending::SetLen(len) => self.flipped.retain(|(at, _)| at < len),
        }
    }
}
