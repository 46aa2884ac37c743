//! The spool's tables in its redb database: one per area, keyed by sequence number, and
//! the reads of them; the writes are [`Op`]s that the writer thread commits.

use std::sync::{Arc, PoisonError, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::error::Error;

/// Which area an entry is in. An entry keeps its sequence number (its arrival order) when it
/// moves between areas, so a key names one entry in whichever area holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Area {
    /// The FIFO the drainer publishes from, head first.
    Main,
    /// Entries no queue takes yet, and the later entries of their guard keys.
    Held,
    /// Entries waiting for an operator; values are parked records.
    Parked,
}

/// An entry by area and number.
pub(crate) type EntryRef = (Area, u64);

impl Area {
    fn table(self) -> TableDefinition<'static, u64, &'static [u8]> {
        match self {
            Area::Main => MAIN,
            Area::Held => HELD,
            Area::Parked => PARKED,
        }
    }
}

const MAIN: TableDefinition<u64, &[u8]> = TableDefinition::new("spool_main");
const HELD: TableDefinition<u64, &[u8]> = TableDefinition::new("spool_held");
const PARKED: TableDefinition<u64, &[u8]> = TableDefinition::new("spool_parked");
/// The sequence numbers the migration gave entries of the legacy `spool_corrupt` tree, by
/// their old key: a migration run again after a crash reuses them instead of parking the
/// entry twice.
const MIGRATED: TableDefinition<&[u8], u64> = TableDefinition::new("spool_migrated_corrupt");
/// The numbers of the legacy entries the migration copied, committed with the copies: sled
/// syncs its removals up to half a second late, so a power cut can bring back entries
/// already copied and drained, and a migration run again skips them.
const MIGRATED_SEQS: TableDefinition<u64, ()> = TableDefinition::new("spool_migrated_seqs");

/// One change of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Sets entry `seq` of `area`.
    Put {
        area: Area,
        seq: u64,
        value: Vec<u8>,
    },
    /// Removes entry `seq` of `area` (nothing if it is absent).
    Remove { area: Area, seq: u64 },
    /// Records the number a legacy corrupt entry was given.
    Migrated { legacy_key: Vec<u8>, seq: u64 },
    /// Records that legacy entry `seq` was copied.
    MigratedSeq(u64),
}

/// An entry: its sequence number and value.
pub(crate) type Row = (u64, Vec<u8>);

/// An entry by area and number, and its value (`None`: absent).
pub(crate) type Slot = (Area, u64, Option<Vec<u8>>);

/// Read access to the tables; cheap to clone.
#[derive(Clone)]
pub(crate) struct Tables {
    /// The database open now: the writer replaces it when it opens the file again after an
    /// I/O error. A read takes a clone of the handle, so a read under way finishes (or
    /// fails) on the handle it started on.
    db: Arc<RwLock<Arc<Database>>>,
}

impl Tables {
    /// Creates the tables that do not exist yet, in one durable commit.
    pub(crate) fn open(db: Arc<Database>) -> Result<Self, Error> {
        let mut txn = db.begin_write()?;
        // Two-phase, as every commit of the spool ([`commit`]).
        txn.set_two_phase_commit(true);
        for area in [Area::Main, Area::Held, Area::Parked] {
            txn.open_table(area.table())?;
        }
        txn.open_table(MIGRATED)?;
        txn.open_table(MIGRATED_SEQS)?;
        txn.commit()?;
        Ok(Self {
            db: Arc::new(RwLock::new(db)),
        })
    }

    /// The database open now.
    pub(crate) fn db(&self) -> Arc<Database> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads and writes go to `db` from now on.
    pub(crate) fn replace(&self, db: Arc<Database>) {
        *self.db.write().unwrap_or_else(PoisonError::into_inner) = db;
    }

    /// The value of each entry `ops` change, as the last commit left it (`None`: absent):
    /// the commit that brings them back after a failed one.
    pub(crate) fn before<'a>(
        &self,
        ops: impl IntoIterator<Item = &'a Op>,
    ) -> Result<Vec<Slot>, Error> {
        let txn = self.db().begin_read()?;
        let mut out = Vec::new();
        for op in ops {
            let (Op::Put { area, seq, .. } | Op::Remove { area, seq }) = op else {
                continue;
            };
            let table = txn.open_table(area.table())?;
            let value = table.get(*seq)?.map(|v| v.value().to_vec());
            out.push((*area, *seq, value));
        }
        Ok(out)
    }

    /// The entry with the lowest number.
    pub(crate) fn first(&self, area: Area) -> Result<Option<Row>, Error> {
        Ok(self.page(area, None, 1)?.pop())
    }

    /// The highest number in `area`.
    pub(crate) fn last_seq(&self, area: Area) -> Result<Option<u64>, Error> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(area.table())?;
        let last = table.last()?.map(|(k, _)| k.value());
        Ok(last)
    }

    /// Entry `seq`.
    pub(crate) fn get(&self, area: Area, seq: u64) -> Result<Option<Vec<u8>>, Error> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(area.table())?;
        let value = table.get(seq)?.map(|v| v.value().to_vec());
        Ok(value)
    }

    /// Up to `limit` entries numbered above `after` (or from the start), in order.
    pub(crate) fn page(
        &self,
        area: Area,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Row>, Error> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(area.table())?;
        let from = match after {
            Some(seq) => match seq.checked_add(1) {
                Some(next) => next,
                None => return Ok(Vec::new()),
            },
            None => 0,
        };
        let mut out = Vec::new();
        for row in table.range(from..)?.take(limit) {
            let (k, v) = row?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Number of entries in `area`.
    pub(crate) fn len(&self, area: Area) -> Result<u64, Error> {
        let txn = self.db().begin_read()?;
        let len = txn.open_table(area.table())?.len()?;
        Ok(len)
    }

    /// The number a legacy corrupt entry was given by an earlier run of the migration.
    pub(crate) fn migrated(&self, legacy_key: &[u8]) -> Result<Option<u64>, Error> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(MIGRATED)?;
        let seq = table.get(legacy_key)?.map(|v| v.value());
        Ok(seq)
    }

    /// Whether legacy entry `seq` was copied by an earlier run of the migration.
    pub(crate) fn seq_migrated(&self, seq: u64) -> Result<bool, Error> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(MIGRATED_SEQS)?;
        let found = table.get(seq)?.is_some();
        Ok(found)
    }

    /// Calls `f` on every entry of `area`, a page at a time.
    pub(crate) fn for_each(
        &self,
        area: Area,
        page: usize,
        mut f: impl FnMut(u64, &[u8]),
    ) -> Result<(), Error> {
        let mut after = None;
        loop {
            let rows = self.page(area, after, page)?;
            let Some((last, _)) = rows.last() else {
                return Ok(());
            };
            after = Some(*last);
            for (seq, value) in &rows {
                f(*seq, value);
            }
        }
    }
}

/// Applies `ops` in one write transaction and commits it durably: when this returns `Ok`,
/// the commit's `fdatasync` has returned.
pub(crate) fn commit<'a>(
    db: &Database,
    ops: impl IntoIterator<Item = &'a Op>,
) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    // In two phases (data synced, then the header that points at it), so that at a
    // recovery a commit whose pages fail redb's checksums is damage, which redb refuses,
    // not a commit cut short, which it would silently roll back to the one before.
    txn.set_two_phase_commit(true);
    {
        let mut main = txn.open_table(MAIN)?;
        let mut held = txn.open_table(HELD)?;
        let mut parked = txn.open_table(PARKED)?;
        let mut migrated = txn.open_table(MIGRATED)?;
        let mut migrated_seqs = txn.open_table(MIGRATED_SEQS)?;
        for op in ops {
            match op {
                Op::Put { area, seq, value } => {
                    let table = match area {
                        Area::Main => &mut main,
                        Area::Held => &mut held,
                        Area::Parked => &mut parked,
                    };
                    table.insert(*seq, value.as_slice())?;
                }
                Op::Remove { area, seq } => {
                    let table = match area {
                        Area::Main => &mut main,
                        Area::Held => &mut held,
                        Area::Parked => &mut parked,
                    };
                    table.remove(*seq)?;
                }
                Op::Migrated { legacy_key, seq } => {
                    migrated.insert(legacy_key.as_slice(), *seq)?;
                }
                Op::MigratedSeq(seq) => {
                    migrated_seqs.insert(*seq, ())?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// Whether redb refuses every write until the database is opened again (an I/O error
/// during an earlier commit).
pub(crate) fn needs_reopen(error: &redb::Error) -> bool {
    matches!(error, redb::Error::Io(_) | redb::Error::PreviousIo)
}
