//! Label sets of the metric families, and the enums of the label values hookgate makes at
//! start-up so that every series is scraped (at zero) before its first event.

use std::marker::PhantomData;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Labels of per-route request counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcome {
    /// Route name (`unmatched` for unknown paths).
    pub route: String,
    /// A [`RequestOutcome`], or `not_found` on the `unmatched` route.
    pub outcome: String,
}

impl RouteOutcome {
    pub(super) fn new(route: &str, outcome: &str) -> Self {
        Self {
            route: route.to_owned(),
            outcome: outcome.to_owned(),
        }
    }
}

/// Labels of guard drops.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteReason {
    /// Route name.
    pub route: String,
    /// Drop reason (contract §2).
    pub reason: String,
}

/// Labels with just the route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Route name.
    pub route: String,
}

/// Labels with just a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// Labels of reconciliation counts with a kind (walk result, event outcome, bad answer).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteKind {
    /// Route name.
    pub route: String,
    /// What is counted.
    pub kind: String,
}

/// Labels of the build info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: String,
}

/// The values of one label, as an enum declared with `label_values!`.
pub trait LabelValue: Copy + 'static {
    /// Every value, in declaration order.
    const VALUES: &'static [Self];
    /// The value as `/metrics` shows it.
    fn label(self) -> &'static str;
}

/// Declares an enum of a label's values. `as_str` is each value as `/metrics` shows it and
/// `ALL` lists every value in declaration order; both come from the one list, so a new
/// value is made at start-up as soon as it is declared.
macro_rules! label_values {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$value_meta:meta])* $value:ident => $label:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$value_meta])* $value, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [Self; [$($label),+].len()] = [$(Self::$value),+];

            /// The value as `/metrics` shows it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$value => $label,)+
                }
            }
        }

        impl $crate::metrics::LabelValue for $name {
            const VALUES: &'static [Self] = &Self::ALL;

            fn label(self) -> &'static str {
                self.as_str()
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use label_values;

label_values! {
    /// How a route's request was answered (label `outcome` of `hookgate_requests_total`):
    /// the pipeline's outcomes and the answers given before the pipeline.
    pub enum RequestOutcome {
        /// Published or spooled.
        Accepted => "accepted",
        /// Seen before.
        Duplicate => "duplicate",
        /// Dropped by the guard or the freshness check.
        Dropped => "dropped",
        /// Missing, malformed or wrong signature.
        InvalidSignature => "invalid_signature",
        /// Not a usable event.
        BadRequest => "bad_request",
        /// Over the route's rate limit, or the peer over its failed verifications.
        RateLimited => "rate_limited",
        /// Could not be made safe now (503).
        Unavailable => "unavailable",
        /// Not a POST.
        MethodNotAllowed => "method_not_allowed",
        /// A body over `max_body_bytes`.
        TooLarge => "too_large",
        /// A body not read within `body_read_timeout`.
        Timeout => "timeout",
        /// A body cut short by the client.
        Aborted => "aborted",
    }
}

label_values! {
    /// Why a webhook connection was closed by hookgate (label of
    /// `hookgate_connections_closed_total`).
    pub enum CloseReason {
        /// No complete request head within `header_read_timeout` of the accept (TLS
        /// handshake, protocol detection and the HTTP/2 preface included).
        SetupTimeout => "setup_timeout",
        /// The TLS handshake failed.
        TlsError => "tls_error",
        /// No request for `idle_timeout` (kept-alive HTTP/1, or HTTP/2 with no open stream).
        Idle => "idle",
        /// Older than `max_connection_age`: asked to close (GOAWAY), then closed.
        MaxAge => "max_age",
        /// Accepted while `max_connections` were open: closed at once.
        OverCapacity => "over_capacity",
    }
}

label_values! {
    /// Why a request was refused before its signature was checked (label of
    /// `hookgate_refusals_total`).
    pub enum RefusalReason {
        /// The peer address spent its `failed_verification_per_peer`: 429 before the body.
        PeerFailures => "peer_failures",
        /// The body could not be read within `body_read_timeout` while waiting for the
        /// unverified body budget: 408.
        BodyBudget => "body_budget",
    }
}

/// A counter family labelled `reason`, with a series for each value of `R` made at zero.
pub struct ReasonCounters<R> {
    family: Family<ReasonLabel, Counter>,
    reasons: PhantomData<R>,
}

impl<R: LabelValue> ReasonCounters<R> {
    /// The family, every reason's series made at zero.
    pub fn new() -> Self {
        let family = Family::<ReasonLabel, Counter>::default();
        for reason in R::VALUES {
            let _ = family.get_or_create(&Self::labels(*reason));
        }
        Self {
            family,
            reasons: PhantomData,
        }
    }

    /// Counts one event of `reason`.
    pub fn count(&self, reason: R) {
        self.family.get_or_create(&Self::labels(reason)).inc();
    }

    /// A handle of the family, to register it.
    pub(super) fn family(&self) -> Family<ReasonLabel, Counter> {
        self.family.clone()
    }

    fn labels(reason: R) -> ReasonLabel {
        ReasonLabel {
            reason: reason.label().to_owned(),
        }
    }
}

impl<R: LabelValue> Default for ReasonCounters<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R> Clone for ReasonCounters<R> {
    fn clone(&self) -> Self {
        Self {
            family: self.family.clone(),
            reasons: PhantomData,
        }
    }
}
