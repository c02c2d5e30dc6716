-- fuse.pool_config: what fuse.upstream's upstream.new and pool:set_peers take, checked:
-- the peer list (each address parsed to the canonical form nginx's balancer takes, weights,
-- duplicates spelled two ways), the pool's options apart from the breakers' options, and
-- the list as the shared dict stores it. Every message names the entry or option and says
-- what is wrong; a raise points at the caller's line (`level`, as fuse's own messages).
-- Not on a request's path: upstream.new, set_peers, a sync that reads a stored list, and
-- pool:failures's address.
local options = require "fuse.options"

local error, pairs, ipairs, tonumber, tostring, type, next =
  error, pairs, ipairs, tonumber, tostring, type, next
local floor, huge = math.floor, math.huge
local fmt, concat = string.format, table.concat
local show = options.show  -- values in messages as fuse's own option errors show them

local M = {}

local POOL_NAMES = { "max_ejected", "tries", "fail_statuses", "fail_on", "enforce", "slow_start", "check", "dict" }
local POOL_KEYS, BREAKER_KEYS = {}, {}
for _, k in ipairs(POOL_NAMES) do POOL_KEYS[k] = true end
for _, k in ipairs(options.NAMES) do BREAKER_KEYS[k] = true end
local DEFAULT_FAIL = { 500, 502, 503, 504 }
local CLASSES = { "connect", "timeout", "status" }
local MAX_WEIGHT, MAX_TRIES, NAME_MAX, MAX_SLOW_START = 1000, 100, 127, 3600
local CHECK_NAMES, CHECK_KEYS = { "path", "interval", "timeout", "host", "https" }, {}
for _, k in ipairs(CHECK_NAMES) do CHECK_KEYS[k] = true end
local MAX_INTERVAL, MAX_CHECK_TIMEOUT = 3600, 60
local DEFAULT_DICT = "fuse_upstream"

local function raise(msg, level) error("fuse.upstream: " .. msg, level + 1) end

local function is_int(v, lo, hi)
  return type(v) == "number" and v == floor(v) and v >= lo and v <= hi
end

-- Whether table t has a key good(k) refuses, and the first such key in the order of
-- options.sorted_keys (the order of pairs differs between LuaJIT, Lua 5.1 and 5.4; the
-- key a message names must not). Sorts only when there is one.
local function bad_key(t, good)
  for k in pairs(t) do
    if not good(k) then
      for _, s in ipairs(options.sorted_keys(t)) do
        if not good(s) then return true, s end
      end
    end
  end
  return false
end

local function is_index(k) return is_int(k, 1, huge) end
local function is_peer_key(k) return k == "addr" or k == "weight" end

---------------------------------------------------------------------------- addresses

-- An IPv4 address in canonical form ("10.0.0.1"), or nil and why.
local function ipv4(h)
  local parts, n = {}, 0
  for x in (h .. "."):gmatch("([^.]*)%.") do
    n = n + 1
    if not x:match("^%d+$") or #x > 3 then return nil, "not an IPv4 address (four numbers 0 to 255)" end
    local v = tonumber(x)
    if v > 255 then return nil, fmt("not an IPv4 address: %s is above 255", x) end
    parts[n] = tostring(v)
  end
  if n ~= 4 then return nil, "not an IPv4 address (four numbers 0 to 255)" end
  return concat(parts, ".")
end

-- An IPv6 address (no brackets, no zone) in RFC 5952 form, or nil and why.
local function ipv6(h)
  if h == "" then return nil, "empty IPv6 address" end
  if h:find("%", 1, true) then return nil, "zone ids (%...) are not supported" end
  local groups = {}
  local head, tail = h, nil
  local dc = h:find("::", 1, true)
  if dc then
    if h:find("::", dc + 1, true) then return nil, "more than one '::' in an IPv6 address" end
    head, tail = h:sub(1, dc - 1), h:sub(dc + 2)
  end
  local function split(s, out, last)
    if s == "" then return true end
    local items = {}
    for x in (s .. ":"):gmatch("([^:]*):") do items[#items + 1] = x end
    for i, x in ipairs(items) do
      if i == #items and last and x:find(".", 1, true) then  -- a trailing IPv4 part
        local v4 = ipv4(x)
        if not v4 then return nil, fmt("bad IPv4 part %s", show(x)) end
        local a, b, c, d = v4:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
        out[#out + 1] = tonumber(a) * 256 + tonumber(b)
        out[#out + 1] = tonumber(c) * 256 + tonumber(d)
      elseif x:match("^%x%x?%x?%x?$") then
        out[#out + 1] = tonumber(x, 16)
      else
        return nil, x == "" and "an empty group (a single ':' at an end, or ':::')"
          or fmt("bad group %s (1 to 4 hex digits)", show(x))
      end
    end
    return true
  end
  local hg, tg = {}, {}
  local ok, why = split(head, hg, tail == nil)
  if not ok then return nil, why end
  if tail then
    ok, why = split(tail, tg, true)
    if not ok then return nil, why end
  end
  local fill = 8 - #hg - #tg
  if (tail and fill < 1) or (not tail and fill ~= 0) then
    return nil, fmt("%d groups in an IPv6 address (8, or fewer with '::')", #hg + #tg)
  end
  for _, g in ipairs(hg) do groups[#groups + 1] = g end
  for _ = 1, tail and fill or 0 do groups[#groups + 1] = 0 end
  for _, g in ipairs(tg) do groups[#groups + 1] = g end
  -- RFC 5952: the longest run (of 2 or more) of zero groups becomes "::", the first on a tie
  local best, best_len, i = nil, 1, 1
  while i <= 8 do
    if groups[i] == 0 then
      local j = i
      while j < 8 and groups[j + 1] == 0 do j = j + 1 end
      if j - i + 1 > best_len then best, best_len = i, j - i + 1 end
      i = j + 1
    else i = i + 1 end
  end
  local out = {}
  for k = 1, 8 do out[k] = fmt("%x", groups[k]) end
  if not best then return concat(out, ":") end
  return concat(out, ":", 1, best - 1) .. "::" .. concat(out, ":", best + best_len, 8)
end

-- "IPv4:port" or "[IPv6]:port" (ngx.balancer takes addresses, not names): the canonical
-- "addr", the host as set_current_peer takes it (IPv6 in brackets), the port; or nil and
-- what is wrong.
local function parse_addr(addr)
  if type(addr) ~= "string" then
    return nil, "must be \"IP:port\" or \"[IPv6]:port\""
  end
  local host, port
  local v6 = false
  if addr:sub(1, 1) == "[" then
    host, port = addr:match("^%[(.*)%]:([^:]*)$")
    if not host then return nil, "an IPv6 address needs the form \"[IPv6]:port\"" end
    v6 = true
  else
    host, port = addr:match("^([^:]*):([^:]*)$")
    if not host then
      return nil, addr:find(":", 1, true) and "an IPv6 address must be in brackets: \"[IPv6]:port\""
        or "no port: the form is \"IP:port\""
    end
  end
  if not port:match("^%d+$") or #port > 5 or tonumber(port) < 1 or tonumber(port) > 65535 then
    return nil, fmt("port %s is not a number from 1 to 65535", show(port))
  end
  local canon, why
  if v6 then
    canon, why = ipv6(host)
    if not canon then return nil, why end
    canon = "[" .. canon .. "]"
  else
    if host == "" then return nil, "no host before the port" end
    canon, why = ipv4(host)
    if not canon then
      return nil, host:find("%a") and (why .. "; ngx.balancer takes addresses, not host names") or why
    end
  end
  port = tonumber(port)
  return canon .. ":" .. port, canon, port
end

-- The peer list as { { addr, host, port, weight }, ... }; raises at `level` naming the
-- entry and what is wrong.
local function check_peers(pool_name, list, level)
  if type(list) ~= "table" then raise("peers must be a non-empty list, got " .. show(list), level + 1) end
  local odd, key = bad_key(list, is_index)
  if odd then raise(fmt("peers must be a list: unexpected key %s", show(key)), level + 1) end
  local top = 0
  for k in pairs(list) do
    if k > top then top = k end
  end
  if top == 0 then raise("peers must be a non-empty list, got an empty table", level + 1) end
  local out, seen = {}, {}
  for i = 1, top do
    local p = list[i]
    if p == nil then
      raise(fmt("peer %d is missing: a hole in the list (entries 1 to %d, %d is nil)", i, top, i), level + 1)
    end
    local addr, weight = p, 1
    if type(p) == "table" then
      addr, weight = p.addr, p.weight == nil and 1 or p.weight
      local unknown_key, k = bad_key(p, is_peer_key)
      if unknown_key then raise(fmt("peer %d: unknown key %s", i, show(k)), level + 1) end
    end
    local canon, host, port = parse_addr(addr)
    if not canon then raise(fmt("peer %d: %s, got %s", i, host, show(addr)), level + 1) end
    if not is_int(weight, 1, MAX_WEIGHT) then
      raise(fmt("peer %d (%s): weight must be an integer from 1 to %d, got %s", i, addr, MAX_WEIGHT,
        show(weight)), level + 1)
    end
    if seen[canon] then
      local first = seen[canon]
      raise(fmt("peer %d: %s is listed twice (%s)", i, addr, first.addr == addr and "also peer " .. first.i
        or fmt("peer %d, %s, is the same address: %s", first.i, first.addr, canon)), level + 1)
    end
    if #pool_name + 1 + #canon > NAME_MAX then
      raise(fmt("peer %d: the breaker name '%s/%s' is longer than %d bytes", i, pool_name, canon, NAME_MAX),
        level + 1)
    end
    seen[canon] = { i = i, addr = addr }
    -- (floor: under Lua 5.3+ a weight of 3.0 is held as the integer 3, shown as LuaJIT shows it)
    out[i] = { addr = canon, host = host, port = port, weight = floor(weight) }
  end
  return out
end

-- A checked list as the shared dict stores it: "addr weight" lines.
local function encode(list)
  local out = {}
  for i, p in ipairs(list) do out[i] = p.addr .. " " .. p.weight end
  return concat(out, "\n")
end

local function decode(s)
  local out = {}
  for addr, w in s:gmatch("(%S+) (%d+)") do
    local canon, host, port = parse_addr(addr)
    if canon then out[#out + 1] = { addr = canon, host = host, port = port, weight = tonumber(w) } end
  end
  return out
end

---------------------------------------------------------------------------- options

local function bad(name, what, v, level)
  raise(fmt("option '%s' must be %s, got %s", name, what, show(v)), level + 1)
end

-- A key that is neither a pool option nor a breaker option: raises at `level` with the
-- near name among both (a mistyped pool option is no breaker option, and fuse.new's
-- message would list only those, pools' forbidden 'name' and 'max_wait' among them),
-- unless the near name is a breaker option: then fuse.new's own message says it.
local function unknown(k, level)
  local known, listed = {}, {}  -- (listed: the breaker options a pool takes)
  for i, name in ipairs(POOL_NAMES) do known[i] = name end
  for _, name in ipairs(options.NAMES) do
    known[#known + 1] = name
    if name ~= "name" and name ~= "max_wait" then listed[#listed + 1] = name end
  end
  local near = options.suggest(k, known)
  if near and BREAKER_KEYS[near] then return end
  local q = options.quote(k, "'")
  if near then raise(fmt("unknown option %s (did you mean '%s'?)", q, near), level + 1) end
  raise(fmt("unknown option %s (pool options: %s; and any breaker option but name and max_wait: %s)", q,
    concat(POOL_NAMES, ", "), concat(listed, ", ")), level + 1)
end

-- Option `check` (nil, or { path, interval, timeout, host, https }): false for none, else the
-- check with its defaults; raises at `level`. A path or host goes into a request line or
-- a header as given: visible ASCII only (no space, no CR or LF).
local function visible(s) return type(s) == "string" and s ~= "" and not s:find("[^\33-\126]") end
local function check_check(c, level)
  if c == nil or c == false then return false end
  if type(c) ~= "table" then
    bad("check", "a table { path = \"/...\", interval = seconds, timeout = seconds }", c, level + 1)
  end
  local has, k = bad_key(c, function(key) return CHECK_KEYS[key] == true end)
  if has then
    local near = type(k) == "string" and options.suggest(k, CHECK_NAMES)
    raise(fmt("option 'check': unknown key %s (%s)", type(k) == "string" and options.quote(k, "'") or show(k),
      near and fmt("did you mean '%s'?", near) or "keys: " .. concat(CHECK_NAMES, ", ")), level + 1)
  end
  local path = c.path
  if not visible(path) or path:sub(1, 1) ~= "/" then
    bad("check.path", "a path starting with '/' (visible ASCII, no spaces)", path, level + 1)
  end
  local interval = c.interval
  if interval == nil then interval = 1 end
  if type(interval) ~= "number" or not (interval >= 0.01 and interval <= MAX_INTERVAL) then
    bad("check.interval", "a number of seconds from 0.01 to " .. MAX_INTERVAL, interval, level + 1)
  end
  local timeout = c.timeout
  if timeout == nil then timeout = 1 end
  if type(timeout) ~= "number" or not (timeout >= 0.001 and timeout <= MAX_CHECK_TIMEOUT) then
    bad("check.timeout", "a number of seconds from 0.001 to " .. MAX_CHECK_TIMEOUT, timeout, level + 1)
  end
  local host = c.host
  if host ~= nil and not visible(host) then
    bad("check.host", "a Host header value (visible ASCII, no spaces)", host, level + 1)
  end
  local https = c.https
  if https == nil then https = false end
  if type(https) ~= "boolean" then bad("check.https", "a boolean", https, level + 1) end
  return { path = path, interval = interval, timeout = timeout, host = host or false, https = https,
           sni = https and host and not host:find("^%[") and host:match("^[^:]+") or false }
end

-- Splits opts into the pool's options and the breakers' options; raises at `level`.
-- The keys are looked at in options.sorted_keys' order, so that of two bad keys the
-- message names the same one under every Lua. A key left to fuse.new's message (one
-- that is not a string, or near a breaker option) is the first bad key fuse.new names
-- (its order is the same), so the unknown keys after it are left to fuse.new too.
local function check_opts(opts, level)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then raise("options must be a table, got " .. show(opts), level + 1) end
  local o, bopts = {}, {}
  local deferred = false
  for _, k in ipairs(options.sorted_keys(opts)) do
    local v = opts[k]
    if POOL_KEYS[k] then o[k] = v
    elseif k == "name" then
      raise("option 'name' is not allowed: each peer's breaker is named \"<pool>/<addr>\"", level + 1)
    elseif k == "max_wait" and v ~= 0 then
      -- every try is admitted in balancer_by_lua*, which cannot yield; pool:access() alone
      -- could wait, and only for a permit it gives back before the balancer asks again
      raise(fmt("option 'max_wait' cannot work in a pool, got %s: each try is admitted in "
        .. "balancer_by_lua*, where nothing can wait (ngx.sleep is disabled there), so a full "
        .. "peer is skipped at once; leave max_wait out (max_concurrent alone limits each peer)",
        show(v)), level + 1)
    else
      if not BREAKER_KEYS[k] then
        if type(k) == "string" and not deferred then unknown(k, level + 1) end
        deferred = true
      end
      bopts[k] = v
    end
  end
  local m = o.max_ejected
  if m == nil then m = 0.5 end
  if type(m) ~= "number" or not (m >= 0 and m <= 1) then bad("max_ejected", "a number from 0 to 1", m, level + 1) end
  o.max_ejected = m
  if o.tries ~= nil then
    if not is_int(o.tries, 1, MAX_TRIES) then bad("tries", "an integer from 1 to " .. MAX_TRIES, o.tries, level + 1) end
    o.tries = floor(o.tries)  -- (an integer under Lua 5.3+, as the peers' weights)
  end
  local fs = o.fail_statuses
  if fs == nil then fs = DEFAULT_FAIL end
  if type(fs) ~= "table" then bad("fail_statuses", "a list of HTTP statuses", fs, level + 1) end
  local set = {}  -- every status from 1 to 599 (an array: one load for a status, no hash search)
  for c = 1, 599 do set[c] = false end
  for k, s in pairs(fs) do
    if type(k) ~= "number" or not is_int(s, 100, 599) then
      bad("fail_statuses", "a list of HTTP statuses (100 to 599)", s, level + 1)
    end
    set[floor(s)] = true
  end
  o.fail = set
  local fo = o.fail_on
  if fo == nil then fo = CLASSES end
  if type(fo) ~= "table" or next(fo) == nil then
    bad("fail_on", 'a non-empty list of "connect", "timeout", "status"', fo, level + 1)
  end
  local on = {}
  for k, c in pairs(fo) do
    if type(k) ~= "number" or (c ~= "connect" and c ~= "timeout" and c ~= "status") then
      bad("fail_on", 'a list of "connect", "timeout", "status"', c, level + 1)
    end
    on[c] = true
  end
  o.on = on
  if o.enforce == nil then o.enforce = true end
  if type(o.enforce) ~= "boolean" then bad("enforce", "a boolean", o.enforce, level + 1) end
  local ss = o.slow_start
  if ss == nil then ss = 0 end
  if type(ss) ~= "number" or not (ss >= 0 and ss <= MAX_SLOW_START) then
    bad("slow_start", "a number of seconds from 0 to " .. MAX_SLOW_START, ss, level + 1)
  end
  o.slow_start = ss
  o.check = check_check(o.check, level + 1)
  local d = o.dict
  if d == nil then d = DEFAULT_DICT end
  if type(d) ~= "string" or d == "" then bad("dict", "the name of a lua_shared_dict", d, level + 1) end
  o.dict = d
  return o, bopts
end

M.raise, M.parse_addr, M.check_peers, M.encode, M.decode, M.check_opts =
  raise, parse_addr, check_peers, encode, decode, check_opts
M.POOL_NAMES, M.CLASSES = POOL_NAMES, CLASSES
return M
