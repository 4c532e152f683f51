//! The Lua scripts the store runs in Redis. Each touches the keys of one
//! rule and key only (one hash tag), so it runs on one node of a cluster.

/// The `sync exact` script. KEYS: counter, latch. ARGV: increment, counter
/// expiry (ms), amount, latch (0: none, -1: manual, else ms).
/// Returns `{count, 0}`, `{-1, latch pttl}` when already engaged (pttl -1:
/// manual), or `{-2, latch ms}` when this call engaged it.
pub(super) const EXACT_SCRIPT: &str = r"
local latch = redis.call('PTTL', KEYS[2])
if latch ~= -2 then return {-1, latch} end
local inc = tonumber(ARGV[1])
local c = redis.call('INCRBY', KEYS[1], inc)
if c == inc then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local l = tonumber(ARGV[4])
if c > tonumber(ARGV[3]) and l ~= 0 then
  if l > 0 then redis.call('SET', KEYS[2], '1', 'PX', l) else redis.call('SET', KEYS[2], '1') end
  return {-2, l}
end
return {c, 0}
";

/// The `sync batch` lease script (`gov_engine::cluster::LeaseCall`). KEYS:
/// counter of leased calls, latch. ARGV: calls wanted, amount, counter expiry
/// (ms), calls counted without a lease, calls given back, the lease share.
/// Gives back and counts first, then grants `min(wanted, ceil(left / share))`
/// of what the window has left (`gov_engine::cluster::lease_grant`), none
/// while the latch is set. Returns `{granted, count}`, or `{-1, latch pttl}`
/// when engaged (pttl -1: manual).
pub(super) const LEASE_SCRIPT: &str = r"
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
local back = math.min(tonumber(ARGV[5]), c)
local unleased = tonumber(ARGV[4])
local latch = redis.call('PTTL', KEYS[2])
local grant = 0
if latch == -2 then
  local left = tonumber(ARGV[2]) - (c - back) - unleased
  if left > 0 then
    grant = math.min(tonumber(ARGV[1]), math.ceil(left / tonumber(ARGV[6])))
  end
end
local delta = grant + unleased - back
if delta ~= 0 then
  c = redis.call('INCRBY', KEYS[1], delta)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if latch ~= -2 then return {-1, latch} end
return {grant, c}
";
