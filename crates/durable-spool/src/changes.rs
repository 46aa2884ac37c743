//! The changes one drainer batch makes (entries deleted, moved to held, parked), committed
//! together, and what each does to the counts once that commit returned.

use std::sync::atomic::Ordering;

use crate::ledger::Ledger;
use crate::parked_record::{encode_parked, now_secs};
use crate::record;
use crate::tables::{Area, Op};

/// What happens to the counts once a commit of the drainer's changes returned.
enum Effect {
    /// An entry of `area` was published and deleted.
    Left {
        area: Area,
        size: u64,
        order_key: Option<String>,
    },
    /// A main entry went to held (its guard key was marked held when that was decided).
    Moved { order_key: Option<String> },
    /// An entry of `from` was parked.
    Parked {
        from: Area,
        size: u64,
        order_key: Option<String>,
    },
}

/// The changes a batch makes, committed together.
#[derive(Default)]
pub(crate) struct Changes {
    pub(crate) ops: Vec<Op>,
    effects: Vec<Effect>,
}

impl Changes {
    pub(crate) fn published(&mut self, area: Area, seq: u64, size: u64, order_key: Option<&str>) {
        self.ops.push(Op::Remove { area, seq });
        self.effects.push(Effect::Left {
            area,
            size,
            order_key: order_key.map(str::to_owned),
        });
    }

    /// Moves main entry `seq` to held; its guard key `order_key` was marked held already.
    pub(crate) fn moved_to_held(&mut self, seq: u64, value: Vec<u8>, order_key: Option<&str>) {
        self.ops.push(Op::Remove {
            area: Area::Main,
            seq,
        });
        self.ops.push(Op::Put {
            area: Area::Held,
            seq,
            value,
        });
        self.effects.push(Effect::Moved {
            order_key: order_key.map(str::to_owned),
        });
    }

    /// Takes back the guard keys marked held for these changes, which will not be
    /// committed: the entries stay where they were.
    pub(crate) fn abandon(self, ledger: &Ledger) {
        for effect in self.effects {
            if let Effect::Moved { order_key } = effect {
                ledger.release_key(order_key.as_deref());
            }
        }
    }

    pub(crate) fn parked(
        &mut self,
        from: Area,
        seq: u64,
        value: &[u8],
        order_key: Option<&str>,
        reason: &str,
    ) {
        self.ops.push(Op::Remove { area: from, seq });
        self.ops.push(Op::Put {
            area: Area::Parked,
            seq,
            value: encode_parked(reason, now_secs(), value),
        });
        self.effects.push(Effect::Parked {
            from,
            size: value.len() as u64,
            order_key: order_key.map(str::to_owned),
        });
        let event_id = record::decode(value)
            .ok()
            .map(|m| m.message_id.into_owned());
        // Data kept but out of the flow: an operator must look at it.
        tracing::error!(
            id = seq,
            event_id = event_id.as_deref().unwrap_or("?"),
            reason,
            "spool entry parked; see `hookgate spool parked`"
        );
    }

    pub(crate) fn apply(self, ledger: &Ledger) {
        for effect in self.effects {
            match effect {
                Effect::Left {
                    area,
                    size,
                    order_key,
                } => {
                    ledger.sub(area, size);
                    if area == Area::Held {
                        ledger.release_key(order_key.as_deref());
                    }
                }
                Effect::Moved { .. } => {
                    let _ = ledger
                        .depth
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
                    ledger.held_depth.fetch_add(1, Ordering::SeqCst);
                }
                Effect::Parked {
                    from,
                    size,
                    order_key,
                } => {
                    ledger.sub(from, size);
                    ledger.add(Area::Parked, 0);
                    if from == Area::Held {
                        ledger.release_key(order_key.as_deref());
                    }
                }
            }
        }
    }
}
