-- b:stats() through a scripted scenario, and fuse.metrics() (Prometheus text format).
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(1000, 1000)

  local uname = support.unique_names("spec10")
  local outcome = support.outcome

  local function reject(b)
    local ticket, rej = b:allow()
    assert.is_nil(ticket)
    assert.is_true(fuse.is_rejection(rej))
    return rej
  end

  local TOTALS = { "calls_total", "successes_total", "failures_total", "slow_total",
                   "rejections_total", "opens_total" }
  local NUMERIC = { "calls", "failures", "slow", "rejections", "failure_rate", "slow_rate",
                    "retry_after", "calls_total", "successes_total", "failures_total",
                    "slow_total", "rejections_total", "opens_total" }

  -- stats() with every field checked for type, and the totals checked against the
  -- previous snapshot: they never go down.
  local function snapshot(b, prev)
    local s = b:stats()
    assert.is_string(s.state)
    for _, k in ipairs(NUMERIC) do
      assert.equal("number", type(s[k]), "stats()." .. k .. " is " .. type(s[k]))
    end
    assert.equal(s.successes_total + s.failures_total, s.calls_total)
    if prev then
      for _, k in ipairs(TOTALS) do
        assert.is_true(s[k] >= prev[k], k .. " went down: " .. prev[k] .. " -> " .. s[k])
      end
    end
    return s
  end

  local function expect(s, want)
    for k, v in pairs(want) do
      if type(v) == "number" and v ~= math.floor(v) then
        assert.near(v, s[k], 1e-6, "stats()." .. k)
      else
        assert.equal(v, s[k], "stats()." .. k)
      end
    end
  end

  support.it_runs_on_backend()

  describe("b:stats()", function()
    it("starts at zero, with rates 0 over an empty window", function()
      local s = snapshot(fuse.new{ slow = 1 })
      expect(s, {
        state = "closed", calls = 0, failures = 0, slow = 0, rejections = 0,
        failure_rate = 0, slow_rate = 0, retry_after = 0,
        calls_total = 0, successes_total = 0, failures_total = 0, slow_total = 0,
        rejections_total = 0, opens_total = 0,
      })
    end)

    it("follows a scripted scenario", function()
      local b = fuse.new{ name = uname("scenario"), fails = 3, window = 10, slow = 1 }
      local t0 = clock.now
      outcome(b, true, 0.5)
      outcome(b, true, 2)                       -- slow
      outcome(b, false, 0.1)
      local s = snapshot(b)
      expect(s, {
        state = "closed", calls = 3, failures = 1, slow = 1, rejections = 0,
        failure_rate = 1 / 3, slow_rate = 1 / 3, retry_after = 0,
        calls_total = 3, successes_total = 2, failures_total = 1, slow_total = 1,
        rejections_total = 0, opens_total = 0,
      })

      clock.now = t0 + 1
      outcome(b, false)
      outcome(b, false)                         -- third failure: opens (open_for = 10)
      s = snapshot(b, s)
      expect(s, {
        state = "open", retry_after = 10, calls_total = 5, successes_total = 2,
        failures_total = 3, slow_total = 1, rejections_total = 0, opens_total = 1,
      })

      local rej = reject(b)
      assert.near(10, rej.retry_after, 1e-6)
      reject(b)
      s = snapshot(b, s)
      expect(s, { rejections = 2, rejections_total = 2 })

      clock.now = t0 + 5                        -- retry_after goes down with the clock
      s = snapshot(b, s)
      expect(s, { state = "open", retry_after = 6 })
      rej = reject(b)
      assert.near(6, rej.retry_after, 1e-6)
      assert.equal("open", rej.state)
      s = snapshot(b, s)
      expect(s, { rejections = 3, rejections_total = 3 })

      clock.now = t0 + 10.5
      s = snapshot(b, s)
      expect(s, { state = "open", retry_after = 0.5 })

      clock.now = t0 + 11.5                     -- due: half_open shows without a call
      s = snapshot(b, s)
      expect(s, { state = "half_open", retry_after = 0, opens_total = 1 })

      outcome(b, true, 0.2)                     -- the probe closes it: a fresh window
      s = snapshot(b, s)
      expect(s, {
        state = "closed", calls = 0, failures = 0, slow = 0, rejections = 0,
        failure_rate = 0, slow_rate = 0, retry_after = 0,
        calls_total = 6, successes_total = 3, failures_total = 3, slow_total = 1,
        rejections_total = 3, opens_total = 1,
      })

      outcome(b, true, 5)
      s = snapshot(b, s)
      expect(s, { calls = 1, slow = 1, slow_rate = 1, slow_total = 2, calls_total = 7 })

      clock:advance(100)                        -- the window rolls over
      s = snapshot(b, s)
      expect(s, {
        state = "closed", calls = 0, failures = 0, slow = 0, rejections = 0,
        calls_total = 7, successes_total = 4, failures_total = 3, slow_total = 2,
        rejections_total = 3, opens_total = 1,
      })

      b:reset()                                 -- a close keeps the totals
      s = snapshot(b, s)
      expect(s, {
        calls_total = 7, successes_total = 4, failures_total = 3, slow_total = 2,
        rejections_total = 3, opens_total = 1,
      })

      b:force_open()                            -- forced_open: rejections, no retry_after
      rej = reject(b)
      assert.equal("forced_open", rej.state)
      s = snapshot(b, s)
      expect(s, { state = "forced_open", retry_after = 0, rejections_total = 4 })
    end)

    it("counts half-open rejections (no free probe slot) and opens_total per open", function()
      local b = fuse.new{ fails = 1, open_for = 5, probes = 1 }
      outcome(b, false)
      clock:advance(5.01)
      local probe = b:allow()
      assert.is_number(probe)
      local rej = reject(b)
      assert.equal("half_open", rej.state)
      local s = snapshot(b)
      expect(s, { state = "half_open", rejections_total = 1, retry_after = 0 })
      b:report(probe, false)                    -- re-opens
      s = snapshot(b, s)
      expect(s, { state = "open", opens_total = 2, failures_total = 2, calls_total = 2 })
    end)

    it("counts successes in the window after the breaker sat idle (no rate rule)", function()
      local b = fuse.new{ fails = 5, window = 10 }
      outcome(b, false)
      clock:advance(30)                         -- the failure expires
      outcome(b, true)
      outcome(b, true)
      outcome(b, true)
      outcome(b, false)
      local s = snapshot(b)
      assert.equal(4, s.calls)
      assert.equal(1, s.failures)
      assert.near(0.25, s.failure_rate, 1e-12)
    end)

    it("keeps failure_rate equal to failures / calls over the window", function()
      local b = fuse.new{ fails = 100 }
      for i = 1, 7 do outcome(b, i % 3 ~= 0) end  -- 2 failures in 7
      local s = snapshot(b)
      assert.equal(7, s.calls)
      assert.equal(2, s.failures)
      assert.near(2 / 7, s.failure_rate, 1e-12)
    end)
  end)

  -- The same program prints the same numbers under every Lua: under Lua 5.3+ a whole
  -- number the core gives is an integer (tostring "10", as LuaJIT writes it; not "10.0"),
  -- and an integer option given as a float (3.0) is held as the integer.
  describe("numbers print as LuaJIT prints them", function()
    -- fields whose tostring ends in ".0": a float with a whole value under Lua 5.3+
    local function floats(t)
      local bad = {}
      for k, v in pairs(t) do
        if type(v) == "number" and tostring(v):find("%.0$") then bad[#bad + 1] = k .. "=" .. tostring(v) end
      end
      table.sort(bad)
      return table.concat(bad, " ")
    end

    it("stats(), a rejection's retry_after and fuse.now()", function()
      local b = fuse.new{ fails = 1, open_for = 10, slow = 1 }
      assert.equal("", floats(b:stats()))
      outcome(b, false, 1)
      local s = b:stats()
      assert.equal("", floats(s))
      assert.equal("10 1 1", ("%s %s %s"):format(s.retry_after, s.failure_rate, s.slow_rate))
      local _, rej = b:allow()
      assert.equal("10", tostring(rej.retry_after))
      assert.equal(tostring(clock.now), tostring(fuse.now()))
      clock:advance(2.5)
      assert.equal("7.5", tostring(b:stats().retry_after))
      assert.equal(tostring(clock.now), tostring(fuse.now()))
    end)

    it("an integer option given as 3.0: a full rejection's limit", function()
      local b = fuse.new{ max_concurrent = 1.0, fails = 2.0 }
      local t = b:allow()
      local _, rej = b:allow()
      assert.equal("1", tostring(rej.limit))
      assert.equal("fuse: breaker 'anonymous' is full (1 calls running)", tostring(rej))
      b:report(t, true)
      assert.equal("", floats(b:stats()))
    end)

    -- (push_num's bound: below 1e14 an integer, whose digits are LuaJIT's "%.14g"; from
    -- 1e14 a float, which 5.4 writes in the exponent form LuaJIT writes)
    it("a whole number below 1e14 by its digits, from 1e14 as LuaJIT writes it", function()
      local i = fuse._counter(uname("big"))
      local got = {}
      for _, n in ipairs({ 1e14 - 1, 1, 2 ^ 53 - 1e14 }) do
        fuse._count(i, n)
        got[#got + 1] = tostring(fuse._counter_value(i))
      end
      assert.equal("99999999999999 1e+14 9.007199254741e+15", table.concat(got, " "))
    end)

    it("fuse.events' seq and upto, a named breaker's stats through fuse.get", function()
      local name = uname("numbers")
      local b = fuse.new{ name = name, fails = 1, window = 4 }
      outcome(b, false)
      local list, _, upto = fuse.events()
      assert.equal("", floats(list[#list]))
      assert.equal(tostring(list[#list].seq), tostring(upto))
      assert.equal("", floats(fuse.get(name):stats()))
    end)
  end)

  describe("fuse.metrics()", function()
    -- Parses the exposition: families (name -> {help, type, samples}), in order.
    local function parse(text)
      local families, order, errors = {}, {}, {}
      local function fam(name)
        if not families[name] then
          families[name] = { samples = {} }
          order[#order + 1] = name
        end
        return families[name]
      end
      local lineno = 0
      for line in text:gmatch("([^\n]*)\n") do
        lineno = lineno + 1
        local kind, mname, rest = line:match("^# (%u+) ([%a_:][%w_:]*) ?(.*)$")
        if kind == "HELP" then
          fam(mname).help = rest
        elseif kind == "TYPE" then
          fam(mname).type = rest
        elseif not (line:match("^#") or line == "") then
          local sname, labels, value = line:match('^([%a_:][%w_:]*)(%b{}) (%S+)$')
          if not sname then
            sname, value = line:match("^([%a_:][%w_:]*) (%S+)$")
          end
          if not sname then
            errors[#errors + 1] = lineno .. ": " .. line
          else
            local f = families[sname] or fam(sname)
            f.samples[#f.samples + 1] = { labels = labels or "", value = tonumber(value) }
          end
        end
      end
      return families, order, errors
    end

    local function escape_label(v)
      return (v:gsub('[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
    end

    -- the unescaped value of label `key` in a {...} label set, or nil
    local function label_value(labels, key)
      local i = 2
      while i < #labels do
        local k, j = labels:match("^([%a_][%w_]*)=\"()", i)
        if not k then return nil end
        local buf = {}
        i = j
        while true do
          local c = labels:sub(i, i)
          if c == "" then return nil end
          if c == '"' then break end
          if c == "\\" then
            local n = labels:sub(i + 1, i + 1)
            buf[#buf + 1] = n == "n" and "\n" or n
            i = i + 2
          else
            buf[#buf + 1] = c
            i = i + 1
          end
        end
        if k == key then return table.concat(buf) end
        i = i + 1
        if labels:sub(i, i) == "," then i = i + 1 end
      end
    end

    local function sample_for(family, name)
      local want = 'name="' .. escape_label(name) .. '"'
      for _, smp in ipairs(family.samples) do
        if smp.labels:find(want, 1, true) then return smp end
      end
    end

    local run_promtool = support.promtool   -- status, output of `promtool check metrics`

    local WEIRD = 'a"b\\c' .. "\n" .. "d"

    local named, weird, anon
    setup(function()
      -- breakers created once for the whole block (names are process-wide)
      fuse.clock(function() return clock.now end)
      named = fuse.new{ name = uname("metrics"), fails = 2 }
      weird = fuse.get(WEIRD) or fuse.new{ name = WEIRD, fails = 2 }
      anon = fuse.new{ fails = 2 }
      fuse.clock()
    end)

    it("is a string in the text format: HELP and TYPE for every family", function()
      local text = fuse.metrics()
      assert.is_string(text)
      assert.equal("\n", text:sub(-1))
      local families, order, errors = parse(text)
      assert.same({}, errors)
      assert.is_true(#order > 0)
      for _, name in ipairs(order) do
        local f = families[name]
        assert.is_string(f.help, "no HELP for " .. name)
        assert.is_truthy(({ gauge = true, counter = true })[f.type],
          "TYPE of " .. name .. " is " .. tostring(f.type))
        if f.type == "counter" then
          assert.is_truthy(name:match("_total$"), "counter without _total: " .. name)
        end
        assert.is_true(#f.samples > 0, "family without samples: " .. name)
      end
    end)

    it("has a state gauge with a sample for every named breaker, none for anonymous ones", function()
      local families, order = parse(fuse.metrics())
      local state
      for _, name in ipairs(order) do
        if families[name].type == "gauge" and name:match("state") then state = families[name] end
      end
      assert.is_table(state, "no state gauge")
      local in_metrics = {}
      for _, smp in ipairs(state.samples) do
        local name = label_value(smp.labels, "name")
        assert.is_string(name, "sample without a name label: " .. smp.labels)
        -- a name with a backslash has it doubled (and bytes not UTF-8 as \xHH)
        if name:find("\\", 1, true) then
          name = name:gsub("\\(.)(%x?%x?)", function(c, hex)
            if c == "x" then return string.char(tonumber(hex, 16)) end
            return c .. hex
          end)
        end
        in_metrics[name] = true
      end
      local listed = {}
      for _, name in ipairs(fuse.list()) do listed[name] = true end
      assert.is_true(listed[named.name] and listed[WEIRD])
      assert.is_nil(anon.name)
      assert.same(listed, in_metrics)           -- every named breaker, nothing else
    end)

    it("escapes a name holding a double quote, a backslash and a newline", function()
      assert.equal(WEIRD, weird.name)
      local text = fuse.metrics()
      -- the label value is a"b\\c<newline>d: a backslash in a name is doubled
      assert.is_truthy(text:find('name="a\\"b\\\\\\\\c\\nd"', 1, true), text)
      for line in text:gmatch("[^\n]+") do
        assert.is_falsy(line == "d" or line:match('^d"'), "raw newline in a label: " .. line)
      end
    end)

    -- the metric families fuse.lua documents, and the stats() field each one mirrors
    local FAMILIES = {
      { "fuse_state", "gauge" },
      { "fuse_window_calls", "gauge", "calls" },
      { "fuse_window_failure_rate", "gauge", "failure_rate" },
      { "fuse_calls_total", "counter", "calls_total" },
      { "fuse_successes_total", "counter", "successes_total" },
      { "fuse_failures_total", "counter", "failures_total" },
      { "fuse_slow_calls_total", "counter", "slow_total" },
      { "fuse_rejections_total", "counter", "rejections_total" },
      { "fuse_opens_total", "counter", "opens_total" },
    }
    local STATE_VALUE = { closed = 0, open = 1, half_open = 2, forced_open = 3, disabled = 4 }

    it("has the documented families, with values that agree with b:stats()", function()
      local b = fuse.new{ name = uname("values"), fails = 2, slow = 1 }
      outcome(b, true, 3)
      outcome(b, false)
      outcome(b, false)                         -- opens
      reject(b)
      local families = parse(fuse.metrics())
      local s = b:stats()
      assert.equal("open", s.state)
      for _, m in ipairs(FAMILIES) do
        local f = families[m[1]]
        assert.is_table(f, "missing family " .. m[1])
        assert.equal(m[2], f.type, m[1])
        local smp = sample_for(f, b.name)
        assert.is_table(smp, b.name .. " missing from " .. m[1])
        local want = m[3] and s[m[3]] or STATE_VALUE[s.state]
        assert.near(want, smp.value, 1e-9, m[1])
      end
      assert.equal(1, sample_for(families.fuse_state, b.name).value)
      assert.equal(3, sample_for(families.fuse_calls_total, b.name).value)
      assert.equal(1, sample_for(families.fuse_slow_calls_total, b.name).value)
      assert.equal(1, sample_for(families.fuse_rejections_total, b.name).value)
      assert.equal(1, sample_for(families.fuse_opens_total, b.name).value)

      b:force_open()
      assert.equal(3, sample_for(parse(fuse.metrics()).fuse_state, b.name).value)
      b:disable()
      assert.equal(4, sample_for(parse(fuse.metrics()).fuse_state, b.name).value)
    end)

    it("shows a time-due transition (open -> half_open) in the state gauge", function()
      local b = fuse.new{ name = uname("due"), fails = 1, open_for = 5 }
      outcome(b, false)
      assert.equal(1, sample_for(parse(fuse.metrics()).fuse_state, b.name).value)
      clock:advance(5.01)
      assert.equal(2, sample_for(parse(fuse.metrics()).fuse_state, b.name).value)
    end)

    it("makes no transition itself: the next call makes it and its listener hears it", function()
      local events = {}
      local f, b = fuse.wrap(function() return "up" end, { name = uname("peek"), fails = 1,
        open_for = 5, on_state_change = function(_, from, to) events[#events + 1] = from .. ">" .. to end })
      b:report(assert(b:allow()), false)
      assert.same({ "closed>open" }, events)
      clock:advance(6)
      assert.equal(2, sample_for(parse(fuse.metrics()).fuse_state, b.name).value)
      assert.same({ "closed>open" }, events)          -- the scrape made nothing
      assert.equal("up", f())                          -- the probe, made by this call
      assert.same({ "closed>open", "open>half_open", "half_open>closed" }, events)
    end)

    it("is accepted by `promtool check metrics`", function()
      local which = io.popen("command -v promtool 2>/dev/null")
      local found = which:read("*a")
      which:close()
      if found == "" then
        pending("promtool is not installed")
        return
      end
      local rc, out = run_promtool(fuse.metrics())
      assert.equal(0, rc, out)
      assert.equal("", out)
    end)

    -- The text as fuse.metrics wrote it before it was made cheaper at 100,000 breakers
    -- (one table per breaker, one string.format per line): the reference it must equal
    -- byte for byte, with any numbers and any names.
    local B = jit and require("fuse.ffi") or require("fuse.core")
    local options = require "fuse.options"
    local SERIES = {
      { "fuse_state", "gauge", "Breaker state: 0 closed, 1 open, 2 half_open, 3 forced_open, 4 disabled.", "state" },
      { "fuse_window_calls", "gauge", "Calls (successes and failures) in the current window.", "calls" },
      { "fuse_window_failure_rate", "gauge", "Failures over calls in the current window.", "failure_rate" },
      { "fuse_calls_total", "counter", "Calls whose outcome was recorded.", "calls_total" },
      { "fuse_successes_total", "counter", "Calls recorded as successes.", "successes_total" },
      { "fuse_failures_total", "counter", "Calls recorded as failures.", "failures_total" },
      { "fuse_slow_calls_total", "counter", "Calls that took at least the slow threshold.", "slow_total" },
      { "fuse_rejections_total", "counter", "Calls rejected without running.", "rejections_total" },
      { "fuse_opens_total", "counter", "Times the circuit opened.", "opens_total" },
      { "fuse_running", "gauge", "Guarded calls running now (max_concurrent's permits held).", "running" },
      { "fuse_full_total", "counter", "Calls rejected because max_concurrent calls were running.", "full_total" },
    }
    local function reference()
      local rows, at = {}, {}
      for i = 0, B.count() - 1 do
        local h = B.at(i)
        if h then
          local name, s = B.name_of(h), {}
          B.peek(h, s)
          s.calls_total = s.successes_total + s.failures_total
          if s.state ~= 5 then
            local label = options.utf8_text(name):gsub("[\\\"\n]",
              { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" })
            local k = at[name] or #rows + 1
            at[name], rows[k] = k, { label, s }
          end
        end
      end
      local out = {}
      for _, m in ipairs(SERIES) do
        out[#out + 1] = ("# HELP %s %s\n# TYPE %s %s\n"):format(m[1], m[3], m[1], m[2])
        for _, row in ipairs(rows) do
          out[#out + 1] = ('%s{name="%s"} %.17g\n'):format(m[1], row[1], row[2][m[4]])
        end
      end
      out[#out + 1] = ("# HELP fuse_registry_full_total Calls run unguarded: their breaker was gone "
        .. "and the registry full.\n# TYPE fuse_registry_full_total counter\n"
        .. "fuse_registry_full_total %.17g\n"):format(B.full_total())
      out[#out + 1] = ("# HELP fuse_registry_evictions_total Idle breakers evicted to make room.\n"
        .. "# TYPE fuse_registry_evictions_total counter\nfuse_registry_evictions_total %.17g\n")
        :format(B.evictions_total())
      return table.concat(out)
    end

    -- Numbers a breaker's stats may hold or come near: at the edge of what is written as
    -- digits (14 digits, 1e14, 2^53 and past it), huge counters, rates such as 1/3, the
    -- tiniest doubles, NaN, the infinities and -0; under Lua 5.4 integers past 2^53 and whole
    -- floats (whose tostring ends in ".0") too.
    local AWKWARD = { 0, 1, 7, 1023, 99999999999999, 1e14, 1e14 + 1, 2 ^ 53, 2 ^ 53 + 2, 1e17,
      12345678901234567890, 2 ^ 64, 1 / 3, 2 / 3, 0.1, 1.5, 1e-300, 5e-324, math.huge, -math.huge, 0 / 0, -0.0 }
    local tointeger = rawget(math, "tointeger")  -- (Lua 5.3 and later)
    if tointeger then
      for _, v in ipairs{ 3.0, 0.0 } do AWKWARD[#AWKWARD + 1] = v end
      for _, v in ipairs{ rawget(math, "maxinteger"), 9007199254740993, 99999999999999, 100000000000000, 12 } do
        AWKWARD[#AWKWARD + 1] = tointeger(v)
      end
    end
    local FIELDS = { "calls", "failure_rate", "successes_total", "failures_total", "slow_total",
      "rejections_total", "opens_total", "running", "full_total" }

    it("writes the reference formatter's text byte for byte, with awkward numbers and names", function()
      local names = { uname("plain"), uname('quote"d'), uname("back\\slash"), uname("new\nline"),
        uname("caf\195\169"), uname("bad\255utf8"), uname("lone\128\"\\\n"), uname("\240\159\146\169") }
      for j = 1, #AWKWARD do names[#names + 1] = uname("awkward-" .. j) end
      local row = {}
      for j, n in ipairs(names) do
        fuse.new{ name = n, fails = 1000 }
        row[n] = j
      end
      local peek = B.peek
      B.peek = function(h, s)  -- each field of the named breakers cycles through AWKWARD
        peek(h, s)
        local j = row[B.name_of(h)]
        if j then
          for f, field in ipairs(FIELDS) do s[field] = AWKWARD[(j + f) % #AWKWARD + 1] end
        end
      end
      local ok, got = pcall(fuse.metrics)
      local again_ok, again = pcall(fuse.metrics)  -- (its labels as the first scrape left them)
      local want = reference()
      B.peek = peek
      assert(ok, got)
      assert(again_ok, again)
      for n in pairs(row) do fuse.remove(n) end
      for _, text in ipairs{ got, again } do
        if text ~= want then  -- the first line that differs, not two texts of kilobytes
          local at = 1
          while text:sub(at, at) == want:sub(at, at) do at = at + 1 end
          local from = (want:sub(1, at):match(".*\n()") or 1)
          assert.equal(want:match("[^\n]*", from), text:match("[^\n]*", from))
        end
        assert.equal(#want, #text)
      end
      for _, v in ipairs(AWKWARD) do  -- every number's text is in it
        assert.is_truthy(got:find(('"} %.17g\n'):format(v), 1, true), ("%.17g"):format(v))
      end
    end)
  end)
end)
