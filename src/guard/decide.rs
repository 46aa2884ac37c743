//! Out-of-order guard decisions (contract §4): pure functions that judge one status or keyword event against the stored state.
//!
//! Nothing here does I/O, locks or awaits. The caller reads the state for a key, asks
//! [`decide_status`] or [`decide_keyword`], publishes, and stores the new state only if the
//! publish succeeded; that keeps the rules testable with fixed inputs and keeps the
//! atomicity concerns (one decision per key at a time, state advances only with a
//! confirmed publish) in the module that owns the store.

use crate::config::{DEFAULT_HELP, DEFAULT_RANKS, DEFAULT_START, DEFAULT_STOP};
use crate::metrics::label_values;

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

label_values! {
    /// Why the guard dropped an event; `as_str()` gives the contract's reason string (§2),
    /// used in the HTTP answer, logs and metric labels. `ALL` lists every reason: each
    /// route's counter of each is made at start-up (`pipeline::drop_reasons`).
    pub enum GuardDrop {
        /// A status ranked below the stored one, or an equal-rank status not later than it.
        StaleStatus => "stale_status",
        /// The stored status again, under a new event id.
        RepeatedStatus => "repeated_status",
        /// A STOP from a contact that is already opted out.
        RepeatedStop => "repeated_stop",
        /// A START from a contact already opted in by an earlier START.
        RepeatedStart => "repeated_start",
        /// A HELP within `help_window` of the last accepted HELP.
        RepeatedHelp => "repeated_help",
        /// A STOP or START older than the last opt-in/opt-out change.
        StaleKeyword => "stale_keyword",
    }
}

impl GuardDrop {
    /// Whether the dropped event says what the stored state already says (the same status,
    /// a STOP of a contact already out, ...): a repeat of the newest fact, not an older one.
    pub const fn is_repeat(self) -> bool {
        matches!(
            self,
            GuardDrop::RepeatedStatus
                | GuardDrop::RepeatedStop
                | GuardDrop::RepeatedStart
                | GuardDrop::RepeatedHelp
        )
    }
}

/// A verdict as a replay takes it. A replay republishes what a consumer lost, and what it
/// lost is most often the very event the stored state came from: an event that repeats the
/// newest state is published again, the state unchanged; one older than it (`stale_*`) is
/// still dropped.
pub fn for_replay<S>(verdict: Verdict<S>) -> Verdict<S> {
    match verdict {
        Verdict::Drop(reason) if reason.is_repeat() => Verdict::Accept(None),
        other => other,
    }
}

/// The guard's answer. `Accept(Some(s))`: publish, then store `s`. `Accept(None)`: publish, state unchanged.
///
/// `Drop` never carries a state: a dropped event must leave the stored state exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<S> {
    /// Publish the event; store the new state (if any) only once the publish is confirmed.
    Accept(Option<S>),
    /// Do not publish to the main exchange; the state is unchanged.
    Drop(GuardDrop),
}

impl<S> Verdict<S> {
    /// True for `Accept(_)`.
    pub fn is_accept(&self) -> bool {
        matches!(self, Verdict::Accept(_))
    }

    /// The drop reason, or `None` for an accepted event.
    pub fn drop_reason(&self) -> Option<GuardDrop> {
        match self {
            Verdict::Accept(_) => None,
            Verdict::Drop(reason) => Some(*reason),
        }
    }
}

/// Rank table from config (status name -> rank); lookups are case-insensitive (store lowercase).
#[derive(Debug, Clone)]
pub struct StatusRanks {
    /// Names lowercased once here so each lookup only lowercases the event's status. A
    /// list: a table has a handful of statuses, and a scan of them costs less than hashing
    /// the status.
    ranks: Vec<(String, u32)>,
}

impl StatusRanks {
    /// Builds the table; names are lowercased. If a name appears twice (in any case), the
    /// last entry wins, as it would for a YAML map.
    pub fn new(ranks: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut table: Vec<(String, u32)> = Vec::new();
        for (name, rank) in ranks {
            let name = name.to_lowercase();
            match table.iter_mut().find(|(known, _)| *known == name) {
                Some(entry) => entry.1 = rank,
                None => table.push((name, rank)),
            }
        }
        Self { ranks: table }
    }

    /// The rank of `status` (any case), or `None` if the table does not know it.
    pub fn rank(&self, status: &str) -> Option<u32> {
        let status = lowercase(status);
        self.ranks
            .iter()
            .find(|(name, _)| *name == status)
            .map(|&(_, rank)| rank)
    }
}

/// `text` lowercased, without a copy when it is ASCII with no capital (statuses usually are).
fn lowercase(text: &str) -> Cow<'_, str> {
    if text
        .bytes()
        .all(|b| b.is_ascii() && !b.is_ascii_uppercase())
    {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.to_lowercase())
    }
}

impl Default for StatusRanks {
    /// The default profile's ranks, [`DEFAULT_RANKS`].
    fn default() -> Self {
        Self::new(
            DEFAULT_RANKS
                .into_iter()
                .map(|(name, rank)| (name.to_owned(), rank)),
        )
    }
}

/// The status to judge: the status field if present and non-empty, else the last dot-separated segment of the event type ("message.delivered" -> "delivered"); lowercased.
///
/// Surrounding white space is trimmed first, so a status field of only white space counts as
/// absent. An event type without a dot is used whole; one ending in a dot gives `""`, which no
/// rank table knows, so the event passes with the state unchanged.
pub fn status_of<'a>(event_type: &'a str, status_field: Option<&'a str>) -> Cow<'a, str> {
    let from_field = status_field.map(str::trim).filter(|s| !s.is_empty());
    let status = match from_field {
        Some(status) => status,
        // rsplit always yields at least one item; the fallback only satisfies the type.
        None => event_type.rsplit('.').next().unwrap_or(event_type).trim(),
    };
    lowercase(status)
}

/// Guard state of one message: the last accepted status, its rank, and its timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusState {
    /// Last accepted status, lowercase.
    pub status: String,
    /// Its rank at the time it was accepted (contract §4 compares against the stored rank).
    pub rank: u32,
    /// The accepted event's own timestamp, Unix milliseconds; breaks ties between equal ranks.
    pub timestamp_ms: i64,
}

/// Judges a status event (contract §4) against the stored state of its message.
///
/// `status` is usually the output of [`status_of`]; it is lowercased again here so the
/// "same status" comparison is case-insensitive like the rank lookup. `timestamp_ms` is the
/// event's timestamp in Unix milliseconds.
pub fn decide_status(
    state: Option<&StatusState>,
    status: &str,
    timestamp_ms: i64,
    ranks: &StatusRanks,
) -> Verdict<StatusState> {
    let status = lowercase(status);
    // Checked before the state: an unknown status has no place in the order, so it can
    // neither be judged nor become the state (with or without a stored state).
    let Some(rank) = ranks.rank(&status) else {
        return Verdict::Accept(None);
    };
    let accept = |status: Cow<'_, str>| {
        Verdict::Accept(Some(StatusState {
            status: status.into_owned(),
            rank,
            timestamp_ms,
        }))
    };
    let Some(current) = state else {
        return accept(status);
    };
    if rank > current.rank {
        accept(status)
    } else if rank < current.rank {
        Verdict::Drop(GuardDrop::StaleStatus)
    } else if *status == current.status {
        // Regardless of timestamp: the consumer already has this status for this message.
        Verdict::Drop(GuardDrop::RepeatedStatus)
    } else if timestamp_ms > current.timestamp_ms {
        accept(status)
    } else {
        // Equal timestamps are dropped too: nothing says the newcomer is later, and keeping
        // the status already published avoids telling consumers the outcome flipped on a tie.
        Verdict::Drop(GuardDrop::StaleStatus)
    }
}

/// The three keyword kinds of contract §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyword {
    /// Opt out.
    Stop,
    /// Opt back in.
    Start,
    /// Ask for help; does not change the opt-in state.
    Help,
}

/// Configured keyword lists (any language), normalised once at construction.
#[derive(Debug, Clone)]
pub struct KeywordLists {
    /// Normalised keyword -> kind, so classifying a message is one normalisation and one lookup.
    words: HashMap<String, Keyword>,
    /// The longest normalised keyword, in bytes.
    longest: usize,
}

impl KeywordLists {
    /// Builds the lookup from the three configured lists, normalising each entry with
    /// [`normalise_keyword_text`]; entries that normalise to nothing are ignored.
    ///
    /// A word in more than one list is classified STOP before START before HELP: honouring
    /// an opt-out is the safe reading of an ambiguous configuration.
    pub fn new(stop: &[String], start: &[String], help: &[String]) -> Self {
        let mut words = HashMap::new();
        for (list, keyword) in [
            (stop, Keyword::Stop),
            (start, Keyword::Start),
            (help, Keyword::Help),
        ] {
            for word in list {
                let word = normalise_keyword_text(word);
                if !word.is_empty() {
                    words.entry(word).or_insert(keyword);
                }
            }
        }
        let longest = words.keys().map(String::len).max().unwrap_or(0);
        Self { words, longest }
    }

    /// The keyword `text` is, if the whole normalised message is exactly one configured word.
    pub fn classify(&self, text: &str) -> Option<Keyword> {
        if text.is_ascii() {
            // Most messages: NFKC leaves ASCII as it is and its capitals are ASCII, so the
            // normal form is the trimmed text in ASCII capitals, and one longer than every
            // keyword is none of them, decided without a copy of a long text.
            let trimmed = trim_keyword_text(text);
            if trimmed.len() > self.longest {
                return None;
            }
            return self.words.get(&trimmed.to_ascii_uppercase()).copied();
        }
        self.words.get(&normalise_keyword_text(text)).copied()
    }
}

impl Default for KeywordLists {
    /// The default profile's keywords: [`DEFAULT_STOP`], [`DEFAULT_START`], [`DEFAULT_HELP`].
    fn default() -> Self {
        fn owned(words: &[&str]) -> Vec<String> {
            words.iter().map(|w| (*w).to_owned()).collect()
        }
        Self::new(
            &owned(&DEFAULT_STOP),
            &owned(&DEFAULT_START),
            &owned(&DEFAULT_HELP),
        )
    }
}

/// Trim white space (Unicode), strip trailing punctuation (Unicode punctuation like ! . ? , ; : and also trailing whitespace after it, e.g. "  Stop! " -> "STOP"), upper-case (Unicode-aware, so "стоп" matches a configured "СТОП").
///
/// Only trailing punctuation goes (contract §4), so "¡Basta!" keeps its leading "¡". Inner
/// white space is kept: "STOP ALL" is not "STOPALL".
///
/// Compatibility forms are folded first (NFKC, contract §4): a full-width `ＳＴＯＰ！` is `STOP`,
/// and a ligature or a circled letter reads as the plain letters it stands for.
pub fn normalise_keyword_text(text: &str) -> String {
    let folded: String = text.nfkc().collect();
    // Composed again after upper-casing: the capital of a composed lower-case letter can
    // come out decomposed ("ῢ" → "Ϋ̀"), and would then differ from the same capital typed
    // composed ("Ϋ̀").
    trim_keyword_text(&folded).to_uppercase().nfkc().collect()
}

/// `text` without leading white space, nor trailing white space and punctuation.
fn trim_keyword_text(text: &str) -> &str {
    text.trim_start()
        .trim_end_matches(|c: char| c.is_whitespace() || is_punctuation(c))
}

/// Punctuation a texter may put after a keyword. std has no Unicode general-category
/// lookup and this crate takes no dependency for one, so this is ASCII punctuation plus the
/// common non-ASCII marks of the languages keyword lists are configured for.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(
            c,
            '¡' | '¿'
                | '«'
                | '»'
                | '·'
                | '\u{037E}' // Greek question mark
                | '\u{0387}' // Greek ano teleia
                | '՜'
                | '՝'
                | '՞'
                | '։'
                | '،'
                | '؛'
                | '؟'
                | '۔'
                | '।'
                | '॥'
                | '‐'..='‧' // dashes, quotes, bullets, ellipsis (U+2010..U+2027)
                | '‹'
                | '›'
                | '‼'..='⁉'
                | '、'
                | '。'
                | '〜'
                | '！'
                | '＂'
                | '，'
                | '．'
                | '：'
                | '；'
                | '？'
                | '～'
                | '｡'
                | '､'
        )
}

/// Guard state of one (contact, channel) pair.
///
/// The default is a contact we have heard nothing from: opted in (SMS opt-out is
/// opt-in by default), not by an explicit START, with no change or HELP recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeywordState {
    /// True after an accepted STOP, until an accepted START.
    pub opted_out: bool,
    /// True when the current opt-in came from an accepted START (so another START is a
    /// repeat); false for a contact that never sent a keyword or is opted out.
    pub opted_in_by_start: bool,
    /// Timestamp (Unix ms) of the last accepted STOP or START; a STOP or START older than
    /// this is stale.
    pub last_change_ms: Option<i64>,
    /// Timestamp (Unix ms) of the latest accepted HELP, for the help window.
    pub last_help_ms: Option<i64>,
}

/// Judges a keyword event (contract §4) against the stored state of its (contact, channel).
///
/// Order of checks: the "repeated" rule is checked before the "stale" rule, in the order
/// contract §4 lists them. A STOP that is both older than the last change and arriving while
/// opted out (or such a START while opted in by START) is therefore `repeated_stop` /
/// `repeated_start`; either way it is dropped and the state is unchanged, and "repeated"
/// tells the operator the more useful fact: the contact is already in that state.
///
/// "Older" is strict: a STOP/START with the same timestamp as the last change is accepted,
/// so within one timestamp tick the arrival order decides, as it would without a guard.
///
/// HELP: repeated if the absolute distance to the last accepted HELP is less than
/// `help_window_ms`, so a delayed HELP sent shortly *before* an accepted one is also a
/// repeat; one exactly `help_window_ms` away is a new request. A `help_window_ms` of zero or
/// less disables the rule. The recorded HELP time only moves forward, so accepting a much
/// older HELP does not reopen the window for a HELP close to the newest one.
pub fn decide_keyword(
    state: Option<&KeywordState>,
    keyword: Keyword,
    timestamp_ms: i64,
    help_window_ms: i64,
) -> Verdict<KeywordState> {
    let current = state.cloned().unwrap_or_default();
    let is_stale = current
        .last_change_ms
        .is_some_and(|last| timestamp_ms < last);
    match keyword {
        Keyword::Stop => {
            if current.opted_out {
                Verdict::Drop(GuardDrop::RepeatedStop)
            } else if is_stale {
                Verdict::Drop(GuardDrop::StaleKeyword)
            } else {
                Verdict::Accept(Some(KeywordState {
                    opted_out: true,
                    opted_in_by_start: false,
                    last_change_ms: Some(timestamp_ms),
                    ..current
                }))
            }
        }
        Keyword::Start => {
            if current.opted_in_by_start {
                Verdict::Drop(GuardDrop::RepeatedStart)
            } else if is_stale {
                Verdict::Drop(GuardDrop::StaleKeyword)
            } else {
                Verdict::Accept(Some(KeywordState {
                    opted_out: false,
                    opted_in_by_start: true,
                    last_change_ms: Some(timestamp_ms),
                    ..current
                }))
            }
        }
        Keyword::Help => {
            // abs_diff in u64 cannot overflow, unlike a subtraction of two i64 timestamps.
            let window = u64::try_from(help_window_ms).unwrap_or(0);
            let repeated = current
                .last_help_ms
                .is_some_and(|last| timestamp_ms.abs_diff(last) < window);
            if repeated {
                Verdict::Drop(GuardDrop::RepeatedHelp)
            } else {
                let last_help_ms = current
                    .last_help_ms
                    .map_or(timestamp_ms, |last| last.max(timestamp_ms));
                Verdict::Accept(Some(KeywordState {
                    last_help_ms: Some(last_help_ms),
                    ..current
                }))
            }
        }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
