//! `Config::validate`: the rules that span fields, one part per section. The parts run in
//! a fixed order and the first rule broken is the error.

use std::collections::HashSet;
use std::time::Duration;

use durable_spool::FLUSH_TIMEOUT as SPOOL_FLUSH_WAIT;

use super::amqp::fits_short_string;
use super::config_error::ConfigError;
use super::route::Route;
use super::schema::{Backend, Config};
use super::secret::SecretSource;

/// Longest `store.commit_interval`: every durable answer may wait this long for its commit.
const MAX_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest `dedup.ttl`: the state store rewrites a run once a ttl has passed since it
/// was written, so a zero ttl rewrites in a loop.
const MIN_DEDUP_TTL: Duration = Duration::from_secs(1);

fn invalid(message: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid(message.into()))
}

impl Config {
    /// Rules that span fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_routes()?;
        self.validate_limits()?;
        self.validate_store()?;
        self.validate_hardening()?;
        self.validate_dedup()?;
        self.validate_spool_and_exchange()?;
        if self.listen.addr == self.admin.addr && self.listen.addr.port() != 0 {
            return invalid("admin.addr: must differ from listen.addr");
        }
        self.amqp.validate().map_err(ConfigError::Invalid)?;
        if self.dedup.backend == Backend::Redis {
            self.redis.validate(
                self.dedup.in_flight_lease,
                self.dedup.in_flight_wait,
                self.amqp.confirm_timeout,
            )?;
        }
        Ok(())
    }

    /// At least one route; paths and names unique; each route valid on its own.
    fn validate_routes(&self) -> Result<(), ConfigError> {
        if self.routes.is_empty() {
            return invalid("routes: at least one route is required");
        }
        let mut paths = HashSet::new();
        let mut names = HashSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            if !route.path.starts_with('/') {
                return invalid(format!("{at}.path: must start with '/'"));
            }
            if !paths.insert(route.path.as_str()) {
                return invalid(format!("{at}.path: {} is used twice", route.path));
            }
            if route.name.is_empty() || !names.insert(route.name.as_str()) {
                return invalid(format!("{at}.name: must be non-empty and unique"));
            }
            check_route(&at, route, self.dedup.ttl)?;
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.limits.max_header_bytes < 1024 {
            return invalid("limits.max_header_bytes: must be at least 1KiB");
        }
        Ok(())
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        if self.store.hot_entries < 1024 {
            return invalid("store.hot_entries: must be at least 1024");
        }
        if self.store.cache < 1 << 20 {
            return invalid("store.cache: must be at least 1MiB");
        }
        if self.store.journal_segment < 64 << 10 {
            return invalid("store.journal_segment: must be at least 64KiB");
        }
        if self.store.commit_interval > MAX_COMMIT_INTERVAL {
            return invalid("store.commit_interval: must be at most 100ms");
        }
        Ok(())
    }

    /// Limits that keep unauthenticated clients small (SECURITY.md).
    fn validate_hardening(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if l.max_unverified_body_bytes < l.max_body_bytes.get() {
            return invalid(
                "limits.max_unverified_body_bytes: must hold at least one body of limits.max_body_bytes",
            );
        }
        if l.header_read_timeout.is_zero()
            || l.body_read_timeout.is_zero()
            || l.idle_timeout.is_zero()
            || l.max_connection_age.is_zero()
        {
            return invalid("limits: timeouts and max_connection_age must be positive");
        }
        if !(1..=32).contains(&l.failed_verification_ipv4_prefix) {
            return invalid("limits.failed_verification_ipv4_prefix: must be 1 to 32");
        }
        if !(1..=128).contains(&l.failed_verification_ipv6_prefix) {
            return invalid("limits.failed_verification_ipv6_prefix: must be 1 to 128");
        }
        if let Some(h) = &l.peer_address_header {
            if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return invalid("limits.peer_address_header: not a valid header name");
            }
        }
        Ok(())
    }

    fn validate_dedup(&self) -> Result<(), ConfigError> {
        if self.dedup.ttl < MIN_DEDUP_TTL {
            return invalid(format!(
                "dedup.ttl: must be at least {MIN_DEDUP_TTL:?} (the state store rewrites its runs once a ttl has passed)"
            ));
        }
        // A request holds its claim while it waits for the guard-key lock (at most
        // `in_flight_wait`), publishes (at most `confirm_timeout`) and, when the publish
        // fails, waits for its spool entry's fsync: a shorter lease lets a second request take
        // a claim whose publish is still under way.
        let held = self.dedup.in_flight_wait + self.amqp.confirm_timeout + SPOOL_FLUSH_WAIT;
        if self.dedup.in_flight_lease <= held {
            return invalid(format!(
                "dedup.in_flight_lease: must be longer than {held:?} (dedup.in_flight_wait + amqp.confirm_timeout + {SPOOL_FLUSH_WAIT:?} for the spool's fsync), or a claim still publishing could be taken over"
            ));
        }
        Ok(())
    }

    fn validate_spool_and_exchange(&self) -> Result<(), ConfigError> {
        if self.store.hung_after <= self.amqp.confirm_timeout {
            // A drainer waits up to a confirm timeout for the broker without a beat.
            return invalid("store.hung_after: must exceed amqp.confirm_timeout");
        }
        if self.spool.stall_after <= self.amqp.confirm_timeout {
            return invalid(
                "spool.stall_after: must be longer than amqp.confirm_timeout, or one slow publish would look like a stall",
            );
        }
        if !fits_short_string(&self.amqp.exchange) {
            return invalid("amqp.exchange: must be at most 255 bytes (an AMQP short string)");
        }
        if let Some(queue) = &self.amqp.queue {
            if queue.name.is_empty() || !fits_short_string(&queue.name) {
                return invalid("amqp.queue.name: must be 1 to 255 bytes (an AMQP short string)");
            }
            if !queue.binding.as_deref().is_none_or(fits_short_string) {
                return invalid(
                    "amqp.queue.binding: must be at most 255 bytes (an AMQP short string)",
                );
            }
        }
        Ok(())
    }
}

/// The rules of one route, `at` its key (`routes[i]`), past the uniqueness of its path and
/// name.
fn check_route(at: &str, route: &Route, dedup_ttl: Duration) -> Result<(), ConfigError> {
    // The name starts every store key; in Redis `:` separates a key's parts, and
    // `guard` and `lock` begin the guard state's and the guard locks' keys.
    if route.name.contains(['\0', ':']) || ["guard", "lock"].contains(&route.name.as_str()) {
        return invalid(format!(
            "{at}.name: may not contain ':' or NUL, nor be `guard` or `lock`"
        ));
    }
    check_secrets(at, route)?;
    // The keys one sender owns (`signature`, `public_url`): its sender says.
    if let Err(reason) = route.profile.sender().check_keys(&route.sender_keys()) {
        return invalid(format!("{at}.{reason}"));
    }
    if let Some(fields) = &route.fields {
        for (name, ptr) in [
            ("fields.event_id", &fields.event_id),
            ("fields.event_type", &fields.event_type),
            ("fields.timestamp", &fields.timestamp),
            ("fields.message_id", &fields.message_id),
        ] {
            check_pointer(&format!("{at}.{name}"), ptr)?;
        }
    }
    check_guard_pointers(at, route)?;
    if let Some(rc) = &route.reconcile {
        if !route.profile.sender().lists_messages() {
            return invalid(format!(
                "{at}.reconcile: only with profile botix (the list API it reads)"
            ));
        }
        rc.validate(&format!("{at}.reconcile"), dedup_ttl)
            .map_err(ConfigError::Invalid)?;
    }
    Ok(())
}

/// At least one secret, and no empty inline one.
fn check_secrets(at: &str, route: &Route) -> Result<(), ConfigError> {
    if route.secrets.is_empty() {
        return invalid(format!("{at}.secrets: at least one secret is required"));
    }
    for (j, s) in route.secrets.iter().enumerate() {
        if matches!(s, SecretSource::Inline { value } if value.is_empty()) {
            return invalid(format!(
                "{at}.secrets[{j}].secret: route {}: an empty secret lets anyone sign",
                route.name
            ));
        }
    }
    Ok(())
}

fn check_guard_pointers(at: &str, route: &Route) -> Result<(), ConfigError> {
    if let Some(st) = &route.guard.status {
        check_pointer(&format!("{at}.guard.status.message_id"), &st.message_id)?;
        check_pointer(&format!("{at}.guard.status.status"), &st.status)?;
    }
    if let Some(kw) = &route.guard.keywords {
        check_pointer(&format!("{at}.guard.keywords.text"), &kw.text)?;
        check_pointer(&format!("{at}.guard.keywords.contact"), &kw.contact)?;
        check_pointer(&format!("{at}.guard.keywords.channel"), &kw.channel)?;
    }
    Ok(())
}

fn check_pointer(at: &str, ptr: &str) -> Result<(), ConfigError> {
    if ptr.is_empty() || ptr.starts_with('/') {
        Ok(())
    } else {
        invalid(format!(
            "{at}: a JSON Pointer must be empty or start with '/', got {ptr:?}"
        ))
    }
}
