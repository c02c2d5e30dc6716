-- fuse.upstream: a balancer for nginx (balancer_by_lua*) that stops sending traffic to
-- sick peers. Each peer has the named breaker "<pool>/<addr>"; under nginx, after
-- fuse.init{ shared = true }, it lives in the shared registry, so every worker skips the
-- same peers and probes to a recovering peer are bounded across workers by `probes`.
--
--   local pool = upstream.new("backend", { "127.0.0.1:8081", { addr = "127.0.0.1:8082", weight = 2 } },
--                             { fails = 3, open_for = 5, max_ejected = 0.5, tries = 2 })
--   balancer_by_lua_block { pool:balance() }   -- once per try
--   log_by_lua_block      { pool:log() }       -- reports every try to its peer's breaker
--
-- Built on fuse's public API (fuse.new, b:allow, b:report, fuse.remove), plus the
-- internal shared counter for the panic picks (fuse._counter, shown by fuse.metrics()).
--
-- Per request, ngx.ctx[pool] holds the tries: { n, [k] = { peer, ticket, failure } }.
-- A try admitted by its breaker holds a ticket until pool:log() reports it. A request
-- whose log phase never runs (a worker that dies, an internal redirect that resets
-- ngx.ctx) does not hold a probe slot for ever: after `probe_timeout` the probe gives its
-- slot back and counts as failed (fuse's own rule).
local fuse = require "fuse"

local error, pairs, ipairs, pcall, tonumber, tostring, type, setmetatable =
  error, pairs, ipairs, pcall, tonumber, tostring, type, setmetatable
local floor, huge, ceil, max, min = math.floor, math.huge, math.ceil, math.max, math.min
local fmt = string.format

local _M = { VERSION = fuse.VERSION }

local Pool = {}
Pool.__index = Pool

local POOL_KEYS = { max_ejected = true, tries = true, fail_statuses = true }
local DEFAULT_FAIL = { 500, 502, 503, 504 }
local MAX_WEIGHT, MAX_TRIES, NAME_MAX = 1000, 100, 127
local PANIC = "upstream_panic:"

local function raise(msg, level) error("fuse.upstream: " .. msg, level + 1) end

local show = require("fuse.options").show  -- how every message of fuse's shows a value

local function is_int(v, lo, hi)
  return type(v) == "number" and v == floor(v) and v >= lo and v <= hi
end

---------------------------------------------------------------------------- validation

local function is_ipv4(h)
  local a, b, c, d = h:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return false end
  for _, x in ipairs({ a, b, c, d }) do
    if #x > 3 or tonumber(x) > 255 then return false end
  end
  return true
end

-- "IPv4:port" or "[IPv6]:port" (ngx.balancer takes addresses, not names): host, port;
-- or nil and why.
local function parse_addr(addr)
  local why = "must be \"IP:port\" or \"[IPv6]:port\" with a port from 1 to 65535, got "
  if type(addr) ~= "string" then return nil, why .. show(addr) end
  local host, port = addr:match("^%[([%x:.]+)%]:(%d+)$")
  if not (host and host:find(":", 1, true)) then
    host, port = addr:match("^([%d.]+):(%d+)$")
    if host and not is_ipv4(host) then host = nil end
  end
  port = tonumber(port)
  if not host or not port or port < 1 or port > 65535 then return nil, why .. show(addr) end
  return host, port
end

-- The peer list as { { addr, host, port, weight }, ... }; raises at `level`.
local function check_peers(pool_name, list, level)
  if type(list) ~= "table" or #list == 0 then
    raise("peers must be a non-empty list, got " .. (type(list) == "table" and "an empty table" or show(list)),
      level + 1)
  end
  local out, seen = {}, {}
  for i, p in ipairs(list) do
    local addr, weight = p, 1
    if type(p) == "table" then
      addr, weight = p.addr, p.weight == nil and 1 or p.weight
      for k in pairs(p) do
        if k ~= "addr" and k ~= "weight" then raise(fmt("peer %d: unknown key %s", i, show(k)), level + 1) end
      end
    end
    local host, port = parse_addr(addr)
    if not host then raise(fmt("peer %d: addr %s", i, port), level + 1) end
    if not is_int(weight, 1, MAX_WEIGHT) then
      raise(fmt("peer %d (%s): weight must be an integer from 1 to %d, got %s", i, addr, MAX_WEIGHT,
        show(weight)), level + 1)
    end
    if seen[addr] then raise(fmt("peer %d: %s is listed twice", i, addr), level + 1) end
    if #pool_name + 1 + #addr > NAME_MAX then
      raise(fmt("peer %d: the breaker name '%s/%s' is longer than %d bytes", i, pool_name, addr, NAME_MAX),
        level + 1)
    end
    seen[addr] = true
    out[i] = { addr = addr, host = host, port = port, weight = weight }
  end
  return out
end

-- Splits opts into the pool's options and the breakers' options; raises at `level`.
local function check_opts(opts, level)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then raise("options must be a table, got " .. show(opts), level + 1) end
  local o, bopts = {}, {}
  for k, v in pairs(opts) do
    if POOL_KEYS[k] then o[k] = v
    elseif k == "name" then
      raise("option 'name' is not allowed: each peer's breaker is named \"<pool>/<addr>\"", level + 1)
    else bopts[k] = v end
  end
  local m = o.max_ejected
  if m == nil then m = 0.5 end
  if type(m) ~= "number" or not (m >= 0 and m <= 1) then
    raise("option 'max_ejected' must be a number from 0 to 1, got " .. show(o.max_ejected), level + 1)
  end
  o.max_ejected = m
  if o.tries ~= nil and not is_int(o.tries, 1, MAX_TRIES) then
    raise(fmt("option 'tries' must be an integer from 1 to %d, got %s", MAX_TRIES, show(o.tries)), level + 1)
  end
  local fs = o.fail_statuses
  if fs == nil then fs = DEFAULT_FAIL end
  if type(fs) ~= "table" then
    raise("option 'fail_statuses' must be a list of HTTP statuses, got " .. show(fs), level + 1)
  end
  local set = {}
  for k, s in pairs(fs) do
    if type(k) ~= "number" or not is_int(s, 100, 599) then
      raise("option 'fail_statuses' must be a list of HTTP statuses (100 to 599), got " .. show(s), level + 1)
    end
    set[s] = true
  end
  o.fail = set
  return o, bopts
end

---------------------------------------------------------------------------- peers

-- A new peer's breaker "<pool>/<addr>"; a bad breaker option raises fuse's own message
-- without a position (the caller re-raises it at the user's line).
local function peer_breaker(self, addr)
  local bo = {}
  for k, v in pairs(self._bopts) do bo[k] = v end
  bo.name = self.name .. "/" .. addr
  local ok, b = pcall(fuse.new, bo)
  if not ok then
    error((tostring(b):gsub("^[^\n]-:%d+: ", "")), 0)
  end
  return b
end

-- Builds the peer array from a checked list, keeping the peer objects (breaker, SWRR
-- weight) of addresses already in the pool.
local function build(self, list)
  local old = self._by_addr or {}
  local peers, by_addr = {}, {}
  for i, p in ipairs(list) do
    local peer = old[p.addr]
    if peer then
      peer.weight = p.weight
    else
      peer = { addr = p.addr, host = p.host, port = p.port, weight = p.weight, cur = 0,
               b = peer_breaker(self, p.addr) }
    end
    peers[i], by_addr[p.addr] = peer, peer
  end
  return peers, by_addr
end

-- upstream.new(pool_name, peers, opts) -> pool
function _M.new(name, peers, opts)
  if type(name) ~= "string" or #name == 0 or name:find("/", 1, true) or #name > 100 then
    raise("pool name must be a string of 1 to 100 bytes without '/', got " .. show(name), 2)
  end
  local o, bopts = check_opts(opts, 2)
  local list = check_peers(name, peers, 2)
  local self = setmetatable({ name = name, max_ejected = o.max_ejected, _tries = o.tries,
    _fail = o.fail, _bopts = bopts, _slow = bopts.slow ~= nil, _ex = {}, _pan = {} }, Pool)
  local ok, peers_or_err, by_addr = pcall(build, self, list)
  if not ok then error(peers_or_err, 2) end
  self._peers, self._by_addr = peers_or_err, by_addr
  self._panic = fuse._counter(PANIC .. name)
  return self
end

-- pool:set_peers(list): replaces the peers of this worker's pool. Peers that stay keep
-- their breaker (and so their state); new ones get a fresh breaker; the breakers of
-- peers that left are removed from the registry (fuse.remove). Requests in flight that
-- tried a removed peer report nothing for it.
function Pool:set_peers(peers)
  local list = check_peers(self.name, peers, 2)
  local ok, new, by_addr = pcall(build, self, list)
  if not ok then error(new, 2) end
  for addr, peer in pairs(self._by_addr) do
    if not by_addr[addr] then
      peer.removed = true
      fuse.remove(peer.b.name)
    end
  end
  self._peers, self._by_addr = new, by_addr
end

-- pool:peers() -> { { addr = "...", weight = n, state = "closed" }, ... }
function Pool:peers()
  local out = {}
  for i, p in ipairs(self._peers) do
    out[i] = { addr = p.addr, weight = p.weight, state = p.b:state() }
  end
  return out
end

function Pool:tries()
  return self._tries or min(#self._peers, 3)
end

---------------------------------------------------------------------------- picking

-- One pick for a try (no nginx needed): smooth weighted round robin over the peers not
-- tried yet by this request (`tried`: peer -> true, or nil) whose breaker admits the call.
-- A peer whose breaker rejects the call is skipped while at most
-- floor(max_ejected * #peers) peers are out for being open (those skipped in this pick,
-- and tried peers that are open now); past that, a rejected peer is picked as if closed
-- (a panic pick, counted, with no ticket).
-- Returns peer, ticket (nil for a panic pick); or nil, retry_after (seconds) when every
-- candidate was skipped.
function Pool:pick(tried)
  local peers, ex, pan = self._peers, self._ex, self._pan
  local n = #peers
  local allowance = floor(self.max_ejected * n + 1e-9)
  local left, open_tried = 0, 0
  for i = 1, n do
    local t = tried ~= nil and tried[peers[i]] or false
    ex[i], pan[i] = t, false
    if not t then left = left + 1 end
  end
  if left == 0 then  -- every peer was tried: start over
    for i = 1, n do ex[i] = false end
  elseif left < n then
    -- peers this request tried that are open now are out of rotation too: they use up
    -- the allowance first (else a retry could skip the last peer of an open pool)
    for i = 1, n do
      if ex[i] then
        local s = peers[i].b:state()
        if s == "open" or s == "forced_open" then open_tried = open_tried + 1 end
      end
    end
  end
  local skipped, soonest = open_tried, huge
  while true do
    local best, bestv, total = nil, -huge, 0
    for i = 1, n do
      if not ex[i] then
        local p = peers[i]
        local w = p.weight
        total = total + w
        if p.cur + w > bestv then best, bestv = i, p.cur + w end
      end
    end
    if not best then return nil, soonest end
    local p = peers[best]
    local ticket, rej
    if not pan[best] then ticket, rej = p.b:allow() end
    if ticket or pan[best] then
      for i = 1, n do
        if not ex[i] then peers[i].cur = peers[i].cur + peers[i].weight end
      end
      p.cur = p.cur - total
      if not ticket then fuse._count(self._panic, 1) end
      return p, ticket
    end
    skipped = skipped + 1
    soonest = min(soonest, rej.retry_after)
    if skipped > allowance then pan[best] = true else ex[best] = true end
  end
end

-- The panic picks counted for this pool, across all workers.
function Pool:panics()
  return fuse._counter_value(self._panic)
end

---------------------------------------------------------------------------- nginx phases

local ngx = rawget(_G, "ngx")
local balancer

local function retry_after_header(seconds)
  ngx.header["Retry-After"] = max(1, ceil(seconds == huge and 1 or seconds))
end

-- No candidate admitted the try (max_ejected let the pick skip them all). A balancer
-- cannot choose the status: nginx answers 500 (pool:access() answers 503 before that);
-- the Retry-After header is set all the same.
local function no_peer(retry_after)
  retry_after_header(retry_after)
  return ngx.exit(ngx.ERROR)
end

-- pool:access(), in access_by_lua* (optional, for max_ejected = 1): when every peer is
-- open and max_ejected lets the pool skip them all, answers 503 with a Retry-After of
-- the soonest peer, before nginx proxies anything. Otherwise does nothing.
function Pool:access()
  local peers = self._peers
  local n = #peers
  if floor(self.max_ejected * n + 1e-9) < n then return end
  local soonest = huge
  for i = 1, n do
    local s = peers[i].b:stats()
    if s.state ~= "open" and s.state ~= "forced_open" then return end
    soonest = min(soonest, s.retry_after)
  end
  ngx.status = 503
  retry_after_header(soonest)
  ngx.say("fuse: every peer of pool '", self.name, "' is open")
  return ngx.exit(503)
end

-- pool:balance(), in balancer_by_lua*: runs once per try.
function Pool:balance()
  balancer = balancer or require "ngx.balancer"
  local ctx = ngx.ctx
  local st = ctx[self]
  if not st then
    st = { n = 0 }
    ctx[self] = st
    local more = self:tries() - 1
    if more > 0 then balancer.set_more_tries(more) end
  else
    -- nginx is retrying: the previous try failed ("failed": no connection, a timeout,
    -- or a status in proxy_next_upstream; "next": 403/404 with http_403/http_404).
    local state, code = balancer.get_last_failure()
    local prev = st[st.n]
    if prev then
      prev.failure, prev.code = state, code
      -- A sure failure (no response at all, or a status in fail_statuses) is reported
      -- now, not in the log phase, so that the next requests see it at once; the log
      -- phase judges the rest with $upstream_header_time (did the peer answer?).
      if prev.ticket and not prev.peer.removed and (code == nil or code == 0 or self._fail[code]) then
        local seconds
        if prev.t0 then ngx.update_time(); seconds = ngx.now() - prev.t0 end
        prev.peer.b:report(prev.ticket, false, seconds)
        prev.ticket = nil
      end
    end
  end
  local tried = nil
  if st.n > 0 then  -- a retry: the peers this request tried
    tried = {}
    for k = 1, st.n do tried[st[k].peer] = true end
  end
  local peer, ticket = self:pick(tried)
  if not peer then return no_peer(ticket) end
  st.n = st.n + 1
  st[st.n] = { peer = peer, ticket = ticket, t0 = self._slow and ticket and ngx.now() or nil }
  local ok, err = balancer.set_current_peer(peer.host, peer.port)
  if not ok then
    if ticket then peer.b:report(ticket, nil) end
    st[st.n].ticket = nil
    error("fuse.upstream: set_current_peer(" .. peer.addr .. ") failed: " .. tostring(err))
  end
end

-- The comma/colon-separated per-try values of an $upstream_* variable, in order.
local function split(s, out)
  local n = 0
  if s then
    for v in s:gmatch("[^%s,:]+") do n = n + 1; out[n] = v end
  end
  return out, n
end

-- A try's outcome: false (failure), true (success) or nil (no verdict: no status).
local function verdict(self, try, last, status, header)
  local answered = header ~= nil and header ~= "-"
  local code = tonumber(status)
  if not last and try.failure == "failed" and not answered then return false end
  if code == nil then
    if not last and try.failure then  -- nginx retried, but we have no list entry
      if self._fail[try.code] or try.failure == "failed" then return false end
      return true
    end
    return nil
  end
  if not answered and (code == 502 or code == 504) then return false end  -- refused, timed out
  if self._fail[code] then return false end
  return true
end

-- pool:log(), in log_by_lua*: reports every try of this request to its peer's breaker,
-- with the try's upstream response time (for `slow`).
function Pool:log()
  local ctx = ngx.ctx
  local st = ctx[self]
  if not st then return end
  ctx[self] = nil
  local var = ngx.var
  local status = var.upstream_status
  if st.n == 1 then  -- one try, one upstream: no list to split (the common case)
    local try = st[1]
    local ticket, peer = try.ticket, try.peer
    if not ticket or peer.removed then return end
    local code = tonumber(status)
    local header = (code == nil or code == 502 or code == 504) and var.upstream_header_time or nil
    if code ~= nil then  -- a list ("502, 200") is no number
      local seconds = self._slow and tonumber(var.upstream_response_time) or nil
      return peer.b:report(ticket, verdict(self, try, true, status, header or "0"), seconds)
    end
  end
  local statuses, ns = split(status, {})
  local times = split(var.upstream_response_time, {})
  local headers = split(var.upstream_header_time, {})
  local base = ns - st.n  -- earlier upstreams of the request (internal redirects) come first
  for k = 1, st.n do
    local try = st[k]
    local ticket, peer = try.ticket, try.peer
    if ticket and not peer.removed then
      local j = base + k
      local ok = verdict(self, try, k == st.n, statuses[j], headers[j])
      peer.b:report(ticket, ok, tonumber(times[j]))
    end
  end
end

return _M
