//! The migration of a spool an earlier version kept in sled: at the first open, every
//! entry moves into the redb tables under its own sequence number (so in its order and its
//! area), then leaves the sled tree.
//!
//! Crash safety: a page of entries is copied in one durable redb commit, with the number (or
//! legacy key) of each entry copied, and only then removed from sled. A crash before the
//! commit leaves it all in sled; a crash after it leaves entries in both, and the next open
//! skips those it copied before and removes them from sled. sled syncs its removals up to
//! half a second late, so a power cut may bring back entries copied and since drained: they
//! are skipped too, never published twice. Entries of the old `spool_corrupt` tree get new
//! numbers; the number each got is committed with it.
//!
//! The old format could leave one entry in two areas (its move to held or parked wrote the
//! new area, then removed it from the old one, with no commit spanning both). Such an entry
//! is kept in the area it was moving to: parked over held over main. The old format kept no
//! guard-key counts on disk; they are counted from the held area when the spool opens.

use crate::error::Error;
use crate::legacy::Tree;
use crate::parked_record::{encode_parked, now_secs};
use crate::record;
use crate::store::Store;
use crate::tables::{self, Area, Op, Tables};

/// The sled trees of the old spool, by area.
const LEGACY_TREES: [(&str, Area); 3] = [
    ("spool", Area::Main),
    ("spool_held", Area::Held),
    ("spool_parked", Area::Parked),
];
/// Where an even earlier version put entries it could not read; they are parked.
const LEGACY_CORRUPT_TREE: &str = "spool_corrupt";
/// Entries copied per commit.
const PAGE: usize = 1_000;

/// What the migration moved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Migrated {
    /// Entries copied into the spool.
    pub(crate) entries: u64,
    /// Copies dropped because the entry was also in the area it was moving to.
    pub(crate) duplicates: u64,
}

/// An entry of a legacy tree whose key is not a sequence number: its tree, key and value.
type Stray = (Tree, Vec<u8>, Vec<u8>);

/// Moves the legacy sled spool of `store`, if any, into `tables`.
pub(crate) fn from_legacy(store: &Store, tables: &Tables) -> Result<Migrated, Error> {
    let mut migrated = Migrated::default();
    if !store.has_legacy() {
        return Ok(migrated);
    }
    let trees: Vec<(Tree, Area)> = LEGACY_TREES
        .iter()
        .map(|(name, area)| Ok((store.tree(name)?, *area)))
        .collect::<Result<_, Error>>()?;
    // Entries whose keys are not sequence numbers are parked under new numbers, after the
    // rest.
    let mut strays: Vec<Stray> = Vec::new();
    for (tree, area) in &trees {
        copy_tree(&trees, tables, tree, *area, &mut migrated, &mut strays)?;
    }
    let corrupt = store.tree(LEGACY_CORRUPT_TREE)?;
    strays.extend(
        corrupt
            .page(None, usize::MAX)?
            .into_iter()
            .map(|(k, v)| (corrupt.clone(), k, v)),
    );
    park_strays(tables, &strays, &mut migrated)?;
    store.flush_blocking()?;
    if migrated.entries > 0 || migrated.duplicates > 0 {
        tracing::info!(
            entries = migrated.entries,
            duplicates = migrated.duplicates,
            "spool migrated from the legacy sled store"
        );
    }
    Ok(migrated)
}

/// Copies the entries of `tree` (the legacy `area`) under their own numbers, a page per
/// commit, and removes each page from sled once committed. Entries whose keys are not
/// numbers are left in sled and added to `strays`.
fn copy_tree(
    trees: &[(Tree, Area)],
    tables: &Tables,
    tree: &Tree,
    area: Area,
    migrated: &mut Migrated,
    strays: &mut Vec<Stray>,
) -> Result<(), Error> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = tree.page(after.as_deref(), PAGE)?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        after = Some(last.clone());
        let mut ops = Vec::with_capacity(page.len());
        for (key, value) in &page {
            let Some(seq) = seq_of(key) else {
                strays.push((tree.clone(), key.clone(), value.clone()));
                continue;
            };
            if tables.seq_migrated(seq)? {
                // Copied by an earlier run: in redb still, or drained since.
                continue;
            }
            if moved_on(trees, tables, area, key, seq)? {
                // Its copy in the later area is copied (and recorded) under this number.
                migrated.duplicates += 1;
                continue;
            }
            ops.push(Op::Put {
                area,
                seq,
                value: value.clone(),
            });
            ops.push(Op::MigratedSeq(seq));
        }
        tables::commit(&tables.db(), &ops)?;
        migrated.entries += ops.iter().filter(|op| matches!(op, Op::Put { .. })).count() as u64;
        for (key, _) in &page {
            if seq_of(key).is_some() {
                tree.remove(key)?;
            }
        }
    }
}

/// Parks `strays` under numbers after every entry's, a page per commit, each number
/// committed with the entry's legacy key so that a second run reuses it; removes each
/// page from sled once committed.
fn park_strays(tables: &Tables, strays: &[Stray], migrated: &mut Migrated) -> Result<(), Error> {
    let mut next = next_seq(tables)?;
    for chunk in strays.chunks(PAGE) {
        let mut ops = Vec::new();
        for (tree, key, value) in chunk {
            let legacy_key = tree_tag(tree, key);
            if tables.migrated(&legacy_key)?.is_some() {
                // Parked by an earlier run: parked still, or deleted by an operator since.
                continue;
            }
            let seq = next;
            next += 1;
            let reason = if record::decode(value).is_ok() {
                "set aside by an earlier version"
            } else {
                "set aside as unreadable by an earlier version"
            };
            ops.push(Op::Put {
                area: Area::Parked,
                seq,
                value: encode_parked(reason, now_secs(), value),
            });
            ops.push(Op::Migrated { legacy_key, seq });
        }
        tables::commit(&tables.db(), &ops)?;
        migrated.entries += (ops.len() / 2) as u64;
        for (tree, key, _) in chunk {
            tree.remove(key)?;
        }
    }
    Ok(())
}

/// Whether entry `seq` of `area` also sits in an area it was moving to (held, then
/// parked), in sled or already in redb.
fn moved_on(
    trees: &[(Tree, Area)],
    tables: &Tables,
    area: Area,
    key: &[u8],
    seq: u64,
) -> Result<bool, Error> {
    let later: &[Area] = match area {
        Area::Main => &[Area::Held, Area::Parked],
        Area::Held => &[Area::Parked],
        Area::Parked => &[],
    };
    for other in later {
        if tables.get(*other, seq)?.is_some() {
            return Ok(true);
        }
        for (tree, tree_area) in trees {
            if tree_area == other && tree.get(key)?.is_some() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The number above every entry in the tables.
fn next_seq(tables: &Tables) -> Result<u64, Error> {
    let mut next = 0;
    for area in [Area::Main, Area::Held, Area::Parked] {
        if let Some(last) = tables.last_seq(area)? {
            next = next.max(last.saturating_add(1));
        }
    }
    Ok(next)
}

/// The key a stray entry is remembered by: its tree's name and its key.
fn tree_tag(tree: &Tree, key: &[u8]) -> Vec<u8> {
    let mut tag = tree.name().as_bytes().to_vec();
    tag.push(0);
    tag.extend_from_slice(key);
    tag
}

pub(crate) fn seq_of(key: &[u8]) -> Option<u64> {
    key.try_into().ok().map(u64::from_be_bytes)
}
