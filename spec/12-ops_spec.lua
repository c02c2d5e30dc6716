-- Operating it: a timed force-open (fake clock), the transition events ring
-- (fuse.events, the watch poller and its overrun report) and the admin endpoint's
-- request handling (fuse.admin's logic, without nginx).
local fuse = require "fuse"
local admin = require "fuse.admin"
local support = require "spec.support"
local BACKEND = support.BACKEND

local EPS = 1e-6

describe("fuse #" .. BACKEND, function()
  local clock = support.fake_clock(5000, 100)
  local uname = support.unique_names("ops-" .. BACKEND)

  -- a listener that keeps "from>to" strings
  local function recorder()
    local seen = {}
    return seen, function(_, from, to) seen[#seen + 1] = from .. ">" .. to end
  end

  support.it_runs_on_backend()

  describe("b:force_open(seconds)", function()
    it("rejects for that long, with retry_after counting down, then probes decide", function()
      local seen, on = recorder()
      local b = fuse.new { name = uname("timed"), fails = 3, open_for = 10, on_state_change = on }
      b:force_open(5)
      assert.same({ "closed>forced_open" }, seen)
      assert.equal("forced_open", b:state())
      assert.near(5, b:stats().retry_after, EPS)
      local ran = false
      local r, rej = b:call(function() ran = true end)
      assert.is_nil(r)
      assert.is_false(ran)
      assert.equal("forced_open", rej.state)
      assert.near(5, rej.retry_after, EPS)
      clock:advance(4.5)
      assert.near(0.5, rej.retry_after, EPS)
      assert.equal("forced_open", b:state())
      clock:advance(0.5)  -- exactly at the end: over
      assert.equal("half_open", b:state())
      -- state() made both transitions, reported in order
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open" }, seen)
      assert.equal(0, b:stats().retry_after)
      support.succeed(b)  -- the probe
      assert.equal("closed", b:state())
    end)

    -- as after an ordinary open period: the first call after the end is the probe (it
    -- made forced_open -> open -> half_open), and nothing is rejected or counted for it
    local function first_call_after_the_end(lifted)
      local seen, on = recorder()
      local b = fuse.new { name = uname(lifted and "lift" or "plain"), fails = 1, open_for = 2,
                           on_state_change = on }
      if lifted then b:force_open(2) else support.fail(b) end
      local before = b:stats().rejections_total
      clock:advance(3)
      local ran = 0
      assert.equal("ok", b:call(function() ran = ran + 1; return "ok" end))
      assert.equal(1, ran)
      assert.equal(before, b:stats().rejections_total)
      return seen, b
    end

    it("the first call after the end is the probe, as after an open period", function()
      local seen = first_call_after_the_end(true)
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open", "half_open>closed" }, seen)
      local plain = first_call_after_the_end(false)
      assert.same({ "closed>open", "open>half_open", "half_open>closed" }, plain)
    end)

    it("after the end, `probes` calls are admitted at once through allow, each listener once", function()
      local _, _, since = fuse.events()
      local seen, on = recorder()
      local name = uname("allow")
      local b = fuse.new { name = name, fails = 3, probes = 2, on_state_change = on }
      b:force_open(1)
      clock:advance(1)
      local t1 = b:allow()
      local t2 = b:allow()
      local t3, rej = b:allow()
      assert.is_number(t1)
      assert.is_number(t2)
      assert.is_nil(t3)
      assert.equal("half_open", rej.state)
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open" }, seen)
      local got = {}
      for i, e in ipairs(fuse.events(since)) do got[i] = e.from .. ">" .. e.to end
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open" }, got)
      b:report(t1, true)
      assert.equal("half_open", b:state())
      b:report(t2, true)
      assert.equal("closed", b:state())
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open", "half_open>closed" }, seen)
    end)

    it("the first call after the end, failing, re-opens for open_for", function()
      local seen, on = recorder()
      local b = fuse.new { name = uname("fail1"), fails = 3, open_for = 7, on_state_change = on }
      b:force_open(1)
      clock:advance(1)
      local _, err = b:call(function() return nil, "down" end)
      assert.equal("down", err)
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open", "half_open>open" }, seen)
      assert.equal("open", b:state())
      assert.near(7, b:stats().retry_after, EPS)
    end)

    it("a failed probe after the lift re-opens for open_for", function()
      local b = fuse.new { name = uname("reopen"), fails = 3, open_for = 7 }
      b:force_open(1)
      clock:advance(1)
      assert.equal("half_open", b:state())
      support.fail(b)
      assert.equal("open", b:state())
      assert.near(7, b:stats().retry_after, EPS)
    end)

    it("without seconds it stays forced_open until reset, whatever the clock does", function()
      local b = fuse.new { name = uname("untimed"), fails = 3 }
      b:force_open(1)
      b:reset()
      b:force_open()  -- a later untimed force-open is not lifted by the earlier end
      clock:advance(1e6)
      assert.equal("forced_open", b:state())
      assert.equal(0, b:stats().retry_after)
      local _, rej = b:call(function() end)
      assert.equal("forced_open", rej.state)
      b:reset()
      assert.equal("closed", b:state())
    end)

    it("a reset ends a timed force-open early; a second force_open restarts the time", function()
      local b = fuse.new { name = uname("again"), fails = 3 }
      b:force_open(10)
      b:reset()
      assert.equal("closed", b:state())
      b:force_open(10)
      clock:advance(6)
      b:force_open(10)
      clock:advance(6)
      assert.equal("forced_open", b:state())
      assert.near(4, b:stats().retry_after, EPS)
    end)

    it("is shared: another object of the same name sees it and its end", function()
      local name = uname("shared")
      local a = fuse.new { name = name, fails = 3 }
      local b2 = fuse.get(name)
      a:force_open(3)
      assert.equal("forced_open", b2:state())
      clock:advance(3)
      assert.equal("half_open", b2:state())
      assert.equal("half_open", a:state())
    end)

    it("metrics show a due timed force-open as half_open without making the transition", function()
      local seen, on = recorder()
      local name = uname("peek")
      local b = fuse.new { name = name, fails = 3, on_state_change = on }
      b:force_open(1)
      clock:advance(2)
      local line = fuse.metrics():match('fuse_state{name="' .. name:gsub("%-", "%%-") .. '"} (%d+)')
      assert.equal("2", line)
      assert.same({ "closed>forced_open" }, seen)
    end)

    it("raises for seconds that are not a number in (0, 2764800]", function()
      local b = fuse.new { fails = 3 }
      -- shown as fuse.options shows values: a string in quotes, never read as a number;
      -- nan, not glibc's -nan
      local cases = { { 0, "0" }, { -1, "-1" }, { 0 / 0, "nan" }, { 1 / 0, "inf" }, { 2764801, "2764801" },
        { "5", '"5"' }, { true, "true" }, { {}, "table" } }
      for _, c in ipairs(cases) do
        assert.has_error(function() b:force_open(c[1]) end,
          "fuse: force_open's seconds must be a number in (0, 2764800], got " .. c[2])
      end
      assert.equal("closed", b:state())
    end)

    it("works on an anonymous breaker too", function()
      local b = fuse.new { fails = 3 }
      b:force_open(0.5)
      assert.equal("forced_open", b:state())
      clock:advance(0.5)
      assert.equal("half_open", b:state())
    end)
  end)

  describe("fuse.events", function()
    it("records every transition of named breakers, oldest first, with seq > since", function()
      local _, _, since = fuse.events()
      local name = uname("ev")
      local b = fuse.new { name = name, fails = 1, open_for = 1 }
      local function failing() return nil, "boom" end
      fuse.new { fails = 1 }:call(failing)  -- anonymous: not recorded
      b:call(failing)                       -- closed -> open
      clock:advance(1)
      b:state()                           -- open -> half_open
      b:force_open(2)                     -- half_open -> forced_open
      local list, lost, upto = fuse.events(since)
      assert.equal(0, lost)
      assert.equal(3, #list)
      local got = {}
      for i, e in ipairs(list) do
        got[i] = e.name .. ":" .. e.from .. ">" .. e.to
        assert.equal(since + i, e.seq)
        assert.is_number(e.pid)
        assert.is_true(e.pid > 0)
        assert.is_true(math.abs(e.time - os.time()) < 60, "time is wall-clock seconds")
      end
      assert.same({ name .. ":closed>open", name .. ":open>half_open", name .. ":half_open>forced_open" }, got)
      assert.equal(list[3].seq, upto)
      -- since: only the newer ones
      local later = fuse.events(list[2].seq)
      assert.equal(1, #later)
      assert.equal("forced_open", later[1].to)
      local none, lost2, upto2 = fuse.events(upto)
      assert.same({}, none)
      assert.equal(0, lost2)
      assert.equal(upto, upto2)
    end)

    it("records the lift of a timed force-open", function()
      local _, _, since = fuse.events()
      local name = uname("evlift")
      local b = fuse.new { name = name, fails = 1 }
      b:force_open(1)
      clock:advance(1)
      b:state()
      local got = {}
      for i, e in ipairs(fuse.events(since)) do got[i] = e.from .. ">" .. e.to end
      assert.same({ "closed>forced_open", "forced_open>open", "open>half_open" }, got)
    end)

    it("counts what the ring overwrote as lost, never skipping it silently", function()
      local _, _, since = fuse.events()
      local b = fuse.new { name = uname("flood"), fails = 1 }
      for _ = 1, 600 do b:force_open(); b:reset() end  -- 1200 transitions, ring of 1024
      local list, lost, upto = fuse.events(since)
      assert.equal(1024, #list)
      assert.equal(176, lost)
      assert.equal(since + 1200, upto)
      assert.equal(since + 177, list[1].seq)
    end)

    it("gives seq, pid and upto as whole numbers that print as such under every Lua", function()
      local _, _, since = fuse.events()
      fuse.new { name = uname("evint"), fails = 1 }:force_open()
      local list, _, upto = fuse.events(since)
      assert.equal(1, #list)
      -- (Lua 5.4 prints a float 3.0 as "3.0": a seq in a log line or a JSON key would read so)
      for what, v in pairs { seq = list[1].seq, pid = list[1].pid, upto = upto, since = since } do
        assert.equal(("%d"):format(v), tostring(v), what)
      end
    end)

    -- (fails) a since beyond the newest event answered {}, lost 0, upto = since: a caller
    -- holding a seq of another ring (nginx restarted, the shared zone made anew) skipped
    -- this ring's events until its seq passed the caller's, and was told nothing was lost
    it("reads a since beyond the newest event (another ring's seq) from this ring's start", function()
      fuse.new { name = uname("evfar"), fails = 1 }:force_open()
      local _, _, last = fuse.events()
      local list, lost, upto = fuse.events(last + 1000)
      assert.equal(last, upto)
      assert.is_true(#list >= 1)
      assert.equal(last, list[#list].seq)
      assert.equal(last, #list + lost)  -- each event of this ring: listed, or counted lost
      local list0, lost0, upto0 = fuse.events(0)
      assert.same({ #list0, lost0, upto0, list0[1].seq }, { #list, lost, upto, list[1].seq })
      -- a since this ring has reached reads as before
      local none, lost2, upto2 = fuse.events(last)
      assert.same({ 0, 0, last }, { #none, lost2, upto2 })
      assert.equal(("%d"):format(upto), tostring(fuse.events(2 ^ 53 - 1) and select(3, fuse.events(2 ^ 53 - 1))))
    end)

    it("raises for a since that is not a seq", function()
      assert.has_error(function() fuse.events(-1) end,
        "fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got -1")
      assert.has_error(function() fuse.events("x") end,
        'fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got "x"')
      assert.has_error(function() fuse.events(0 / 0) end,
        "fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got nan")
      -- (the message said ">= 0" for these too)
      assert.has_error(function() fuse.events(2 ^ 53) end,
        "fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got 9007199254740992")
      assert.has_error(function() fuse.events(1 / 0) end,
        "fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got inf")
    end)
  end)

  describe("the watch poller", function()
    it("delivers each new transition once, in order, and reports an overrun", function()
      local calls = {}
      local poll = admin.poller(function(name, from, to) calls[#calls + 1] = { name, from, to } end)
      local name = uname("watch")
      local b = fuse.new { name = name, fails = 1 }
      b:force_open()
      b:reset()
      poll()
      assert.same({ { name, "closed", "forced_open" }, { name, "forced_open", "closed" } }, calls)
      poll()
      assert.equal(2, #calls)  -- nothing new: nothing delivered again
      calls = {}
      for _ = 1, 520 do b:force_open(); b:reset() end  -- 1040 transitions between polls
      poll()
      assert.same({ nil, "overrun", 16 }, calls[1])
      assert.equal(1 + 1024, #calls)
      assert.same({ name, "closed", "forced_open" }, calls[2])
    end)

    it("an error in the callback is reported and the next poll goes on", function()
      local reported = {}
      local saved = fuse.report_error
      fuse.report_error = function(msg) reported[#reported + 1] = msg end
      local n = 0
      local poll = admin.poller(function() n = n + 1; error("boom") end)
      local b = fuse.new { name = uname("watcherr"), fails = 1 }
      b:force_open()
      poll()
      b:reset()
      poll()
      fuse.report_error = saved
      assert.equal(2, n)
      assert.equal(2, #reported)
      assert.matches("fuse.watch callback failed: .*boom", reported[1])
    end)

    it("an error in the callback that fuse.report_error cannot report still leaves the rest delivered", function()
      local saved = fuse.report_error
      fuse.report_error = function() error("the reporter is down") end
      local seen = {}
      local poll = admin.poller(function(_, from, to) seen[#seen + 1] = from .. ">" .. to; error("boom") end)
      local b = fuse.new { name = uname("watchrep"), fails = 1 }
      b:force_open()
      b:reset()
      local ok, err = pcall(poll)
      b:disable()
      local ok2 = pcall(poll)
      fuse.report_error = saved
      assert.is_true(ok, tostring(err))  -- (was: the reporter's error ended the poll)
      assert.is_true(ok2)
      assert.same({ "closed>forced_open", "forced_open>closed", "closed>disabled" }, seen)
    end)

    -- ngx.timer.every starts each poll at its time, whether the one before ended or not
    -- (test/ops.t.sh sees it in nginx); here two coroutines stand for two timers.
    it("a callback that yields: a poll meanwhile delivers nothing, and each transition comes once, in order",
      function()
        -- pcall lets a coroutine yield under LuaJIT and Lua 5.4, not under Lua 5.1
        if not coroutine.wrap(function() return pcall(coroutine.yield, true) end)() then return end
        local log = {}
        local poll = admin.poller(function(_, from, to)
          log[#log + 1] = "start " .. from .. ">" .. to
          if to == "forced_open" then coroutine.yield() end  -- a cosocket, ngx.sleep
          log[#log + 1] = "end " .. from .. ">" .. to
        end)
        local b = fuse.new { name = uname("watchyield"), fails = 1 }
        b:force_open()
        local first = coroutine.create(poll)
        assert.is_true(coroutine.resume(first))            -- delivers closed>forced_open, which yields
        b:reset()
        local second = coroutine.create(poll)
        local ok, n = coroutine.resume(second)              -- the next tick, while the first still runs
        assert.is_true(ok)
        assert.same({ "dead", nil }, { coroutine.status(second), n })
        assert.is_true(coroutine.resume(first))            -- the callback ends
        assert.equal("dead", coroutine.status(first))
        assert.equal(1, poll())                             -- the poll after it: forced_open>closed
        assert.same({ "start closed>forced_open", "end closed>forced_open",
          "start forced_open>closed", "end forced_open>closed" }, log)
      end)

    -- ngx.exit in the callback ends the timer's coroutine inside pcall (test/watch.t.sh
    -- in nginx); Lua 5.4's coroutine.close stands for it here.
    it("a poll whose coroutine died in the callback does not stop the watch", function()
      if not rawget(coroutine, "close") then return end
      local seen = {}
      local poll = admin.poller(function(_, from, to)
        seen[#seen + 1] = from .. ">" .. to
        if to == "forced_open" then coroutine.yield() end
      end)
      local b = fuse.new { name = uname("watchdead"), fails = 1 }
      b:force_open()
      local co = coroutine.create(poll)
      assert.is_true(coroutine.resume(co))
      assert.is_true(rawget(coroutine, "close")(co))  -- dead, never back in the poll
      b:reset()
      assert.equal(1, poll())
      assert.same({ "closed>forced_open", "forced_open>closed" }, seen)
    end)
  end)

  describe("the admin endpoint's requests", function()
    it("GET lists every named breaker with state, retry_after, window counts and totals", function()
      local name = uname("adm")
      local b = fuse.new { name = name, fails = 3 }
      support.succeed(b, 2)
      support.fail(b)
      local all = support.admin_all()
      local mine
      for _, e in ipairs(all) do if e.name == name then mine = e end end
      assert.is_table(mine)
      assert.equal("closed", mine.state)
      assert.equal(0, mine.retry_after)
      assert.equal(3, mine.calls)
      assert.equal(1, mine.failures)
      assert.equal(0, mine.rejections)
      assert.equal(3, mine.calls_total)
      -- every page walked: each breaker once
      local count = {}
      for _, e in ipairs(all) do count[e.name] = (count[e.name] or 0) + 1 end
      for _, n in ipairs(fuse.list()) do assert.equal(1, count[require("fuse.options").utf8_text(n)], n) end
      assert.equal(#fuse.list(), #all)
      local json = admin.encode({ breakers = { mine } })
      assert.matches('"name":"' .. name:gsub("%-", "%%-") .. '"', json)
      assert.matches('^{"breakers":%[', json)
    end)

    it("POST force_open with seconds, reset, disable act and answer the new state", function()
      local name = uname("adm")
      local b = fuse.new { name = name, fails = 3 }
      local status, body = admin.handle("POST", { name = name, action = "force_open", seconds = "30" })
      assert.equal(200, status)
      assert.equal("forced_open", body.state)
      assert.near(30, body.retry_after, EPS)
      assert.equal("forced_open", b:state())
      clock:advance(30)
      assert.equal("half_open", b:state())
      status, body = admin.handle("POST", { name = name, action = "disable" })
      assert.equal(200, status)
      assert.equal("disabled", body.state)
      status, body = admin.handle("POST", { name = name, action = "force_open" })
      assert.same({ 200, "forced_open", 0 }, { status, body.state, body.retry_after })
      -- a field given twice is refused (it took the last one), and nothing is done
      status, body = admin.handle("POST", { name = name, action = { "disable", "reset" } })
      assert.same({ 400, "field 'action' is given 2 times: give it once" }, { status, body.error })
      assert.equal("forced_open", b:state())
    end)

    it("answers 400 for a bad request and 404 for an unknown name, each with an error", function()
      local name = uname("adm")
      local b = fuse.new { name = name, fails = 3 }
      -- (it said "a number in (0, 2764800]" to "1e3", which is one)
      local BAD = "seconds must be decimal digits (30, 2.5) for a number in (0, 2764800], got "
      local cases = {
        { {}, 400, "missing name" },
        { { name = "", action = "reset" }, 400, "empty name: name=N names the breaker" },
        { { name = true, action = "reset" }, 400, "empty name: name=N names the breaker" },
        { { name = name }, 400, "missing action: action=force_open, reset or disable" },
        { { name = name, action = "explode" }, 400, 'action must be force_open, reset or disable, got "explode"' },
        { { name = name, action = "\233" }, 400, 'action must be force_open, reset or disable, got "\\xE9"' },
        { { name = name, action = "force_open", seconds = "abc" }, 400, BAD .. '"abc"' },
        { { name = name, action = "force_open", seconds = "-5" }, 400, BAD .. '"-5"' },
        { { name = name, action = "force_open", seconds = "0" }, 400, BAD .. '"0"' },
        { { name = name, action = "force_open", seconds = "0x10" }, 400, BAD .. '"0x10"' },
        { { name = name, action = "force_open", seconds = "inf" }, 400, BAD .. '"inf"' },
        { { name = name, action = "force_open", seconds = "1e3" }, 400, BAD .. '"1e3"' },
        { { name = name, action = "force_open", seconds = " 30" }, 400, BAD .. '" 30"' },
        { { name = name, action = "force_open", seconds = "9999999" }, 400, BAD .. '"9999999"' },
        { { name = name, action = "reset", seconds = "5" }, 400, "seconds applies to force_open only" },
        { { name = "nope\233", action = "reset" }, 404, 'no breaker named "nope\\xE9"' },
        -- a field it does not take: a typo would change the action (force_open for good)
        { { name = name, action = "force_open", second = "30" }, 400,
          "unknown field 'second' (did you mean 'seconds'?)" },
        { { nmae = name, action = "reset" }, 400, "unknown field 'nmae' (did you mean 'name'?)" },
        { { name = name, action = "reset", ["{\"x\":1}"] = true }, 400,
          "unknown field '{\"x\":1}' (a POST takes name, action, seconds)" },
      }
      for _, c in ipairs(cases) do
        local status, body = admin.handle("POST", c[1])
        assert.equal(c[2], status)
        assert.is_string(body.error)
        if c[3] then assert.equal(c[3], body.error) end
      end
      for _, c in ipairs {
        { { stat = "open" }, "unknown field 'stat' (did you mean 'state'?)" },
        { { name = name, action = "force_open" }, "unknown field 'action' (a GET takes name, state, limit, after; "
          .. "an action is a POST of name=N&action=A[&seconds=S])" },
        { { pretty = true }, "unknown field 'pretty' (a GET takes name, state, limit, after)" },
      } do
        for _, method in ipairs { "GET", "HEAD" } do
          local status, body = admin.handle(method, c[1])
          assert.same({ 400, c[2] }, { status, body.error })
        end
      end
      local status, body = admin.handle("DELETE")
      assert.equal(405, status)
      assert.equal('method "DELETE" not allowed: GET, HEAD or POST', body.error)
      assert.equal("closed", b:state())  -- nothing acted
      assert.equal('{"error":"missing name"}', admin.encode({ error = "missing name" }))
    end)

    it("fuse.watch starts in init_worker or a timer, and raises in any other phase", function()
      if rawget(_G, "ngx") then return end
      local phase, started = nil, 0
      local fake = { get_phase = function() return phase end, req = {},
        timer = { every = function() started = started + 1; return true end } }
      local function watch_in(p)
        phase = p
        rawset(_G, "ngx", fake)
        local ok, err = pcall(fuse.watch, function() end)
        rawset(_G, "ngx", nil)
        return ok, err
      end
      for _, p in ipairs { "init_worker", "timer" } do assert.is_true((watch_in(p))) end
      assert.equal(2, started)
      for _, c in ipairs {
        { "init", "init_by_lua* (the master, which runs no timers)" },  -- (was: "no request")
        { "content", "the content phase" },  -- (was: a watch more for each request)
        { "access", "the access phase" },
        { "log", "the log phase" },
      } do
        local ok, err = watch_in(c[1])
        assert.is_false(ok)
        assert.equal("fuse: fuse.watch belongs in init_worker_by_lua* (it watches for the worker's life), not in "
          .. c[2], err)
      end
      assert.equal(2, started)
    end)

    it("fuse.reject and fuse.watch say they need OpenResty outside nginx", function()
      if rawget(_G, "ngx") then return end
      local b = fuse.new { fails = 1 }
      b:force_open()
      local _, rej = b:call(function() end)
      assert.equal(1, admin.retry_after(rej))  -- untimed: at least 1
      assert.has_error(function() fuse.reject(rej) end,
        "fuse: fuse.reject needs OpenResty (the nginx Lua module)")
      assert.has_error(function() fuse.reject("x") end, 'fuse: fuse.reject needs a rejection, got "x"')
      assert.has_error(function() fuse.reject({}) end, "fuse: fuse.reject needs a rejection, got table")
      assert.has_error(function() fuse.watch(function() end) end,
        "fuse: fuse.watch needs OpenResty (the nginx Lua module)")
      -- a callable table is a callable fn (docs/api.md: "fn not callable"), as for fuse.wrap
      local callable = setmetatable({}, { __call = function() end })
      assert.has_error(function() fuse.watch(callable) end,
        "fuse: fuse.watch needs OpenResty (the nginx Lua module)")
      assert.has_error(function() fuse.watch({}) end, "fuse: fuse.watch needs a function, got table")
      b:force_open(2.2)
      _, rej = b:call(function() end)
      assert.equal(3, admin.retry_after(rej))  -- rounded up
    end)
  end)

  describe("the alert rules and the dashboard", function()
    local function read(file)
      local f = assert(io.open(file, "rb"))
      local text = f:read("*a")
      f:close()
      return text
    end

    -- the metric names fuse.metrics() exports (its # TYPE lines)
    local function exported()
      local names = {}
      for name in fuse.metrics():gmatch("# TYPE (%S+)") do names[name] = true end
      return names
    end

    -- every fuse_* name in the queries of `exprs`, which must not be empty
    local function used(exprs)
      assert.is_true(#exprs > 0)
      local names = {}
      for _, e in ipairs(exprs) do
        for name in e:gmatch("fuse_[%w_]+") do names[#names + 1] = name end
      end
      return names
    end

    it("the rules query only metric names fuse exports", function()
      local exprs = {}
      for e in read("examples/prometheus/fuse-alerts.yml"):gmatch("\n%s*expr:%s*([^\n]+)") do
        exprs[#exprs + 1] = e
      end
      local have = exported()
      local names = used(exprs)
      assert.same({ "fuse_state", "fuse_opens_total", "fuse_full_total" }, names)
      for _, n in ipairs(names) do assert.is_true(have[n], n .. " is not exported by fuse.metrics()") end
    end)

    it("the dashboard is JSON whose panels query only metric names fuse exports", function()
      local cjson = require "cjson.safe"
      local dash = assert(cjson.decode(read("examples/grafana/fuse-dashboard.json")))
      local exprs = {}
      for _, p in ipairs(dash.panels) do
        for _, t in ipairs(p.targets) do exprs[#exprs + 1] = t.expr end
      end
      exprs[#exprs + 1] = dash.templating.list[1].definition
      local have = exported()
      local names = used(exprs)
      assert.is_true(#names >= 6)
      for _, n in ipairs(names) do assert.is_true(have[n], n .. " is not exported by fuse.metrics()") end
    end)
  end)

  describe("fuse.settle, and fuse.log its old name", function()
    it("fuse.log() does what fuse.settle() does, and says once per process it is deprecated", function()
      local out = support.run_child([[
local fuse = require "fuse"
assert(type(fuse.settle) == "function")
fuse.settle()                -- outside nginx: nothing to settle, nothing said
io.stderr:write("after settle\n")
for _ = 1, 3 do fuse.log() end
]])
      assert.equal("after settle\nfuse: fuse.log() is deprecated: call fuse.settle(), which does the "
        .. 'same (log_by_lua_block { require("fuse").settle() })\n', out)
    end)
  end)
end)
