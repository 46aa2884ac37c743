//! The machine's Redis, shared by the tests: its URL, and a key prefix of a test's own
//! whose keys are deleted when it is dropped.

use super::{unique, BROKER_TIMEOUT};

/// The machine's Redis.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";

/// A fresh key prefix in the shared Redis (`hg-test-<random>:`). Every key under it is
/// deleted on drop, also when the test fails, so test runs leave Redis as they found it.
pub struct KeyPrefix(String);

impl KeyPrefix {
    pub fn new() -> Self {
        Self(unique("hg-test") + ":")
    }
}

impl std::ops::Deref for KeyPrefix {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Drop for KeyPrefix {
    /// A blocking connection: drop cannot await.
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(REDIS_URL) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(BROKER_TIMEOUT) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}
