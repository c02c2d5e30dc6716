-- Option validation (lua/fuse/options.lua). Only the core's bound table is read through
-- the backend; the tag (the backend of this interpreter) puts these tests in every
-- backend's run.

local options = require "fuse.options"

local BACKEND = jit and "ffi" or "capi"

local HERE = debug.getinfo(1, "S").short_src

-- The message check raises for opts, without a position (level 0).
local function check_error(opts)
  local ok, err = pcall(options.check, opts, 0)
  assert(not ok, "check accepted options it should refuse")
  return err
end

local function init_error(opts)
  local ok, err = pcall(options.check_init, opts, 0)
  assert(not ok, "check_init accepted options it should refuse")
  return err
end

-- opts with the extra fields of more (a fresh table).
local function with(opts, more)
  local t = {}
  for k, v in pairs(opts or {}) do t[k] = v end
  for k, v in pairs(more or {}) do t[k] = v end
  return t
end

-- A stand-in for the facade: fuse.new(opts) calls options.check(opts, 3).
local function fake_new(opts)
  local o = options.check(opts, 3)
  return o
end

local function fake_init(opts)
  local o = options.check_init(opts, 3)
  return o
end

local DEFAULT_CFG = {
  window = 10, open_for = 10, max_open_for = 320, slow = 0, probe_timeout = 10,
  failure_rate = 0, slow_rate = 0, backoff = 1, jitter = 0, fails = 5,
  count_window = 0, min_calls = 10, probes = 1, max_concurrent = 0,
}

-- Every numeric option: the options it needs beside it (base), values accepted (each
-- at a bound), and values refused with the end of their message.
local NUMERIC = {
  { opt = "fails", ok = { 1, 1000000 }, bad = {
      { 0, "a positive integer, got 0" },
      { -3, "a positive integer, got -3" },
      { 2.5, "a positive integer, got 2.5" },
      { 1000001, "an integer from 1 to 1000000, got 1000001" },
      { "x", 'a positive integer, got "x"' },
  } },
  { opt = "window", ok = { 0.01, 86400 }, bad = {
      { 0.0099, "a number from 0.01 to 86400, got 0.0099" },
      { 0, "a number from 0.01 to 86400, got 0" },
      { 86400.5, "a number from 0.01 to 86400, got 86400.5" },
      { 1e9, "a number from 0.01 to 86400, got 1000000000" },
      { "10", 'a number, got "10"' },
  } },
  { opt = "count_window", ok = { 1, 1024 }, bad = {
      { 0, "a positive integer, got 0" },
      { 1.5, "a positive integer, got 1.5" },
      { 1025, "an integer from 1 to 1024, got 1025" },
      { true, "a positive integer, got true" },
  } },
  { opt = "failure_rate", ok = { 1e-9, 1 }, bad = {
      { 0, "a number above 0 and at most 1, got 0" },
      { -0.5, "a number above 0 and at most 1, got -0.5" },
      { 1.01, "a number above 0 and at most 1, got 1.01" },
      { "50%", 'a number, got "50%"' },
  } },
  { opt = "min_calls", base = { failure_rate = 0.5 }, ok = { 1, 1000000 }, bad = {
      { 0, "a positive integer, got 0" },
      { 3.25, "a positive integer, got 3.25" },
      { 1000001, "an integer from 1 to 1000000, got 1000001" },
      { {}, "a positive integer, got table" },
  } },
  { opt = "slow", ok = { 1e-6, 86400 }, bad = {
      { 0, "a number above 0 and at most 86400, got 0" },
      { 86401, "a number above 0 and at most 86400, got 86401" },
      { false, "a number, got false" },
  } },
  { opt = "slow_rate", base = { slow = 1 }, ok = { 1e-9, 1 }, bad = {
      { 0, "a number above 0 and at most 1, got 0" },
      { 2, "a number above 0 and at most 1, got 2" },
      { "0.5", 'a number, got "0.5"' },
  } },
  { opt = "open_for", ok = { 0.001, 86400 }, bad = {
      { 0.0009, "a number from 0.001 to 86400, got 0.0009" },
      { -1, "a number from 0.001 to 86400, got -1" },
      { 86401, "a number from 0.001 to 86400, got 86401" },
      { print, "a number, got function" },
  } },
  { opt = "backoff", ok = { 1, 100 }, bad = {
      { 0.99, "a number from 1 to 100, got 0.99" },
      { 100.5, "a number from 1 to 100, got 100.5" },
      { "2", 'a number, got "2"' },
  } },
  { opt = "max_open_for", base = { open_for = 0.001, backoff = 2 },
    ok = { 0.001, 2764800 }, bad = {
      { 0.0005, "a number from 0.001 to 2764800, got 0.0005" },
      { 2764801, "a number from 0.001 to 2764800, got 2764801" },
      { "1m", 'a number, got "1m"' },
  } },
  { opt = "jitter", ok = { 0, 0.999 }, bad = {
      { 1, "a number from 0 to below 1, got 1" },
      { -0.1, "a number from 0 to below 1, got -0.1" },
      { "0", 'a number, got "0"' },
  } },
  { opt = "probes", ok = { 1, 16 }, bad = {
      { 0, "a positive integer, got 0" },
      { 20, "an integer from 1 to 16, got 20" },
      { 2.5, "a positive integer, got 2.5" },
      { "1", 'a positive integer, got "1"' },
  } },
  { opt = "probe_timeout", ok = { 0.001, 86400 }, bad = {
      { 0.0001, "a number from 0.001 to 86400, got 0.0001" },
      { 1e5, "a number from 0.001 to 86400, got 100000" },
      { "5s", 'a number, got "5s"' },
  } },
}

describe("options #" .. BACKEND, function()

  it("lists every option name, in the order of DESIGN.md", function()
    assert.same({
      "name", "fallback", "fails", "window", "count_window", "failure_rate", "min_calls",
      "slow", "slow_rate", "open_for", "backoff", "max_open_for", "jitter", "probes",
      "probe_timeout", "is_failure", "on_state_change", "max_concurrent", "max_wait",
    }, options.NAMES)
  end)

  describe("defaults", function()
    it("nil and {} give every default", function()
      for _, opts in ipairs({ false, {} }) do
        local r = options.check(opts or nil)
        assert.same({ cfg = DEFAULT_CFG }, r)
        assert.is_nil(r.name)
        assert.is_nil(r.fallback)
      end
    end)

    it("open_for, probe_timeout and max_open_for follow window and open_for", function()
      assert.same(with(DEFAULT_CFG, { window = 2, open_for = 2, probe_timeout = 2,
        max_open_for = 64 }), options.check({ window = 2 }).cfg)
      assert.same(with(DEFAULT_CFG, { window = 2, open_for = 3, probe_timeout = 2,
        max_open_for = 96 }), options.check({ window = 2, open_for = 3 }).cfg)
      assert.same(with(DEFAULT_CFG, { open_for = 5, backoff = 2, max_open_for = 160,
        probe_timeout = 7 }),
        options.check({ open_for = 5, backoff = 2, probe_timeout = 7 }).cfg)
      assert.same(with(DEFAULT_CFG, { backoff = 1.5, max_open_for = 60 }),
        options.check({ backoff = 1.5, max_open_for = 60 }).cfg)
    end)

    it("a rate rule turns fails off unless it is given", function()
      assert.same(with(DEFAULT_CFG, { fails = 0, failure_rate = 0.5 }),
        options.check({ failure_rate = 0.5 }).cfg)
      assert.same(with(DEFAULT_CFG, { fails = 0, slow = 2, slow_rate = 0.25 }),
        options.check({ slow = 2, slow_rate = 0.25 }).cfg)
      assert.same(with(DEFAULT_CFG, { fails = 7, failure_rate = 0.5, min_calls = 20 }),
        options.check({ failure_rate = 0.5, fails = 7, min_calls = 20 }).cfg)
    end)

    it("slow alone counts slow calls and keeps the fails rule", function()
      assert.same(with(DEFAULT_CFG, { slow = 0.5 }), options.check({ slow = 0.5 }).cfg)
    end)

    it("a short count_window cuts the default fails and min_calls down to it", function()
      assert.same(with(DEFAULT_CFG, { count_window = 3, fails = 3, min_calls = 3 }),
        options.check({ count_window = 3 }).cfg)
      assert.same(with(DEFAULT_CFG, { count_window = 4, fails = 0, min_calls = 4,
        failure_rate = 0.5 }), options.check({ count_window = 4, failure_rate = 0.5 }).cfg)
      assert.same(with(DEFAULT_CFG, { count_window = 100 }),
        options.check({ count_window = 100 }).cfg)
    end)

    it("passes name, fallback and the functions through, and leaves opts alone", function()
      local fb, isf, osc = function() end, function() end, function() end
      local opts = { name = "db", fallback = fb, is_failure = isf, on_state_change = osc,
        fails = 3 }
      local r = options.check(opts)
      assert.equal("db", r.name)
      assert.equal(fb, r.fallback)
      assert.equal(isf, r.is_failure)
      assert.equal(osc, r.on_state_change)
      assert.equal(3, r.cfg.fails)
      assert.same({ name = "db", fallback = fb, is_failure = isf, on_state_change = osc,
        fails = 3 }, opts)
      assert.not_equal(opts, r)
    end)

    it("takes any non-nil fallback value", function()
      for _, v in ipairs({ 0, "cached", false, {}, true }) do
        assert.equal(v, options.check({ fallback = v }).fallback)
      end
    end)
  end)

  describe("numeric options", function()
    for _, case in ipairs(NUMERIC) do
      local opt = case.opt

      it(opt .. " accepts its bounds", function()
        for _, v in ipairs(case.ok) do
          local r = options.check(with(case.base, { [opt] = v }))
          assert.equal(v, r.cfg[opt])
        end
      end)

      it(opt .. " refuses values out of bounds or of another type", function()
        for _, b in ipairs(case.bad) do
          assert.equal("fuse: option '" .. opt .. "' must be " .. b[2],
            check_error(with(case.base, { [opt] = b[1] })))
        end
      end)

      it(opt .. " refuses NaN and infinities", function()
        for _, b in ipairs({ { 0 / 0, "nan" }, { math.huge, "inf" },
                              { -math.huge, "-inf" } }) do
          assert.equal("fuse: option '" .. opt .. "' must be a finite number, got " .. b[2],
            check_error(with(case.base, { [opt] = b[1] })))
        end
      end)
    end
  end)

  describe("other options", function()
    it("name is a string of 1 to 127 bytes without NUL", function()
      assert.equal("x", options.check({ name = "x" }).name)
      local long = string.rep("n", 127)
      assert.equal(long, options.check({ name = long }).name)
      assert.equal([[fuse: option 'name' must be a string of 1 to 127 bytes, got ""]],
        check_error({ name = "" }))
      assert.equal("fuse: option 'name' must be a string of 1 to 127 bytes, got 128 bytes",
        check_error({ name = long .. "n" }))
      assert.equal("fuse: option 'name' must be a string, got 5", check_error({ name = 5 }))
      assert.equal([[fuse: option 'name' must be a string without NUL bytes, got "a\000b" (a NUL at byte 2)]],
        check_error({ name = "a\0b" }))
      -- past the 60 bytes a message shows: the byte says where (it said nothing of it)
      assert.equal("fuse: option 'name' must be a string without NUL bytes, got \"" .. ("n"):rep(60)
        .. '..." (a NUL at byte 100)', check_error({ name = ("n"):rep(99) .. "\0" }))
    end)

    it("is_failure and on_state_change are functions", function()
      for _, opt in ipairs({ "is_failure", "on_state_change" }) do
        assert.equal("fuse: option '" .. opt .. [[' must be a function, got "f"]],
          check_error({ [opt] = "f" }))
        assert.equal("fuse: option '" .. opt .. "' must be a function, got table",
          check_error({ [opt] = setmetatable({}, { __call = print }) }))
        assert.equal("fuse: option '" .. opt .. "' must be a function, got false",
          check_error({ [opt] = false }))
      end
    end)

    it("opts itself must be a table", function()
      assert.equal([[fuse: options must be a table, got "fails"]], check_error("fails"))
      assert.equal("fuse: options must be a table, got 5", check_error(5))
    end)

    it("checks options in the order of NAMES", function()
      assert.equal("fuse: option 'fails' must be a positive integer, got 0",
        check_error({ probes = 0, fails = 0, window = 0 }))
    end)
  end)

  describe("rules between options", function()
    it("slow_rate needs slow", function()
      assert.equal("fuse: option 'slow_rate' needs option 'slow' (the seconds that make "
        .. "a call slow)", check_error({ slow_rate = 0.5 }))
    end)

    it("min_calls needs a rate rule", function()
      assert.equal("fuse: option 'min_calls' has no effect without 'failure_rate' or "
        .. "'slow_rate'", check_error({ min_calls = 5 }))
      assert.equal("fuse: option 'min_calls' has no effect without 'failure_rate' or "
        .. "'slow_rate'", check_error({ min_calls = 5, fails = 3, slow = 1 }))
      assert.equal(5, options.check({ min_calls = 5, slow = 1, slow_rate = 0.5 })
        .cfg.min_calls)
    end)

    it("min_calls and fails cannot exceed count_window", function()
      assert.equal("fuse: option 'min_calls' must be at most count_window (20), got 21",
        check_error({ count_window = 20, failure_rate = 0.5, min_calls = 21 }))
      assert.equal("fuse: option 'fails' must be at most count_window (20), got 21",
        check_error({ count_window = 20, fails = 21 }))
      local cfg = options.check({ count_window = 20, failure_rate = 0.5, min_calls = 20,
        fails = 20 }).cfg
      assert.equal(20, cfg.min_calls)
      assert.equal(20, cfg.fails)
    end)

    it("max_open_for needs backoff above 1 and open_for at most it", function()
      assert.equal("fuse: option 'max_open_for' has no effect unless 'backoff' is above 1",
        check_error({ max_open_for = 100 }))
      assert.equal("fuse: option 'max_open_for' has no effect unless 'backoff' is above 1",
        check_error({ max_open_for = 100, backoff = 1 }))
      assert.equal("fuse: option 'max_open_for' must be at least open_for (10), got 5",
        check_error({ backoff = 2, max_open_for = 5 }))
      assert.equal("fuse: option 'max_open_for' must be at least open_for (30), got 29.5",
        check_error({ backoff = 2, open_for = 30, max_open_for = 29.5 }))
      assert.equal("fuse: option 'max_open_for' must be at least open_for (60), got 50",
        check_error({ backoff = 2, window = 60, max_open_for = 50 }))
      assert.equal(30, options.check({ backoff = 2, open_for = 30, max_open_for = 30 })
        .cfg.max_open_for)
    end)

    it("the largest open_for fits its default max_open_for", function()
      local cfg = options.check({ open_for = 86400, backoff = 100 }).cfg
      assert.equal(2764800, cfg.max_open_for)
    end)
  end)

  describe("unknown options", function()
    local function suggests(key, near)
      assert.equal("fuse: unknown option '" .. key .. "' (did you mean '" .. near .. "'?)",
        check_error({ [key] = 1 }))
    end

    it("suggest the near name", function()
      suggests("Fails", "fails")
      suggests("fail", "fails")
      suggests("windw", "window")
      suggests("probe", "probes")
      suggests("fials", "fails")
      suggests("FAILURE_RATE", "failure_rate")
      suggests("maxOpenFor", "max_open_for")
      suggests("open-for", "open_for")
      suggests("on_state_changed", "on_state_change")
      suggests("isFailure", "is_failure")
      suggests("fallbak", "fallback")
      suggests("timeout", "probe_timeout")
    end)

    it("list the options when no name is near", function()
      local list = "name, fallback, fails, window, count_window, failure_rate, "
        .. "min_calls, slow, slow_rate, open_for, backoff, max_open_for, jitter, probes, "
        .. "probe_timeout, is_failure, on_state_change, max_concurrent, max_wait"
      assert.equal("fuse: unknown option 'retries' (options are: " .. list .. ")",
        check_error({ retries = 3 }))
      -- 'rate' is in two names: no guess
      assert.equal("fuse: unknown option 'rate' (options are: " .. list .. ")",
        check_error({ rate = 0.5 }))
    end)

    it("report the first unknown key in sorted order", function()
      assert.equal("fuse: unknown option 'bogus' (options are: " ..
        table.concat(options.NAMES, ", ") .. ")",
        check_error({ zzzzzz = 1, bogus = 2, yyyyyy = 3, fails = 0 }))
    end)

    it("escape odd keys", function()
      assert.equal([[fuse: unknown option 'a\nb\'c' (options are: ]] ..
        table.concat(options.NAMES, ", ") .. ")", check_error({ ["a\nb'c"] = 1 }))
    end)

    it("refuse keys that are not strings", function()
      assert.equal("fuse: option names must be strings, got key 1 (value 5)",
        check_error({ 5 }))
      assert.equal([[fuse: option names must be strings, got key true (value "x")]],
        check_error({ [true] = "x" }))
    end)

    -- pairs' order differs between LuaJIT, Lua 5.1 and 5.4: of several keys that are not
    -- strings the message names the same one under each (numbers, smallest first; then
    -- false, true; then the rest by their text), and before any unknown string key
    it("name the same one of several keys that are not strings under every Lua", function()
      local cases = {
        { { [2.5] = 2, [1] = 3, [false] = 1, fails = 1 }, "key 1 (value 3)" },
        { { [true] = 1, [false] = 2, [7] = 3, [-1] = 4 }, "key -1 (value 4)" },
        { { [true] = 1, [false] = 2, zz = 1 }, "key false (value 2)" },
        { { [{}] = 2, [print] = 3, [true] = 4 }, "key true (value 4)" },
        { { [{}] = 2, [print] = 3 }, "key function (value 3)" },
      }
      for _, c in ipairs(cases) do
        assert.equal("fuse: option names must be strings, got " .. c[2], check_error(c[1]))
        assert.equal("fuse: option names must be strings, got " .. c[2],
          (select(2, pcall(options.check_init, c[1])):gsub("^.-: fuse", "fuse")))
      end
    end)
  end)

  describe("errors point at the line that called the facade", function()
    it("check(opts, 3) from a fake fuse.new", function()
      assert.truthy(HERE:find("spec/01%-options_spec%.lua$"), HERE)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() fake_new({ fails = 0 }) end)
      assert.is_false(ok)
      assert.equal(HERE .. ":" .. line
        .. ": fuse: option 'fails' must be a positive integer, got 0", err)
    end)

    it("for unknown keys and rules between options too", function()
      local line = debug.getinfo(1, "l").currentline + 1
      local _, e1 = pcall(function() fake_new({ windw = 1 }) end)
      local _, e2 = pcall(function() fake_new({ slow_rate = 1 }) end)
      local _, e3 = pcall(function() fake_new("x") end)
      assert.equal(HERE .. ":" .. line
        .. ": fuse: unknown option 'windw' (did you mean 'window'?)", e1)
      assert.equal(HERE .. ":" .. (line + 1)
        .. ": fuse: option 'slow_rate' needs option 'slow' (the seconds that make a call "
        .. "slow)", e2)
      assert.equal(HERE .. ":" .. (line + 2) .. [[: fuse: options must be a table, got "x"]],
        e3)
    end)

    it("check_init(opts, 3) from a fake fuse.init", function()
      local line = debug.getinfo(1, "l").currentline + 1
      local _, err = pcall(function() fake_init({ shared = true, capacity = 0 }) end)
      assert.equal(HERE .. ":" .. line
        .. ": fuse: option 'capacity' must be a positive integer, got 0", err)
    end)

    it("level defaults to check's caller", function()
      local line = debug.getinfo(1, "l").currentline + 1
      local _, err = pcall(function() options.check({ probes = 17 }) end)
      assert.equal(HERE .. ":" .. line
        .. ": fuse: option 'probes' must be an integer from 1 to 16, got 17", err)
    end)
  end)

  describe("check_init", function()
    it("returns shared, capacity (1024 shared, 4096 private by default) and idle", function()
      assert.same({ shared = true, capacity = 1024, idle = 0 }, options.check_init({ shared = true }))
      assert.same({ shared = false, capacity = 4096, idle = 0 },
        options.check_init({ shared = false }))
      assert.same({ shared = true, capacity = 1, idle = 0 },
        options.check_init({ shared = true, capacity = 1 }))
      assert.same({ shared = true, capacity = 1000000, idle = 0 },
        options.check_init({ shared = true, capacity = 1000000 }))
      assert.same({ shared = false, capacity = 10, idle = 0 }, options.check_init({ capacity = 10 }))
      assert.same({ shared = false, capacity = 4096, idle = 2.5 }, options.check_init({ idle = 2.5 }))
    end)

    it("refuses bad values", function()
      assert.equal("fuse: fuse.init needs capacity, shared or idle", init_error({}))
      assert.equal("fuse: option 'idle' must be seconds above 0, got 0", init_error({ idle = 0 }))
      -- (the core's bound: above it the message said "seconds above 0", got 2000000000)
      assert.equal("fuse: option 'idle' must be at most 1000000000 seconds, got 2000000000",
        init_error({ idle = 2e9 }))
      assert.equal([[fuse: option 'idle' must be a finite number of seconds, got "1"]],
        init_error({ idle = "1" }))
      assert.equal([[fuse: option 'shared' must be true or false, got "yes"]],
        init_error({ shared = "yes" }))
      assert.equal("fuse: option 'capacity' must be a positive integer, got 0",
        init_error({ shared = true, capacity = 0 }))
      assert.equal("fuse: option 'capacity' must be a positive integer, got 10.5",
        init_error({ shared = true, capacity = 10.5 }))
      assert.equal([[fuse: option 'capacity' must be a positive integer, got "10"]],
        init_error({ shared = true, capacity = "10" }))
      assert.equal("fuse: option 'capacity' must be an integer from 1 to 1000000, "
        .. "got 1000001", init_error({ shared = true, capacity = 1000001 }))
      assert.equal("fuse: option 'capacity' must be a finite number, got nan",
        init_error({ shared = true, capacity = 0 / 0 }))
      assert.equal("fuse: option 'capacity' must be a finite number, got inf",
        init_error({ shared = true, capacity = math.huge }))
    end)

    it("refuses unknown keys and non-tables", function()
      assert.equal("fuse: unknown option 'capcity' (did you mean 'capacity'?)",
        init_error({ shared = true, capcity = 10 }))
      assert.equal("fuse: unknown option 'fails' (options are: shared, capacity, idle)",
        init_error({ shared = true, fails = 10 }))
      assert.equal("fuse: option names must be strings, got key 1 (value true)",
        init_error({ true }))
      assert.equal("fuse: fuse.init needs a table such as { shared = true }, got nil",
        init_error(nil))
    end)
  end)

  describe("diff", function()
    it("is empty for equal options", function()
      assert.same({}, options.diff(options.check({ fails = 3 }).cfg,
        options.check({ fails = 3 }).cfg))
      assert.same({}, options.diff(options.check().cfg, options.check({ fails = 5 }).cfg))
    end)

    it("names each differing field with both values, in option order", function()
      local a = options.check({ fails = 5, window = 10 }).cfg
      local b = options.check({ fails = 3, window = 0.5, probes = 2, failure_rate = 0.5,
        min_calls = 20 }).cfg
      assert.same({
        "fails (5 vs 3)", "window (10 vs 0.5)", "failure_rate (off vs 0.5)",
        "min_calls (10 vs 20)", "open_for (10 vs 0.5)", "max_open_for (320 vs 16)",
        "probes (1 vs 2)", "probe_timeout (10 vs 0.5)",
      }, options.diff(a, b))
      assert.same({ "count_window (off vs 100)", "slow (2 vs off)" },
        options.diff(options.check({ slow = 2 }).cfg,
          options.check({ count_window = 100 }).cfg))
    end)

    it("ignores float noise from a round trip through C", function()
      local a = options.check({ window = 0.1, jitter = 0.3 }).cfg
      local b = with(a, { window = 0.1 * (1 + 1e-13), jitter = 0.1 + 0.2 })
      assert.same({}, options.diff(a, b))
      local c = with(a, { window = 0.1000001 })
      assert.same({ "window (0.1 vs 0.1000001)" }, options.diff(a, c))
    end)
  end)
end)
