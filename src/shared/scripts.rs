//! The Lua scripts the store runs, each atomic on the server and timed by the server's own
//! clock (`TIME`), so processes on hosts whose clocks differ agree on every expiry.

use std::sync::LazyLock;

use redis::Script;

/// Take a lease: KEYS leases, waiters, waiters' last poll; ARGV capacity, lease ms, lease id,
/// rank (empty: no queue, take it now or not), ms after which a waiter that stopped polling
/// is dropped. Returns 1 when the lease is held, else 0 (the waiter keeps its place).
pub static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local id = ARGV[3]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + lease, id)
  return 1
end
local held = redis.call('ZCARD', KEYS[1])
local ahead = 0
if ARGV[4] ~= '' then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[5]))
  for _, w in ipairs(gone) do
    redis.call('ZREM', KEYS[2], w)
    redis.call('ZREM', KEYS[3], w)
  end
  if not redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZADD', KEYS[2], tonumber(ARGV[4]), id)
  end
  ahead = redis.call('ZRANK', KEYS[2], id)
end
if held + ahead < cap then
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('PEXPIRE', KEYS[1], 2 * lease)
  if ARGV[4] ~= '' then
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
  return 1
end
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[3], now, id)
  redis.call('PEXPIRE', KEYS[2], 2 * lease)
  redis.call('PEXPIRE', KEYS[3], 2 * lease)
end
return 0
"#,
    )
});

/// Renew leases (adding those the store lost, as after its restart): KEYS the lease sets;
/// ARGV lease ms, then for each key the number of its ids and the ids.
pub static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local lease = tonumber(ARGV[1])
local until_ = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local i = 2
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    redis.call('ZADD', KEYS[k], until_, ARGV[i])
    i = i + 1
  end
  redis.call('PEXPIRE', KEYS[k], 2 * lease)
end
return 1
"#,
    )
});

/// A client's token buckets, refilled continuously over their windows: KEYS the client's
/// hash; ARGV mode (`reserve` or `settle`), tokens (the cost, or what goes back: may be
/// negative), then capacity and window ms of requests, tokens and day (capacity 0: no such
/// limit). `reserve` takes one request and the tokens from every bucket or nothing; `settle`
/// gives tokens back to the token buckets (takes them, when negative). Returns whether it
/// took, then each bucket's level after ("" where there is no limit).
pub static BUCKETS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reserve = ARGV[1] == 'reserve'
local tokens = tonumber(ARGV[2])
local names = {'r', 't', 'd'}
local level, cap = {}, {}
for i = 1, 3 do
  local c = tonumber(ARGV[1 + 2 * i])
  local w = tonumber(ARGV[2 + 2 * i])
  if c > 0 then
    local n = names[i]
    local l = tonumber(redis.call('HGET', KEYS[1], n .. 'l'))
    if l == nil then
      l = c
    else
      local oc = tonumber(redis.call('HGET', KEYS[1], n .. 'c')) or c
      local at = tonumber(redis.call('HGET', KEYS[1], n .. 'at')) or now
      l = c - (oc - l)
      l = math.min(c, l + math.max(0, now - at) * c / w)
    end
    level[i], cap[i] = l, c
  end
end
local took = 0
if reserve then
  took = 1
  for i = 1, 3 do
    if cap[i] then
      local cost = tokens
      if i == 1 then cost = 1 end
      if cost > cap[i] or level[i] < cost then took = 0 end
    end
  end
  if took == 1 then
    for i = 1, 3 do
      if cap[i] then
        if i == 1 then level[i] = level[i] - 1 else level[i] = level[i] - tokens end
      end
    end
  end
else
  for i = 2, 3 do
    if cap[i] then level[i] = math.min(cap[i], level[i] + tokens) end
  end
end
local out = {took}
for i = 1, 3 do
  if cap[i] then
    local n = names[i]
    redis.call('HSET', KEYS[1], n .. 'l', tostring(level[i]), n .. 'c', cap[i], n .. 'at', now)
    out[i + 1] = tostring(level[i])
  else
    out[i + 1] = ''
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * 86400000)
return out
"#,
    )
});
