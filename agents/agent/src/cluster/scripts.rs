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

/// The `sync exact` script of a sliding window. KEYS: this window's
/// counter, the previous window's, latch. ARGV: amount, counter expiry (ms),
/// latch (0: none, -1: manual, else ms), window (ms), ms elapsed in it.
/// Counts the call only when `previous * (window - elapsed) / window +
/// count < amount` (a refused call is not counted: it would weigh on the
/// next window). Returns `{count, 0}` counted, `{-3, previous, count}`
/// refused, `{-1, latch pttl}` already engaged, `{-2, latch ms}` engaged by
/// this call.
pub(super) const SLIDING_SCRIPT: &str = r"
local latch = redis.call('PTTL', KEYS[3])
if latch ~= -2 then return {-1, latch} end
local amount = tonumber(ARGV[1])
local w = tonumber(ARGV[4])
local e = tonumber(ARGV[5])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if prev * (w - e) + cur * w < amount * w then
  local c = redis.call('INCR', KEYS[1])
  if c == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return {c, 0}
end
local l = tonumber(ARGV[3])
if l ~= 0 then
  if l > 0 then redis.call('SET', KEYS[3], '1', 'PX', l) else redis.call('SET', KEYS[3], '1') end
  return {-2, l}
end
return {-3, prev, cur}
";

/// The `sync exact` script of a token bucket (GCRA): one key per bucket,
/// holding its theoretical arrival time in Unix microseconds. KEYS: bucket,
/// latch. ARGV: now (Unix us), interval (us), tolerance (us), latch (as
/// above). A call is admitted while the arrival time is at most the
/// tolerance ahead of now, and moves it one interval on (the key expires
/// when the bucket is full again). Returns `{1, 0}` admitted, `{-3, wait
/// us}` refused, `{-1, latch pttl}` / `{-2, latch ms}` as above. The wait is
/// one interval at most: a bucket is further ahead of `now` only when a
/// call with a later clock reading reached Redis first, and the refused
/// caller's next try is judged by a fresh reading.
pub(super) const BUCKET_SCRIPT: &str = r"
local latch = redis.call('PTTL', KEYS[2])
if latch ~= -2 then return {-1, latch} end
local now = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local ahead = tat - now - tonumber(ARGV[3])
if ahead > 0 then
  local l = tonumber(ARGV[4])
  if l ~= 0 then
    if l > 0 then redis.call('SET', KEYS[2], '1', 'PX', l) else redis.call('SET', KEYS[2], '1') end
    return {-2, l}
  end
  return {-3, math.min(ahead, tonumber(ARGV[2]))}
end
local nxt = tat + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%.0f', nxt), 'PX', math.floor((nxt - now) / 1000) + 1)
return {1, 0}
";

/// The `sync batch` lease script of a sliding window
/// (`gov_engine::cluster::LeaseAlgorithm::SlidingWindow`). KEYS: this
/// window's counter of leased calls, the previous window's, latch. ARGV as
/// [`LEASE_SCRIPT`]'s, then the window (ms) and the ms elapsed in it. Grants
/// `min(wanted, ceil(left / share))` of what the weighted estimate leaves
/// after the give-back and the unleased calls (`left = ceil((amount *
/// window - previous * (window - elapsed)) / window) - count`,
/// `gov_engine::cluster::sliding_left`). Returns `{granted, count,
/// previous}`, or `{-1, latch pttl}` when engaged.
pub(super) const SLIDING_LEASE_SCRIPT: &str = r"
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local back = math.min(tonumber(ARGV[5]), c)
local unleased = tonumber(ARGV[4])
local latch = redis.call('PTTL', KEYS[3])
local grant = 0
if latch == -2 then
  local w = tonumber(ARGV[7])
  local room = tonumber(ARGV[2]) * w - prev * (w - tonumber(ARGV[8]))
  if room > 0 then
    local left = math.ceil(room / w) - (c - back + unleased)
    if left > 0 then
      grant = math.min(tonumber(ARGV[1]), math.ceil(left / tonumber(ARGV[6])))
    end
  end
end
local delta = grant + unleased - back
if delta ~= 0 then
  c = redis.call('INCRBY', KEYS[1], delta)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if latch ~= -2 then return {-1, latch} end
return {grant, c, prev}
";

/// The `sync batch` lease script of a token bucket
/// (`gov_engine::cluster::LeaseAlgorithm::TokenBucket`; the bucket's one
/// key, as [`BUCKET_SCRIPT`]'s). KEYS: bucket, latch. ARGV: calls wanted,
/// now (Unix us), interval (us), tolerance (us), calls given back, the end
/// of the agent's last lease (us), the lease share. Takes the give-back
/// only while the arrival time is still that end (nobody leased after
/// it), then grants `min(wanted, ceil(fit / share))` of the `fit` calls
/// whose arrival times are within the tolerance of now, moving the arrival
/// time one interval per call (`gov_engine::cluster::bucket_lease`).
/// Returns `{granted, arrival time}`, or `{-1, latch pttl}` when engaged.
pub(super) const BUCKET_LEASE_SCRIPT: &str = r"
local now = tonumber(ARGV[2])
local i = tonumber(ARGV[3])
local tol = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local was = tat
local back = tonumber(ARGV[5])
if back > 0 and tat == tonumber(ARGV[6]) then tat = tat - back * i end
local latch = redis.call('PTTL', KEYS[2])
local grant = 0
local from = math.max(tat, now)
if latch == -2 and from - now <= tol then
  local fit = math.floor((now + tol - from) / i) + 1
  grant = math.min(tonumber(ARGV[1]), math.ceil(fit / tonumber(ARGV[7])))
end
if grant > 0 then tat = from + grant * i end
if tat ~= was then
  if tat > now then
    redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1)
  else
    redis.call('DEL', KEYS[1])
  end
end
if latch ~= -2 then return {-1, latch} end
return {grant, tat}
";
