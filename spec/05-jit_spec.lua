-- The hot path stays compiled: loops of guarded calls record traces and never abort,
-- wherever a trace starts (spec/jit_support.lua). Trace events come from
-- jit.attach(cb, "trace"); aborts are printed with their reason. A process that lives
-- long, with interpreted callers and many call sites: spec/12-longlived_spec.lua.
local fuse = require "fuse"
local support = require "spec.support"

local has_jit = type(jit) == "table" and type(jit.attach) == "function"
local jit_support = has_jit and require "spec.jit_support"
local traced = has_jit and jit_support.traced
local assert_compiled = has_jit and jit_support.assert_compiled
local N = has_jit and jit_support.N or 20000

local function add(a, b) return a + b end
local function failing() return nil, "boom" end

-- Only the ffi backend (LuaJIT) has a JIT: the run of another backend lists these specs
-- as pending instead of leaving them out.
if support.ffi_only("the JIT specs") then return end

describe("fuse #ffi", function()
  support.fake_clock(1000)

  support.it_runs_on_backend()  -- "ffi": the other backends return above

  if not has_jit then
    pending("not running under LuaJIT: no JIT to check")
    return
  end

  local W = 20  -- the warm-up runs of traced()

  it("a wrapped call in the closed state stays compiled (fake clock)", function()
    local f, b = fuse.wrap(add, { fails = 5 })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert.equal("closed", b:state())
    assert_compiled(ev)
  end)

  it("a wrapped call in the closed state stays compiled (real clock)", function()
    fuse.clock()
    local f, b = fuse.wrap(add, { fails = 5, window = 10 })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert_compiled(ev)
  end)

  it("a named wrap with a fallback stays compiled in the closed state", function()
    local f, b = fuse.wrap(add, { name = "s05-closed-named", fails = 5,
      fallback = function() return 0 end })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert_compiled(ev)
  end)

  it("a wrap with max_concurrent stays compiled: its permits taken and given in the trace", function()
    local f, b = fuse.wrap(add, { name = "s05-limited", fails = 5, max_concurrent = 3,
      fallback = function() return 0 end })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    local s = b:stats()
    assert.equal(N + W, s.successes_total)
    assert.equal(0, s.running)
    assert.equal(0, s.full_total)
    assert_compiled(ev)
  end)

  it("a call past max_concurrent stays compiled too (the fallback's answer)", function()
    local b = fuse.new({ fails = 5, max_concurrent = 1 })
    local f = b:wrap(add, 0)
    local held = b:allow()
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(0, sum)
    assert.equal(N + W, b:stats().full_total)
    b:report(held, true)
    assert_compiled(ev)
  end)

  it("a wrap with four arguments and a fallback stays compiled", function()
    local function add4(a, b, c, d) return a + b + c + d end
    local f, b = fuse.wrap(add4, { fails = 5, fallback = function() return 0 end })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1, 0, 0) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert_compiled(ev)
  end)

  -- eight is the documented limit: a ninth argument makes the wrapper keep them in a table
  it("a wrap with eight arguments and a fallback stays compiled", function()
    local function add8(a, b, c, d, e, f, g, h) return a + b + c + d + e + f + g + h end
    local f, b = fuse.wrap(add8, { fails = 5, fallback = function() return 0 end })
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1, 0, 0, 0, 0, 0, 0) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert_compiled(ev)
  end)

  it("b:call in the closed state stays compiled", function()
    local b = fuse.new { fails = 5 }
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + b:call(add, i, 1) end
    end)
    assert.equal(N * (N + 1) / 2 + N, sum)
    assert.equal(N + W, b:stats().successes_total)
    assert_compiled(ev)
  end)

  it("rejections in the open state stay compiled (no fallback)", function()
    local f, b = fuse.wrap(failing, { fails = 1, open_for = 1000 })
    f()
    assert.equal("open", b:state())
    local rejected
    local ev = traced(function(n)
      rejected = 0
      for i = 1, n do
        local r, rej = f(i)
        if r == nil and rej ~= nil and rej ~= "boom" then rejected = rejected + 1 end
      end
    end)
    assert.equal(N, rejected)
    assert.equal(N + W, b:stats().rejections_total)
    assert.equal("open", b:state())
    assert_compiled(ev)
  end)

  it("rejections in the open state stay compiled (with a fallback)", function()
    local f, b = fuse.wrap(failing, { fails = 1, open_for = 1000,
      fallback = function(_, x) return x end })
    f(0)
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i) end
    end)
    assert.equal(N * (N + 1) / 2, sum)
    assert.equal(N + W, b:stats().rejections_total)
    assert_compiled(ev)
  end)

  -- forced_open rejections take a path of their own (in the core and in the wrapper)
  it("rejections in the forced_open state stay compiled (no fallback)", function()
    local f, b = fuse.wrap(add, { fails = 5 })
    b:force_open()
    local rejected
    local ev = traced(function(n)
      rejected = 0
      for i = 1, n do
        local r, rej = f(i, 1)
        if r == nil and fuse.is_rejection(rej) and rej.state == "forced_open" then rejected = rejected + 1 end
      end
    end)
    assert.equal(N, rejected)
    assert.equal(N + W, b:stats().rejections_total)
    assert.equal("forced_open", b:state())
    assert_compiled(ev)
  end)

  it("rejections in the forced_open state stay compiled (with a fallback)", function()
    local f, b = fuse.wrap(add, { fails = 5, fallback = function(rej, x)
      return rej.state == "forced_open" and x or -1e9
    end })
    b:force_open()
    local sum
    local ev = traced(function(n)
      sum = 0
      for i = 1, n do sum = sum + f(i, 1) end
    end)
    assert.equal(N * (N + 1) / 2, sum)
    assert.equal(N + W, b:stats().rejections_total)
    assert.equal(0, b:stats().successes_total)
    assert_compiled(ev)
  end)

  it("allow/report stays compiled", function()
    local b = fuse.new { fails = 5 }
    local ev = traced(function(n)
      for _ = 1, n do
        local t = b:allow()
        b:report(t, true)
      end
    end)
    local s = b:stats()
    assert.equal(N + W, s.successes_total)
    assert.equal("closed", s.state)
    assert_compiled(ev)
  end)

  it("allow/report with a measured duration stays compiled", function()
    local b = fuse.new { slow = 1, slow_rate = 1, min_calls = 10 }
    local ev = traced(function(n)
      for _ = 1, n do
        local t = b:allow()
        b:report(t, true, 0.001)
      end
    end)
    local s = b:stats()
    assert.equal(N + W, s.successes_total)
    assert.equal(0, s.slow_total)
    assert_compiled(ev)
  end)

  it("the harness sees aborts (self-check)", function()
    -- closures created and resumed as coroutines in a loop do not compile cleanly
    local ev = traced(function(n)
      local s = 0
      for i = 1, n / 10 do
        local co = coroutine.wrap(function() return i end)
        s = s + co()
      end
      return s
    end)
    assert.is_true(#ev.aborts > 0, "expected at least one abort")
  end)
end)
