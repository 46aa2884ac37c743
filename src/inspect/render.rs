//! The text `hookgate inspect` prints by default: one fact a line, and what is not known
//! said as such, never left blank.

use std::fmt::Write as _;

use crate::inspect::report::{
    Answer, ContactReport, EventReport, GuardEventReport, MessageReport, Report, RequestReport,
};

/// Why an unknown event or request may be unknown: the window passed, or it was refused
/// before anything was recorded.
const UNSEEN_WHY: &str = "an event older than that is forgotten; a delivery refused \
(401 bad signature, 400, 413, 429, 503) is never recorded";

/// The text of `report`.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let (route, window) = (&report.route, &report.window);
    match &report.answer {
        Answer::Event(e) => {
            let _ = writeln!(out, "event {} on route {route}", e.event_id);
            event_lines(&mut out, e, window);
        }
        Answer::Request(r) => request_lines(&mut out, r, route, window),
        Answer::Message(m) => message_lines(&mut out, m, route),
        Answer::Contact(c) => contact_lines(&mut out, c, route),
    }
    out
}

fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "  {label:<12} {value}");
}

fn event_lines(out: &mut String, e: &EventReport, window: &str) {
    let Some(mark) = &e.mark else {
        line(
            out,
            "seen",
            format!("not seen within the window of {window} ({UNSEEN_WHY})"),
        );
        return;
    };
    if e.by_message_id {
        line(out, "found as", "an inbound message id (its dedup key)");
    }
    let Some(r) = &e.record else {
        let state = if mark.state == "in_flight" {
            "a delivery of it is being decided now".to_owned()
        } else {
            "handled; its mark holds no record (written before marks kept one)".to_owned()
        };
        line(out, "outcome", state);
        if let Some(until) = &mark.kept_until {
            line(out, "kept until", until);
        }
        return;
    };
    let outcome = match (r.outcome.as_str(), &r.delivery, &r.reason) {
        ("accepted", Some(d), _) if d == "spooled" => {
            "accepted, spooled (the broker was away; the spool publishes it once it is back)"
                .to_owned()
        }
        ("accepted", Some(d), _) if d == "held" => {
            "accepted, held in the spool (no queue was bound for it, or for an earlier event of \
             its key; published once a queue takes it)"
                .to_owned()
        }
        ("accepted", _, _) => "accepted, published (the broker confirmed it)".to_owned(),
        (_, _, Some(reason)) => format!("dropped: {reason}"),
        (other, _, _) => other.to_owned(),
    };
    line(out, "outcome", outcome);
    line(
        out,
        "first seen",
        format!("{} via {}", r.first_seen, r.source),
    );
    let duplicates = r.deliveries.saturating_sub(1);
    line(
        out,
        "deliveries",
        format!(
            "{} ({duplicates} answered as duplicate); sources: {}",
            r.deliveries,
            r.sources.join(", ")
        ),
    );
    let requests = match (&r.first_request_id, &r.last_request_id) {
        (Some(first), Some(last)) => format!("first {first}, latest {last}"),
        (Some(first), None) => first.clone(),
        (None, Some(last)) => format!("latest {last}"),
        (None, None) => "none kept (not a webhook delivery)".to_owned(),
    };
    line(out, "request ids", requests);
    if let Some(until) = &mark.kept_until {
        line(out, "kept until", until);
    }
}

fn request_lines(out: &mut String, r: &RequestReport, route: &str, window: &str) {
    let _ = writeln!(out, "request {} on route {route}", r.request_id);
    let Some(mark) = &r.mark else {
        line(
            out,
            "seen",
            format!("not seen within the window of {window} ({UNSEEN_WHY})"),
        );
        return;
    };
    match (&r.event_id, &r.event) {
        (Some(id), Some(event)) => {
            line(out, "event", id);
            event_lines(out, event, window);
        }
        _ if mark.state == "in_flight" => line(out, "event", "being decided now"),
        _ => line(
            out,
            "event",
            "handled; its mark names no event (written before marks kept one)",
        ),
    }
}

fn guard_event(e: &GuardEventReport) -> String {
    match &e.reason {
        Some(reason) => format!("{} {} at {}: {reason}", e.event_id, e.what, e.at),
        None => format!("{} {} at {}", e.event_id, e.what, e.at),
    }
}

fn dropped_lines(out: &mut String, dropped: &[GuardEventReport], what: &str) {
    if dropped.is_empty() {
        line(
            out,
            "dropped",
            format!("no {what} dropped against this state"),
        );
    }
    for (i, e) in dropped.iter().enumerate() {
        line(out, if i == 0 { "dropped" } else { "" }, guard_event(e));
    }
}

fn message_lines(out: &mut String, m: &MessageReport, route: &str) {
    let _ = writeln!(out, "message {} on route {route}", m.message_id);
    let Some(status) = &m.status else {
        line(
            out,
            "status",
            "no status kept (none seen within guard.status.retention)",
        );
        return;
    };
    let rank = m.rank.map_or_else(String::new, |r| format!(" (rank {r})"));
    line(out, "status", format!("{status}{rank}"));
    if let Some(t) = &m.status_time {
        line(out, "event time", t);
    }
    let set_by = m.set_by.as_ref().map_or_else(
        || "not named (state written before the guard named events)".to_owned(),
        guard_event,
    );
    line(out, "set by", set_by);
    dropped_lines(out, &m.dropped, "status event");
    if let Some(until) = &m.kept_until {
        line(out, "kept until", until);
    }
}

fn contact_lines(out: &mut String, c: &ContactReport, route: &str) {
    let _ = writeln!(out, "contact {} to {} on route {route}", c.from, c.to);
    if !c.known {
        line(
            out,
            "opt",
            "opted in: no STOP, START or HELP kept for this contact and channel",
        );
        return;
    }
    let opt = match c.opt.as_deref() {
        Some("opted_out") => "opted out",
        Some("opted_in") => "opted in (by a START)",
        _ => "opted in (never opted out)",
    };
    match &c.changed_at {
        Some(at) => line(out, "opt", format!("{opt} since {at} (the keyword's time)")),
        None => line(out, "opt", opt),
    }
    let last = c.last_keyword.as_ref().map_or_else(
        || "not named (state written before the guard named events)".to_owned(),
        guard_event,
    );
    line(out, "last keyword", last);
    if let Some(help) = &c.last_help {
        line(out, "last HELP", help);
    }
    dropped_lines(out, &c.dropped, "keyword");
    line(
        out,
        "kept until",
        c.kept_until
            .as_deref()
            .unwrap_or("changed (no retention set)"),
    );
}
