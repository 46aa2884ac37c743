//! The Lua scripts of the Redis backend, each with its contract: the fenced writes (a write
//! made only while the writer's token still holds its lease, in the same atomic step), the
//! lease renewal before a publish, and the duplicate's check under `WAIT`.

/// First byte of a done mark's value, which its decision record follows (`state::decision`;
/// a mark written before records is this byte alone). A claim's value is its token in
/// decimal digits, so the two never meet.
pub const DONE: u8 = b'd';

/// Deletes a key only if it still holds our value: a claim or lock taken over after its
/// lease must not be released by the old owner.
pub const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Takes a lease for `ARGV[1]`, or extends it when `ARGV[1]` holds it already, for
/// `ARGV[2]` ms; 1 if held now.
pub const TAKE_OR_EXTEND: &str = r#"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#;

/// The guard commit: writes the state `KEYS[2]` (`ARGV[2]`, expiring after `ARGV[3]` ms,
/// never when 0) and releases the lock `KEYS[1]`, only while token `ARGV[1]` holds that
/// lock; 0 otherwise. A lock that expired and was never taken again is lost too: another
/// request may have taken it, decided and released it in between.
pub const FENCED_COMMIT: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[2], ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
redis.call('DEL', KEYS[1])
return 1
"#;

/// Writes `KEYS[2]` (`ARGV[2]`, never expiring) only while token `ARGV[1]` holds the lease
/// `KEYS[1]`; 0 otherwise. The lease stays: its holder renews and ends it.
pub const FENCED_PUT: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"#;

/// Marks every key `KEYS[i]` done with its value `ARGV[2 + i]` (a done mark and its
/// record) for `ARGV[2]` ms, all or none, unless one of them is claimed by another token
/// than `ARGV[1]`: then 0. A key that is free (its claim expired and nobody took it) or
/// done already is marked: the event was handled, and a done mark only ever keeps a
/// duplicate out.
pub const FENCED_DONE: &str = r#"
for _, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held and held ~= ARGV[1] and string.sub(held, 1, 1) ~= 'd' then
    return 0
  end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[2 + i], 'PX', ARGV[2])
end
return 1
"#;

/// Replaces the value of `KEYS[1]` by `ARGV[2]`, keeping its expiry, only while it is still
/// `ARGV[1]`: its remaining lifetime in ms; -3 otherwise (a concurrent update won; its
/// count stands).
pub const COMPARE_AND_SET: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return redis.call('PTTL', KEYS[1])
end
return -3
"#;

/// The value of `KEYS[1]` and its remaining lifetime in ms, read at one point in time.
pub const GET_WITH_TTL: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#;

/// A duplicate's check under `WAIT`: counts the keys that are done (their value starts
/// with `d`, the done mark, its decision record after it) and rewrites each one's expiry as
/// it stands. The rewrite is a write, so it moves the calling connection's replication
/// offset past the mark, and the `WAIT` after it covers the mark whichever connection wrote
/// it; a mark the master no longer has (lost in a failover) counts nothing.
pub const TOUCH_DONE: &str = r#"
local done = 0
for _, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  if value and string.sub(value, 1, 1) == 'd' then
    local ttl = redis.call('PTTL', key)
    if ttl > 0 then
      redis.call('PEXPIRE', key, ttl)
    else
      redis.call('SET', key, value, 'KEEPTTL')
    end
    done = done + 1
  end
end
return done
"#;

/// Renews the leases `KEYS` (claims and a guard key's lock) for `ARGV[n + 1]` ms, all or
/// none, only while each still holds its token (`ARGV[i]` for `KEYS[i]`); 0 otherwise.
/// Sent with a `WAIT` before a publish, so the leases it publishes under are on the
/// replicas: a failover cannot hand them to a second replica that would decide again.
pub const RENEW: &str = r#"
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[i] then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[#KEYS + 1])
end
return 1
"#;
