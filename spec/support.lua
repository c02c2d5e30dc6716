-- What the specs share: the backend this run is on and the test that asserts it, a fake
-- clock, unique registry names, one admitted call through the two-step form, the guard
-- of the LuaJIT-only specs, and `promtool check metrics`.
--
--   local support = require "spec.support"
--
-- resolves through "./?.lua" on package.path (LuaJIT, Lua 5.1 and 5.4 all have it), as
-- busted runs from the repository root. Declarations (it, before_each) go to the describe
-- block that calls the function, through busted's API.
local busted = require "busted"
local assert = require "luassert"
local fuse = require "fuse"

local support = {}

-- the backend fuse runs on here: every spec asserts it
support.BACKEND = jit and "ffi" or "capi"

-- Declares the test that the run is on support.BACKEND.
function support.it_runs_on_backend()
  local backend = support.BACKEND
  busted.it("runs on the " .. backend .. " backend", function()
    assert.equal(backend, fuse._backend)
  end)
end

-- Installs a fake clock for every test of the calling describe block and returns it:
-- fuse reads clock.now, which tests read and set directly or move with clock:advance(s).
-- Each test starts at `start`; with `step`, each test starts `step` seconds after where
-- the previous one left the clock instead, so that the clock only ever goes forward.
-- After each test fuse is back on the real clock.
function support.fake_clock(start, step)
  local clock = { now = start }

  function clock:advance(seconds)
    self.now = self.now + seconds
  end

  busted.before_each(function()
    if step then clock.now = clock.now + step else clock.now = start end
    fuse.clock(function() return clock.now end)
  end)

  busted.after_each(function()
    fuse.clock()
  end)

  return clock
end

-- support.reported(finally): for one test, fuse.report_error records its messages instead of
-- writing them to stderr, so that a spec of a listener that raises on purpose prints
-- nothing that reads like a failure; the test asserts on the list. Restored after the
-- test by busted's `finally`, which the test passes (it is not a global of modules).
function support.reported(finally)
  local saved, got = fuse.report_error, {}
  fuse.report_error = function(msg) got[#got + 1] = msg end
  finally(function() fuse.report_error = saved end)
  return got
end

-- Returns a function that makes registry names ("TAG-PREFIX-N") no other call returns:
-- the registry lives as long as the process, so every test takes names of its own.
function support.unique_names(tag)
  local seq = 0
  return function(prefix)
    seq = seq + 1
    return ("%s-%s-%d"):format(tag, prefix, seq)
  end
end

-- one admitted call through the two-step form
function support.outcome(b, ok, seconds)
  local ticket, rej = b:allow()
  assert.is_number(ticket, "call rejected: " .. tostring(rej))
  b:report(ticket, ok, seconds)
end

-- n (default 1) admitted calls that succeed / fail, each taking `seconds` when given
function support.succeed(b, n, seconds)
  for _ = 1, n or 1 do support.outcome(b, true, seconds) end
end

function support.fail(b, n, seconds)
  for _ = 1, n or 1 do support.outcome(b, false, seconds) end
end

-- For a spec file that needs LuaJIT: on another backend, declares one pending test that
-- says so and returns true, and the file returns at once:
--   if support.ffi_only("the JIT specs") then return end
function support.ffi_only(what)
  local backend = support.BACKEND
  if backend == "ffi" then return false end
  busted.describe("fuse #" .. backend, function()
    busted.pending(what .. " need LuaJIT (the ffi backend); this run is on " .. backend)
  end)
  return true
end

-- `promtool check metrics` on text: its exit status and output; nil when promtool is
-- not installed.
function support.promtool(text)
  local which = io.popen("command -v promtool 2>/dev/null")
  local found = which:read("*l")
  which:close()
  if not found then return nil end
  local path = os.tmpname()
  local fh = assert(io.open(path, "wb"))
  fh:write(text)
  fh:close()
  local p = assert(io.popen("promtool check metrics < '" .. path .. "' 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  os.remove(path)
  return tonumber(out:match("rc=(%d+)%s*$")), (out:gsub("rc=%d+%s*$", ""))
end

-- Whether the array `list` holds `x`.
function support.has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

-- Every breaker the admin GET lists, walking its pages (`query`: its other arguments,
-- such as { state = "open" }); and the number of pages.
function support.admin_all(query)
  local admin = require "fuse.admin"
  local all, args, pages = {}, {}, 0
  for k, v in pairs(query or {}) do args[k] = v end
  repeat
    local status, body = admin.handle("GET", args)
    assert.equal(200, status, body.error)
    pages = pages + 1
    for _, b in ipairs(body.breakers) do all[#all + 1] = b end
    args.after = body.next
  until not body.next
  return all, pages
end

-- The interpreter running this spec (busted's --lua), for a script in a process of its
-- own.
function support.interpreter()
  local i = 0
  while arg and arg[i - 1] do i = i - 1 end
  return arg and arg[i] or (jit and "luajit" or "lua")
end

-- Runs the Lua `text` in a fresh process of this interpreter, with this process's paths
-- (busted may have set them with --lpath/--cpath) on line 1; returns what it printed,
-- stderr included. For what is process-wide: a registry sized before any named breaker.
function support.run_child(text)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(("package.path = %q; package.cpath = %q\n"):format(package.path, package.cpath))
  f:write(text)
  f:close()
  local p = assert(io.popen(("%q %q 2>&1"):format(support.interpreter(), script)))
  local out = p:read("*a")
  p:close()
  os.remove(script)
  return out
end

-- Runs `text` as run_child does, for a script that prints one "ok WHAT" or "not ok WHAT:
-- why" line per check: every line must be "ok", and there must be `count` of them.
function support.assert_child(text, count)
  local out = support.run_child(text)
  local n = 0
  for line in out:gmatch("[^\n]+") do
    n = n + 1
    assert.matches("^ok ", line, nil, nil, out)
  end
  assert.equal(count, n, out)
end

return support
