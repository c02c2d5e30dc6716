-- No allocation per call: the guarded call, the rejection and the two-step form leave
-- the Lua heap where it was (DESIGN.md, "Hot path"). One allocation of 16 bytes a call
-- would show as 3 MB over 200000 calls; the bound below allows trace bookkeeping only.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local CALLS = 200000
local BOUND_KB = 64

-- KB the heap grew by over CALLS calls of fn, with the collector stopped
local function growth(fn)
  for i = 1, 1000 do fn(i) end  -- warm up (and let the JIT compile)
  collectgarbage()
  collectgarbage("stop")
  local before = collectgarbage("count")
  for i = 1, CALLS do fn(i) end
  local grew = collectgarbage("count") - before
  collectgarbage("restart")
  return grew
end

describe("fuse #" .. BACKEND, function()
  support.it_runs_on_backend()

  local function add(a, b) return a + b end

  it("allocates nothing per call in the closed state", function()
    local f = fuse.wrap(add, { fails = 5 })
    local kb = growth(function(i) return f(i, 1) end)
    assert.is_true(kb < BOUND_KB, ("the heap grew by %.1f KB"):format(kb))
  end)

  it("allocates nothing per call with a fallback function", function()
    local f = fuse.wrap(add, { fails = 5, fallback = function() return 0 end })
    local kb = growth(function(i) return f(i, 1, 2, 3) end)
    assert.is_true(kb < BOUND_KB, ("the heap grew by %.1f KB"):format(kb))
  end)

  it("allocates nothing per rejection", function()
    local f, b = fuse.wrap(function() return nil, "down" end, { fails = 1, open_for = 86400 })
    f()
    assert.equal("open", b:state())
    local kb = growth(function(i) return f(i) end)
    assert.is_true(kb < BOUND_KB, ("the heap grew by %.1f KB"):format(kb))
    assert.is_true(b:stats().rejections_total >= CALLS)
  end)

  it("allocates nothing per allow/report", function()
    local b = fuse.new { fails = 5 }
    local kb = growth(function() b:report(b:allow(), true) end)
    assert.is_true(kb < BOUND_KB, ("the heap grew by %.1f KB"):format(kb))
  end)
end)
