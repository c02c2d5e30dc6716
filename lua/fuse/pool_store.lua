-- fuse.pool_store: where fuse.upstream keeps what every nginx worker must see alike beyond
-- the breakers (the peer lists and their versions, slow-start ramps, the panic, dry-run
-- and failure-class counters): a lua_shared_dict the user declares (pool option `dict`,
-- default "fuse_upstream"), or outside nginx one table of this Lua state; its keys, and
-- the counters made in it only while the pool or peer they count is still wanted.
local raise = require("fuse.pool_config").raise

local pairs = pairs
local fmt = string.format

local M = {}

-- Outside nginx: one table per Lua state stands in for the shared dict.
local function local_store()
  local t = {}
  return {
    get = function(_, k) return t[k] end,
    set = function(_, k, v) t[k] = v; return true end,
    safe_set = function(_, k, v) t[k] = v; return true end,
    safe_add = function(_, k, v)
      if t[k] ~= nil then return false, "exists" end
      t[k] = v
      return true
    end,
    delete = function(_, k) t[k] = nil end,
    -- (as nginx's: without an init value, a missing key is not made)
    incr = function(_, k, n, init)
      local v = t[k] or init
      if v == nil then return nil, "not found" end
      v = v + n
      t[k] = v
      return v
    end,
    get_keys = function()
      local out = {}
      for k in pairs(t) do out[#out + 1] = k end
      return out
    end,
  }
end

local LOCAL
local STORES = {}  -- dict name -> store, for metrics()

local function store_for(name, level)
  local s = STORES[name]
  if s then return s end
  local ngx = rawget(_G, "ngx")
  if ngx and ngx.shared then
    s = ngx.shared[name]
    if not s then
      raise(fmt("lua_shared_dict '%s' is not declared: add `lua_shared_dict %s 1m;` to http {} "
        .. "(it holds the peer lists, slow-start ramps and counters every worker shares; "
        .. "option 'dict' names another)", name, name), level + 1)
    end
  else
    LOCAL = LOCAL or local_store()
    s = LOCAL
  end
  STORES[name] = s
  return s
end

-- Keys: g/P the pool's incarnation (below), v/P version, l/P stored list, b/P the config
-- list it was set over, p/P panic picks, d/P dry-run picks of rejected peers, r/P/ADDR
-- slow-start start, c/P/ADDR/CLASS failures. Pool names hold no '/', addresses neither.
--
-- An incarnation is the life of a name from the upstream.new that found none to its
-- pool:close(). Every copy of the pool (one per worker, and those a reload makes) holds
-- the token in g/P it found or made; close() deletes every key of the name, g/P first,
-- so a copy that syncs afterwards finds no token, or another one (an upstream.new of the
-- name since), and is closed: it never takes the new pool's list, and a closed name
-- leaves nothing in the dict.

-- One more on counter `key`; its new value, or nil. A counter is made only where the
-- dict has room (safe_add): nginx's incr with an init value, like set, makes room by
-- evicting the least recently used keys, and those are the stored peer lists, read only
-- when a version moves. A counter that finds no room is not counted. ("exists": another
-- worker made it between the two calls.) A second value, true, says this call made it.
local function bump(store, key)
  local v = store:incr(key, 1)
  if v then return v end
  local ok, err = store:safe_add(key, 1)
  if ok then return 1, true end
  if err == "exists" then return store:incr(key, 1) end
  return nil
end

-- Whether a key or breaker of pool incarnation `gen` (g/P is `gkey`, l/P `lkey`) for peer
-- `addr` (nil: of the pool itself) is still wanted: its incarnation is open and its list
-- holds the peer (a list not stored, as when a full dict evicted it: any peer), or the
-- name's next incarnation holds the peer in the list it stored (then the key is its). A
-- copy that acted on a peer after its sync (a pick's breaker call, a try's counter) made
-- the name again after another worker's close or set_peers removed it: what it made is
-- not wanted, and goes (see refind, count, counted).
local function wanted(store, gkey, lkey, gen, addr)
  local g = store:get(gkey)
  if g == nil then return false end
  if addr == nil then return true end
  local s = store:get(lkey)
  if s == nil then return g == gen end
  return (("\n" .. s):find("\n" .. addr .. " ", 1, true)) ~= nil
end

-- One more on the pool's own counter `key` (d/P, p/P); made, it goes again when the pool
-- was closed meanwhile (after this copy's sync) and no next pool of the name holds it.
local function count(self, key)
  local store = self._store
  local _, made = bump(store, key)
  if made and not wanted(store, self._gkey, self._lkey, self._gen, nil) then store:delete(key) end
end

-- One more on peer `peer`'s counter `key` (c/P/ADDR/CLASS), the same way: made, it goes
-- again when the peer left meanwhile (close or set_peers in another worker).
local function counted(self, peer, key)
  local store = self._store
  local _, made = bump(store, key)
  if made and not wanted(store, self._gkey, self._lkey, self._gen, peer.addr) then store:delete(key) end
end

M.local_store, M.STORES, M.store_for, M.bump, M.wanted, M.count, M.counted =
  local_store, STORES, store_for, bump, wanted, count, counted
return M
