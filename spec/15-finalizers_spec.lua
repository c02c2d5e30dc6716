-- Breakers stay usable from finalizers: an object whose __gc makes a guarded call, and
-- a wrapper or rejection that a finalizer resurrects, work as they do while reachable,
-- on every backend. (Lua 5.4 finalizes a breaker's handle in the same cycle as the
-- objects that reach it, and in any order.)
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

-- An object whose finalizer is fn: a userdata from newproxy (LuaJIT, 5.1), else a
-- table with __gc (5.2+).
local newproxy = rawget(_G, "newproxy")
local function with_gc(fn)
  if newproxy then
    local p = newproxy(true)
    getmetatable(p).__gc = fn
    return p
  end
  return setmetatable({}, { __gc = fn })
end

local function full_gc()
  for _ = 1, 4 do collectgarbage("collect") end
end

describe("fuse #" .. BACKEND, function()
  support.it_runs_on_backend()

  describe("breakers reached from finalizers", function()
    -- Each test builds its objects in a function, so that no local of the test keeps
    -- them; the finalizing object is made before the breaker (finalized after it).

    it("an object whose __gc makes a guarded call gets the call's result", function()
      local got = {}
      local function build()
        local box = {}
        local obj = with_gc(function()
          got[#got + 1] = { pcall(box.f, 21) }
        end)
        box.f = fuse.wrap(function(x) return x * 2 end, { fails = 1 })
        box.obj = obj
      end
      for _ = 1, 20 do build() end
      full_gc()
      assert.equal(20, #got)
      for _, r in ipairs(got) do
        assert.is_true(r[1], tostring(r[2]))
        assert.equal(42, r[2])
      end
    end)

    it("a wrapper and its breaker resurrected by a finalizer keep working", function()
      local keep = {}
      local function build()
        local box = {}
        local obj = with_gc(function() keep[#keep + 1] = box end)
        box.f, box.b = fuse.wrap(function() return "x" end, { fails = 2 })
        box.obj = obj
      end
      for _ = 1, 10 do build() end
      full_gc()
      assert.equal(10, #keep)
      for round = 1, 3 do
        for _, box in ipairs(keep) do
          local ok, r = pcall(box.f)
          assert.is_true(ok, tostring(r))
          assert.equal("x", r)
          assert.equal("closed", box.b:state())
          assert.equal(round, box.b:stats().successes_total)
        end
        full_gc()
      end
    end)

    it("a rejection resurrected by a finalizer still reads retry_after", function()
      local clock = 1000
      fuse.clock(function() return clock end)
      local keep = {}
      local function build()
        local box = {}
        local obj = with_gc(function() keep[#keep + 1] = box.rej end)
        local b = fuse.new{ fails = 1, open_for = 30 }
        b:call(function() return nil, "down" end)
        local _, rej = b:allow()
        box.rej, box.obj = rej, obj
      end
      for _ = 1, 10 do build() end
      full_gc()
      local results = {}
      for _, rej in ipairs(keep) do results[#results + 1] = { pcall(function() return rej.retry_after end) } end
      clock = 1010
      full_gc()
      for _, rej in ipairs(keep) do results[#results + 1] = { pcall(function() return rej.retry_after end) } end
      fuse.clock()
      assert.equal(20, #results)
      for i, r in ipairs(results) do
        assert.is_true(r[1], tostring(r[2]))
        assert.near(i <= 10 and 30 or 20, r[2], 1e-6)
      end
    end)

    it("a breaker dropped for good is collected, and nothing breaks", function()
      local gone = 0
      for _ = 1, 200 do
        local f = fuse.wrap(function() return 1 end, { fails = 1 })
        f()
        with_gc(function() gone = gone + 1 end)
      end
      full_gc()
      assert.equal(200, gone)
      assert.equal(1, fuse.wrap(function() return 1 end, { fails = 1 })())
    end)
  end)
end)
