//! A route as the pipeline serves it, and the settings it reads on every request.

use std::time::Duration;

use crate::clock::Clock;
use crate::config::{Backend, Config, Route};
use crate::guard::RouteGuard;
use crate::ingress::event::EventFields;
use crate::ingress::secrets::RouteSecrets;
use crate::metrics::{Metrics, RouteCounters};
use crate::outbox::spooling::FLUSH_TIMEOUT as SPOOL_FLUSH_WAIT;
use crate::providers::Scheme;
use crate::ratelimit::TokenBucket;

use super::outcome::drop_reasons;

/// A route built from its config before any port is bound: secrets loaded, signature
/// scheme, fields and guard rules compiled.
pub struct CompiledRoute {
    /// The route's config.
    pub config: Route,
    /// Where its events' id, type and time are.
    pub fields: EventFields,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// Its active secrets (reloadable).
    pub secrets: RouteSecrets,
    /// Its guard rules.
    pub guard: RouteGuard,
}

/// A route as requests use it: compiled, with its rate limit on the serving clock and its
/// counters.
pub struct RouteRuntime {
    /// The route's config.
    pub config: Route,
    /// Where its events' id, type and time are.
    pub fields: EventFields,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// Its active secrets (reloadable).
    pub secrets: RouteSecrets,
    /// Its guard rules.
    pub guard: RouteGuard,
    /// Its rate limit for verified deliveries, if configured.
    pub limiter: Option<TokenBucket>,
    /// Its request, drop, duplicate and signature counters.
    pub counters: RouteCounters,
}

impl RouteRuntime {
    /// `route` with its rate limit on `clock` and its counters in `metrics`.
    pub fn new(route: CompiledRoute, metrics: &Metrics, clock: &Clock) -> Self {
        let CompiledRoute {
            config,
            fields,
            scheme,
            secrets,
            guard,
        } = route;
        Self {
            limiter: config
                .rate_limit
                .as_ref()
                .map(|r| TokenBucket::new(r, clock.clone())),
            counters: metrics.route_counters(&config.name, &drop_reasons()),
            config,
            fields,
            scheme,
            secrets,
            guard,
        }
    }
}

/// The settings the pipeline reads on every request.
pub struct PipelineSettings {
    pub(super) routing_key: String,
    pub(super) dropped_routing_key: Option<String>,
    pub(super) ttl: Duration,
    pub(super) skew_ms: i64,
    pub(super) in_flight_wait: Duration,
    pub(super) in_flight_lease: Duration,
    /// The latest after its claims (or, with `redis.wait_replicas`, after their renewal)
    /// that a request may start its publish and still finish within its lease: the lease
    /// less what the publish and the writes after it may take.
    pub(super) publish_by: Duration,
}

impl PipelineSettings {
    /// The settings of `config`.
    pub fn of(config: &Config) -> Self {
        Self {
            routing_key: config.amqp.routing_key.clone(),
            dropped_routing_key: config.amqp.dropped_routing_key.clone(),
            ttl: config.dedup.ttl,
            skew_ms: config.max_clock_skew.as_millis() as i64,
            in_flight_wait: config.dedup.in_flight_wait,
            in_flight_lease: config.dedup.in_flight_lease,
            publish_by: config
                .dedup
                .in_flight_lease
                .saturating_sub(match config.dedup.backend {
                    Backend::Redis => config.redis.hold_from_publish(config.amqp.confirm_timeout),
                    Backend::Local => config.amqp.confirm_timeout + SPOOL_FLUSH_WAIT,
                }),
        }
    }
}
