-- The objects of named breakers at gateway scale (DESIGN.md, "Gateway scale"): a name
-- looked up again gives its object again, however many names there are, without
-- allocating; the objects kept stay bounded by the registry's capacity when names come
-- and go; an object never outlives its breaker in the lookups. What needs many names
-- runs in a process of its own (a registry sized for it).
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unique = support.unique_names("s18")

-- 5,000 names: more than the 2 x 1024 recent names the facade used to keep objects
-- for. grew(fn): KB the Lua heap grew by while fn ran, with the collector stopped.
local MANY = [[
local fuse = require "fuse"
fuse.init{ capacity = 8192 }
local names = {}
for i = 1, 5000 do
  names[i] = "many-" .. i
  fuse.new{ name = names[i], fails = 5 }
end
local function grew(fn)
  collectgarbage()
  collectgarbage("stop")
  local before = collectgarbage("count")
  fn()
  local kb = collectgarbage("count") - before
  collectgarbage("restart")
  return ("%.0f"):format(kb)
end
]]

-- The numbers a child printed, one a line.
local function numbers(out)
  local list = {}
  for line in out:gmatch("[^\n]+") do
    local n = tonumber(line)
    assert(n, out)
    list[#list + 1] = n
  end
  return list
end

local BOUND_KB = 64

describe("objects of named breakers #" .. BACKEND, function()
  support.it_runs_on_backend()

  it("fuse.get of any of 5,000 names gives its object again, and allocates nothing", function()
    local kb = numbers(support.run_child(MANY .. [[
local first = {}
for i, n in ipairs(names) do first[i] = assert(fuse.get(n)) end
for _ = 1, 2 do  -- twice: the second pass is the steady state
  print(grew(function()
    for i, n in ipairs(names) do assert(rawequal(first[i], fuse.get(n)), n) end
  end))
end
]]))
    assert.equal(2, #kb)
    for _, k in ipairs(kb) do assert.is_true(k < BOUND_KB, ("the heap grew by %d KB"):format(k)) end
  end)

  it("fuse.new of any of 5,000 names with the options that made them gives that object, "
    .. "and allocates nothing but its options", function()
    local kb = numbers(support.run_child(MANY .. [[
local first = {}
for i, n in ipairs(names) do first[i] = fuse.new{ name = n, fails = 5 } end
local opts = { fails = 5 }
for _ = 1, 2 do
  print(grew(function()
    for i, n in ipairs(names) do
      opts.name = n
      assert(rawequal(first[i], fuse.new(opts)), n)
    end
  end))
end
]]))
    assert.equal(2, #kb)
    for _, k in ipairs(kb) do assert.is_true(k < BOUND_KB, ("the heap grew by %d KB"):format(k)) end
  end)

  it("a guarded call through each of 5,000 objects makes no closure: the objects of one set of options "
    .. "share their call path", function()
    local kb = numbers(support.run_child(MANY .. [[
local objs = {}
for i, n in ipairs(names) do objs[i] = fuse.new{ name = n, fails = 5 } end
local function ok() return true end
print(grew(function()
  for _, b in ipairs(objs) do assert(b:call(ok)) end
end))
]]))
    -- (one closure and its upvalues per object, as before, would be 200 KB and more)
    assert.equal(1, #kb)
    assert.is_true(kb[1] < BOUND_KB, ("the heap grew by %d KB"):format(kb[1]))
  end)

  it("other options make another object; the same options give it again", function()
    local name = unique("opts")
    local b0 = fuse.new{ name = name, fails = 5 }
    local fb = function() return "fb" end
    local b = fuse.new{ name = name, fails = 5, fallback = fb }
    assert.is_false(rawequal(b0, b))
    assert.is_true(rawequal(b, fuse.new{ name = name, fails = 5, fallback = fb }))
    assert.is_false(rawequal(b, fuse.new{ name = name, fails = 5, fallback = fb, window = 10 }))
    assert.equal("fb", b:call(function() error("down") end))
  end)

  -- The hit path compares the known options only (so that the JIT can sink the caller's
  -- table); one hit in 61 also counts the keys. So an unknown key at a call site whose
  -- names all exist already is raised within 61 calls, even when another site's calls
  -- come between each of its own.
  it("an unknown option for a name whose object exists is raised within 61 calls, at the caller's line",
    function()
      local name = unique("typo")
      fuse.new{ name = name, fails = 5 }
      for _, others in ipairs{ 0, 1, 2 } do  -- calls of a good site between the bad one's
        local err, calls
        for i = 1, 61 do
          for _ = 1, others do fuse.new{ name = name, fails = 5 } end
          local ok, e = pcall(function()
            local b = fuse.new{ name = name, fails = 5, fial = 1 }  -- (not a tail call: its line)
            return b
          end)
          if not ok then err, calls = e, i break end
        end
        assert.is_string(err, ("%d calls with another site's %d between each: no error"):format(61, others))
        assert.matches("unknown option 'fial'", err, 1, true)
        assert.matches("22%-objects_spec%.lua:%d+: fuse:", err)
        assert.is_true(calls <= 61)
      end
      -- and at once where the call makes the name
      local ok, err = pcall(fuse.new, { name = unique("typo"), fails = 5, fial = 1 })
      assert.is_false(ok)
      assert.matches("unknown option 'fial'", err, 1, true)
    end)

  it("fuse.new{ name = n, ... } of existing names in a compiled loop makes no table per call"
    .. (jit and "" or " (skipped: not LuaJIT)"), function()
    if not jit then return end
    local kb = numbers(support.run_child(MANY .. [[
local first = {}
for i, n in ipairs(names) do first[i] = fuse.new{ name = n, fails = 5, window = 10 } end
local function pass()
  for i = 1, #names do
    assert(rawequal(first[i], fuse.new{ name = names[i], fails = 5, window = 10 }))
  end
end
pass()  -- compiled here
for _ = 1, 2 do print(grew(function() for _ = 1, 4 do pass() end end)) end
]]))
    -- 20,000 calls: a table each (80 bytes and more) would be 1.5 MB and more; one in 61
    -- is made, for its keys' count
    assert.equal(2, #kb)
    for _, k in ipairs(kb) do
      assert.is_true(k < BOUND_KB, ("the heap grew by %d KB: the options tables were made"):format(k))
    end
  end)

  it("a removed name's object is not given again, and its name made again gets another", function()
    local name = unique("again")
    local b, g = fuse.new{ name = name, fails = 5 }, fuse.get(name)
    assert.is_true(fuse.remove(name))
    assert.is_nil(fuse.get(name))
    local b2 = fuse.new{ name = name, fails = 5 }
    assert.is_false(rawequal(b, b2))
    local g2 = fuse.get(name)
    assert.is_false(rawequal(g, g2))
    assert.equal("closed", g2:state())
    support.fail(b2, 1)
    assert.equal(1, g2:stats().failures)
  end)

  -- Gateways look names up from request handlers, which often run interpreted: LuaJIT
  -- then starts traces at fuse.get's and fuse.new's entries, and blacklists one whose
  -- traces keep aborting (spec/12-longlived_spec.lua for the guarded call).
  it("no function of fuse is blacklisted after 100,000 lookups of each kind from interpreted code"
    .. (jit and "" or " (skipped: not LuaJIT)"), function()
    if not (jit and jit.attach) then return end
    local jit_support = require "spec.jit_support"
    local names = {}
    for i = 1, 3000 do  -- more than fit the JIT's guess of a few hot keys
      names[i] = unique("jit")
      fuse.new{ name = names[i], fails = 5 }
      if i % 1000 == 0 then fuse.remove(names[i]) end  -- misses and re-creations too
    end
    local fb = function() return 0 end
    local kinds = {
      function(i) return fuse.get(names[i % #names + 1]) end,
      function(i) return fuse.new{ name = names[i % #names + 1], fails = 5 } end,
      function(i) return fuse.new{ name = names[i % #names + 1], fails = 5, fallback = fb } end,
      function(i) return fuse.new{ name = names[i % 50 + 1], fails = 5, window = 10, open_for = 10,
        probes = 1, backoff = 1, fallback = fb } end,  -- more options than same_opts unrolls
      function(i) return fuse.new{ name = names[i % #names + 1], fails = 5 }:call(fb) end,
    }
    local aborts = jit_support.fuse_aborts(function()
      for k, kind in ipairs(kinds) do
        -- the loop itself in the handler the JIT never compiles, as a server's would be
        local handler = assert(load("local fn = ... return function(n) for i = 1, n do fn(i) end end",
          "=interpreted<lookup " .. k .. ">"))(kind)
        jit.off(handler)
        handler(100000)
      end
    end)
    local bad, n = jit_support.blacklisted(jit_support.fuse_roots({ fuse.get(names[1]) }))
    assert.is_true(n > 50, ("only %d functions of fuse were found: the walk is broken"):format(n))
    assert.is_true(#bad == 0, ("%d blacklisted entries or loops in fuse's functions:\n  %s\n"
      .. "aborts of traces that started in fuse (%d):\n  %s"):format(#bad, table.concat(bad, "\n  "),
      #aborts, table.concat(aborts, "\n  ", 1, math.min(#aborts, 20))))
  end)

  it("keeps a bounded number of objects while names come and go: 40,000 names through a registry of 64",
    function()
      local kb = numbers(support.run_child([[
local fuse = require "fuse"
fuse.init{ capacity = 64 }
local function churn(from, to)
  for i = from, to do
    local name = "churn-" .. i
    local b = fuse.new{ name = name, fails = 5 }
    assert(fuse.get(name) and b:call(function() return 1 end) == 1)
    if i > 32 then assert(fuse.remove("churn-" .. (i - 32))) end
  end
end
churn(1, 10000)  -- the steady state
collectgarbage(); collectgarbage()
local before = collectgarbage("count")
churn(10001, 40000)
collectgarbage(); collectgarbage()
print(("%.0f"):format(collectgarbage("count") - before))
]]))
      assert.equal(1, #kb)
      -- 30,000 objects of each kind kept would be several MB
      assert.is_true(kb[1] < 512, ("the heap grew by %d KB"):format(kb[1]))
    end)
end)
