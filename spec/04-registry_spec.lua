-- The registry: named breakers share one state, fuse.get / fuse.list, anonymous
-- breakers are independent and freed with their wrapper, bad options raise at the
-- caller's line.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unique = support.unique_names("s04")

local function failing() return nil, "boom" end

-- resident set size in KiB, or nil where /proc is missing
local function rss_kib()
  local f = io.open("/proc/self/statm", "r")
  if not f then return nil end
  local s = f:read("*l")
  f:close()
  local pages = tonumber(s:match("^%d+%s+(%d+)"))
  return pages and pages * 4
end

-- Calls fuse[fn_name](...) from a known line of this file; returns the error message
-- (or nil) and that line. The call is not a tail call, so level 2 is this function.
local function raise_line(fn_name, ...)
  local line = debug.getinfo(1, "l").currentline + 1
  local ok, err = pcall(function(...) local r = fuse[fn_name](...); return r end, ...)
  return (not ok) and err or nil, line
end

-- like raise_line, but the line that calls fuse.new is in the inner closure
local function new_error(opts)
  local line
  local ok, err = pcall(function()
    line = debug.getinfo(1, "l").currentline + 1
    local b = fuse.new(opts)
    return b
  end)
  return (not ok) and err or nil, line
end

local function wrap_error(fn, opts)
  local line
  local ok, err = pcall(function()
    line = debug.getinfo(1, "l").currentline + 1
    local f = fuse.wrap(fn, opts)
    return f
  end)
  return (not ok) and err or nil, line
end

local THIS_FILE = "04%-registry_spec%.lua"

local function assert_at_line(err, line)
  assert.is_string(err)
  assert.matches(THIS_FILE .. ":" .. line .. ": fuse: ", err)
end

describe("fuse #" .. BACKEND, function()
  support.fake_clock(1000)

  support.it_runs_on_backend()

  it("has a VERSION string", function()
    assert.is_string(fuse.VERSION)
    assert.matches("^%d+%.%d+%.%d+", fuse.VERSION)
  end)

  describe("named breakers", function()
    it("two wraps with the same name share one state", function()
      local name = unique("share")
      local calls2 = 0
      local f1, b1 = fuse.wrap(failing, { name = name, fails = 2 })
      local f2, b2 = fuse.wrap(function() calls2 = calls2 + 1; return nil, "x" end,
        { name = name, fails = 2 })
      f1()
      assert.equal("closed", b2:state())
      f2()
      assert.equal(1, calls2)
      assert.equal("open", b1:state())
      assert.equal("open", b2:state())
      local _, rej = f2()
      assert.equal(1, calls2)
      assert.is_true(fuse.is_rejection(rej))
      assert.equal(name, rej.name)
      assert.equal(name, b1.name)
      assert.equal(name, b2.name)
    end)

    it("fuse.new with the same name and options shares the state", function()
      local name = unique("same")
      local b1 = fuse.new { name = name, fails = 3, window = 7 }
      local b2 = fuse.new { name = name, fails = 3, window = 7 }
      b1:call(failing)
      b2:call(failing)
      assert.equal(2, b1:stats().failures)
      assert.equal(2, b2:stats().failures)
      b1:force_open()
      assert.equal("forced_open", b2:state())
    end)

    it("an option given explicitly at its default value is the same option", function()
      local name = unique("defaults")
      fuse.new { name = name }
      assert.has_no.errors(function()
        fuse.new { name = name, fails = 5, window = 10, open_for = 10, probes = 1, backoff = 1 }
      end)
    end)

    it("fallback, is_failure and on_state_change may differ between wraps of one name", function()
      local name = unique("fns")
      local f1 = fuse.wrap(failing, { name = name, fails = 1, fallback = "one" })
      local f2 = fuse.wrap(failing, { name = name, fails = 1, fallback = "two",
        is_failure = function() return true end, on_state_change = function() end })
      assert.equal("one", (f1()))
      assert.equal("one", (f1()))
      assert.equal("two", (f2()))
    end)

    it("different numeric options raise an error naming which differ", function()
      local name = unique("differ")
      fuse.new { name = name, fails = 5, window = 10 }
      local err, line = new_error { name = name, fails = 3, window = 10 }
      assert_at_line(err, line)
      assert.matches("breaker '" .. name .. "' already exists with other options", err, 1, true)
      assert.matches("fails", err, 1, true)
      assert.matches("5", err, 1, true)
      assert.matches("3", err, 1, true)
      assert.not_matches("window", err, 1, true)

      err = new_error { name = name, fails = 5, window = 20, probes = 2 }
      assert.matches("window", err, 1, true)
      assert.matches("probes", err, 1, true)
      assert.not_matches("fails", err, 1, true)

      -- and the existing breaker is unchanged
      assert.equal(1, #(function()
        local n = {}
        for _, v in ipairs(fuse.list()) do if v == name then n[#n + 1] = v end end
        return n
      end)())
    end)

    it("fuse.wrap with a name but other options raises too", function()
      local name = unique("wrapdiffer")
      fuse.wrap(failing, { name = name, fails = 2 })
      local err, line = wrap_error(failing, { name = name, fails = 4 })
      assert_at_line(err, line)
      assert.matches("fails", err, 1, true)
    end)
  end)

  describe("fuse.get / fuse.list", function()
    it("fuse.get returns the named breaker, nil for an unknown name", function()
      local name = unique("get")
      assert.is_nil(fuse.get(name))
      local f = fuse.wrap(failing, { name = name, fails = 1 })
      local b = fuse.get(name)
      assert.is_not_nil(b)
      assert.equal(name, b.name)
      assert.equal("closed", b:state())
      f()
      assert.equal("open", b:state())
      b:reset()
      local calls = 0
      fuse.wrap(function() calls = calls + 1 end, { name = name, fails = 1 })()
      assert.equal(1, calls)
    end)

    it("fuse.list gives the names in creation order, without anonymous breakers", function()
      local before = fuse.list()
      assert.is_table(before)
      local names = { unique("list-a"), unique("list-c"), unique("list-b") }
      for _, n in ipairs(names) do fuse.new { name = n } end
      fuse.new {}
      fuse.wrap(failing, {})
      fuse.new { name = names[1] }  -- not created twice
      local after = fuse.list()
      assert.equal(#before + 3, #after)
      for i = 1, #before do assert.equal(before[i], after[i]) end
      assert.same(names, { after[#before + 1], after[#before + 2], after[#before + 3] })
    end)

    it("fuse.list returns a fresh table", function()
      local l1 = fuse.list()
      l1[#l1 + 1] = "garbage"
      assert.is_nil(fuse.get("garbage"))
      assert.equal(#l1 - 1, #fuse.list())
    end)
  end)

  -- The registry is process-wide, so filling one takes a process of its own: the same
  -- interpreter, with the same paths, runs a script that fills a shared registry of 2.
  describe("a full registry", function()
    it("is a clear error at creation, naming the breaker and the capacity", function()
      local script = os.tmpname()
      local f = assert(io.open(script, "w"))
      -- this process's paths (busted may have set them with --lpath/--cpath), on line 1
      f:write(("package.path = %q; package.cpath = %q; "):format(package.path, package.cpath))
      f:write([[
        local fuse = require "fuse"
        fuse.init{ shared = true, capacity = 2 }
        fuse.new{ name = "one" }
        fuse.new{ name = "two" }
        local again = fuse.new{ name = "one" }          -- an existing name still works
        local ok, err = pcall(function() local b = fuse.new{ name = "three" }; return b end)
        io.write(tostring(ok), "\n", tostring(err), "\n", again.name, "\n", #fuse.list(), "\n")
      ]])
      f:close()
      local p = assert(io.popen(("%q %q 2>&1"):format(support.interpreter(), script)))
      local out = p:read("*a")
      p:close()
      os.remove(script)
      local ok, err, again, count = out:match("^(%a+)\n([^\n]*)\n([^\n]*)\n(%d+)\n$")
      assert.equal("false", ok, out)
      assert.matches("fuse: cannot create breaker 'three': breaker registry is full (capacity 2;",
        err, 1, true)
      assert.matches(":6: fuse:", err, 1, true)  -- at the caller's line in the script
      assert.equal("one", again)
      assert.equal("2", count)
      assert.matches("raise it with fuse.init{ shared = true, capacity = N })", err, 1, true)
    end)

    it("of a process's own registry says how to raise its capacity, without shared", function()
      local out = support.run_child([[
        local fuse = require "fuse"
        fuse.init{ capacity = 1 }
        fuse.new{ name = "one" }
        io.write(select(2, pcall(fuse.new, { name = "two" })), "\n")
      ]])
      -- (shared = true would make it another registry, one for forked workers)
      assert.equal("fuse: cannot create breaker 'two': breaker registry is full (capacity 1; "
        .. "raise it with fuse.init{ capacity = N })\n", out)
    end)
  end)

  describe("fuse.init under nginx", function()
    it("refuses a shared registry outside init_by_lua, where each worker would get its own", function()
      local saved = rawget(_G, "ngx")
      rawset(_G, "ngx", { get_phase = function() return "init_worker" end })
      local ok, err = pcall(fuse.init, { shared = true, capacity = 8 })
      rawset(_G, "ngx", saved)
      assert.is_false(ok)
      assert.matches("fuse.init{ shared = true } belongs in init_by_lua*", err, 1, true)
      assert.matches("in init_worker each worker would get a registry of its own", err, 1, true)
    end)
  end)

  describe("anonymous breakers", function()
    it("are independent of each other", function()
      local f1, b1 = fuse.wrap(failing, { fails = 1 })
      local _, b2 = fuse.wrap(failing, { fails = 1 })
      local b3 = fuse.new { fails = 1 }
      f1()
      assert.equal("open", b1:state())
      assert.equal("closed", b2:state())
      assert.equal("closed", b3:state())
      assert.is_nil(b1.name)
    end)

    it("are freed with their wrapper: 200000 wraps stay bounded", function()
      local function work() return 1 end
      local listed = #fuse.list()
      -- warm up, so that the steady state is what gets measured
      for _ = 1, 20000 do
        local f = fuse.wrap(work, { fails = 3 })
        f()
      end
      collectgarbage()
      collectgarbage()
      local lua_before = collectgarbage("count")
      local rss_before = rss_kib()
      for i = 1, 200000 do
        local f, b = fuse.wrap(work, { fails = 3, window = 5 })
        assert(f() == 1)
        if i % 3 == 0 then b:call(failing) end
        if i % 5000 == 0 then collectgarbage() end
      end
      collectgarbage()
      collectgarbage()
      local lua_after = collectgarbage("count")
      local rss_after = rss_kib()
      assert.equal(listed, #fuse.list())
      -- the Lua heap holds no trace of the 200000 breakers (< 2 MiB of growth)
      assert.is_true(lua_after - lua_before < 2048,
        ("Lua heap grew from %.0f KiB to %.0f KiB"):format(lua_before, lua_after))
      -- nor does C memory: a leak of even 100 bytes per breaker would be ~20 MiB
      if rss_before then
        assert.is_true(rss_after - rss_before < 16 * 1024,
          ("RSS grew from %d KiB to %d KiB"):format(rss_before, rss_after))
      end
    end)

    it("b:wrap wrappers keep their breaker alive", function()
      local f = fuse.new({ fails = 1 }):wrap(failing)
      collectgarbage()
      collectgarbage()
      f()
      local r, rej = f()
      assert.is_nil(r)
      assert.is_true(fuse.is_rejection(rej))
    end)
  end)

  describe("bad options", function()
    it("raise at the caller's line with the documented message", function()
      local err, line = new_error { fails = "x" }
      assert_at_line(err, line)
      assert.matches(": fuse: option 'fails' must be a positive integer, got \"x\"$", err)
      err, line = wrap_error(failing, { fails = "x" })
      assert_at_line(err, line)
      assert.matches("option 'fails'", err, 1, true)
    end)

    local nan, inf = 0 / 0, math.huge
    local bad = {
      { "fails", 0 }, { "fails", 1.5 }, { "fails", -3 }, { "fails", 1e6 + 1 },
      { "window", 0 }, { "window", 0.001 }, { "window", 86401 }, { "window", -1 },
      { "window", nan }, { "window", inf }, { "window", "10" },
      { "count_window", 0 }, { "count_window", 1025 }, { "count_window", 2.5 },
      { "failure_rate", 0 }, { "failure_rate", 1.5 }, { "failure_rate", nan },
      { "slow", 0 }, { "slow", -1 }, { "slow", 86401 },
      { "open_for", 0 }, { "open_for", 86401 }, { "open_for", inf },
      { "backoff", 0.5 }, { "backoff", 101 },
      { "jitter", 1 }, { "jitter", -0.1 },
      { "probes", 0 }, { "probes", 17 }, { "probes", 1.5 },
      { "probe_timeout", 0 }, { "probe_timeout", 86401 },
      { "name", "" }, { "name", ("n"):rep(128) }, { "name", 123 }, { "name", true },
      { "is_failure", "yes" }, { "on_state_change", 1 }, { "is_failure", {} },
    }
    for _, case in ipairs(bad) do
      local opt, value = case[1], case[2]
      local shown = type(value) == "string" and ("%q"):format(value:sub(1, 20)) or tostring(value)
      it(("%s = %s raises at the caller's line naming the option"):format(opt, shown), function()
        local err, line = new_error { [opt] = value }
        assert_at_line(err, line)
        assert.matches("option '" .. opt .. "'", err, 1, true)
        if type(value) == "number" and value == value and value ~= inf then
          assert.matches(("%.14g"):format(value), err, 1, true)  -- 5.4 writes 1e6+1 "1000001.0"
        end
      end)
    end

    local combos = {
      { "min_calls above count_window", { count_window = 5, failure_rate = 0.5, min_calls = 6 }, "min_calls" },
      { "min_calls without a rate rule", { min_calls = 3 }, "min_calls" },
      { "fails above count_window", { count_window = 5, fails = 6 }, "fails" },
      { "max_open_for below open_for", { open_for = 10, max_open_for = 5, backoff = 2 }, "max_open_for" },
      { "max_open_for with backoff 1", { open_for = 10, max_open_for = 50 }, "max_open_for" },
      { "slow_rate without slow", { slow_rate = 0.5 }, "slow_rate" },
    }
    for _, case in ipairs(combos) do
      it(case[1] .. " is an error naming " .. case[3], function()
        local err, line = new_error(case[2])
        assert_at_line(err, line)
        assert.matches(case[3], err, 1, true)
      end)
    end

    it("the same options are accepted when they make sense", function()
      assert.has_no.errors(function()
        fuse.new { count_window = 5, failure_rate = 0.5, min_calls = 5 }
        fuse.new { open_for = 10, max_open_for = 50, backoff = 2 }
        fuse.new { slow = 1, slow_rate = 0.5 }
        fuse.new { fails = 1e6, window = 86400, probes = 16, jitter = 0.99, backoff = 100 }
        fuse.new { fallback = false }
        fuse.new {}
      end)
    end)

    local near = {
      { "fail", "fails" }, { "windw", "window" }, { "probe", "probes" },
      { "fallbak", "fallback" }, { "is_falure", "is_failure" }, { "openfor", "open_for" },
      { "on_state_chnage", "on_state_change" },
    }
    for _, case in ipairs(near) do
      it(("unknown option '%s' suggests '%s'"):format(case[1], case[2]), function()
        local err, line = new_error { [case[1]] = 1 }
        assert_at_line(err, line)
        assert.matches(("fuse: unknown option '%s' (did you mean '%s'?)"):format(case[1], case[2]),
          err, 1, true)
      end)
    end

    it("an unknown option far from every name is still named", function()
      local err, line = new_error { zzzzqqq = 1 }
      assert_at_line(err, line)
      assert.matches("unknown option 'zzzzqqq'", err, 1, true)
    end)

    it("fuse.wrap needs a function and a table", function()
      local err, line = raise_line("wrap", "not a function", {})
      assert_at_line(err, line)
      err = raise_line("wrap", failing, "not a table")
      assert.is_string(err)
      assert.matches("fuse: ", err, 1, true)
    end)
  end)
end)
