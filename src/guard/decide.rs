//! Out-of-order guard decisions (contract §4): pure functions that judge one status or keyword event against the stored state.
//!
//! Nothing here does I/O, locks or awaits. The caller reads the state for a key, asks
//! [`decide_status`] or [`decide_keyword`], publishes, and stores the new state only if the
//! publish succeeded; that keeps the rules testable with fixed inputs and keeps the
//! atomicity concerns (one decision per key at a time, state advances only with a
//! confirmed publish) in the module that owns the store.

use crate::config::profiles::{DEFAULT_HELP, DEFAULT_RANKS, DEFAULT_START, DEFAULT_STOP};

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

/// Why the guard dropped an event; `as_str()` gives the contract's reason string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuardDrop {
    /// A status ranked below the stored one, or an equal-rank status not later than it.
    StaleStatus,
    /// The stored status again, under a new event id.
    RepeatedStatus,
    /// A STOP from a contact that is already opted out.
    RepeatedStop,
    /// A START from a contact already opted in by an earlier START.
    RepeatedStart,
    /// A HELP within `help_window` of the last accepted HELP.
    RepeatedHelp,
    /// A STOP or START older than the last opt-in/opt-out change.
    StaleKeyword,
}

impl GuardDrop {
    /// Every reason. Each has a counter made at start-up (`metrics::DROP_REASONS`; a test
    /// there checks the list is complete).
    pub const ALL: [GuardDrop; 6] = [
        GuardDrop::StaleStatus,
        GuardDrop::RepeatedStatus,
        GuardDrop::RepeatedStop,
        GuardDrop::RepeatedStart,
        GuardDrop::RepeatedHelp,
        GuardDrop::StaleKeyword,
    ];

    /// The reason string of contract §2, used in the HTTP answer, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            GuardDrop::StaleStatus => "stale_status",
            GuardDrop::RepeatedStatus => "repeated_status",
            GuardDrop::RepeatedStop => "repeated_stop",
            GuardDrop::RepeatedStart => "repeated_start",
            GuardDrop::RepeatedHelp => "repeated_help",
            GuardDrop::StaleKeyword => "stale_keyword",
        }
    }
}

impl fmt::Display for GuardDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// Keys are lowercased once here so each lookup only lowercases the event's status.
    ranks: HashMap<String, u32>,
}

impl StatusRanks {
    /// Builds the table; names are lowercased. If a name appears twice (in any case), the
    /// last entry wins, as it would for a YAML map.
    pub fn new(ranks: impl IntoIterator<Item = (String, u32)>) -> Self {
        let ranks = ranks
            .into_iter()
            .map(|(name, rank)| (name.to_lowercase(), rank))
            .collect();
        Self { ranks }
    }

    /// The rank of `status` (any case), or `None` if the table does not know it.
    pub fn rank(&self, status: &str) -> Option<u32> {
        self.ranks.get(lowercase(status).as_ref()).copied()
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
pub fn status_of(event_type: &str, status_field: Option<&str>) -> String {
    let from_field = status_field.map(str::trim).filter(|s| !s.is_empty());
    let status = match from_field {
        Some(status) => status,
        // rsplit always yields at least one item; the fallback only satisfies the type.
        None => event_type.rsplit('.').next().unwrap_or(event_type).trim(),
    };
    status.to_lowercase()
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
        Self { words }
    }

    /// The keyword `text` is, if the whole normalised message is exactly one configured word.
    pub fn classify(&self, text: &str) -> Option<Keyword> {
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
    folded
        .trim_start()
        .trim_end_matches(|c: char| c.is_whitespace() || is_punctuation(c))
        .to_uppercase()
        .nfkc()
        .collect()
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
mod tests {
    /// Found by the keyword normalisation property test: upper-casing after NFKC left
    /// "ῢ" decomposed, so it did not match its own capital typed composed.
    #[test]
    fn a_lower_case_letter_and_its_composed_capital_normalise_alike() {
        assert_eq!(
            super::normalise_keyword_text("ῢ"),
            super::normalise_keyword_text("Ϋ̀")
        );
        let once = super::normalise_keyword_text("ῢ");
        assert_eq!(super::normalise_keyword_text(&once), once);
    }

    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;
    use std::collections::HashSet;

    const SCENARIOS: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/guard_scenarios.json"
    );
    /// contract §7 default `help_window`.
    const HELP_WINDOW_MS: i64 = 60_000;
    /// contract §7 example route: event types judged by the status rules.
    const STATUS_EVENTS: [&str; 4] = [
        "message.status",
        "message.sent",
        "message.delivered",
        "message.failed",
    ];
    /// contract §7 example route: event types judged by the keyword rules.
    const KEYWORD_EVENTS: [&str; 1] = ["message.received"];

    fn st(status: &str, rank: u32, timestamp_ms: i64) -> StatusState {
        StatusState {
            status: status.to_owned(),
            rank,
            timestamp_ms,
        }
    }

    fn decide(state: Option<&StatusState>, status: &str, ts: i64) -> Verdict<StatusState> {
        decide_status(state, status, ts, &StatusRanks::default())
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    // ---- GuardDrop ----

    #[test]
    fn drop_reasons_match_spec_strings() {
        let strs: Vec<&str> = GuardDrop::ALL.iter().map(|d| d.as_str()).collect();
        assert_eq!(
            strs,
            [
                "stale_status",
                "repeated_status",
                "repeated_stop",
                "repeated_start",
                "repeated_help",
                "stale_keyword"
            ]
        );
        let distinct: HashSet<GuardDrop> = GuardDrop::ALL.into_iter().collect();
        assert_eq!(distinct.len(), GuardDrop::ALL.len());
        assert_eq!(GuardDrop::StaleKeyword.to_string(), "stale_keyword");
    }

    #[test]
    fn verdict_helpers() {
        let accepted: Verdict<()> = Verdict::Accept(None);
        assert!(accepted.is_accept());
        assert_eq!(accepted.drop_reason(), None);
        let dropped: Verdict<()> = Verdict::Drop(GuardDrop::RepeatedHelp);
        assert!(!dropped.is_accept());
        assert_eq!(dropped.drop_reason(), Some(GuardDrop::RepeatedHelp));
    }

    // ---- StatusRanks and status_of ----

    #[test]
    fn default_ranks_are_the_spec_table() {
        let ranks = StatusRanks::default();
        for (name, rank) in [
            ("queued", 0),
            ("accepted", 0),
            ("sending", 1),
            ("sent", 2),
            ("delivered", 3),
            ("undelivered", 3),
            ("failed", 3),
            ("read", 4),
        ] {
            assert_eq!(ranks.rank(name), Some(rank), "{name}");
        }
        assert_eq!(ranks.rank("carrier_ack"), None);
        assert_eq!(ranks.rank(""), None);
    }

    #[test]
    fn rank_lookup_is_case_insensitive_both_ways() {
        let ranks = StatusRanks::new([("Delivered".to_owned(), 7), ("ÉCHEC".to_owned(), 9)]);
        assert_eq!(ranks.rank("delivered"), Some(7));
        assert_eq!(ranks.rank("DELIVERED"), Some(7));
        assert_eq!(ranks.rank("échec"), Some(9));
        assert_eq!(ranks.rank("Échec"), Some(9));
        assert_eq!(ranks.rank("sent"), None);
    }

    #[test]
    fn status_of_prefers_the_field() {
        assert_eq!(status_of("message.status", Some("Delivered")), "delivered");
        assert_eq!(status_of("message.delivered", Some("FAILED")), "failed");
    }

    #[test]
    fn status_of_falls_back_to_the_last_event_segment() {
        assert_eq!(status_of("message.delivered", None), "delivered");
        assert_eq!(status_of("message.Delivered", Some("")), "delivered");
        assert_eq!(status_of("message.sent", Some("   ")), "sent");
        assert_eq!(status_of("a.b.READ", None), "read");
        assert_eq!(status_of("delivered", None), "delivered");
        assert_eq!(status_of("message.", None), "");
        assert_eq!(status_of("", None), "");
    }

    // ---- decide_status: every row of the contract §4 table ----

    #[test]
    fn status_no_state_accepts_and_stores() {
        assert_eq!(
            decide(None, "sent", 10),
            Verdict::Accept(Some(st("sent", 2, 10)))
        );
    }

    #[test]
    fn status_no_state_unknown_accepts_without_state() {
        assert_eq!(decide(None, "carrier_ack", 10), Verdict::Accept(None));
    }

    #[test]
    fn status_unknown_with_state_leaves_state() {
        let s = st("delivered", 3, 10);
        assert_eq!(decide(Some(&s), "carrier_ack", 20), Verdict::Accept(None));
        assert_eq!(decide(Some(&s), "carrier_ack", 0), Verdict::Accept(None));
        assert_eq!(decide(Some(&s), "", 20), Verdict::Accept(None));
    }

    #[test]
    fn status_higher_rank_accepts_even_if_older() {
        let s = st("sent", 2, 100);
        assert_eq!(
            decide(Some(&s), "delivered", 50),
            Verdict::Accept(Some(st("delivered", 3, 50)))
        );
    }

    #[test]
    fn status_lower_rank_is_stale_even_if_newer() {
        let s = st("delivered", 3, 100);
        assert_eq!(
            decide(Some(&s), "sent", 200),
            Verdict::Drop(GuardDrop::StaleStatus)
        );
    }

    #[test]
    fn status_same_rank_same_status_is_repeated_at_any_time() {
        let s = st("delivered", 3, 100);
        for ts in [50, 100, 200] {
            assert_eq!(
                decide(Some(&s), "delivered", ts),
                Verdict::Drop(GuardDrop::RepeatedStatus),
                "ts {ts}"
            );
        }
        assert_eq!(
            decide(Some(&s), "DELIVERED", 200),
            Verdict::Drop(GuardDrop::RepeatedStatus)
        );
    }

    #[test]
    fn status_same_rank_other_status_later_wins() {
        let s = st("failed", 3, 100);
        assert_eq!(
            decide(Some(&s), "delivered", 101),
            Verdict::Accept(Some(st("delivered", 3, 101)))
        );
    }

    #[test]
    fn status_same_rank_other_status_earlier_is_stale() {
        let s = st("delivered", 3, 100);
        assert_eq!(
            decide(Some(&s), "failed", 99),
            Verdict::Drop(GuardDrop::StaleStatus)
        );
    }

    #[test]
    fn status_same_rank_other_status_equal_timestamp_is_stale() {
        let s = st("delivered", 3, 100);
        assert_eq!(
            decide(Some(&s), "failed", 100),
            Verdict::Drop(GuardDrop::StaleStatus)
        );
    }

    #[test]
    fn status_is_stored_lowercase() {
        assert_eq!(
            decide(None, "Read", 1),
            Verdict::Accept(Some(st("read", 4, 1)))
        );
    }

    #[test]
    fn status_judges_against_stored_rank() {
        // The stored rank is what contract §4 compares against, even under a changed table.
        let ranks = StatusRanks::new([("a".to_owned(), 5), ("b".to_owned(), 1)]);
        let s = st("a", 0, 0);
        assert_eq!(
            decide_status(Some(&s), "b", 1, &ranks),
            Verdict::Accept(Some(st("b", 1, 1)))
        );
    }

    /// Known limit of the contract's state (one status, one timestamp) together with "a drop
    /// leaves the state unchanged": a repeated status with a later timestamp cannot refresh
    /// the stored timestamp, so an equal-rank status between the two is still accepted.
    #[test]
    fn status_repeat_does_not_refresh_timestamp() {
        let s1 = st("delivered", 3, 1_000);
        assert_eq!(
            decide(Some(&s1), "delivered", 5_000),
            Verdict::Drop(GuardDrop::RepeatedStatus)
        );
        assert_eq!(
            decide(Some(&s1), "failed", 3_000),
            Verdict::Accept(Some(st("failed", 3, 3_000)))
        );
    }

    #[test]
    fn states_round_trip_through_json() -> Result<(), serde_json::Error> {
        let s = st("delivered", 3, -5);
        assert_eq!(
            serde_json::from_str::<StatusState>(&serde_json::to_string(&s)?)?,
            s
        );
        let k = KeywordState {
            opted_out: true,
            opted_in_by_start: false,
            last_change_ms: Some(7),
            last_help_ms: None,
        };
        assert_eq!(
            serde_json::from_str::<KeywordState>(&serde_json::to_string(&k)?)?,
            k
        );
        // Missing fields default, so a state stored by an older build still loads.
        assert_eq!(
            serde_json::from_str::<KeywordState>("{}")?,
            KeywordState::default()
        );
        Ok(())
    }

    // ---- normalisation and classification ----

    #[test]
    fn normalise_cases() {
        for (input, want) in [
            ("stop", "STOP"),
            ("Stop!", "STOP"),
            ("  Stop! ", "STOP"),
            ("\tstop\n", "STOP"),
            ("STOP!!!", "STOP"),
            ("stop .", "STOP"),
            ("stop?!", "STOP"),
            ("stop…", "STOP"),
            ("стоп", "СТОП"),
            ("\u{3000}停止。", "停止"),
            ("توقف؟", "توقف"),
            ("¡Basta!", "¡BASTA"),
            ("straße", "STRASSE"),
            ("please stop texting", "PLEASE STOP TEXTING"),
            ("stop all", "STOP ALL"),
            ("ＳＴＯＰ", "STOP"),
            ("ｓｔｏｐ！", "STOP"),
            ("Ｓtop\u{3000}", "STOP"),
            ("ﬁn", "FIN"),
            ("", ""),
            (" !?. ", ""),
        ] {
            assert_eq!(normalise_keyword_text(input), want, "input {input:?}");
        }
    }

    #[test]
    fn classify_default_lists() {
        let lists = KeywordLists::default();
        for word in ["STOP", "stopall", "Unsubscribe", "cancel", "end", "quit"] {
            assert_eq!(lists.classify(word), Some(Keyword::Stop), "{word}");
        }
        for word in ["start", "UNSTOP", "yes"] {
            assert_eq!(lists.classify(word), Some(Keyword::Start), "{word}");
        }
        for word in ["help", "Info."] {
            assert_eq!(lists.classify(word), Some(Keyword::Help), "{word}");
        }
        assert_eq!(lists.classify("Stop!"), Some(Keyword::Stop));
        assert_eq!(lists.classify("  Stop! "), Some(Keyword::Stop));
        assert_eq!(lists.classify("please stop texting"), None);
        assert_eq!(lists.classify("stop please"), None);
        assert_eq!(lists.classify("!stop"), None);
        assert_eq!(lists.classify(""), None);
        assert_eq!(lists.classify("   "), None);
    }

    #[test]
    fn classify_configured_non_ascii_lists() {
        let lists = KeywordLists::new(
            &strings(&["СТОП", "Arrêt"]),
            &strings(&["старт"]),
            &strings(&["ПОМОЩЬ", ""]),
        );
        assert_eq!(lists.classify("стоп"), Some(Keyword::Stop));
        assert_eq!(lists.classify(" Стоп! "), Some(Keyword::Stop));
        assert_eq!(lists.classify("arrêt."), Some(Keyword::Stop));
        assert_eq!(lists.classify("СТАРТ"), Some(Keyword::Start));
        assert_eq!(lists.classify("помощь?"), Some(Keyword::Help));
        // The empty configured entry must not make empty texts a keyword.
        assert_eq!(lists.classify(""), None);
        assert_eq!(lists.classify("STOP"), None);
    }

    #[test]
    fn classify_overlap_prefers_stop_then_start() {
        let lists = KeywordLists::new(
            &strings(&["end"]),
            &strings(&["END", "go"]),
            &strings(&["go", "help"]),
        );
        assert_eq!(lists.classify("end"), Some(Keyword::Stop));
        assert_eq!(lists.classify("go"), Some(Keyword::Start));
        assert_eq!(lists.classify("help"), Some(Keyword::Help));
    }

    // ---- decide_keyword: every rule ----

    fn kw(opted_out: bool, by_start: bool, change: Option<i64>, help: Option<i64>) -> KeywordState {
        KeywordState {
            opted_out,
            opted_in_by_start: by_start,
            last_change_ms: change,
            last_help_ms: help,
        }
    }

    fn dk(state: Option<&KeywordState>, keyword: Keyword, ts: i64) -> Verdict<KeywordState> {
        decide_keyword(state, keyword, ts, HELP_WINDOW_MS)
    }

    #[test]
    fn stop_without_state_opts_out() {
        assert_eq!(
            dk(None, Keyword::Stop, 10),
            Verdict::Accept(Some(kw(true, false, Some(10), None)))
        );
    }

    #[test]
    fn stop_while_opted_out_is_repeated() {
        let s = kw(true, false, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Stop, 20),
            Verdict::Drop(GuardDrop::RepeatedStop)
        );
    }

    #[test]
    fn stop_older_than_last_change_is_stale() {
        let s = kw(false, true, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Stop, 9),
            Verdict::Drop(GuardDrop::StaleKeyword)
        );
    }

    #[test]
    fn stop_both_repeated_and_older_is_repeated() {
        let s = kw(true, false, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Stop, 5),
            Verdict::Drop(GuardDrop::RepeatedStop)
        );
    }

    #[test]
    fn stop_after_start_opts_out_and_keeps_help() {
        let s = kw(false, true, Some(10), Some(3));
        assert_eq!(
            dk(Some(&s), Keyword::Stop, 11),
            Verdict::Accept(Some(kw(true, false, Some(11), Some(3))))
        );
    }

    #[test]
    fn stop_at_same_time_as_last_change_is_accepted() {
        let s = kw(false, true, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Stop, 10),
            Verdict::Accept(Some(kw(true, false, Some(10), None)))
        );
    }

    #[test]
    fn start_without_state_opts_in_by_start() {
        assert_eq!(
            dk(None, Keyword::Start, 10),
            Verdict::Accept(Some(kw(false, true, Some(10), None)))
        );
    }

    #[test]
    fn start_after_start_is_repeated() {
        let s = kw(false, true, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Start, 20),
            Verdict::Drop(GuardDrop::RepeatedStart)
        );
        assert_eq!(
            dk(Some(&s), Keyword::Start, 5),
            Verdict::Drop(GuardDrop::RepeatedStart)
        );
    }

    #[test]
    fn start_older_than_stop_is_stale() {
        let s = kw(true, false, Some(10), None);
        assert_eq!(
            dk(Some(&s), Keyword::Start, 9),
            Verdict::Drop(GuardDrop::StaleKeyword)
        );
    }

    #[test]
    fn start_after_stop_opts_in() {
        let s = kw(true, false, Some(10), Some(4));
        assert_eq!(
            dk(Some(&s), Keyword::Start, 12),
            Verdict::Accept(Some(kw(false, true, Some(12), Some(4))))
        );
    }

    #[test]
    fn default_state_behaves_like_no_state() {
        let s = KeywordState::default();
        for keyword in [Keyword::Stop, Keyword::Start, Keyword::Help] {
            assert_eq!(dk(Some(&s), keyword, 42), dk(None, keyword, 42));
        }
    }

    #[test]
    fn help_without_state_is_recorded() {
        assert_eq!(
            dk(None, Keyword::Help, 1_000),
            Verdict::Accept(Some(kw(false, false, None, Some(1_000))))
        );
    }

    #[test]
    fn help_within_window_is_repeated_either_side() {
        let s = kw(false, false, None, Some(100_000));
        for ts in [100_000, 130_000, 159_999, 70_000, 40_001] {
            assert_eq!(
                dk(Some(&s), Keyword::Help, ts),
                Verdict::Drop(GuardDrop::RepeatedHelp),
                "ts {ts}"
            );
        }
    }

    #[test]
    fn help_at_or_beyond_window_is_accepted() {
        let s = kw(true, false, Some(5), Some(100_000));
        assert_eq!(
            dk(Some(&s), Keyword::Help, 160_000),
            Verdict::Accept(Some(kw(true, false, Some(5), Some(160_000))))
        );
        // An older HELP outside the window is accepted but does not move the record back.
        assert_eq!(
            dk(Some(&s), Keyword::Help, 40_000),
            Verdict::Accept(Some(kw(true, false, Some(5), Some(100_000))))
        );
    }

    #[test]
    fn help_window_zero_or_negative_disables_the_rule() {
        let s = kw(false, false, None, Some(100));
        for window in [0, -1, i64::MIN] {
            assert!(decide_keyword(Some(&s), Keyword::Help, 100, window).is_accept());
        }
    }

    #[test]
    fn help_extreme_timestamps_do_not_overflow() {
        let s = kw(false, false, None, Some(i64::MIN));
        assert!(decide_keyword(Some(&s), Keyword::Help, i64::MAX, i64::MAX).is_accept());
        let s = kw(false, false, None, Some(i64::MAX));
        assert_eq!(
            decide_keyword(Some(&s), Keyword::Help, i64::MAX - 1, i64::MAX),
            Verdict::Drop(GuardDrop::RepeatedHelp)
        );
    }

    #[test]
    fn help_does_not_touch_opt_state() {
        let s = kw(true, false, Some(10), None);
        let Verdict::Accept(Some(next)) = dk(Some(&s), Keyword::Help, 1) else {
            panic!("help should be accepted");
        };
        assert!(next.opted_out);
        assert_eq!(next.last_change_ms, Some(10));
        assert_eq!(
            dk(Some(&next), Keyword::Stop, 20),
            Verdict::Drop(GuardDrop::RepeatedStop)
        );
    }

    // ---- guard_scenarios.json as calls to the pure functions ----

    fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
        value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("missing string at {pointer} in {value}"))
    }

    fn outcome<S>(verdict: &Verdict<S>) -> String {
        match verdict {
            Verdict::Accept(_) => "accepted".to_owned(),
            Verdict::Drop(reason) => format!("dropped:{reason}"),
        }
    }

    #[test]
    fn shared_scenarios() -> Result<(), Box<dyn std::error::Error>> {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(SCENARIOS)?)?;
        let scenarios = doc["scenarios"].as_array().ok_or("no scenarios array")?;
        let ranks = StatusRanks::default();
        let lists = KeywordLists::default();
        let (mut status_steps, mut keyword_steps) = (0, 0);
        for scenario in scenarios {
            let name = str_at(scenario, "/name");
            let mut status_states: HashMap<String, StatusState> = HashMap::new();
            let mut keyword_states: HashMap<(String, String), KeywordState> = HashMap::new();
            let steps = scenario["steps"].as_array().ok_or("no steps")?;
            for (i, step) in steps.iter().enumerate() {
                let body = &step[0];
                let expected = step[1].as_str().ok_or("no outcome")?;
                // Dedup, not the guard, answers a re-delivered event.
                if expected == "duplicate" {
                    continue;
                }
                let event = str_at(body, "/event");
                let ts_ms = body["timestamp"].as_i64().ok_or("no timestamp")? * 1000;
                let got = if STATUS_EVENTS.contains(&event) {
                    status_steps += 1;
                    let key = str_at(body, "/data/message_id").to_owned();
                    let status =
                        status_of(event, body.pointer("/data/status").and_then(Value::as_str));
                    let verdict = decide_status(status_states.get(&key), &status, ts_ms, &ranks);
                    if let Verdict::Accept(Some(next)) = &verdict {
                        status_states.insert(key, next.clone());
                    }
                    outcome(&verdict)
                } else if KEYWORD_EVENTS.contains(&event) {
                    keyword_steps += 1;
                    let key = (
                        str_at(body, "/data/from").to_owned(),
                        str_at(body, "/data/to").to_owned(),
                    );
                    match lists.classify(str_at(body, "/data/text")) {
                        None => "accepted".to_owned(),
                        Some(keyword) => {
                            let verdict = decide_keyword(
                                keyword_states.get(&key),
                                keyword,
                                ts_ms,
                                HELP_WINDOW_MS,
                            );
                            if let Verdict::Accept(Some(next)) = &verdict {
                                keyword_states.insert(key, next.clone());
                            }
                            outcome(&verdict)
                        }
                    }
                } else {
                    return Err(format!("{name}: unexpected event type {event}").into());
                };
                assert_eq!(got, expected, "scenario {name}, step {i}");
            }
        }
        // Guards against a reshaped file that parses but exercises neither rule set.
        assert!(
            status_steps > 0 && keyword_steps > 0,
            "{status_steps} status, {keyword_steps} keyword steps"
        );
        Ok(())
    }

    // ---- property: status order converges ----

    const DEFAULT_STATUSES: [&str; 8] = [
        "queued",
        "accepted",
        "sending",
        "sent",
        "delivered",
        "undelivered",
        "failed",
        "read",
    ];

    /// Applies the events in order, storing accepted states; returns the ranks of accepted
    /// events in arrival order and the final state.
    fn run(events: &[(&str, i64)]) -> (Vec<u32>, Option<StatusState>) {
        let ranks = StatusRanks::default();
        let mut state: Option<StatusState> = None;
        let mut accepted = Vec::new();
        for (status, ts) in events {
            match decide_status(state.as_ref(), status, *ts, &ranks) {
                Verdict::Accept(next) => {
                    accepted.push(ranks.rank(status).unwrap_or_default());
                    if next.is_some() {
                        state = next;
                    }
                }
                Verdict::Drop(_) => {}
            }
        }
        (accepted, state)
    }

    /// The state the guard should end in: highest rank, then latest timestamp.
    fn expected_final(events: &[(&str, i64)]) -> Option<StatusState> {
        let ranks = StatusRanks::default();
        events
            .iter()
            .filter_map(|(status, ts)| Some(st(status, ranks.rank(status)?, *ts)))
            .max_by_key(|s| (s.rank, s.timestamp_ms))
    }

    /// Each status at most once (a random subset in random order), distinct timestamps.
    fn distinct_status_events() -> impl Strategy<Value = Vec<(&'static str, i64)>> {
        (
            Just(DEFAULT_STATUSES.to_vec()).prop_shuffle(),
            proptest::collection::btree_set(-1_000_000_i64..1_000_000, 8),
            1_usize..=8,
        )
            .prop_flat_map(|(statuses, stamps, len)| {
                let stamps: Vec<i64> = stamps.into_iter().collect();
                let events: Vec<(&'static str, i64)> =
                    statuses.into_iter().zip(stamps).take(len).collect();
                Just(events).prop_shuffle()
            })
    }

    /// Statuses may repeat; timestamps are distinct.
    fn any_status_events() -> impl Strategy<Value = Vec<(&'static str, i64)>> {
        proptest::collection::btree_set(-1_000_000_i64..1_000_000, 1..24).prop_flat_map(|stamps| {
            let n = stamps.len();
            let stamps: Vec<i64> = stamps.into_iter().collect();
            (
                Just(stamps).prop_shuffle(),
                proptest::collection::vec(proptest::sample::select(DEFAULT_STATUSES.to_vec()), n),
            )
                .prop_map(|(stamps, statuses)| statuses.into_iter().zip(stamps).collect())
        })
    }

    proptest! {
        /// With each status at most once, the guard ends where the full history says: the
        /// highest rank, and among equal highest rank the latest timestamp, whatever the
        /// arrival order; accepted ranks never go down.
        #[test]
        fn status_converges_to_highest_then_latest(events in distinct_status_events()) {
            let (accepted, last) = run(&events);
            prop_assert!(accepted.windows(2).all(|w| w[0] <= w[1]), "ranks went down: {accepted:?}");
            prop_assert_eq!(last, expected_final(&events));
        }

        /// With repeated statuses, accepted ranks still never go down and the final rank is
        /// the highest sent. The "latest timestamp" half cannot hold in general: a repeat is
        /// dropped with the state unchanged, so its later timestamp is never recorded (see
        /// `status_repeat_does_not_refresh_timestamp`).
        #[test]
        fn status_never_regresses_with_repeats(events in any_status_events()) {
            let (accepted, last) = run(&events);
            prop_assert!(accepted.windows(2).all(|w| w[0] <= w[1]), "ranks went down: {accepted:?}");
            let want = expected_final(&events);
            prop_assert_eq!(last.as_ref().map(|s| s.rank), want.as_ref().map(|s| s.rank));
            let last = last.ok_or_else(|| TestCaseError::fail("no final state"))?;
            prop_assert!(events.iter().any(|(s, t)| *s == last.status && *t == last.timestamp_ms));
        }
    }
}
