//! What the simulated disk holds: its files ([`Inode`]), its directories' entries (live and
//! synced), and the faults to come. [`State::power_cut`] keeps what a power cut keeps;
//! [`State::begin`] counts an operation and decides whether it fails.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::change::Landing;
use super::faults::{Fault, OpKind, WriteDamage};
use super::inode::Inode;
use super::paths::{parent, root};
use super::rng::Rng;

/// Operations kept for [`super::SimDisk::recent`].
const TRACE: usize = 48;

/// An entry of a directory: a directory, or a file's inode.
#[derive(Clone, Copy)]
pub(super) enum Node {
    Dir,
    File(u64),
}

pub(super) struct State {
    pub(super) generation: u64,
    pub(super) rng: Rng,
    /// Operations that change the disk (reads excluded), since the disk was made.
    pub(super) ops: u64,
    /// The operation at which the power goes: it and every later call fail.
    pub(super) cut_at: Option<u64>,
    pub(super) cut: bool,
    /// Each of the next operations of a kind (whose description holds the text, if one is
    /// given) fails with its fault, in order.
    pub(super) scheduled: VecDeque<(OpKind, Fault, Option<String>)>,
    /// Every faultable operation fails with this chance in a million.
    pub(super) random_faults: u32,
    pub(super) faults_injected: u64,
    pub(super) live: BTreeMap<PathBuf, Node>,
    pub(super) durable: BTreeMap<PathBuf, Node>,
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) next_inode: u64,
    pub(super) trace: VecDeque<String>,
    /// Damage the next writes to files whose path holds the text suffer, in order.
    pub(super) write_damage: VecDeque<(WriteDamage, String)>,
    /// Whether the next power cut keeps any subset of each file's unsynced writes (a later
    /// one without an earlier), not only a prefix.
    pub(super) reorder_next_cut: bool,
    /// While true, every sync waits (a hung device); a condition variable wakes them.
    pub(super) syncs_held: Arc<(Mutex<bool>, Condvar)>,
}

impl State {
    /// An empty disk (only `/`) whose chances follow `seed`.
    pub(super) fn new(seed: u64) -> Self {
        let mut live = BTreeMap::new();
        live.insert(root(), Node::Dir);
        let mut durable = BTreeMap::new();
        durable.insert(root(), Node::Dir);
        State {
            generation: 0,
            rng: Rng::new(seed),
            ops: 0,
            cut_at: None,
            cut: false,
            scheduled: VecDeque::new(),
            random_faults: 0,
            faults_injected: 0,
            live,
            durable,
            inodes: HashMap::new(),
            next_inode: 0,
            trace: VecDeque::new(),
            write_damage: VecDeque::new(),
            reorder_next_cut: false,
            syncs_held: Arc::default(),
        }
    }

    /// A power cut: every file keeps its synced data and a random prefix of its unsynced
    /// writes, every directory its synced entries, and the next generation starts. Returns
    /// it.
    pub(super) fn power_cut(&mut self) -> u64 {
        self.generation += 1;
        self.cut = false;
        self.cut_at = None;
        self.scheduled.clear();
        let reorder = std::mem::take(&mut self.reorder_next_cut);
        let mut ids: Vec<u64> = self.inodes.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(inode) = self.inodes.get_mut(&id) {
                inode.power_cut(&mut self.rng, reorder);
            }
        }
        self.keep_synced_entries();
        let generation = self.generation;
        self.note(format_args!("power cut; generation {generation} starts"));
        generation
    }

    /// A process restart: nothing on the disk or in the page cache changes; the next
    /// generation starts. Returns it.
    pub(super) fn restart(&mut self) -> u64 {
        self.generation += 1;
        self.scheduled.clear();
        let generation = self.generation;
        self.note(format_args!(
            "process restart; generation {generation} starts"
        ));
        generation
    }

    /// Keeps the synced entries of every directory that survives (an entry whose directory
    /// did not survive is gone with it), and the files they name.
    fn keep_synced_entries(&mut self) {
        let durable = std::mem::take(&mut self.durable);
        let mut kept: BTreeMap<PathBuf, Node> = BTreeMap::new();
        // Parents sort before their children.
        for (path, node) in durable {
            if path == root() || matches!(kept.get(&parent(&path)), Some(Node::Dir)) {
                kept.insert(path, node);
            }
        }
        self.live = kept.clone();
        self.durable = kept;
        let used: HashSet<u64> = self
            .live
            .values()
            .filter_map(|n| match n {
                Node::File(i) => Some(*i),
                Node::Dir => None,
            })
            .collect();
        self.inodes.retain(|id, _| used.contains(id));
    }

    pub(super) fn alive(&self, generation: u64) -> io::Result<()> {
        if self.cut || generation != self.generation {
            return Err(Fault::Io.error());
        }
        Ok(())
    }

    pub(super) fn note(&mut self, what: std::fmt::Arguments<'_>) {
        if self.trace.len() == TRACE {
            self.trace.pop_front();
        }
        let line = format!("#{} {what}", self.ops);
        self.trace.push_back(line);
    }

    /// Counts an operation that changes the disk and decides whether it fails.
    pub(super) fn begin(
        &mut self,
        generation: u64,
        kind: Option<OpKind>,
        what: std::fmt::Arguments<'_>,
    ) -> io::Result<()> {
        self.alive(generation)?;
        self.ops += 1;
        if self.cut_at.is_some_and(|at| self.ops >= at) {
            self.cut = true;
            self.note(format_args!("power cut before: {what}"));
            return Err(Fault::Io.error());
        }
        let Some(kind) = kind else {
            self.note(what);
            return Ok(());
        };
        let described = what.to_string();
        let due = |(k, _, text): &(OpKind, Fault, Option<String>)| {
            *k == kind && text.as_ref().is_none_or(|t| described.contains(t.as_str()))
        };
        let fault = match self.scheduled.iter().position(due) {
            Some(at) => self.scheduled.remove(at).map(|(_, f, _)| f),
            None if self.random_faults > 0 && self.rng.chance(self.random_faults) => {
                Some(if self.rng.below(2) == 0 {
                    Fault::NoSpace
                } else {
                    Fault::Io
                })
            }
            None => None,
        };
        match fault {
            Some(fault) => {
                self.faults_injected += 1;
                self.note(format_args!("{fault:?} injected: {what}"));
                Err(fault.error())
            }
            None => {
                self.note(what);
                Ok(())
            }
        }
    }

    /// The path a file has now, if a directory holds it.
    pub(super) fn path_of(&self, id: u64) -> Option<&PathBuf> {
        self.live
            .iter()
            .find(|(_, n)| matches!(n, Node::File(i) if *i == id))
            .map(|(p, _)| p)
    }

    /// How a write of `len` bytes at `offset` to file `id` lands: damaged if one is
    /// scheduled for its path.
    pub(super) fn landing(&mut self, id: u64, offset: u64, len: usize) -> Landing {
        let Some(path) = self.path_of(id).map(|p| p.display().to_string()) else {
            return Landing::Whole;
        };
        let Some(at) = self
            .write_damage
            .iter()
            .position(|(_, text)| path.contains(text.as_str()))
        else {
            return Landing::Whole;
        };
        let Some((damage, _)) = self.write_damage.remove(at) else {
            return Landing::Whole;
        };
        let landing = match damage {
            WriteDamage::Tear => Landing::Torn(self.rng.below(len as u64) as usize),
            WriteDamage::Misdirect => {
                let size = self.inodes.get(&id).map_or(0, |f| f.data.len() as u64);
                let room = size.max(offset + len as u64) - len as u64;
                let elsewhere = self.rng.below(room + 1);
                // Other bytes than those aimed at: just past them if the draw overlaps.
                Landing::At(if elsewhere.abs_diff(offset) < len as u64 {
                    offset + len as u64
                } else {
                    elsewhere
                })
            }
        };
        self.note(format_args!(
            "{damage:?} injected: write to {path} at {offset}, {len} bytes lands {landing:?}"
        ));
        landing
    }

    pub(super) fn inode(&mut self, id: u64) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&id).ok_or_else(|| Fault::Io.error())
    }
}

/// Locks the disk; a panic of another holder does not make it unusable.
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits while syncs are held ([`super::SimDisk::hold_syncs`]).
pub(super) fn wait_while_held(state: &Mutex<State>) {
    let gate = lock(state).syncs_held.clone();
    let mut held = gate.0.lock().unwrap_or_else(PoisonError::into_inner);
    while *held {
        held = gate.1.wait(held).unwrap_or_else(PoisonError::into_inner);
    }
}
