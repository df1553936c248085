//! The Lua scripts the store runs, each atomic on the server and timed by the server's own
//! clock (`TIME`), so processes on hosts whose clocks differ agree on every expiry.

use std::sync::LazyLock;

use redis::Script;

/// Take a lease: KEYS leases, waiters, waiters' last ask, waiters' clients, the fair turn's
/// tags, the processes' place counts, when each process last asked, this id's released mark;
/// ARGV capacity, lease ms, lease id, rank (empty: no queue, take it now or not), ms after
/// which a waiter that stopped asking is dropped, client, process (empty: the capacity is
/// this caller's own; else the least capacity of the processes asking within a lease is
/// used). In the queue the free places go to the best class first, and within it in fair
/// turns by client (start-time fair queueing: a client's tag counts its turns, never below
/// the class's last served tag, least first; ties to the client waiting longest), each
/// client's own waiters by arrival. An id already released is refused. Returns {1 when the
/// lease is held else 0 (a waiter keeps its place), the capacity used}.
pub(crate) static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local id = ARGV[3]
local client = ARGV[6]
local CLASS = 281474976710656
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[6], ARGV[7], cap)
  redis.call('ZADD', KEYS[7], now, ARGV[7])
  for _, p in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now - lease)) do
    redis.call('HDEL', KEYS[6], p)
    redis.call('ZREM', KEYS[7], p)
  end
  for _, c in ipairs(redis.call('HVALS', KEYS[6])) do
    cap = math.min(cap, tonumber(c))
  end
  redis.call('PEXPIRE', KEYS[6], 2 * lease)
  redis.call('PEXPIRE', KEYS[7], 2 * lease)
end
if redis.call('EXISTS', KEYS[8]) == 1 then
  return {0, cap}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + lease, id)
  return {1, cap}
end
local free = cap - redis.call('ZCARD', KEYS[1])
local function hold()
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('PEXPIRE', KEYS[1], 2 * lease)
end
if ARGV[4] == '' then
  if free > 0 then
    hold()
    return {1, cap}
  end
  return {0, cap}
end
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[5]))) do
  redis.call('ZREM', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
  redis.call('HDEL', KEYS[4], w)
end
if not redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[4]), id)
  redis.call('HSET', KEYS[4], id, client)
end
redis.call('ZADD', KEYS[3], now, id)
for k = 2, 4 do
  redis.call('PEXPIRE', KEYS[k], 2 * lease)
end
-- The class and tag of this waiter's turn when it is among the next `free` to go, else nil.
local function turn()
  local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local picks, i = 0, 1
  while i <= #all and picks < free do
    local class = math.floor(tonumber(all[i + 1]) / CLASS)
    local order, lists = {}, {}
    while i <= #all and math.floor(tonumber(all[i + 1]) / CLASS) == class do
      local c = redis.call('HGET', KEYS[4], all[i]) or ''
      if not lists[c] then
        lists[c] = {}
        order[#order + 1] = c
      end
      table.insert(lists[c], all[i])
      i = i + 2
    end
    local v = tonumber(redis.call('HGET', KEYS[5], 'v:' .. class)) or 0
    local tag, at = {}, {}
    for _, c in ipairs(order) do
      tag[c] = math.max(tonumber(redis.call('HGET', KEYS[5], class .. ':' .. c)) or 0, v)
      at[c] = 1
    end
    while picks < free do
      local best = nil
      for _, c in ipairs(order) do
        if at[c] <= #lists[c] and (best == nil or tag[c] < tag[best]) then
          best = c
        end
      end
      if best == nil then
        break
      end
      if lists[best][at[best]] == id then
        return class, tag[best]
      end
      at[best] = at[best] + 1
      tag[best] = tag[best] + 1
      picks = picks + 1
    end
  end
  return nil
end
if free > 0 then
  local class, tag = turn()
  if class then
    hold()
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HSET', KEYS[5], class .. ':' .. client, tag + 1, 'v:' .. class, tag)
    redis.call('PEXPIRE', KEYS[5], 2 * lease)
    return {1, cap}
  end
end
return {0, cap}
"#,
    )
});

/// Renew leases (adding those the store lost, as after its restart), except those released
/// meanwhile: KEYS the lease sets; ARGV lease ms, the released marks' prefix, then for each
/// key the number of its ids and the ids.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local lease = tonumber(ARGV[1])
local until_ = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local i = 3
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    if redis.call('EXISTS', ARGV[2] .. ARGV[i]) == 0 then
      redis.call('ZADD', KEYS[k], until_, ARGV[i])
    end
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
/// negative), then capacity and window ms of requests and tokens (capacity 0: no such
/// limit). `reserve` takes one request and the tokens from every bucket or nothing; `settle`
/// gives tokens back to the token buckets (takes them, when negative). Returns whether it
/// took, then each bucket's level after ("" where there is no limit).
pub(crate) static BUCKETS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reserve = ARGV[1] == 'reserve'
local tokens = tonumber(ARGV[2])
local names = {'r', 't'}
local level, cap = {}, {}
for i = 1, 2 do
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
  for i = 1, 2 do
    if cap[i] then
      local cost = tokens
      if i == 1 then cost = 1 end
      if cost > cap[i] or level[i] < cost then took = 0 end
    end
  end
  if took == 1 then
    for i = 1, 2 do
      if cap[i] then
        if i == 1 then level[i] = level[i] - 1 else level[i] = level[i] - tokens end
      end
    end
  end
else
  if cap[2] then level[2] = math.min(cap[2], level[2] + tokens) end
end
local out = {took}
for i = 1, 2 do
  if cap[i] then
    local n = names[i]
    redis.call('HSET', KEYS[1], n .. 'l', tostring(level[i]), n .. 'c', cap[i], n .. 'at', now)
    out[i + 1] = tostring(level[i])
  else
    out[i + 1] = ''
  end
end
redis.call('PEXPIRE', KEYS[1], 120000)
return out
"#,
    )
});
