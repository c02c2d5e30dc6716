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
-- Built on fuse's public API (fuse.new, b:allow, b:report, b:state, fuse.remove,
-- fuse.now). What every worker must see alike beyond the breakers (the peer list and its
-- version, slow-start ramps, the panic and failure-class counters) lives in a
-- lua_shared_dict the user declares (option `dict`, default "fuse_upstream"): nginx's
-- slab holds lists of any length and keeps them across `nginx -s reload`. Outside nginx
-- a table of this Lua state stands in for it (fuse.pool_store). docs/upstream.md says why.
-- The peer list and the options are checked in fuse.pool_config.
--
-- Per request, a record of this worker's REQS, keyed by the request's address (lua-resty-
-- core's get_request()) and checked against its start time, holds the tries:
-- { pool, t, n, refused, [k] = { peer, ticket, t0, done, failure } }, where `pool` is
-- false once the log phase took the record (no longer live), and the first try is the
-- record itself (rec[1] == rec: its fields beside the record's, one table less to reach
-- in either phase). It is not ngx.ctx: that
-- costs a table, a pool cleanup and two FFI look-ups per request, and the records are
-- reused by the next request at the same address, so a healthy request allocates nothing.
-- Their fields never go back to nil (false instead): a key set to nil and set again is a
-- new key for the JIT's trace, an insert that rehashes the table each time.
-- The log phase judges a request proxied once by ngx.status (one FFI read) and reads the
-- $upstream_* lists only when that status is not a plain success. A try admitted by its
-- breaker holds a ticket until it is reported. A request whose log phase never runs (a
-- worker that dies, a subrequest) does not hold a probe slot for ever: after
-- `probe_timeout` the probe gives its slot back and counts as failed (fuse's own rule).
local fuse = require "fuse"
local options = require "fuse.options"

local error, pairs, ipairs, pcall, tonumber, tostring, type, setmetatable, getmetatable, next =
  error, pairs, ipairs, pcall, tonumber, tostring, type, setmetatable, getmetatable, next
local floor, huge, ceil, max, min = math.floor, math.huge, math.ceil, math.max, math.min
local fmt, concat, sort = string.format, table.concat, table.sort
local find, byte, sub = string.find, string.byte, string.sub
local show = options.show  -- values in messages as fuse's own option errors show them

local _M = { VERSION = fuse.VERSION }

-- Tests only: _M._pause, when set, is called with a point's name where a worker killed
-- there must wedge nothing (test/kill.t.sh parks a worker there and kills it). Not on a
-- pick's path: only in set_peers, close and a check.
local function pause(where)
  local f = _M._pause
  if f then f(where) end
end

local config = require "fuse.pool_config"  -- the peer list and the options, checked
local pstore = require "fuse.pool_store"   -- the shared dict every worker reads
local raise, parse_addr, check_peers, check_opts = config.raise, config.parse_addr, config.check_peers,
  config.check_opts
local encode, decode, CLASSES = config.encode, config.decode, config.CLASSES
local STORES, store_for, bump, wanted = pstore.STORES, pstore.store_for, pstore.bump, pstore.wanted
local count, counted = pstore.count, pstore.counted

local Pool = {}
Pool.__index = Pool

local RAMP_FLOOR = 0.1  -- slow start begins at 10% of the weight

-- Raises at the caller's line of pool method `method` unless self is a pool: the usual
-- cause is pool.method() for pool:method(), which passes nil, or the first argument, as
-- self (as fuse's breaker methods say it). Not in the request-path methods balance, log
-- and access: see their comments.
local function check_self(self, method)
  if getmetatable(self) == Pool then return end
  local got = self == nil and "nil" or type(self) == "table" and "a table" or "a " .. type(self)
  error(fmt("fuse.upstream: call pool:%s(), not pool.%s(): self is %s, not a pool", method, method, got), 3)
end

_M._parse_addr = parse_addr  -- for the specs

---------------------------------------------------------------------------- versions

-- The keys of the shared dict, and what an incarnation is: lua/fuse/pool_store.lua.
--
-- Every change of a pool's version (a list stored, a close, a slow-start ramp) also adds
-- one to fuse's shared counter CHANGES (csrc/fz_counters.c: lock-free, one mapping for
-- every worker). A pick reads that counter (under LuaJIT one load of its word, CHANGES_WORD,
-- in the trace; else one call into the core) and reads the pool's version
-- in the shared dict only when it moved, or when a second has passed since the last read
-- (a counter mapping that a reload did not share, or none left: see sync).
local CHANGES = false  -- the counter's index; false before the first pool, nil when none
local CHANGES_WORD = nil  -- its word (a uint64_t pointer) under LuaJIT
local function changes_counter()
  if CHANGES == false then
    local ok, i = pcall(fuse._counter, "fuse_upstream_changes")
    CHANGES = ok and i or nil
    CHANGES_WORD = CHANGES and fuse._counter_word and fuse._counter_word(CHANGES) or nil
  end
  return CHANGES
end

local function changed(store, vkey)
  local v = bump(store, vkey)
  if CHANGES then fuse._count(CHANGES, 1) end
  return v
end

---------------------------------------------------------------------------- peers

-- A new peer's breaker "<pool>/<addr>"; a bad breaker option raises fuse's own message
-- without a position (the caller re-raises it at the user's line).
local function peer_breaker(self, addr)
  local bo = {}
  for k, v in pairs(self._bopts) do bo[k] = v end
  bo.name = self.name .. "/" .. addr
  local store, gkey, lkey, gen = self._store, self._gkey, self._lkey, self._gen
  if self._slow_start > 0 then
    local user, key, vkey = self._bopts.on_state_change, self._pfx .. "r/" .. self.name .. "/" .. addr,
      self._vkey
    -- the worker that closes the breaker stamps the ramp's start for every worker
    bo.on_state_change = function(name, from, to)
      -- (safe_set: on a full dict the peer is not ramped, rather than another key evicted)
      if to == "closed" and from == "half_open" and store:safe_set(key, fuse.now()) then
        changed(store, vkey)
        -- the peer left meanwhile (another worker's close or set_peers): neither stays
        if not wanted(store, gkey, lkey, gen, addr) then
          store:delete(key)
          if store:get(gkey) == nil then store:delete(vkey) end
        end
      end
      if user then return user(name, from, to) end
    end
  end
  local made = fuse.get(bo.name) == nil  -- (else fuse.new gives the existing breaker)
  local ok, b = pcall(fuse.new, bo)
  if not ok then
    error((tostring(b):gsub("^[^\n]-:%d+: ", "")), 0)
  end
  -- removed (close, set_peers) or evicted, the breaker is made again at its next call
  -- only while its pool holds the peer (see refind in fuse.lua)
  b._keep = function() return wanted(store, gkey, lkey, gen, addr) end
  return b, made
end

-- A peer's allow in a pool with checks (option `check`): a probe ticket (the breaker
-- half-open) is given back at once, without a verdict, and the try goes elsewhere as
-- when the probe slot is taken: only the pool's checks probe a peer whose breaker opened,
-- never a client's request.
-- Whether breaker ticket t is a probe's (of kind 0 or 2: fz_internal.h, KIND_LIFT and
-- KIND_PROBE), not a closed or disabled breaker's call.
local function is_probe(t) return floor(t / 2) % 2 == 0 end

local function checked_allow(b)
  local t = b:allow()
  if t and is_probe(t) then
    b:report(t, nil)
    return nil
  end
  return t
end

-- Builds the peer array from a checked list, keeping the peer objects (breaker, SWRR
-- weight) of addresses already in the pool; the weights of the list are theirs once
-- install() takes the array (until then the pool is as it was). A breaker that cannot be
-- made (a full registry, a bad option) raises its message, once the breakers this call
-- made before it are removed: a failed upstream.new or set_peers holds no registry slot.
-- Breakers that existed already (the pool's peers, one another worker's pool of this name
-- made, a peer kept across a reload) stay. Returns the array, its peers by address and
-- the names of the breakers this call made.
local function build(self, list)
  local old = self._by_addr or {}
  local peers, by_addr, made = {}, {}, {}
  for i, p in ipairs(list) do
    local peer = old[p.addr]
    if not peer then
      local ok, b, new = pcall(peer_breaker, self, p.addr)
      if not ok then
        for _, name in ipairs(made) do fuse.remove(name) end
        error(b, 0)
      end
      if new then made[#made + 1] = b.name end
      -- allow and report: the breaker's own methods, kept in the peer (found through the
      -- breaker, each is a search of the object and then of its metatable in a trace)
      -- (a pool with checks: its clients' allow, which takes no probe; see checked_allow)
      peer = { addr = p.addr, host = p.host, port = p.port, weight = p.weight, cur = 0,
               b = b, allow = self._check and checked_allow or b.allow, report = b.report,
               removed = false, w = 0, ramp = false,
               ckey = self._pfx .. "c/" .. self.name .. "/" .. p.addr .. "/",
               kkey = self._pfx .. "k/" .. self.name .. "/" .. p.addr .. "/",
               rkey = self._pfx .. "r/" .. self.name .. "/" .. p.addr }
    end
    peers[i], by_addr[p.addr] = peer, peer
  end
  return peers, by_addr, made
end

-- The round robin's schedule. While every pick is admitted at the first ask, smooth
-- weighted round robin from the state where each peer's `cur` is 0 goes through a fixed
-- cycle of sum(weights) picks. The pool keeps that cycle and its position in it
-- (self._pos): such a pick is one array read, with no loop over the peers (a loop in the
-- pick was most of the pool's work per request under the JIT). The peers' `cur` hold the
-- round robin's state only outside the schedule (self._pos false): from a rejection, a
-- retry, a ramp or a change of peers on, the position's state is written into them first
-- (replayed from the cycle's start), so the loop goes on exactly as if it had run all
-- along. After a whole cycle of picks admitted at the first ask, the pool starts the
-- cycle again from all-zero `cur` (a fresh start of the round robin, weights unchanged).
local SCHED_MAX = 65536  -- the largest sum(weights) * #peers kept as a schedule

-- The peers' `cur` from the schedule's position; the schedule is left.
local function to_cur(self)
  local pos = self._pos
  if not pos then return end
  self._pos, self._clean = false, 0
  local peers, w, sched, total = self._speers, self._sw, self._sched, self._stotal
  if #w <= 2 then  -- (kept by make_sched: no loop, see pick_two)
    peers[1].cur = self._scur1[pos + 1]
    if #w == 2 then peers[2].cur = self._scur2[pos + 1] end
    return
  end
  for i = 1, #w do peers[i].cur = 0 end
  for k = 1, pos do
    for i = 1, #w do peers[i].cur = peers[i].cur + w[i] end
    local b = peers[sched[k]]
    b.cur = b.cur - total
  end
end

-- The schedule of the pool's peers and weights (false when sum(weights) * #peers is above
-- SCHED_MAX); the pool starts on it when every peer's `cur` is 0.
local function make_sched(self)
  local peers = self._peers
  local n, total = #peers, 0
  for i = 1, n do total = total + peers[i].weight end
  self._sched, self._total, self._clean = false, total, 0
  if total * n > SCHED_MAX then return end
  local sched, w, cur = {}, {}, {}
  -- (with one or two peers, their `cur` at each position, for to_cur)
  local scur1, scur2 = n <= 2 and {} or false, n == 2 and {} or false
  for i = 1, n do w[i], cur[i] = peers[i].weight, 0 end
  for k = 1, total do  -- the first round of pick, with every peer admitted
    if scur1 then scur1[k] = cur[1] end
    if scur2 then scur2[k] = cur[2] end
    local best, bestv = 1, -huge
    for i = 1, n do
      local c = cur[i] + w[i]
      cur[i] = c
      if c > bestv then best, bestv = i, c end
    end
    cur[best] = cur[best] - total
    sched[k] = best
  end
  self._sched, self._sw, self._speers, self._stotal = sched, w, peers, total
  self._scur1, self._scur2 = scur1, scur2
  if self._ramping then return end
  for i = 1, n do if peers[i].cur ~= 0 then return end end
  self._pos = 0
end

-- Sets the peer array, and what a pick reads of it kept with it: its length, the tries
-- beyond the first that pool:balance() asks nginx for (set_more_tries), the schedule.
local function set_array(self, peers, by_addr)
  to_cur(self)
  self._peers, self._by_addr, self._n = peers, by_addr, #peers
  self._more = (self._tries or min(#peers, 3)) - 1
  make_sched(self)
end

-- Installs a peer array; peers that left are flagged `removed` (requests in flight count
-- nothing for them and give their tickets back without a verdict: see failed) and, when
-- `remove`, their breakers and counters go.
-- Peer `addr` of this pool, gone: its breaker, its failure and check counters and its ramp.
local CHECK_RESULTS = { "healthy", "unhealthy" }
local function forget(self, addr)
  local store, pfx = self._store, self._pfx
  fuse.remove(self.name .. "/" .. addr)
  for _, c in ipairs(CLASSES) do store:delete(pfx .. "c/" .. self.name .. "/" .. addr .. "/" .. c) end
  for _, c in ipairs(CHECK_RESULTS) do store:delete(pfx .. "k/" .. self.name .. "/" .. addr .. "/" .. c) end
  store:delete(pfx .. "r/" .. self.name .. "/" .. addr)
end

local function install(self, peers, by_addr, remove, list)
  for i, p in ipairs(list) do peers[i].weight = p.weight end
  for addr, peer in pairs(self._by_addr or {}) do
    if not by_addr[addr] and not peer.removed then
      peer.removed = true
      if remove then forget(self, addr) end
    end
  end
  set_array(self, peers, by_addr)
end

-- The slow-start ramps, read again from the store after any version change.
local function read_ramps(self)
  if self._slow_start <= 0 then return end
  local last = nil
  for _, p in ipairs(self._peers) do
    local r = self._store:get(p.rkey)
    -- a new ramp starts the peer at the back of the round robin (a weight it gathered
    -- before it opened would otherwise send it a burst in every worker)
    if r and r ~= p.ramp then to_cur(self); p.cur = 0 end
    p.ramp = r or false
    if p.ramp and (not last or p.ramp > last) then last = p.ramp end
  end
  self._ramping = last ~= nil
  self._ramp_end = last and last + self._slow_start
  if self._ramping then to_cur(self) end  -- (a pick on the schedule reads no ramp)
end

-- A copy whose incarnation another worker closed: its peers are removed here too, so that
-- a try in flight here counts nothing (no counter of the closed pool comes back; its
-- ticket goes back without a verdict, see failed).
-- What the close left, it removes: the breakers and counters of peers no next pool of the
-- name holds and, with no next pool, the pool's own keys (a close whose worker was
-- killed before it removed them, test/kill.t.sh, is finished by the next copy that
-- finds the pool closed: a pick, or a close again from another worker).
local function closed_elsewhere(self)
  if self._closed then return end  -- (once per copy: each later sync of it comes here too)
  local store = self._store
  for _, p in ipairs(self._peers) do
    p.removed = true
    if not wanted(store, self._gkey, self._lkey, self._gen, p.addr) then forget(self, p.addr) end
  end
  if store:get(self._gkey) == nil then
    for _, k in ipairs { self._vkey, self._lkey, self._bkey, self._pkey, self._dkey } do store:delete(k) end
  end
  self._closed = true
end

-- The breakers `made` (names) that this copy made after another worker closed its pool
-- (or removed the peers) go again, but for those the name's next pool holds by now.
local function drop_made(self, made)
  for i = 1, #made do
    local addr = made[i]:sub(#self.name + 2)
    if not wanted(self._store, self._gkey, self._lkey, self._gen, addr) then fuse.remove(made[i]) end
  end
end

-- Brings this worker's pool to the store's version: the list set_peers stored (by any
-- worker), the ramps.
local function refresh(self, v)
  local store = self._store
  self._ver = v
  local s = store:get(self._lkey)
  if s and s ~= self._list_s then
    local list = decode(s)
    if #list > 0 then
      local ok, peers, by_addr, made = pcall(build, self, list)
      -- closed by another worker since this copy's check of the incarnation: what the
      -- build made goes again
      if ok and store:get(self._gkey) ~= self._gen then
        drop_made(self, made)
        return closed_elsewhere(self)
      end
      if ok then
        -- every worker removes what left: one that re-made a breaker meanwhile (a pick
        -- between the writer's store and its removal) takes it away again
        install(self, peers, by_addr, true, list)
        self._list_s = s
      end
    end
  end
  read_ramps(self)
end

-- In nginx's init_by_lua* (the master, at the first start or a reload).
local in_init = fuse._in_init

local function log_err(msg)
  local ngx = rawget(_G, "ngx")
  if ngx and ngx.log then ngx.log(ngx.ERR, msg) end
end

-- The peers of `before` (the list stored until now) that are not in `list` (the config's
-- list, which replaces it at a reload): their breakers, failure counters and ramps go,
-- as set_peers removes them. (Workers still holding them flag them removed at their next
-- sync.)
local function drop_left(self, before, list)
  local keep = {}
  for _, p in ipairs(list) do keep[p.addr] = true end
  for _, p in ipairs(before) do
    if not keep[p.addr] then forget(self, p.addr) end
  end
end

-- Stores the config's list `list` (encoded: `cfg`) as the pool's, in every worker: l/P
-- and b/P set, the version bumped, the peers of the list stored before (`before`, or
-- nil) that are not in it removed. When the dict cannot hold it, the breakers `made` for
-- it go again and nothing changes: nil and the dict's error.
local function store_cfg(self, cfg, list, made, before)
  local store = self._store
  local ok, err = store:safe_set(self._lkey, cfg)
  if not ok then
    for _, n in ipairs(made) do fuse.remove(n) end
    return nil, err
  end
  store:safe_set(self._bkey, cfg)
  changed(store, self._vkey)
  if before then drop_left(self, decode(before), list) end  -- (a closed name has none)
  return true
end

-- A reload whose config edited a pool's list: upstream.new in init_by_lua* stores
-- nothing (nginx may still fail the reload after it, a later pool's bad peer, a port it
-- cannot bind, and keep the old workers, which must keep the list in force); the pool
-- starts on the stored list with the config's pending, and the first sync of a worker
-- forked from it (a new worker) stores the config list as upstream.new did: l/P and b/P
-- set, the version bumped, the dropped peers' breakers and counters removed. Only while
-- b/P is the one the reload saw: another new worker stored it first (or a later reload's
-- did), then the stored list is read as usual. A commit that fails (a full registry or
-- dict) is logged and tried again at the next sync.
local function commit_cfg(self)
  local p, store = self._pending, self._store
  if store:get(self._bkey) ~= p.base then self._pending = false; return end
  local ok, peers, by_addr, made = pcall(build, self, p.list)
  if not ok then
    return log_err(fmt("fuse.upstream: pool '%s': the reload's peer list is not in force yet: %s",
      self.name, tostring(peers)))
  end
  local stored, err = store_cfg(self, p.cfg, p.list, made, store:get(self._lkey))
  if not stored then
    return log_err(fmt("fuse.upstream: pool '%s': the reload's peer list is not in force yet: "
      .. "cannot store it in lua_shared_dict: %s", self.name, tostring(err)))
  end
  self._pending = false
  install(self, peers, by_addr, true, p.list)
  self._list_s = p.cfg
end

-- ngx.now under nginx (the event loop's cached time)
local function ngx_now()
  local ngx = rawget(_G, "ngx")
  return ngx.shared ~= nil and ngx.now or nil
end
local now_cached = rawget(_G, "ngx") and ngx_now()
local counter_value = fuse._counter_value

---------------------------------------------------------------------------- checks

-- Option `check = { path, interval, timeout, host, https }`: a peer whose breaker opened is
-- probed by the pool, never by a client's request. Every worker runs a timer per pool
-- with checks (started by its first sync: a pool made in init_by_lua is copied into each
-- worker); every `interval` seconds it asks each peer whose breaker is open or half-open
-- for a probe ticket, which the breaker gives once its open period is over, to one
-- caller across all workers (`probes`). The worker that gets it sends `GET path` and
-- reports the answer as the probe's outcome: a status from 200 to 399 closes the breaker
-- (with slow_start, the ramp begins), anything else (refused, reset, a timeout, another
-- status) opens it again (for open_for, times backoff). Client tries take no probe
-- (checked_allow). The breakers' rules stay theirs: client tries trip them, their
-- transitions show in events and metrics as any other.
local check_tick  -- (below sync)
-- The pool whose checks run in this worker, by name: one timer per name, the copy made
-- last (another upstream.new of the name in this worker takes over from the one before,
-- whose timer then stops: copies made again and again hold no timer each).
local CHECKERS = {}

-- This worker's checks of pool `self`, started once per process; not in the master
-- (init_by_lua: no timers there).
local function start_checks(self)
  -- (CHECKERS is this process's: the master, where nothing is started, forks it empty)
  if in_init() or CHECKERS[self.name] == self then return end
  local ok, started = pcall(rawget(_G, "ngx").timer.at, 0, check_tick, self)
  if ok and started then CHECKERS[self.name] = self end
end

-- The read of the pool's version in the store, and what follows when it moved. Under
-- nginx it runs interpreted (jit.off): it is the once-a-second branch of sync, and a
-- trace made from it (a side trace of the balancer's and of the log phase's, taken after
-- ten seconds of running) would hold the store's get and refresh, a long trace to compile
-- for a branch that is not hot: an exit to the interpreter once a second costs less.
-- (Outside nginx every sync reads the store: there it stays compiled.)
-- The stored list is compared too: a set_peers whose worker was killed between storing
-- its list and moving the version (test/kill.t.sh) left a list no version announces,
-- which every copy takes here, within a second.
local function resync(self)
  if self._check then start_checks(self) end
  local store = self._store
  if store:get(self._gkey) ~= self._gen then return closed_elsewhere(self) end
  if self._pending then
    -- (in the master, at init: each forked worker's first sync comes back here)
    if in_init() then self._seen = -1 else commit_cfg(self) end
  end
  local v = store:get(self._vkey)
  if v ~= self._ver then return refresh(self, v) end
  local s = store:get(self._lkey)
  if s and s ~= self._list_s then refresh(self, v) end
end
local jit = rawget(_G, "jit")
if jit and jit.off and now_cached then jit.off(resync) end

-- `t`: the time now, or the current request's start time (the balancer and log phases
-- have it at hand; ngx.now() would be one more call into nginx).
local function sync(self, t)
  local c = CHANGES
  if c and now_cached then
    local w = CHANGES_WORD
    if w then c = tonumber(w[0]) else c = counter_value(c) end
    t = t or now_cached()
    local since = t - self._seen_at  -- (below 0: a request older than the last read's)
    if c == self._seen and since < 1 and since > -1 then return end
    self._seen, self._seen_at = c, t
  end
  return resync(self)
end

-- One check of peer `p`, which holds its breaker's probe `ticket`: the answer to GET
-- path is the probe's outcome. A peer that left the pool meanwhile gets no verdict.
local function check_one(self, p, ticket)
  pause("check-probing")
  local c, ngx = self._check, rawget(_G, "ngx")
  local healthy = false
  local sock = ngx.socket.tcp()
  local ms = c.timeout * 1000
  sock:settimeouts(ms, ms, ms)
  -- (https: TLS without verifying the peer's certificate, as nginx's proxy_ssl_verify
  -- off by default; the server name is `host`'s, when it is a name)
  if sock:connect(p.host, p.port) and (not c.https or sock:sslhandshake(nil, c.sni or nil, false))
      and sock:send(fmt("GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: fuse-check/%s\r\n\r\n",
        c.path, c.host or p.addr, _M.VERSION)) then
    local line = sock:receive("*l")
    local code = line and tonumber(line:match("^HTTP/%d%.%d (%d%d%d)"))
    healthy = code ~= nil and code >= 200 and code < 400
  end
  sock:close()
  if p.removed then return p.report(p.b, ticket, nil) end
  p.report(p.b, ticket, healthy)
  counted(self, p, p.kkey .. (healthy and "healthy" or "unhealthy"))
end

-- A check that raised (nothing expected to): its probe ticket is given back unjudged,
-- and the error logged.
local function check_safe(self, p, ticket)
  local ok, err = pcall(check_one, self, p, ticket)
  if not ok then
    pcall(p.report, p.b, ticket, nil)
    log_err(fmt("fuse.upstream: pool '%s': the check of %s failed: %s", self.name, p.addr, tostring(err)))
  end
end

-- One round of pool `self`'s checks in this worker: a probe ticket asked of each peer
-- whose breaker is open or half-open (a ticket is a probe in one worker only), each
-- probe checked in a light thread of its own; returns once they are all done.
local function check_round(self)
  local ngx = rawget(_G, "ngx")
  local threads = {}
  for _, p in ipairs(self._peers) do
    local s = p.b:state()
    if s == "open" or s == "half_open" then
      local t = p.b:allow()
      if t and is_probe(t) then
        threads[#threads + 1] = ngx.thread.spawn(check_safe, self, p, t)
      elseif t then
        p.report(p.b, t, nil)  -- closed meanwhile: not a probe, given back
      end
    end
  end
  for _, co in ipairs(threads) do ngx.thread.wait(co) end
end

-- The timer's run: a round, then the next run. A closed pool, or a worker that exits (a
-- reload), runs no more; a round that raised (nothing expected to) is logged, and the
-- next run comes as usual.
check_tick = function(premature, self)
  local ngx = rawget(_G, "ngx")
  if premature or ngx.worker.exiting() then return end
  if CHECKERS[self.name] ~= self then return end  -- (a later copy of the name took over)
  local ok, err = pcall(sync, self)
  if ok and self._closed then
    CHECKERS[self.name] = nil
    return
  end
  if ok then ok, err = pcall(check_round, self) end
  if not ok then log_err(fmt("fuse.upstream: pool '%s': a round of checks failed: %s", self.name, tostring(err))) end
  ok, err = ngx.timer.at(self._check.interval, check_tick, self)
  if not ok then
    CHECKERS[self.name] = nil  -- the next sync starts them again
    log_err(fmt("fuse.upstream: pool '%s': checks paused, no timer: %s", self.name, tostring(err)))
  end
end
-- (interpreted, as resync: a run per interval is no hot path, and a loop of the tick
-- compiled would hold the store's reads and the peers' states for nothing)
if jit and jit.off and now_cached then
  jit.off(start_checks); jit.off(check_one); jit.off(check_safe); jit.off(check_round); jit.off(check_tick)
end

-- The statuses pool:log() does not take for the try's own (the fast path, below): the
-- fail_statuses, and the redirects an error_page to a URL answers with (301, 302, 303,
-- 307, 308: nginx sends them without an internal redirect, whatever the try's outcome).
local function not_plain(fail)
  local t = {}  -- (an array 1 to 599, as fail_statuses' set)
  for c = 1, 599 do t[c] = fail[c] end
  t[301], t[302], t[303], t[307], t[308] = true, true, true, true, true
  return t
end

-- A new incarnation's token: the process, the time and a count, unique across the
-- workers and reloads that share the dict.
local tokens = 0
local function token()
  tokens = tokens + 1
  local ngx = rawget(_G, "ngx")
  local pid = ngx and ngx.worker and ngx.worker.pid and ngx.worker.pid() or 0
  return fmt("%d:%.6f:%d", pid, fuse.now(), tokens)
end

-- upstream.new(pool_name, peers, opts) -> pool
function _M.new(name, peers, opts)
  if type(name) ~= "string" or #name == 0 or name:find("/", 1, true) or #name > 100 then
    raise("pool name must be a string of 1 to 100 bytes without '/', got " .. show(name), 2)
  end
  local o, bopts = check_opts(opts, 2)
  local ngx_ = rawget(_G, "ngx")
  if o.check and not (ngx_ and ngx_.socket and ngx_.timer and ngx_.worker and ngx_.thread) then
    raise("option 'check' needs nginx (its checks are sent from timers, over cosockets)", 2)
  end
  local list = check_peers(name, peers, 2)
  local store = store_for(o.dict, 2)
  changes_counter()
  local pfx = ""
  -- (a dry run ramps no peer: a ramp is the breaker acting, a healed peer's share cut to 10%)
  local self = setmetatable({ name = name, max_ejected = o.max_ejected, _tries = o.tries,
    _fail = o.fail, _on = o.on, _enforce = o.enforce, _slow_start = o.enforce and o.slow_start or 0,
    _check = o.check,
    _bopts = bopts, _slow = bopts.slow ~= nil, _plain = bopts.slow == nil and not_plain(o.fail), _store = store,
    _looks = 0,
    _pfx = pfx,
    _vkey = pfx .. "v/" .. name, _lkey = pfx .. "l/" .. name, _bkey = pfx .. "b/" .. name,
    _gkey = pfx .. "g/" .. name, _gen = false, _pkey = pfx .. "p/" .. name, _dkey = pfx .. "d/" .. name,
    _ex = {}, _skip = {}, _pan = {}, _open = {}, _busy = {}, _old = {}, _seen = -1, _seen_at = 0,
    _closed = false, _pending = false, _ramping = false, _ramp_end = false, _n = 0, _more = 0,
    _pos = false, _sched = false, _total = 0, _clean = 0, _scur1 = false, _scur2 = false }, Pool)
  -- The phase methods are the pool's own fields: nginx runs a *_by_lua chunk in the
  -- interpreter (a chunk is a vararg function, which LuaJIT does not compile), where
  -- `pool:balance()` found through the metatable is a metamethod look-up every request.
  self.access, self.balance, self.log = Pool.access, Pool.balance, Pool.log
  -- A list set_peers stored over this same config list (since the config took effect:
  -- kept across reloads) wins; a config whose list changed starts over from it.
  local cfg = encode(list)
  -- the incarnation: the one in the store (another worker's pool, or the pool before a
  -- reload), else a new one; added, not set: of two workers that make the first pool of
  -- a name at once, the second takes the first's token
  local gen = store:get(self._gkey)
  if not gen then
    local ok, err = store:safe_add(self._gkey, token())
    if not ok and err ~= "exists" then
      raise(fmt("cannot store the pool in lua_shared_dict '%s': %s", o.dict, err), 2)
    end
    gen = store:get(self._gkey)
  end
  self._gen = gen
  local stored = store:get(self._lkey)
  local from_cfg = not (stored and store:get(self._bkey) == cfg)
  local pending = false
  if from_cfg and stored and in_init() and #decode(stored) > 0 then
    -- a reload that edited the list: the config's list waits for the new workers (see
    -- commit_cfg); its breakers are tried now, so that a full registry or a bad option
    -- still fails the reload, and taken back (fresh ones, nothing of them is lost)
    local ok, err, _, made = pcall(build, self, list)
    if not ok then error(err, 2) end
    for _, n in ipairs(made) do fuse.remove(n) end
    pending = { list = list, cfg = cfg, base = store:get(self._bkey) }
    from_cfg = false
  end
  if not from_cfg then
    local from_store = decode(stored)
    if #from_store > 0 then list = from_store end
  end
  -- The breakers first: a new() that fails (a full registry) stores no list and drops no
  -- peer of the list in force, which the workers still serving go on with.
  local ok, peers_or_err, by_addr, made = pcall(build, self, list)
  if not ok then error(peers_or_err, 2) end
  if from_cfg then
    local stored_ok, err = store_cfg(self, cfg, list, made, stored)
    if not stored_ok then
      raise(fmt("cannot store the peer list in lua_shared_dict '%s': %s", o.dict, err), 2)
    end
  end
  store:safe_add(self._pkey, 0)  -- the panic counter shows (at 0) from the start
  set_array(self, peers_or_err, by_addr)
  self._pending = pending
  self._list_s = encode(list)
  self._ver = store:get(self._vkey)
  read_ramps(self)
  return self
end

local function check_open(self, level)
  if self._closed then raise(fmt("pool '%s' is closed", self.name), level + 1) end
end

-- The pool brought to the store's version (any worker's set_peers, close or ramp), and
-- open; raises at `level` when it is closed.
local function check_live(self, level)
  sync(self)
  check_open(self, level + 1)
end

-- pool:set_peers(list): replaces the pool's peers, in every worker (their next pick).
-- Peers that stay keep their breaker (and so their state); new ones get a fresh breaker;
-- the breakers and counters of peers that left are removed. Requests in flight that
-- tried a removed peer count nothing for it (see failed). Returns true, or nil and why when the
-- shared dict cannot hold the list.
function Pool:set_peers(peers)
  check_self(self, "set_peers")
  check_open(self, 2)
  local list = check_peers(self.name, peers, 2)
  check_live(self, 2)
  local ok, new, by_addr, made = pcall(build, self, list)
  if not ok then error(new, 2) end
  local s = encode(list)
  local stored, err = self._store:safe_set(self._lkey, s)
  if not stored then  -- nothing changes: the breakers made for new peers go again
    for _, name in ipairs(made) do fuse.remove(name) end
    return nil, "cannot store the peer list: " .. tostring(err)
  end
  pause("set-peers-stored")
  self._ver = changed(self._store, self._vkey)
  local store = self._store
  if store:get(self._gkey) ~= self._gen then
    -- closed by another worker since the check above: the list, the version and the
    -- breakers this call made go again (a next pool of the name keeps what it holds),
    -- and the pool is closed here too
    if store:get(self._gkey) == nil then
      store:delete(self._lkey)
      store:delete(self._vkey)
    end
    drop_made(self, made)
    closed_elsewhere(self)
    check_open(self, 2)
  end
  install(self, new, by_addr, true, list)
  self._list_s = s
  read_ramps(self)
  -- Another worker's set_peers may have stored its list between this store and this
  -- version bump: the version then is not this list's, and the store's list must win
  -- here too (as it does in every other worker). The next sync reads it.
  if self._store:get(self._lkey) ~= s then self._ver = false end
  return true
end

-- pool:close(): removes the pool's breakers, counters and stored list, in every worker;
-- the pool (and its copies in other workers) cannot be used afterwards.
function Pool:close()
  check_self(self, "close")
  if self._closed then return end
  resync(self)  -- a copy of an incarnation closed elsewhere closes nothing of the name's next
  if self._closed then return end
  local store = self._store
  store:delete(self._gkey)  -- first: a copy that syncs from here on is closed
  changed(store, self._vkey)
  pause("close-unbound")
  for _, p in ipairs(self._peers) do
    p.removed = true
    fuse.remove(p.b.name)
  end
  local mine = { self._vkey, self._lkey, self._bkey, self._pkey, self._dkey }
  for _, k in ipairs(mine) do store:delete(k) end
  local c, r = self._pfx .. "c/" .. self.name .. "/", self._pfx .. "r/" .. self.name .. "/"
  local kk = self._pfx .. "k/" .. self.name .. "/"
  for _, k in ipairs(store:get_keys(0)) do
    if k:sub(1, #c) == c or k:sub(1, #r) == r or k:sub(1, #kk) == kk then store:delete(k) end
  end
  self._closed = true
end

-- pool:peers() -> { { addr = "...", weight = n, state = "closed" }, ... }
function Pool:peers()
  check_self(self, "peers")
  check_live(self, 2)
  local out = {}
  for i, p in ipairs(self._peers) do
    out[i] = { addr = p.addr, weight = p.weight, state = p.b:state() }
  end
  return out
end

function Pool:tries()
  check_self(self, "tries")
  check_live(self, 2)
  return self._tries or min(#self._peers, 3)
end

---------------------------------------------------------------------------- picking

local function is_open(b)
  local s = b:state()
  return s == "open" or s == "forced_open"
end

-- Which open peers are skipped: with k open and a = floor(max_ejected * n), all of them
-- when k <= a; else the first a in list order (the same in every worker), the other
-- k - a are picked as if closed (panic). A busy peer (one that rejected the try without
-- being open: half-open with its probe slots taken, or full under max_concurrent) is not
-- open: it is left out and counts for nothing (`strict`), so that `probes` and
-- max_concurrent hold and max_ejected counts open peers only. Only when that leaves no
-- candidate (strict false: the pool is never emptied) do busy peers count as open, and
-- they are the first skipped, so that panic picks go to open peers first.
local function decide(self, n, strict)
  local open, skip, pan, busy = self._open, self._skip, self._pan, self._busy
  local a = floor(self.max_ejected * n + 1e-9)
  local taken = 0
  for i = 1, n do
    skip[i], pan[i] = false, false
    if busy[i] then
      if strict then skip[i] = true
      elseif taken < a then skip[i], taken = true, taken + 1 else pan[i] = true end
    end
  end
  for i = 1, n do
    if open[i] and not busy[i] then
      if taken < a then skip[i], taken = true, taken + 1 else pan[i] = true end
    end
  end
end

-- The soonest retry_after among the skipped peers (no candidate left).
local function soonest(self, n)
  local s = huge
  for i = 1, n do
    if self._skip[i] then s = min(s, self._peers[i].b:stats().retry_after) end
  end
  return s
end

-- The time for slow-start weights (nil when no peer ramps; the pool notes when every
-- ramp is over).
local function ramp_now(self)
  if not self._ramping then return nil end
  local now = fuse.now()
  if now >= self._ramp_end then self._ramping = false; return nil end  -- every ramp is over
  return now
end

-- A peer's weight in this pick: its weight, ramped during its slow start.
local function weight_of(p, now, ss)
  local w = p.weight
  if now and p.ramp then
    local f = (now - p.ramp) / ss
    if f < 1 then w = w * max(RAMP_FLOOR, RAMP_FLOOR + (1 - RAMP_FLOOR) * f) end
  end
  return w
end

-- pick_from's rounds, from its arrays and state as set up (see pick_from): one round, and
-- the next by a tail call. (A `while true` loop around the rounds was entered on every
-- call and mostly ran once: traces begun at it left it, and traces begun at rounds' entry
-- aborted there, "inner loop in root trace"; LuaJIT blacklisted rounds in pools of four
-- or five peers with open peers.)
local rounds

-- Peer `best` rejected a try (its breaker admitted nothing) in a pool of n peers whose
-- open set (self._open) was read: it is marked open if it opened since the read, else busy
-- (a probe slot taken, a limit full); the open set decides again which peers are skipped
-- and which picked as if closed, and the rounds go on (the open set known from here).
-- Every rejection ends here: those of rounds, of pick's fast path (pick_from) and of the
-- first rounds written out (first_round_end, retry_few, retry_three).
local function on_rejected(self, n, best, now, only, strict, nbusy, fallback, retry)
  local open, busy = self._open, self._busy
  if not open[best] and is_open(self._peers[best].b) then open[best] = true end  -- (opened since the read)
  if not open[best] and not busy[best] then busy[best], nbusy = true, nbusy + 1 end
  decide(self, n, strict)
  return rounds(self, now, only, strict, nbusy, true, fallback, retry)
end

function rounds(self, now, only, strict, nbusy, known, fallback, retry)
  local peers, ex, skip, pan, open = self._peers, self._ex, self._skip, self._pan, self._open
  local n = #peers
  local ss = self._slow_start
  local best, bestv, total = nil, -huge, 0
  local nopan = false  -- the panic peers stay out of this round's round robin step
  if retry and known then
    for i = 1, n do
      if not ex[i] and not skip[i] and not pan[i] then
        local p = peers[i]
        if p.cur + p.weight > bestv then best, bestv = i, p.cur + p.weight end
      end
    end
    -- (this round only: when that peer rejects the try, the panic peers are candidates
    -- again, before the tried peers come back)
    nopan = best ~= nil
    best, bestv = nil, -huge
  end
  for i = 1, n do
    if not ex[i] and not skip[i] and not (nopan and pan[i]) then
      local p = peers[i]
      local w = weight_of(p, now, ss)
      p.w = w
      total = total + w
      if p.cur + w > bestv then best, bestv = i, p.cur + w end
    end
  end
  if not best then
    if only then return nil, huge end
    if not fallback then  -- every untried peer skipped: back to the tried ones
      fallback = true
      for i = 1, n do ex[i] = false end
    elseif strict and nbusy > 0 then  -- only busy peers left out: counted as open now
      strict = false
      decide(self, n, strict)
    else
      return nil, soonest(self, n)
    end
  else
    -- the `only` round of a retry (pick_retry: the untried peers without failures)
    -- takes no panic pick: an open peer whose window emptied counts no failure, and the
    -- retry's own pick prefers any admitted peer to it
    if only and pan[best] then return nil, huge end
    local p = peers[best]
    local ticket
    if not pan[best] then ticket = p.allow(p.b) end
    if ticket or pan[best] or not self._enforce then
      for i = 1, n do
        local q = peers[i]
        if not ex[i] and not skip[i] and not (nopan and pan[i]) then q.cur = q.cur + q.w end
      end
      p.cur = p.cur - total
      if not ticket then count(self, pan[best] and self._pkey or self._dkey) end
      return p, ticket
    end
    -- rejected: the open set decides whether it is skipped or picked as if closed
    if not known then
      for i = 1, n do open[i] = is_open(peers[i].b) end
    end
    return on_rejected(self, n, best, now, only, strict, nbusy, fallback, retry)
  end
  return rounds(self, now, only, strict, nbusy, known, fallback, retry)  -- the next round
end

-- One pick for a try (no nginx needed): smooth weighted round robin over the peers not
-- tried yet by this request (`tried`: peer -> true, or nil) that are admitted: closed,
-- half-open with a free slot, and open peers past max_ejected's allowance (panic picks,
-- counted). When every untried peer is skipped, the tried ones that are admitted. With
-- enforce = false no peer is skipped. Returns peer, ticket (nil for a panic pick or a dry
-- run's pick of a rejected peer); or nil, retry_after (seconds) when every peer was skipped.
-- pick_from is the whole of it; `rejected` (with tried nil) is the peer whose breaker
-- rejected the first round of pick's fast path, which pick_from goes on from. `only`:
-- the untried peers or none (nil, retry_after), never back to the tried ones.
local function pick_from(self, tried, now, rejected, only)
  local peers, ex, skip, pan, open = self._peers, self._ex, self._skip, self._pan, self._open
  local busy = self._busy
  local n = #peers
  local left = 0
  for i = 1, n do
    local t = tried ~= nil and tried[peers[i]] or false
    ex[i], skip[i], pan[i], open[i], busy[i] = t, false, false, false, false
    if not t then left = left + 1 end
  end
  local strict, nbusy = true, 0  -- (see decide)
  local fallback = left == 0
  if fallback then
    if only then return nil, huge end
    for i = 1, n do ex[i] = false end
  end
  -- a retry (tried is given) prefers admitted peers over panic picks: the request has
  -- failed once already, and a peer picked in panic is open
  local retry = tried ~= nil and next(tried) ~= nil
  if rejected then  -- as the rounds go on after a rejection
    for i = 1, n do open[i] = is_open(peers[i].b) end
    return on_rejected(self, n, rejected, now, only, strict, nbusy, fallback, retry)
  end
  return rounds(self, now, only, strict, nbusy, false, fallback, retry)
end

-- The end of pick_two's and pick_three's first round (n peers, 2 or 3; s1 to s3: which
-- are skipped, s3 true for two): peer `best` (nil: none) takes the pick, or, rejected,
-- the rounds go on as pick_from's do after a rejection.
local function first_round_end(self, n, best, nbusy, s1, s2, s3)
  if best == nil then return rounds(self, nil, nil, true, nbusy, true, false, false) end
  local peers = self._peers
  local p, panic = peers[best], self._pan[best]
  local ticket = nil
  if not panic then ticket = p.allow(p.b) end
  if ticket or panic or not self._enforce then
    local p1, p2, p3 = peers[1], peers[2], peers[3]
    local total = (s1 and 0 or p1.weight) + (s2 and 0 or p2.weight) + (s3 and 0 or p3.weight)
    if not s1 then p1.cur = p1.cur + p1.weight end
    if not s2 then p2.cur = p2.cur + p2.weight end
    if not s3 then p3.cur = p3.cur + p3.weight end
    p.cur = p.cur - total
    if not ticket then count(self, panic and self._pkey or self._dkey) end
    return p, ticket
  end
  return on_rejected(self, n, best, nil, nil, true, nbusy, false, false)  -- (the open set: read)
end

-- pick_from(self, nil, nil, r) in a pool of two peers: its set-up, decide and first round
-- written out for the two, without a loop; what follows a second rejection goes on in
-- rounds. (LuaJIT cannot start a trace at a loop that runs twice: "leaving loop in root
-- trace"; such a loop that runs often is blacklisted, and then every trace through it
-- aborts. With one of two peers open, pick_from ran here on every pick.)
local function pick_two(self, r)
  local peers, ex, skip, pan, open, busy = self._peers, self._ex, self._skip, self._pan, self._open, self._busy
  local p1, p2 = peers[1], peers[2]
  local o1, o2 = is_open(p1.b), is_open(p2.b)
  local b1, b2 = r == 1 and not o1, r == 2 and not o2
  -- decide(self, 2, true): a busy peer is skipped; the open ones in list order while the
  -- allowance lasts, the others picked in panic
  local a = floor(self.max_ejected * 2 + 1e-9)
  local s1, s2, n1, n2, taken = b1, b2, false, false, 0
  if o1 and not b1 then if taken < a then s1, taken = true, taken + 1 else n1 = true end end
  if o2 and not b2 then if taken < a then s2 = true else n2 = true end end
  ex[1], ex[2], open[1], open[2], busy[1], busy[2] = false, false, o1, o2, b1, b2
  skip[1], skip[2], pan[1], pan[2] = s1, s2, n1, n2
  local nbusy = (b1 or b2) and 1 or 0
  local best = nil  -- the first round: the peer not skipped with the most (the first on a tie)
  if not s1 then best = 1 end
  if not s2 and (best == nil or p2.cur + p2.weight > p1.cur + p1.weight) then best = 2 end
  return first_round_end(self, 2, best, nbusy, s1, s2, true)
end

-- pick_two for a pool of three peers (its loops over three peers were blacklisted too,
-- with one or two of them open).
local function pick_three(self, r)
  local peers, ex, skip, pan, open, busy = self._peers, self._ex, self._skip, self._pan, self._open, self._busy
  local p1, p2, p3 = peers[1], peers[2], peers[3]
  local o1, o2, o3 = is_open(p1.b), is_open(p2.b), is_open(p3.b)
  local b1, b2, b3 = r == 1 and not o1, r == 2 and not o2, r == 3 and not o3
  local a = floor(self.max_ejected * 3 + 1e-9)
  local s1, s2, s3, n1, n2, n3, taken = b1, b2, b3, false, false, false, 0
  if o1 and not b1 then if taken < a then s1, taken = true, taken + 1 else n1 = true end end
  if o2 and not b2 then if taken < a then s2, taken = true, taken + 1 else n2 = true end end
  if o3 and not b3 then if taken < a then s3 = true else n3 = true end end
  ex[1], ex[2], ex[3], open[1], open[2], open[3] = false, false, false, o1, o2, o3
  busy[1], busy[2], busy[3] = b1, b2, b3
  skip[1], skip[2], skip[3], pan[1], pan[2], pan[3] = s1, s2, s3, n1, n2, n3
  local nbusy = (b1 or b2 or b3) and 1 or 0
  local best, bestv = nil, -huge  -- the first round: the peer not skipped with the most (the first on a tie)
  if not s1 then best, bestv = 1, p1.cur + p1.weight end
  if not s2 and p2.cur + p2.weight > bestv then best, bestv = 2, p2.cur + p2.weight end
  if not s3 and p3.cur + p3.weight > bestv then best = 3 end
  return first_round_end(self, 3, best, nbusy, s1, s2, s3)
end

-- pick_from(self, nil, now, r): a first try goes on after peer r rejected it.
local function rejected_first(self, now, r)
  if now == nil and self._n == 2 then return pick_two(self, r) end
  if now == nil and self._n == 3 then return pick_three(self, r) end
  return pick_from(self, nil, now, r)
end

-- A retry's pick (`tried`: the peers this request tried): first among the untried peers
-- whose breaker counts no failure in its window, when there is one (a peer that has just
-- failed other requests is likely to fail this one: with two sick peers of three, the
-- retry of a try that failed on one goes to the healthy peer, not to the other sick one
-- while neither has tripped yet); when none of those is admitted, as any retry. The
-- breakers' counts are read only here, on a retry (about 0.3 us a peer).
local failures_of = fuse._failures
local function pick_retry(self, tried, now)
  local peers = self._peers
  local avoid, clean = nil, false
  for i = 1, #peers do
    local p = peers[i]
    if not tried[p] then
      if failures_of(p.b) > 0 then
        avoid = avoid or {}
        avoid[p] = true
      else
        clean = true
      end
    end
  end
  if avoid and clean then
    for p in pairs(tried) do avoid[p] = true end
    local p, ticket = pick_from(self, avoid, now, nil, true)
    if p then return p, ticket end
  end
  return pick_from(self, tried, now, nil)
end

-- A retry's pick in a pool of one or two peers whose one untried peer is peer u (the
-- other, if any, tried): pick_retry's, written out without a loop for its first round
-- (pick_retry has no `only` round with one untried peer, and pick_from's first round
-- asks that peer alone; with one peer, tried, pick_from goes back to it at once). What
-- follows a rejection goes on in rounds, as there. (A loop that runs once or twice per
-- call cannot start a trace, "leaving loop in root trace": with one or two peers, a
-- retry's loops were blacklisted, and with them pick_from, pick and pool:pick, whose
-- every later pick then ran interpreted, first tries too.)
local function retry_few(self, tried, now, u)
  local peers, ex, skip, pan, open, busy = self._peers, self._ex, self._skip, self._pan, self._open, self._busy
  local n = self._n
  local p = peers[u]
  ex[1], skip[1], pan[1], open[1], busy[1] = false, false, false, false, false
  if n == 2 then
    ex[u], ex[3 - u] = false, tried[peers[3 - u]] or false
    skip[2], pan[2], open[2], busy[2] = false, false, false, false
  end
  local w = weight_of(p, now, self._slow_start)
  p.w = w
  local ticket = p.allow(p.b)
  if ticket or not self._enforce then
    p.cur = (p.cur + w) - w  -- (as rounds: its weight added, then the total, its own, taken)
    if not ticket then count(self, self._dkey) end
    return p, ticket
  end
  open[1] = is_open(peers[1].b)
  if n == 2 then open[2] = is_open(peers[2].b) end
  return on_rejected(self, n, u, now, nil, true, 0, n == 1, true)
end

-- retry_few for a pool of three peers whose one tried peer is peer t (`tried` holds no
-- other of them): pick_retry's first round, written out, when its untried peers u and v
-- both count failures or neither does (then it has no `only` round); else pick_retry.
local function retry_three(self, tried, now, t)
  local peers, ex, skip, pan, open, busy = self._peers, self._ex, self._skip, self._pan, self._open, self._busy
  local u, v = t == 1 and 2 or 1, t == 3 and 2 or 3
  local pu, pv = peers[u], peers[v]
  if (failures_of(pu.b) > 0) ~= (failures_of(pv.b) > 0) then return pick_retry(self, tried, now) end
  ex[1], ex[2], ex[3] = false, false, false
  ex[t] = true
  skip[1], skip[2], skip[3], pan[1], pan[2], pan[3] = false, false, false, false, false, false
  open[1], open[2], open[3], busy[1], busy[2], busy[3] = false, false, false, false, false, false
  local ss = self._slow_start
  local wu, wv = weight_of(pu, now, ss), weight_of(pv, now, ss)
  pu.w, pv.w = wu, wv
  local total = wu + wv
  local best, p = u, pu
  if pv.cur + wv > pu.cur + wu then best, p = v, pv end
  local ticket = p.allow(p.b)
  if ticket or not self._enforce then
    pu.cur, pv.cur = pu.cur + wu, pv.cur + wv
    p.cur = p.cur - total
    if not ticket then count(self, self._dkey) end
    return p, ticket
  end
  open[1], open[2], open[3] = is_open(peers[1].b), is_open(peers[2].b), is_open(peers[3].b)
  return on_rejected(self, 3, best, now, nil, true, 0, false, true)
end

-- peers[i].cur = v[i] for the n peers: written out for up to three (see pick_two).
local ZEROS = { 0, 0, 0 }
local function set_cur(peers, n, v)
  if n <= 3 then
    peers[1].cur = v[1]
    if n >= 2 then peers[2].cur = v[2] end
    if n == 3 then peers[3].cur = v[3] end
    return
  end
  for i = 1, n do peers[i].cur = v[i] or 0 end
end

-- A pick. A request's first try (nothing tried) on the schedule is its next entry. Else
-- the first round of pick_from over every peer in one loop, which moves every peer's
-- round robin weight at once; a rejection takes the weights back (the old ones, kept
-- while a ramp makes weights fractional) and goes on in pick_from.
local function pick(self, tried)
  local pos = self._pos  -- (never while a ramp is on: see read_ramps)
  if pos and tried == nil then
    local i = self._sched[pos + 1]
    local p = self._peers[i]
    local ticket = p.allow(p.b)
    if ticket or not self._enforce then
      self._pos = (pos + 1) % self._total  -- (no branch: a branch taken once a cycle is a side trace)
      if not ticket then count(self, self._dkey) end
      return p, ticket
    end
    to_cur(self)
    return rejected_first(self, nil, i)
  end
  local now = ramp_now(self)
  to_cur(self)
  if tried ~= nil then
    self._clean = 0
    if next(tried) == nil then return pick_from(self, tried, now, nil) end
    local n = self._n
    if n == 1 and tried[self._peers[1]] then return retry_few(self, tried, now, 1) end
    if n == 2 then  -- (one tried, the other not)
      local t1, t2 = tried[self._peers[1]] or false, tried[self._peers[2]] or false
      if t1 ~= t2 then return retry_few(self, tried, now, t1 and 2 or 1) end
    elseif n == 3 then  -- (one tried)
      local ps = self._peers
      local t1, t2, t3 = tried[ps[1]] and 1 or 0, tried[ps[2]] and 1 or 0, tried[ps[3]] and 1 or 0
      if t1 + t2 + t3 == 1 then return retry_three(self, tried, now, t1 == 1 and 1 or t2 == 1 and 2 or 3) end
    end
    return pick_retry(self, tried, now)
  end
  local peers = self._peers
  local best, bestv, total = 1, -huge, 0
  if now == nil and self._n == 2 then  -- (as the loop below, without a loop: see pick_two)
    local p1, p2 = peers[1], peers[2]
    local c1, c2 = p1.cur + p1.weight, p2.cur + p2.weight
    p1.cur, p2.cur, total = c1, c2, p1.weight + p2.weight
    if c2 > c1 then best = 2 end
  elseif now == nil and self._n <= 3 then  -- (the same for one or three: such loops were blacklisted)
    local p1 = peers[1]
    local c1 = p1.cur + p1.weight
    p1.cur, total, bestv = c1, p1.weight, c1
    if self._n == 3 then
      local p2, p3 = peers[2], peers[3]
      local c2, c3 = p2.cur + p2.weight, p3.cur + p3.weight
      p2.cur, p3.cur, total = c2, c3, total + p2.weight + p3.weight
      if c2 > bestv then best, bestv = 2, c2 end
      if c3 > bestv then best = 3 end
    end
  elseif now == nil then  -- no ramp: each weight is the peer's own
    for i = 1, self._n do
      local p = peers[i]
      local w = p.weight
      local c = p.cur + w
      p.cur, total = c, total + w
      if c > bestv then best, bestv = i, c end
    end
  elseif self._n <= 3 then  -- (a ramp: the same, written out for up to three peers)
    local old, ss, n = self._old, self._slow_start, self._n
    local p1 = peers[1]
    local w1, c1 = weight_of(p1, now, ss), p1.cur
    old[1], p1.cur, total, bestv = c1, c1 + w1, w1, c1 + w1
    if n >= 2 then
      local p2 = peers[2]
      local w2, c2 = weight_of(p2, now, ss), p2.cur
      old[2], p2.cur, total = c2, c2 + w2, total + w2
      if c2 + w2 > bestv then best, bestv = 2, c2 + w2 end
    end
    if n == 3 then
      local p3 = peers[3]
      local w3, c3 = weight_of(p3, now, ss), p3.cur
      old[3], p3.cur, total = c3, c3 + w3, total + w3
      if c3 + w3 > bestv then best = 3 end
    end
  else
    local old, ss = self._old, self._slow_start
    for i = 1, self._n do
      local p = peers[i]
      local w = weight_of(p, now, ss)
      local c = p.cur
      old[i], p.cur = c, c + w
      total = total + w
      if c + w > bestv then best, bestv = i, c + w end
    end
  end
  local p = peers[best]
  local ticket = p.allow(p.b)
  if ticket or not self._enforce then
    p.cur = p.cur - total
    if not ticket then count(self, self._dkey) end
    local clean = now == nil and self._sched and self._clean + 1 or 0
    if clean >= self._total then  -- a whole cycle admitted at the first ask: the schedule again
      set_cur(peers, self._n, ZEROS)
      self._pos, clean = 0, 0
    end
    self._clean = clean
    return p, ticket
  end
  self._clean = 0
  if now == nil and self._n == 2 then
    local p1, p2 = peers[1], peers[2]
    p1.cur, p2.cur = p1.cur - p1.weight, p2.cur - p2.weight
  elseif now == nil and self._n <= 3 then
    local p1 = peers[1]
    p1.cur = p1.cur - p1.weight
    if self._n == 3 then
      local p2, p3 = peers[2], peers[3]
      p2.cur, p3.cur = p2.cur - p2.weight, p3.cur - p3.weight
    end
  elseif now == nil then
    -- (whole numbers: exact; after a ramp made them fractional, within a rounding)
    for i = 1, self._n do local q = peers[i]; q.cur = q.cur - q.weight end
  else
    set_cur(peers, self._n, self._old)
  end
  return rejected_first(self, now, best)
end

function Pool:pick(tried)
  check_self(self, "pick")
  check_live(self, 2)
  return pick(self, tried)
end

-- The panic picks counted for this pool, across all workers.
function Pool:panics()
  check_self(self, "panics")
  check_live(self, 2)  -- (a closed pool's key may be its name's next pool's)
  return self._store:get(self._pkey) or 0
end

-- The failures of class `class` counted for peer `addr` (any spelling the peer lists
-- take: read as its canonical form), across all workers. A class that is not one, or an
-- address that does not parse, raises: a typo would read 0.
local CLASS_SET = { connect = true, timeout = true, status = true }
function Pool:failures(addr, class)
  check_self(self, "failures")
  if not CLASS_SET[class] then
    local near = type(class) == "string" and options.suggest(class, CLASSES)
    raise(fmt('pool:failures: class must be "connect", "timeout" or "status", got %s%s', show(class),
      near and fmt(' (did you mean "%s"?)', near) or ""), 2)
  end
  local canon, why = parse_addr(addr)
  if not canon then raise(fmt("pool:failures: address %s: %s", show(addr), why), 2) end
  check_live(self, 2)
  return self._store:get(self._pfx .. "c/" .. self.name .. "/" .. canon .. "/" .. class) or 0
end

---------------------------------------------------------------------------- outcomes

-- A try's failure of class `class`: counted, and reported to its breaker (as a failure
-- when fail_on has the class, else as a success: the peer answered, or the class is not
-- held against it).
-- A try on a peer that left the pool (set_peers, close) counts nowhere, but its ticket is
-- given back, without a verdict (which counts nothing, in no breaker, and makes none):
-- a registry slot keeps the max_concurrent permits of the breaker that was there, for its
-- calls to give back, and a ticket never given back left the slot's next breaker (another
-- pool's peer, the peer added again) with a call running for good.
local function failed(self, try, class, seconds)
  try.done = true
  local peer, ticket = try.peer, try.ticket
  try.ticket = false
  if peer.removed then
    if ticket then peer.report(peer.b, ticket, nil) end
    return
  end
  counted(self, peer, peer.ckey .. class)
  if ticket then peer.b:report(ticket, not self._on[class], seconds) end
end
_M._failed = failed  -- for the specs
_M._stores = STORES  -- for the specs: dict name -> store
_M._local_store = pstore.local_store  -- for the specs (spec/fake_nginx.lua's shared dicts)

local function succeeded(try, ok, seconds)
  try.done = true
  local ticket = try.ticket
  if ticket then
    try.ticket = false
    local peer = try.peer
    if peer.removed then ok = nil end  -- (given back without a verdict: see failed)
    peer.report(peer.b, ticket, ok, seconds)
  end
end

-- A try's outcome from its status and response header time: a class ("connect",
-- "timeout", "status"), or nil and true (success) / nil (no verdict).
local function classify(self, code, answered, failure)
  if code == nil then
    if failure == "failed" then return "connect" end
    return nil, nil
  end
  if not answered and code == 504 then return "timeout" end
  if not answered and code == 502 then return "connect" end
  if self._fail[code] then return "status" end
  return nil, true
end

---------------------------------------------------------------------------- nginx phases

-- Under nginx, nginx's functions are upvalues set once, here: an upvalue never assigned
-- again is a constant to the JIT, where one assigned later (at a first call) costs a load
-- and a guard at every use in every trace. The common case of each phase calls the C
-- functions behind four of lua-resty-core's functions (their declarations are resty.core's,
-- made when it loaded) with the request the phase already holds: the start time, the
-- response status, whether nginx is retrying, and set_more_tries, whose Lua function
-- makes a string of nginx's warning at every call when proxy_next_upstream_tries is below
-- `tries`. Any other answer (a retry, an error) goes to the public function, which says it
-- as before. Outside nginx, or where resty.core has no such declaration, the public
-- functions throughout. (set_current_peer stays the public function: code that wraps it,
-- as test/upstream-pools.conf does, sees every peer the pool sets.)
local ngx = rawget(_G, "ngx")
local NGX = ngx ~= nil and ngx.shared ~= nil and ngx.req ~= nil and pcall(require, "ngx.balancer")
local function c_fn(name)  -- a function resty.core declared, or nil
  local ok, f = pcall(function() return require("ffi").C[name] end)
  return ok and f or nil
end
local balancer = NGX and require "ngx.balancer" or nil
local get_last_failure = balancer and balancer.get_last_failure
local set_current_peer = balancer and balancer.set_current_peer
local set_more_tries = balancer and balancer.set_more_tries
local cast = NGX and require("ffi").cast or nil
local intptr = NGX and require("ffi").typeof("intptr_t") or nil
local get_request = NGX and require("resty.core.base").get_request or nil
local req_start_time = NGX and ngx.req.start_time or nil
local c_start_time = NGX and c_fn("ngx_http_lua_ffi_req_start_time") or nil
local c_resp_status = NGX and c_fn("ngx_http_lua_ffi_get_resp_status") or nil
local c_last_failure = NGX and c_fn("ngx_http_lua_ffi_balancer_get_last_failure") or nil
local c_more_tries = NGX and c_fn("ngx_http_lua_ffi_balancer_set_more_tries") or nil
local c_is_internal = NGX and c_fn("ngx_http_lua_ffi_req_is_internal") or nil
local int_out = NGX and require("ffi").new("int[1]") or nil
local err_out = NGX and require("ffi").new("char *[1]") or nil

-- (These three return the C call in parentheses: `return (f(r))` is no tail call. The
-- interpreter calls them before the phases are compiled, so a trace may begin at their
-- entry; a tail call into C from a trace's first frame aborts it ("leaving loop in root
-- trace"), and an entry whose traces keep aborting is blacklisted for the process's life,
-- and with it every later trace through it: test/upstream.t.sh's JIT check.)

-- The request's start time (r: the request, from get_request()).
local function start_time(r)
  if c_start_time then return (c_start_time(r)) end
  return req_start_time()
end

-- The response status (r: the request), as ngx.status reads it.
local function resp_status(r)
  if c_resp_status then return (c_resp_status(r)) end
  return ngx.status
end

-- 1 when request r went through an internal redirect (ngx.req.is_internal()), else 0.
local function internal(r)
  if c_is_internal then return (c_is_internal(r)) end
  return ngx.req.is_internal() and 1 or 0
end

-- This worker's request records (see the top of this file), by request address (`key`,
-- a number). They live in SLOTS, an array indexed by ten bits of the address: one array
-- read, where a table keyed by the address costs a hash of a number and a search (about
-- 20 instructions more in each phase). A record stays in its slot for the next request
-- at its address, or for another address once it is not live (its log phase ran) or
-- older than STALE_AFTER seconds (a log phase that never ran for it). A request whose
-- slot holds another live request's record keeps its own in REQS, by address, until its
-- log phase; SWEEP_EVERY records made there, those not live and the stale go.
-- (FUSE_UPSTREAM_RECORD_SLOTS, a global set before this module is loaded, a power of two
-- up to 1024, is for tests: test/upstream-pools.conf sets 1, so that every two requests
-- at once in a worker share a slot and its checks exercise the records kept in REQS.)
local SLOT_MASK = 1023
do
  local n, p = tonumber(rawget(_G, "FUSE_UPSTREAM_RECORD_SLOTS")), 1
  while n and p < n and p < 1024 do p = p * 2 end
  if n == p then SLOT_MASK = n - 1 end
end
local SLOTS = {}
for i = 1, SLOT_MASK + 1 do SLOTS[i] = false end  -- (an array: filled as used, a hash)
local REQS, in_reqs, made = {}, 0, 0
local SWEEP_EVERY, STALE_AFTER = 1024, 600
local band, bxor, rshift = NGX and bit.band, NGX and bit.bxor, NGX and bit.rshift

local function slot_of(key)  -- bits 4 to 13 of the address and 14 to 23 (r is 16-aligned)
  return band(bxor(rshift(key, 4), rshift(key, 14)), SLOT_MASK) + 1
end

-- The tries of live record `rec` that hold a ticket nothing reported, when the record is
-- let go: its request's log phase never ran for the pool (a subrequest, a location
-- without pool:log()) and a later request has its address (nginx freed the request: its
-- tries are over), or it is STALE_AFTER old, or an internal redirect left an upstream
-- whose lists did not say how its tries ended. Each ticket is given back: a probe as
-- failed (what probe_timeout makes of it, sooner), another try without a verdict. Before,
-- they were dropped, and each held its peer's max_concurrent permit for good (a peer with
-- max_concurrent = 1 was full for good after one subrequest).
local function give_back(rec)
  for k = 1, rec.n do
    local try = rec[k]
    local ticket = try.ticket
    if ticket and not try.done then
      try.ticket = false
      local peer, ok = try.peer, nil
      if is_probe(ticket) and not peer.removed then ok = false end
      peer.report(peer.b, ticket, ok, nil)
    end
  end
end

local function sweep(now)
  in_reqs = 0
  for k, rec in pairs(REQS) do
    if not rec.pool or now - rec.t > STALE_AFTER then
      if rec.pool then give_back(rec) end
      REQS[k] = nil
    else
      in_reqs = in_reqs + 1
    end
  end
  made = 0
end

-- A record with every field it will hold (its first try's too), so that none is a new key
-- later.
local function new_record(key, t)
  local rec = { key = key, pool = false, t = t, n = 0, refused = false, before = 0,
                peer = false, ticket = false, done = false, failure = false, t0 = false }
  rec[1] = rec
  return rec
end

-- The record of address `key` when slot i holds another address's or none: the one in
-- REQS; else the slot's, taken over when it is not live or stale; else a new one in REQS.
local function other_record(i, key, t)
  local rec = in_reqs > 0 and REQS[key] or nil
  if rec then return rec end
  rec = SLOTS[i]
  if not rec then
    rec = new_record(key, t)
    SLOTS[i] = rec
    return rec
  end
  if not rec.pool or t - rec.t > STALE_AFTER then
    rec.key = key
    return rec
  end
  made = made + 1
  if made > SWEEP_EVERY then sweep(t) end
  rec = new_record(key, t)
  REQS[key], in_reqs = rec, in_reqs + 1
  return rec
end

-- A record cleared for the first try of this pool's upstream (t: the request's start time).
local function clear(self, rec, t)
  if rec.pool then give_back(rec) end  -- (a record let go live: see give_back)
  rec.pool, rec.t, rec.n, rec.refused = self, t, 0, false
  return rec, true, t
end

-- The record of this request's tries: its live one (`fresh` false; rec.pool is the pool
-- whose upstream made it, this one or another before an internal redirect), or one
-- cleared for this pool (true) when there is none (its first try; or, after STALE_AFTER
-- seconds, a record lost); and the request's start time.
local function record(self, r)
  local key, t = tonumber(cast(intptr, r)), start_time(r)
  local i = slot_of(key)
  local rec = SLOTS[i]
  if not rec or rec.key ~= key then rec = other_record(i, key, t) end
  if rec.t == t and rec.pool then return rec, false, t end
  return clear(self, rec, t)
end

-- The record the log phase judges, taken (no longer live; out of REQS), with the
-- request and the pool whose upstream made it: pool `self`'s (pool:log()), or any pool's
-- (self false: upstream.log()); nil when this request has none.
local function take(self)
  if not get_request then return nil end  -- not under nginx
  local r = get_request()
  if r == nil then return nil end
  local key = tonumber(cast(intptr, r))
  local rec = SLOTS[slot_of(key)]
  local in_slot = rec and rec.key == key
  if not in_slot then rec = in_reqs > 0 and REQS[key] or nil end
  local pool = rec and rec.pool
  if not pool or (self and pool ~= self) then return nil end
  if not in_slot then REQS[key], in_reqs = nil, in_reqs - 1 end
  if rec.t ~= start_time(r) then  -- an earlier request's, at the same address
    give_back(rec)
    rec.pool = false
    return nil
  end
  rec.pool = false
  return rec, r, pool
end

-- Sets the Retry-After header to `seconds` (rounded up, at least 1); returns its value.
local function retry_after_header(seconds)
  local v = max(1, ceil(seconds == huge and 1 or seconds))
  ngx.header["Retry-After"] = v
  return v
end

-- No candidate admitted the try of pool `self` (max_ejected let the pick skip them all,
-- on a first try or on a retry): the request ends as when nginx's own balancer has no
-- live peer. The exit code is nginx's NGX_BUSY: nginx logs "no live upstreams" and
-- answers 502 (NGX_HTTP_UPSTREAM_FT_NOLIVE, which no proxy_next_upstream asks to retry),
-- with the Retry-After header of the soonest peer. (Measured in Debian's nginx 1.22 and
-- lua-nginx-module 0.10.23: ngx.exit(ngx.ERROR) answered 500 whatever the last try got;
-- a status such as ngx.exit(503) is turned into NGX_ERROR, a 500, unless nginx carries
-- OpenResty's balancer status-code patch; NGX_DECLINED made nginx call the balancer
-- again at once, without end.) pool:access() answers 503 before any try.
local NGX_BUSY = -3
local function no_peer(self, retry_after)
  local ra = retry_after_header(retry_after)
  ngx.log(ngx.WARN, "fuse.upstream: pool '", self.name, "': no peer admits the try (each open or busy,",
    " max_ejected = ", self.max_ejected, "): 502, Retry-After ", ra)
  return ngx.exit(NGX_BUSY)
end

-- pool:access(), in access_by_lua* (optional, for max_ejected = 1): when every peer is
-- open and max_ejected lets the pool skip them all, answers 503 with a Retry-After of
-- the soonest peer, before nginx proxies anything. Otherwise does nothing.
function Pool:access()
  sync(self)
  if self._closed then return end  -- the balancer says so
  local peers = self._peers
  local n = #peers
  if not self._enforce or floor(self.max_ejected * n + 1e-9) < n then return end
  local soon = huge
  for i = 1, n do
    local b = peers[i].b
    local s = b:stats()
    if s.state ~= "open" and s.state ~= "forced_open" then
      -- it admits this request unless it is busy (half-open with its probe slots taken,
      -- or full under max_concurrent), which admits nothing either: asked with a ticket,
      -- given back unjudged (at once: a pool's breakers have no max_wait, see check_opts)
      -- (with checks, a probe ticket admits no client try: see checked_allow)
      local t = b:allow()
      if t then
        b:report(t, nil)
        if not (self._check and is_probe(t)) then return end
      end
    end
    soon = min(soon, s.retry_after)
  end
  ngx.status = 503
  retry_after_header(soon)
  ngx.say("fuse: every peer of pool '", self.name, "' is open")
  return ngx.exit(503)
end

-- The per-try values of an $upstream_* variable ("502, 200 : 200"), in order: its runs
-- of bytes other than whitespace, ',' and ':', put in out[1..k]; returns out, k. Without
-- string.gmatch or a pattern (LuaJIT compiles neither: a trace through them ends or
-- aborts there), and without a loop for lists of up to three values in nginx's form: a
-- loop that runs once or twice per call cannot start a trace ("leaving loop in root
-- trace"), and LuaJIT blacklisted it, and then the log phase and the balancer that call
-- it, on the requests with retries, those of a sick peer. nginx joins the tries of an
-- upstream with ", " and upstreams with " : "; anything else goes byte by byte (runs).

-- The values of s from byte i on (n = #s), byte by byte, after out[1..k]; out, k.
local function runs(s, i, n, out, k)
  local start = nil
  for j = i, n do
    local c = byte(s, j)
    if c == 32 or c == 44 or c == 58 or (c >= 9 and c <= 13) then  -- (%s: 9 to 13 and 32)
      if start then k = k + 1; out[k] = sub(s, start, j - 1); start = nil end
    elseif not start then
      start = j
    end
  end
  if start then k = k + 1; out[k] = sub(s, start, n) end
  return out, k
end

-- The entry of s that starts at byte i, in nginx's form: a value ("-" or a number, whose
-- bytes hold no separator) or nothing, then ", ", " : " or the end. Puts the value in
-- out[k + 1]; returns the new count and where the next entry starts (nil after the last),
-- or nil where s is not in that form (the caller goes on byte by byte from i).
local function take_value(s, i, n, out, k)
  local e, nx = n, nil
  local sp = find(s, " ", i, true)
  if sp then
    if byte(s, sp - 1) == 44 then e, nx = sp - 2, sp + 1  -- (s[i - 1] is a space, never ',')
    elseif byte(s, sp + 1) == 58 and byte(s, sp + 2) == 32 then e, nx = sp - 1, sp + 3
    else return nil end
  end
  if e < i then return k, nx end  -- an empty entry: no value
  local v = sub(s, i, e)
  -- (tonumber takes no separator inside a number, only whitespace around it)
  if v ~= "-" and not (byte(v, 1) > 32 and byte(v, -1) > 32 and tonumber(v)) then return nil end
  out[k + 1] = v
  return k + 1, nx
end

local function split(s, out)
  if s == nil then return out, 0 end
  local n = #s
  local k1, i1 = take_value(s, 1, n, out, 0)
  if k1 == nil then return runs(s, 1, n, out, 0) end
  if i1 == nil then return out, k1 end
  local k2, i2 = take_value(s, i1, n, out, k1)
  if k2 == nil then return runs(s, i1, n, out, k1) end
  if i2 == nil then return out, k2 end
  local k3, i3 = take_value(s, i2, n, out, k2)
  if k3 == nil then return runs(s, i2, n, out, k2) end
  if i3 == nil then return out, k3 end
  return runs(s, i3, n, out, k3)  -- a fourth value on
end
_M._split = split  -- for the specs

local function judge(self, try, code, header, seconds)
  local answered = header ~= nil and header ~= "-"
  local class, ok = classify(self, code, answered, try.failure)
  if class then return failed(self, try, class, seconds) end
  return succeeded(try, ok, seconds)
end

-- Try `try`, unless judged already, from entry j of the split lists.
local function judge_at(self, try, j, statuses, headers, times)
  if not try.done then judge(self, try, tonumber(statuses[j]), headers[j], tonumber(times[j])) end
end

-- The tries of record `rec` that nothing judged yet, from the $upstream_status,
-- $upstream_header_time and $upstream_response_time lists given, split: the record's
-- tries are the entries after the rec.before entries of the request's earlier upstreams
-- (an internal redirect's), whatever came after them (a later upstream, of a pool or
-- not). `whole`: nothing when the lists hold fewer values than that. Returns how many
-- values the status list holds.
local function judge_tries(self, rec, status, header, response, whole)
  local statuses, ns = split(status, {})
  local base = rec.before
  if whole and ns < base + rec.n then return ns end
  local headers, times = split(header, {}), split(response, {})
  -- the first three tries written out (a loop over a request's two tries was blacklisted:
  -- see split)
  local n = rec.n
  if n >= 1 then judge_at(self, rec[1], base + 1, statuses, headers, times) end
  if n >= 2 then judge_at(self, rec[2], base + 2, statuses, headers, times) end
  if n >= 3 then judge_at(self, rec[3], base + 3, statuses, headers, times) end
  for k = 4, n do judge_at(self, rec[k], base + k, statuses, headers, times) end
  return ns
end

-- The last per-try value of an $upstream_* list ("0.002, - : " in the balancer: the tries
-- so far, then the current one's empty entry).
local LAST = {}  -- (last_value's list: a request's balancer runs to its end before another's)
local function last_value(s)
  local t, k = split(s, LAST)
  if k == 0 then return nil end
  return t[k]
end
_M._last_value = last_value  -- for the specs

-- nginx is retrying: the previous try failed ("failed": no connection, a timeout, or a
-- status in proxy_next_upstream; "next": 403/404 with http_403/http_404). A failure is
-- reported now, not in the log phase, so that the next requests see it at once.
local function judge_previous(self, rec, state, code)
  local prev = rec[rec.n]
  if not prev or prev.done then return end
  prev.failure = state
  if state ~= "failed" then return end
  local answered = true
  if code == 502 or code == 504 or code == nil or code == 0 then
    local h = last_value(ngx.var.upstream_header_time)
    answered = h ~= nil and h ~= "-"
  end
  local class = classify(self, (code ~= 0) and code or nil, answered, state)
  if class then
    local seconds
    if prev.t0 then ngx.update_time(); seconds = ngx.now() - prev.t0 end
    failed(self, prev, class, seconds)
  end
end

-- An $upstream_* list in the balancer of another upstream's first try ("500, 500 : -"),
-- without the current try's entry: the earlier upstreams' values, or nil.
local function before_current(s)
  return s and s:match("^(.*) : [^:]*$") or nil
end

-- How many $upstream_* entries the request's earlier upstreams left before this
-- upstream's first try (r: the request, on that first try, in the balancer): none for a
-- request that was never internal (no look); for an internal one (an error_page or an
-- X-Accel-Redirect may have followed an earlier upstream; nginx keeps one bit for any
-- rewrite of the URI), counted from $upstream_status ("500, 502 : -"). (nginx's state of
-- the previous try cannot tell: between two upstreams nginx keeps an empty entry, the
-- " : ", whose status is 0 as when there is no entry at all.) A plain find and a loop of
-- bytes, which the JIT compiles (a pattern match would end the trace there).
local function earlier_entries(r)
  if internal(r) == 0 then return 0 end
  local s = ngx.var.upstream_status
  if s == nil then return 0 end
  local last, i = nil, find(s, " : ", 1, true)  -- the current try's group is after the last
  while i do last = i; i = find(s, " : ", i + 3, true) end
  if not last then return 0 end
  local n = 1  -- entries before it: one more than the ',' and ':' between them
  for j = 1, last - 1 do
    local c = byte(s, j)
    if c == 44 or c == 58 then n = n + 1 end
  end
  return n
end

-- The first try of another upstream of a request that pool `self` proxied already (an
-- internal redirect, such as an error_page, to a location of this pool or of another):
-- the tries of the earlier upstream that nothing judged yet (its last one: nginx ended
-- that upstream on it) are judged, for pool `self`, from the earlier upstreams'
-- $upstream_* values, which end with theirs.
-- (Fewer values than tries: not the lists expected, no verdict.)
-- Returns how many entries the earlier upstreams left (the new upstream's rec.before).
local function judge_earlier(self, rec)
  local var = ngx.var
  return judge_tries(self, rec, before_current(var.upstream_status), before_current(var.upstream_header_time),
    before_current(var.upstream_response_time), true)
end

-- nginx refused `peer` (set_current_peer failed with `err`): a failure of that peer, and
-- the try goes to another one. Returns the peer nginx took and its ticket, or nil and the
-- retry_after of no_peer; raises when nginx refused #peers + 1 of them. (A function of
-- its own: a loop in pool:balance() would be an inner loop of its trace, which LuaJIT
-- refuses to record.)
local function other_peer(self, rec, tried, peer, ticket, err)
  for refused = 1, self._n + 1 do
    ngx.log(ngx.WARN, "fuse.upstream: pool '", self.name, "': nginx refused peer ", peer.addr,
      " (set_current_peer: ", tostring(err), "), counted as a connect failure of its breaker")
    failed(self, { peer = peer, ticket = ticket }, "connect", nil)
    rec.refused = rec.refused or {}
    rec.refused[peer] = true
    tried = tried or {}
    tried[peer] = true
    if refused > self._n then break end
    peer, ticket = pick(self, tried)
    if not peer then return nil, ticket end
    local ok
    ok, err = set_current_peer(peer.host, peer.port)
    if ok then return peer, ticket end
  end
  error("fuse.upstream: pool '" .. self.name .. "': nginx refused every peer (set_current_peer failed)")
end

-- The peers request record `rec` tried (a retry's), as peer -> true: the first two tries
-- written out, and the refused peers only when there are some (a loop that runs once per
-- call, or a pairs() over an empty table, cannot start a trace: "leaving loop in root
-- trace"; LuaJIT blacklisted both, and then pool:balance(), on every retry).
local function tried_of(rec)
  local tried, n = {}, rec.n
  if n >= 1 then tried[rec.peer] = true end  -- (rec[1] is rec)
  if n >= 2 then tried[rec[2].peer] = true end
  for k = 3, n do tried[rec[k].peer] = true end
  if rec.refused then
    for p in pairs(rec.refused) do tried[p] = true end
  end
  return tried
end

-- pool:balance(), in balancer_by_lua*: runs once per try.
function Pool:balance()
  if not balancer then error("fuse.upstream: pool:balance() runs in nginx's balancer_by_lua*", 2) end
  local r = get_request()
  if r == nil then return get_last_failure() end  -- (raises: no request)
  -- A request with no live record is on its first try here, and nginx's state of the
  -- previous try is read only for one this pool's upstream recorded (one call into nginx
  -- less on a first try): a retry, or the first try of another upstream of the same
  -- request (an internal redirect back to a location of this pool). The first try of
  -- another upstream (that, or a redirect from another pool's location) judges what is
  -- left of the earlier upstream's tries, for its pool, and starts the record again.
  local rec, fresh, t = record(self, r)
  -- (synced before the previous try is judged: a pool another worker closed, or a peer
  -- it removed, gets no report)
  sync(self, t)
  local state, code = nil, nil  -- nil on the upstream's first try
  local before = nil  -- (known when an earlier upstream's tries were judged here)
  if not fresh then
    local earlier = rec.pool  -- (another pool's: an internal redirect from its location)
    if earlier == self and (c_last_failure == nil or c_last_failure(r, int_out, err_out) ~= 0) then
      state, code = get_last_failure()
    end
    if state == nil then
      -- (the earlier pool synced too, when it is another: closed or changed by another
      -- worker since its last call here, its tries count nothing, as in its log phase)
      if earlier ~= self then sync(earlier, t) end
      before = judge_earlier(earlier, rec)
      rec, fresh = clear(self, rec, t)
    end
  end
  if fresh then
    rec.before = before or earlier_entries(r)
    local more = self._more
    if more > 0 and (c_more_tries == nil or c_more_tries(r, more, err_out) ~= 0) then
      set_more_tries(more)
    end
  else
    judge_previous(self, rec, state, code)
  end
  local tried = nil
  if rec.n > 0 or rec.refused then tried = tried_of(rec) end  -- a retry
  if self._closed then
    ngx.log(ngx.ERR, "fuse.upstream: pool '", self.name, "' is closed (pool:close()): no peer for this request")
    return ngx.exit(ngx.ERROR)
  end
  local peer, ticket = pick(self, tried)
  if not peer then return no_peer(self, ticket) end
  local ok, err = set_current_peer(peer.host, peer.port)
  if not ok then
    peer, ticket = other_peer(self, rec, tried, peer, ticket, err)
    if not peer then return no_peer(self, ticket) end
  end
  local k = rec.n + 1
  local try = k == 1 and rec or rec[k]  -- (the first try is the record)
  if not try then try = {}; rec[k] = try end
  try.peer, try.ticket, try.done, try.failure = peer, ticket or false, false, false
  try.t0 = self._slow and ticket and ngx.now() or false
  rec.n = k
end

-- Whether this pool's responses may come from a cache: `proxy_cache_use_stale` answers a
-- failed try with an expired copy (200 STALE), so the response's status is not the
-- try's. nginx sets $upstream_cache_status for every proxied request of a location with a
-- cache (MISS, EXPIRED, BYPASS, STALE, ...). One read costs about as much as the rest of
-- the pool's work, so each worker reads it on a pool's first request and every 32nd
-- after; once it is seen, pool:log() judges every request of that pool from
-- $upstream_status (_plain false). A pool first used only by locations without a cache
-- and later by one with it is found within 32 of its requests in each worker.
local function from_cache(self)
  local n = self._looks + 1
  self._looks = n
  if band(n, 31) ~= 1 or ngx.var.upstream_cache_status == nil then return false end
  self._plain = false
  return true
end

-- The log phase's verdicts on record `rec` of pool `self` (r: the request): every try
-- of it nothing judged yet, reported to its peer's breaker with the try's upstream
-- response time (for `slow`), and the failure classes counted.
local function log_record(self, rec, r)
  if rec.n == 0 then return end
  sync(self, rec.t)  -- peers removed meanwhile (any worker) get no report
  if rec.n == 1 then  -- one try (the common case): the record itself
    if rec.done then return end
    -- A plain success of a try counted in the closed window needs no $upstream_*
    -- variable (reading one costs about as much as the rest of the pool's work): the
    -- response's status is the upstream's for a request that was never internal. After
    -- an internal redirect (an error_page, which may answer `=200` for a failed try; an
    -- X-Accel-Redirect) the response may be another location's, and nginx keeps one
    -- bit for any rewrite of the URI (try_files, `rewrite`, ngx.req.set_uri, named
    -- locations), set before the try or after it alike: every internal request is
    -- judged from $upstream_status. A probe's verdict closes or re-opens its peer:
    -- probes, and every other status, are judged from $upstream_status too.
    -- The record is taken (no longer live): nothing reads its done and ticket again, which
    -- succeeded() would set.
    -- Nor is it for a redirect an error_page to a URL answers with (see not_plain), or
    -- for a stale copy a cache answers with after a failed try (see from_cache).
    local plain = self._plain  -- (not_plain's array when there is no `slow` rule, else false)
    if plain then
      local s, t = resp_status(r), rec.ticket
      if s >= 100 and s < 499 and not plain[s] and (not t or floor(t / 2) % 2 == 1)
          and internal(r) == 0 and not from_cache(self) then
        local peer = rec.peer
        if t then peer.report(peer.b, t, not peer.removed or nil, nil) end  -- (removed: see failed)
        return
      end
    end
  end
  local fail, slow = self._fail, self._slow
  local var = ngx.var
  local status = var.upstream_status
  if rec.n == 1 then  -- one try, one upstream: no list to split
    local try = rec
    local code = tonumber(status)
    if code ~= nil then  -- a list ("502, 200") is no number
      if not try.ticket and not fail[code] and code ~= 502 and code ~= 504 then return end
      local header = (code == 502 or code == 504) and var.upstream_header_time or "0"
      local seconds = slow and tonumber(var.upstream_response_time) or nil
      return judge(self, try, code, header, seconds)
    end
  end
  judge_tries(self, rec, status, var.upstream_header_time, var.upstream_response_time)
end

-- pool:log(), in log_by_lua*: the verdicts on this request's tries in this pool's
-- upstream (nothing for a request another pool proxied last). The pool judged is the
-- one take() found, which is self for a pool: pool.log() (self nil) is upstream.log(),
-- where it raised an index error into this file once the record was taken, leaving its
-- tickets unreported. (No check of self here: this runs on every request.)
function Pool:log()
  local rec, r, pool = take(self)
  if rec then return log_record(pool, rec, r) end
end

-- upstream.log(), in log_by_lua*: the same for whichever pool proxied this request last,
-- so that one line in `http {}` or `server {}` serves every pool (a request no pool
-- proxied costs one look-up).
function _M.log()
  local rec, r, pool = take(false)
  if rec then return log_record(pool, rec, r) end
end

---------------------------------------------------------------------------- metrics

-- A label value: the label() of fuse.metrics' breaker names (UTF-8, with \, " and \n
-- escaped), so that a pool's series and its peers' fuse_state{name="<pool>/<peer>"} agree.
local label = require("fuse.metrics").label
local FAILS_LINE = 'fuse_upstream_failures_total{pool="%s",peer="%s",class="%s"} %.17g\n'
local CHECKS_LINE = 'fuse_upstream_checks_total{pool="%s",peer="%s",result="%s"} %.17g\n'

-- upstream.metrics(): the pools' counters in Prometheus text (fuse.metrics() appends it):
-- fuse_upstream_panic_total{pool}, fuse_upstream_dry_run_picks_total{pool},
-- fuse_upstream_failures_total{pool, peer, class}, fuse_upstream_checks_total{pool, peer, result}.
function _M.metrics()
  local panic, dry, fails, checks = {}, {}, {}, {}
  for _, store in pairs(STORES) do
    local keys = store:get_keys(0)
    sort(keys)
    for _, k in ipairs(keys) do
      local kind, rest = k:match("^(%a)/(.+)$")
      if kind == "p" or kind == "d" or kind == "c" or kind == "k" then
        local v = store:get(k)
        if type(v) == "number" then
          if kind == "p" then
            panic[#panic + 1] = fmt('fuse_upstream_panic_total{pool="%s"} %.17g\n', label(rest), v)
          elseif kind == "d" then
            dry[#dry + 1] = fmt('fuse_upstream_dry_run_picks_total{pool="%s"} %.17g\n', label(rest), v)
          else  -- per peer: "c/<pool>/<peer>/<class>", "k/<pool>/<peer>/<result>"
            local pool, peer, what = rest:match("^(.+)/([^/]+)/(%a+)$")
            if pool then
              local out = kind == "c" and fails or checks
              out[#out + 1] = fmt(kind == "c" and FAILS_LINE or CHECKS_LINE, label(pool), label(peer), what, v)
            end
          end
        end
      end
    end
  end
  local out = {}
  if #panic > 0 then
    out[#out + 1] = "# HELP fuse_upstream_panic_total Open peers picked because max_ejected was reached.\n"
      .. "# TYPE fuse_upstream_panic_total counter\n" .. concat(panic)
  end
  if #dry > 0 then
    out[#out + 1] = "# HELP fuse_upstream_dry_run_picks_total Picks of peers their breaker rejected, "
      .. "made because enforce = false.\n# TYPE fuse_upstream_dry_run_picks_total counter\n" .. concat(dry)
  end
  if #fails > 0 then
    out[#out + 1] = "# HELP fuse_upstream_failures_total Failed tries per peer, by class "
      .. "(connect, timeout, status).\n# TYPE fuse_upstream_failures_total counter\n" .. concat(fails)
  end
  if #checks > 0 then
    out[#out + 1] = "# HELP fuse_upstream_checks_total Checks of open peers (option check), by result "
      .. "(healthy, unhealthy).\n# TYPE fuse_upstream_checks_total counter\n" .. concat(checks)
  end
  return concat(out)
end

return _M
