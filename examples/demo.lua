-- examples/demo.lua -- a circuit breaker in action, one line per event.
--
--   make demo
--   (or, from the repo root: LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;"
--    luajit examples/demo.lua)
--
-- A price service answers its first call, fails the next four, then recovers. We guard it
-- with fuse.wrap and call it every half second. Time is simulated: fuse.clock(fn) makes
-- the breaker read our variable `now` instead of the real clock, so the demo runs
-- instantly and prints the same thing every time.

local fuse = require "fuse"

local now = 0                            -- simulated seconds
fuse.clock(function() return now end)

local function say(fmt, ...)
  print(("[t=%4.1fs] "):format(now) .. fmt:format(...))
end

-- The flaky service. It knows nothing about the breaker.
local served = 0
local function fetch_price(item)
  served = served + 1
  if served >= 2 and served <= 5 then
    say("    service: call #%d for %s ... fails: timeout", served, item)
    return nil, "timeout"                -- `nil, err` counts as a failure
  end
  local price = 100 + served
  say("    service: call #%d for %s ... ok: %d", served, item, price)
  return price
end

local last_good = { apple = 101 }        -- what the fallback serves

local why = {
  ["closed->open"] = "   (3 failures within 10 s: calls are now rejected, the service is left alone)",
  ["open->half_open"] = "   (open_for is over: this call is let through as a probe)",
  ["half_open->open"] = "   (the probe failed: open again for another 2 s)",
  ["half_open->closed"] = "   (the probe succeeded: back to normal, with a fresh window)",
}

local get_price, breaker = fuse.wrap(fetch_price, {
  name = "prices",
  fails = 3,          -- 3 failures ...
  window = 10,        -- ... within 10 seconds open the circuit
  open_for = 2,       -- it stays open 2 seconds, then lets one probe through
  -- The fallback answers instead of the service: for a failed call (err is the error)
  -- and for a rejected one (err is a rejection, which says when to retry).
  fallback = function(err, item)
    if fuse.is_rejection(err) then
      say("    fallback: circuit %s, service not called (retry in %.1fs) -> last known price",
        err.state, err.retry_after)
    else
      say("    fallback: the call failed (%s) -> last known price", tostring(err))
    end
    return last_good[item], "stale"
  end,
  on_state_change = function(name, from, to)
    say("*** breaker '%s': %s -> %s%s", name, from, to, why[from .. "->" .. to] or "")
  end,
})

print("fuse demo -- simulated time (fuse.clock): runs instantly, same output every run.")
print("get_price = fuse.wrap(fetch_price, {fails = 3, window = 10, open_for = 2, fallback = ...})")
print("The service answers call #1, fails calls #2 to #5, then recovers. We call it every 0.5 s.")
print("Indented lines happen inside a call; '***' lines are the breaker changing state;")
print("'=>' is what the caller gets, with the breaker's state after the call.")
print()

for step = 0, 12 do
  now = step * 0.5
  say("get_price(\"apple\")")
  local price, note = get_price("apple")
  if price ~= nil and note == nil then last_good.apple = price end
  local st = breaker:stats()
  local where = st.state == "closed"
    and ("closed, %d of 3 failures in the window"):format(st.failures)
    or st.state
  say("    => %s%s   [%s]", tostring(price), note and (" (" .. note .. ")") or "", where)
end

print()
local s = breaker:stats()
print(("Summary (breaker:stats()): state %s; %d calls reached the service: %d succeeded, %d failed;")
  :format(s.state, s.calls_total, s.successes_total, s.failures_total))
print(("%d calls were rejected without touching it; the circuit opened %d times.")
  :format(s.rejections_total, s.opens_total))
print(("In the current window (fresh since the circuit closed): %d call(s), %d failure(s), %d rejection(s).")
  :format(s.calls, s.failures, s.rejections))

fuse.clock()                             -- back to the real clock
