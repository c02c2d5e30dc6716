-- Seams between the registry (stale handles, slot reuse), the core's ticket checks and
-- the allow ledger, timed force-open and the Lua facade: cases no single feature's spec
-- covers (integration review after issues 7-11).
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unique = support.unique_names("s16")

-- Runs `body` in a fresh process with fuse loaded; returns what it printed.
local function run_child(body)
  return support.run_child((body:find("^local B") and "local fuse\n" or 'local fuse = require "fuse"\n') .. body)
end

describe("seams #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1)
  support.it_runs_on_backend()

  describe("an allow ticket taken before a removal, reported after the name is back", function()
    it("counts nothing and is not refused when the object found its name again meanwhile", function()
      local name = unique("refound")
      local b = fuse.new{ name = name, fails = 1 }
      local t = assert(b:allow())
      fuse.remove(name)
      assert.equal("closed", b:state())  -- finds its name again: a fresh breaker
      b:report(t, false)                 -- the old breaker's ticket: stale there, no error
      assert.equal("closed", b:state())
      assert.equal(0, b:stats().failures_total)
      assert.has_error(function() b:report(t, false) end)  -- still only once
    end)

    it("counts nothing and is not refused when another object re-created the name", function()
      local name = unique("recreated")
      local b = fuse.new{ name = name, fails = 1 }
      local t = assert(b:allow())
      fuse.remove(name)
      local other = fuse.new{ name = name, fails = 1 }
      b:report(t, false)
      assert.equal("closed", other:state())
      assert.equal(0, other:stats().failures_total)
    end)

    it("counts nothing and is not refused when another name took its slot", function()
      -- one slot: the second name must take the first one's
      local out = run_child([[
fuse.init{ capacity = 1 }
local b = fuse.new{ name = "first", fails = 1 }
local t = assert(b:allow())
fuse.remove("first")
local other = fuse.new{ name = "second", fails = 1 }
local ok, err = pcall(b.report, b, t, false)
print(ok, err, other:stats().failures_total, other:state())
]])
      assert.equal("true\tnil\t0\tclosed\n", out)
    end)

    it("still refuses another live breaker's ticket", function()
      local name = unique("moved")
      local b = fuse.new{ name = name, fails = 1 }
      local c = fuse.new{ fails = 1 }
      fuse.remove(name)
      b:state()
      local t = assert(c:allow())
      assert.has_error(function() b:report(t, false) end)
      c:report(t, true)
      assert.equal(1, c:stats().successes_total)
    end)
  end)

  describe("b:allow whose breaker is removed again right after it found its name again", function()
    it("finds it again, and answers a ticket, not nil, nil", function()
      -- the core answers FZ_STALE to the first two allows: a removal in another worker
      -- between the re-find and the allow (a proxy in front of the backend's core)
      local out = run_child([[
local B = jit and require("fuse.ffi") or require("fuse.core")
local real = B.lib or { fz_allow_id = B.allow }
local stale = 2
local proxy = setmetatable({}, { __index = function(_, k)
  if k == "fz_allow_id" then
    return function(h, id)
      if stale > 0 then stale = stale - 1; return -(1 + 7 * 4) end
      return real.fz_allow_id(h, id)
    end
  end
  return B.lib and B.lib[k]
end })
if B.lib then B.lib = proxy else B.allow = proxy.fz_allow_id end
fuse = package.loaded.fuse or require "fuse"
local b = fuse.new{ name = "again", fails = 1 }
local t, rej = b:allow()
print(type(t), type(rej), stale)
]])
      assert.equal("number\tnil\t0\n", out)
    end)
  end)

  describe("a breaker retired whose remover died before dropping it (identity unchanged)", function()
    -- The core answers FZ_STALE while the breaker looks retired; only the registry's lock
    -- (B.open) repairs it. A proxy in front of the backend's core stands for the dead
    -- remover; after 1000 stale answers it gives up (the old code spun for ever).
    local PROXY = [[
local B = jit and require("fuse.ffi") or require("fuse.core")
local retired, answers = false, 0
local function stale_or(f)
  return function(h, id)
    if retired then
      answers = answers + 1
      if answers < 1000 then return -(1 + 7 * 4) end
      retired = false
    end
    return f(h, id)
  end
end
local lib = B.lib or { fz_enter_id = B.enter, fz_allow_id = B.allow }
local enter, allow = stale_or(lib.fz_enter_id), stale_or(lib.fz_allow_id)
local open = B.open
B.open = function(...) retired = false; return open(...) end  -- the lock repairs
if B.lib then
  local real = B.lib
  B.lib = setmetatable({ fz_enter_id = enter, fz_allow_id = allow }, { __index = real })
else
  B.enter, B.allow = enter, allow
end
fuse = require "fuse"
local function retire() retired, answers = true, 0 end
]]

    it("a guarded call takes the registry's lock, and does not spin on the stale handle", function()
      local out = run_child(PROXY .. [[
local g = fuse.wrap(function(x) return x end, { name = "dead-remover", fails = 1 })
g(1)
retire()
print(g(2), answers)
]])
      assert.equal("2\t1\n", out)
    end)

    it("b:allow takes the registry's lock, and does not spin on the stale handle", function()
      local out = run_child(PROXY .. [[
local b = fuse.new{ name = "dead-remover", fails = 1 }
retire()
local t = b:allow()
print(type(t), answers)
]])
      assert.equal("number\t1\n", out)
    end)
  end)

  describe("state, stats and metrics of a breaker retired whose identity did not move yet", function()
    it("show a fresh breaker's state, never the state 'removed', and create nothing", function()
      -- B.state/B.stats/B.peek answer FZ_REMOVED (5) for the first handle while it looks
      -- retired; a read looks the name up (B.find) but never opens it (B.open: creation)
      local out = run_child([[
local B = jit and require("fuse.ffi") or require("fuse.core")
fuse = require "fuse"
local b = fuse.new{ name = "retired", fails = 1 }
local first, retired = b._h, true
local function same(h) return B.id(h) == B.id(first) and B.name_of(h) == "retired" end
local open, state, stats, peek = B.open, B.state, B.stats, B.peek
B.open = function(...) retired = false; return open(...) end
B.state = function(h) if retired and same(h) then return 5 end return state(h) end
B.stats = function(h, s) local c = stats(h, s); if retired and same(h) then s.state = 5 end return c end
B.peek = function(h, s) peek(h, s); if retired and same(h) then s.state = 5 end end
print(fuse.metrics():find('fuse_state{name="retired"} 5', 1, true) == nil)
print(b:state(), retired)
retired = true
print(b:stats().state, retired)
]])
      assert.equal("true\nclosed\ttrue\nclosed\ttrue\n", out)
    end)
  end)

  -- A child's registry of a, b, d with a free slot after b, and remake_a(): what another
  -- worker does while this one walks the slots (removes "a", makes it in that slot).
  local REMADE = [[
local B = jit and require("fuse.ffi") or require("fuse.core")
fuse = require "fuse"
fuse.init{ capacity = 4 }
for _, n in ipairs{ "a", "b", "x", "d" } do fuse.new{ name = n, fails = 1 } end
fuse.remove("x")  -- a free slot after "b"
local function remake_a()
  fuse.remove("a")
  fuse.new{ name = "a", fails = 1 }  -- in the free slot
end
]]

  describe("fuse.metrics", function()
    it("has one series per name when a name is removed and made again in a later slot meanwhile", function()
      -- another worker does it while this one walks the slots: here, while it reads "b"
      local out = run_child(REMADE .. [[
local peek, done = B.peek, false
B.peek = function(h, s)
  if not done and B.name_of(h) == "b" then
    done = true
    remake_a()
  end
  return peek(h, s)
end
local m = fuse.metrics()
local n = 0
for _ in m:gmatch('fuse_state{name="a"}') do n = n + 1 end
print(done, n)
]])
      assert.equal("true\t1\n", out)
    end)
  end)

  describe("fuse.list", function()
    it("lists a name once when it is removed and made again in a later slot meanwhile", function()
      -- as for fuse.metrics above: another worker does it while this one reads "b"
      local out = run_child(REMADE .. [[
local name_of, done = B.name_of, false
B.name_of = function(h)
  local name = name_of(h)
  if not done and name == "b" then
    done = true
    remake_a()
  end
  return name
end
local list = fuse.list()
table.sort(list)
print(done, table.concat(list, " "))
]])
      assert.equal("true\ta b d\n", out)
    end)
  end)

  it("keeps the fake clock honest", function() assert.is_number(clock.now) end)
end)
