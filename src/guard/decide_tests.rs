//! Tests of the pure guard decisions ([`super`]): the contract §4 status and keyword rules as
//! named tables, normalisation and classification, the shared scenario file, and
//! properties of the status order.

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

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

// ---- GuardDrop ----

#[test]
fn a_replay_publishes_a_repeat_of_the_newest_state_and_drops_an_older_one() {
    let ranks = StatusRanks::default();
    let delivered = st("delivered", 3, 2_000);
    let again = decide_status(Some(&delivered), "delivered", 2_000, &ranks);
    assert_eq!(again, Verdict::Drop(GuardDrop::RepeatedStatus));
    assert_eq!(for_replay(again), Verdict::Accept(None), "state unchanged");
    let older = decide_status(Some(&delivered), "sent", 1_000, &ranks);
    assert_eq!(for_replay(older), Verdict::Drop(GuardDrop::StaleStatus));
    let newer = decide_status(Some(&st("sent", 2, 1_000)), "delivered", 2_000, &ranks);
    assert_eq!(for_replay(newer.clone()), newer);
    let repeats: Vec<_> = GuardDrop::ALL
        .into_iter()
        .filter(|r| r.is_repeat())
        .collect();
    assert_eq!(
        repeats.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        [
            "repeated_status",
            "repeated_stop",
            "repeated_start",
            "repeated_help"
        ]
    );
    for stale in [GuardDrop::StaleStatus, GuardDrop::StaleKeyword] {
        assert_eq!(
            for_replay(Verdict::<StatusState>::Drop(stale)),
            Verdict::Drop(stale)
        );
    }
}

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
fn default_ranks_are_the_configs_table_in_the_spec_order() {
    let ranks = StatusRanks::default();
    for (name, rank) in DEFAULT_RANKS {
        assert_eq!(ranks.rank(name), Some(rank), "{name}");
    }
    // The contract's order: queued and accepted start, the outcomes are final together,
    // and a read comes after them.
    assert_eq!(ranks.rank("queued"), ranks.rank("accepted"));
    assert!(ranks.rank("sending") < ranks.rank("sent"));
    assert!(ranks.rank("sent") < ranks.rank("delivered"));
    assert_eq!(ranks.rank("delivered"), ranks.rank("failed"));
    assert_eq!(ranks.rank("delivered"), ranks.rank("undelivered"));
    assert!(ranks.rank("delivered") < ranks.rank("read"));
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

/// One status case: the stored state of the message, the incoming status and its
/// timestamp, and the verdict the guard must give.
struct StatusCase {
    name: &'static str,
    stored: Option<StatusState>,
    status: &'static str,
    ts: i64,
    /// The rank table, when not the default one.
    ranks: Option<&'static [(&'static str, u32)]>,
    want: Verdict<StatusState>,
}

/// Accept, and store `state`.
fn stores<S>(state: S) -> Verdict<S> {
    Verdict::Accept(Some(state))
}

/// Accept, and leave the stored state as it is.
fn passes<S>() -> Verdict<S> {
    Verdict::Accept(None)
}

#[rustfmt::skip]
fn status_cases() -> Vec<StatusCase> {
    use GuardDrop::{RepeatedStatus, StaleStatus};
    let case = |name, stored: Option<StatusState>, status, ts, want| StatusCase {
        name,
        stored,
        status,
        ts,
        ranks: None,
        want,
    };
    let delivered_at_100 = || Some(st("delivered", 3, 100));
    vec![
        case("no state: a known status is accepted and stored", None, "sent", 10, stores(st("sent", 2, 10))),
        case("no state: an unknown status passes without a state", None, "carrier_ack", 10, passes()),
        case("no state: the status is stored lowercase", None, "Read", 1, stores(st("read", 4, 1))),
        case("stored: an unknown later status passes, state kept", Some(st("delivered", 3, 10)), "carrier_ack", 20, passes()),
        case("stored: an unknown earlier status passes, state kept", Some(st("delivered", 3, 10)), "carrier_ack", 0, passes()),
        case("stored: an empty status passes, state kept", Some(st("delivered", 3, 10)), "", 20, passes()),
        case("higher rank is accepted even if older", Some(st("sent", 2, 100)), "delivered", 50, stores(st("delivered", 3, 50))),
        case("lower rank is stale even if newer", delivered_at_100(), "sent", 200, Verdict::Drop(StaleStatus)),
        case("same status, earlier: repeated", delivered_at_100(), "delivered", 50, Verdict::Drop(RepeatedStatus)),
        case("same status, same time: repeated", delivered_at_100(), "delivered", 100, Verdict::Drop(RepeatedStatus)),
        case("same status, later: repeated", delivered_at_100(), "delivered", 200, Verdict::Drop(RepeatedStatus)),
        case("same status in capitals: repeated", delivered_at_100(), "DELIVERED", 200, Verdict::Drop(RepeatedStatus)),
        case("same rank, other status, later: accepted", Some(st("failed", 3, 100)), "delivered", 101, stores(st("delivered", 3, 101))),
        case("same rank, other status, earlier: stale", delivered_at_100(), "failed", 99, Verdict::Drop(StaleStatus)),
        case("same rank, other status, same time: stale", delivered_at_100(), "failed", 100, Verdict::Drop(StaleStatus)),
        // A known limit of the contract's state (one status, one timestamp) together with "a
        // drop leaves the state unchanged": a repeated status with a later timestamp
        // cannot refresh the stored timestamp, so an equal-rank status between the two is
        // still accepted.
        case("a repeat does not refresh the timestamp: the repeat", Some(st("delivered", 3, 1_000)), "delivered", 5_000, Verdict::Drop(RepeatedStatus)),
        case("a repeat does not refresh the timestamp: a status between", Some(st("delivered", 3, 1_000)), "failed", 3_000, stores(st("failed", 3, 3_000))),
        // The stored rank is what contract §4 compares against, even under a changed table.
        StatusCase {
            ranks: Some(&[("a", 5), ("b", 1)]),
            ..case("judged against the stored rank, not the table's", Some(st("a", 0, 0)), "b", 1, stores(st("b", 1, 1)))
        },
    ]
}

#[test]
fn status_table() {
    let cases = status_cases();
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let ranks = c.ranks.map_or_else(StatusRanks::default, |r| {
                StatusRanks::new(r.iter().map(|(s, n)| ((*s).to_owned(), *n)))
            });
            let got = decide_status(c.stored.as_ref(), c.status, c.ts, &ranks);
            (got != c.want).then(|| format!("{}: got {got:?}, want {:?}", c.name, c.want))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} status cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
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

/// Found by the keyword normalisation property test: upper-casing after NFKC left
/// "ῢ" decomposed, so it did not match its own capital typed composed.
#[test]
fn a_lower_case_letter_and_its_composed_capital_normalise_alike() {
    assert_eq!(normalise_keyword_text("ῢ"), normalise_keyword_text("Ϋ̀"));
    let once = normalise_keyword_text("ῢ");
    assert_eq!(normalise_keyword_text(&once), once);
}

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

/// One keyword case: the stored state of the (contact, channel), the incoming keyword, its
/// timestamp and the help window, and the verdict the guard must give.
struct KeywordCase {
    name: &'static str,
    stored: Option<KeywordState>,
    keyword: Keyword,
    ts: i64,
    help_window_ms: i64,
    want: Verdict<KeywordState>,
}

#[rustfmt::skip]
fn keyword_cases() -> Vec<KeywordCase> {
    use GuardDrop::{RepeatedHelp, RepeatedStart, RepeatedStop, StaleKeyword};
    use Keyword::{Help, Start, Stop};
    let case = |name, stored: Option<KeywordState>, keyword, ts, want| KeywordCase {
        name,
        stored,
        keyword,
        ts,
        help_window_ms: HELP_WINDOW_MS,
        want,
    };
    let opted_out_at_10 = || Some(kw(true, false, Some(10), None));
    let started_at_10 = || Some(kw(false, true, Some(10), None));
    let help_at_100s = || Some(kw(false, false, None, Some(100_000)));
    let window = |help_window_ms, c: KeywordCase| KeywordCase { help_window_ms, ..c };
    vec![
        // STOP
        case("STOP, no state: opts out", None, Stop, 10, stores(kw(true, false, Some(10), None))),
        case("STOP while opted out: repeated", opted_out_at_10(), Stop, 20, Verdict::Drop(RepeatedStop)),
        case("STOP older than the last change: stale", started_at_10(), Stop, 9, Verdict::Drop(StaleKeyword)),
        case("STOP both repeated and older: repeated", opted_out_at_10(), Stop, 5, Verdict::Drop(RepeatedStop)),
        case("STOP after START: opts out, HELP kept", Some(kw(false, true, Some(10), Some(3))), Stop, 11, stores(kw(true, false, Some(11), Some(3)))),
        case("STOP at the time of the last change: accepted", started_at_10(), Stop, 10, stores(kw(true, false, Some(10), None))),
        // START
        case("START, no state: opted in by START", None, Start, 10, stores(kw(false, true, Some(10), None))),
        case("START after START, later: repeated", started_at_10(), Start, 20, Verdict::Drop(RepeatedStart)),
        case("START after START, earlier: repeated", started_at_10(), Start, 5, Verdict::Drop(RepeatedStart)),
        case("START older than the STOP: stale", opted_out_at_10(), Start, 9, Verdict::Drop(StaleKeyword)),
        case("START after STOP: opts in, HELP kept", Some(kw(true, false, Some(10), Some(4))), Start, 12, stores(kw(false, true, Some(12), Some(4)))),
        // HELP
        case("HELP, no state: recorded", None, Help, 1_000, stores(kw(false, false, None, Some(1_000)))),
        case("HELP at the same time: repeated", help_at_100s(), Help, 100_000, Verdict::Drop(RepeatedHelp)),
        case("HELP 30 s later: repeated", help_at_100s(), Help, 130_000, Verdict::Drop(RepeatedHelp)),
        case("HELP 1 ms inside the window, later: repeated", help_at_100s(), Help, 159_999, Verdict::Drop(RepeatedHelp)),
        case("HELP 30 s earlier: repeated", help_at_100s(), Help, 70_000, Verdict::Drop(RepeatedHelp)),
        case("HELP 1 ms inside the window, earlier: repeated", help_at_100s(), Help, 40_001, Verdict::Drop(RepeatedHelp)),
        case("HELP exactly a window later: accepted, opt state kept", Some(kw(true, false, Some(5), Some(100_000))), Help, 160_000, stores(kw(true, false, Some(5), Some(160_000)))),
        case("HELP a window earlier: accepted, the record does not move back", Some(kw(true, false, Some(5), Some(100_000))), Help, 40_000, stores(kw(true, false, Some(5), Some(100_000)))),
        window(0, case("HELP, window 0: the rule is off", Some(kw(false, false, None, Some(100))), Help, 100, stores(kw(false, false, None, Some(100))))),
        window(-1, case("HELP, negative window: the rule is off", Some(kw(false, false, None, Some(100))), Help, 100, stores(kw(false, false, None, Some(100))))),
        window(i64::MIN, case("HELP, window i64::MIN: the rule is off", Some(kw(false, false, None, Some(100))), Help, 100, stores(kw(false, false, None, Some(100))))),
        window(i64::MAX, case("HELP, extreme timestamps far apart: no overflow, accepted", Some(kw(false, false, None, Some(i64::MIN))), Help, i64::MAX, stores(kw(false, false, None, Some(i64::MAX))))),
        window(i64::MAX, case("HELP, extreme timestamps close: no overflow, repeated", Some(kw(false, false, None, Some(i64::MAX))), Help, i64::MAX - 1, Verdict::Drop(RepeatedHelp))),
        case("HELP while opted out: accepted, opt state untouched", opted_out_at_10(), Help, 1, stores(kw(true, false, Some(10), Some(1)))),
        case("STOP after a HELP while opted out: still repeated", Some(kw(true, false, Some(10), Some(1))), Stop, 20, Verdict::Drop(RepeatedStop)),
    ]
}

/// Every row; and every row without a stored state again with the default state stored,
/// which must behave exactly like no state.
#[test]
fn keyword_table() {
    let cases = keyword_cases();
    let default = KeywordState::default();
    let mut runs = 0;
    let mut failed = Vec::new();
    for c in &cases {
        let mut stored = vec![(c.stored.as_ref(), "")];
        if c.stored.is_none() {
            stored.push((Some(&default), " (with the default state stored)"));
        }
        for (state, how) in stored {
            runs += 1;
            let got = decide_keyword(state, c.keyword, c.ts, c.help_window_ms);
            if got != c.want {
                failed.push(format!("{}{how}: got {got:?}, want {:?}", c.name, c.want));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {runs} keyword checks failed:\n{}",
        failed.len(),
        failed.join("\n")
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
                let status = status_of(event, body.pointer("/data/status").and_then(Value::as_str));
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

proptest! {
    /// A message is classified as its full normal form says, whatever shortcut an ASCII
    /// message takes: keywords and messages drawn from letters of either case, white
    /// space, punctuation and a few non-ASCII letters, configured words included.
    #[test]
    fn classify_is_the_lookup_of_the_normal_form(
        words in proptest::collection::vec("[sStTopP ñ!.]{0,7}", 0..6),
        message in "[ \t\nsStTopPxñ!.?,¡]{0,12}",
        pick in proptest::option::of(0_usize..6),
    ) {
        let lists = KeywordLists::new(&words, &strings(&["start"]), &strings(&["help"]));
        let text = match pick.and_then(|i| words.get(i)) {
            Some(word) => format!("  {word}!  "),
            None => message,
        };
        prop_assert_eq!(
            lists.classify(&text),
            lists.words.get(&normalise_keyword_text(&text)).copied(),
            "{:?} against {:?}", text, words
        );
    }
}
