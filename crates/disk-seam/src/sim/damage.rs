//! Damage a test does to the simulated disk's data: bits flipped in synced data (and their
//! repair), torn or misdirected writes, and unsynced writes reordered at a power cut.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::faults::{Flip, WriteDamage};
use super::paths::absolute;
use super::state::{lock, Node, State};
use super::SimDisk;

/// Tries of [`SimDisk::flip_synced_bit`] for a byte whose synced and cached copies agree.
const FLIP_TRIES: usize = 16;

impl SimDisk {
    /// Flips one bit of synced data in a file under `dir` (at any depth), both picked at
    /// random: in a byte whose cached copy is the synced one, so reads see the flip at
    /// once, as after the page cache dropped the page. `None` if no file there holds such
    /// a byte.
    pub fn flip_synced_bit(&self, dir: &Path) -> Option<Flip> {
        let dir = absolute(dir);
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let files: Vec<(PathBuf, u64)> = state
            .live
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(id) if p.starts_with(&dir) => Some((p.clone(), *id)),
                _ => None,
            })
            .filter(|(_, id)| state.inodes.get(id).is_some_and(|f| !f.durable.is_empty()))
            .collect();
        if files.is_empty() {
            return None;
        }
        let (path, id) = files[state.rng.below(files.len() as u64) as usize].clone();
        flip_in(state, path, id, 0..u64::MAX)
    }

    /// Flips one bit, picked at random, of the synced data of the file at `path` within
    /// the bytes `within`, as [`SimDisk::flip_synced_bit`] does. `None` if the file holds
    /// no such byte there.
    pub fn flip_synced_bit_in(&self, path: &Path, within: Range<u64>) -> Option<Flip> {
        let path = absolute(path);
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let Some(Node::File(id)) = state.live.get(&path) else {
            return None;
        };
        let id = *id;
        flip_in(state, path, id, within)
    }

    /// What a power cut now keeps for certain of the file at `path`: its synced data.
    /// `None` if no file is there.
    pub fn synced_data(&self, path: &Path) -> Option<Vec<u8>> {
        let path = absolute(path);
        let state = lock(&self.state);
        match state.live.get(&path) {
            Some(Node::File(id)) => state.inodes.get(id).map(|f| f.durable.clone()),
            _ => None,
        }
    }

    /// Undoes the bits [`SimDisk::flip_synced_bit`] flipped that no write or length change
    /// has covered since (an operator restoring the damaged bytes). Returns how many.
    pub fn repair_flips(&self) -> usize {
        let mut state = lock(&self.state);
        let mut repaired = 0;
        for file in state.inodes.values_mut() {
            for (at, mask) in std::mem::take(&mut file.flipped) {
                let at = at as usize;
                if let (Some(d), Some(c)) = (file.durable.get_mut(at), file.data.get_mut(at)) {
                    *d ^= mask;
                    *c ^= mask;
                    repaired += 1;
                }
            }
        }
        state.note(format_args!("{repaired} flipped bits repaired"));
        repaired
    }

    /// The next write to a file whose path (at the write) contains `text` suffers
    /// `damage` (after those scheduled before it): torn or misdirected on the platter,
    /// whatever its sync says.
    pub fn damage_next_write(&self, damage: WriteDamage, text: &str) {
        lock(&self.state)
            .write_damage
            .push_back((damage, text.to_owned()));
    }

    /// The next power cut keeps any subset of each file's unsynced writes, not only a
    /// prefix: a device that wrote its cache back out of order.
    pub fn reorder_at_next_power_cut(&self) {
        lock(&self.state).reorder_next_cut = true;
    }
}

/// Flips a random bit of a random byte of file `id` (at `path`) within `within` whose
/// synced and cached copies agree.
fn flip_in(state: &mut State, path: PathBuf, id: u64, within: Range<u64>) -> Option<Flip> {
    let mask = 1u8 << state.rng.below(8);
    let file = state.inodes.get(&id)?;
    let end = within
        .end
        .min(file.durable.len().min(file.data.len()) as u64);
    if within.start >= end {
        return None;
    }
    for _ in 0..FLIP_TRIES {
        let at = (within.start + state.rng.below(end - within.start)) as usize;
        let file = state.inodes.get_mut(&id)?;
        // A hole has no block a bit could flip in.
        let in_hole = !file.durable_blocks.holds(at as u64);
        if in_hole || file.data.get(at) != file.durable.get(at) {
            continue;
        }
        file.durable[at] ^= mask;
        file.data[at] ^= mask;
        file.flipped.push((at as u64, mask));
        let flip = Flip {
            path,
            offset: at as u64,
            mask,
        };
        state.note(format_args!("bit flipped: {flip:?}"));
        return Some(flip);
    }
    None
}
