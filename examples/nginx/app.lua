-- examples/nginx/app.lua: the Lua side of examples/nginx/nginx.conf.
--
-- setup() runs in init_by_lua, after fuse.init{shared = true}: the breakers it creates
-- live in the shared mapping, and every worker forked afterwards inherits this module
-- (and its breaker objects) with them. Handlers then just use app.get_upstream,
-- app.upstream and app.twostep.
local fuse = require "fuse"

local ngx = ngx
local capture = ngx.location.capture
local shared_fake = ngx.shared.fake

local app = {}

-- The options every worker's breaker shares. Short periods, so the demo and the test
-- see the whole cycle within seconds.
local UPSTREAM = {
  name = "upstream",
  fails = 3,            -- 3 failures inside the window open the circuit, across all workers
  window = 10,
  open_for = 1,         -- then 1 s of fast 503s before a probe is let through
  probes = 1,           -- one probe at a time, across all workers
  probe_timeout = 5,    -- a probe that has not answered in 5 s counts as failed
}

-- Open for 30 s once tripped: long enough for Prometheus (test/ops.t.sh) to see it open.
local TWOSTEP = {
  name = "twostep",
  fails = 3, window = 10, open_for = 30, probes = 1, probe_timeout = 5,
}

-- The guarded call: a 5xx (or no answer at all) is a failure, reported as nil, err.
local function fetch(uri, args)
  local res = capture("/_upstream" .. uri, { args = args })
  if res.status >= 500 then
    return nil, "upstream answered " .. res.status
  end
  return { status = res.status, body = res.body }
end

-- Called with the failure or the rejection, then fetch's arguments.
local function fallback(err)
  if fuse.is_rejection(err) then
    return {
      status = 503,
      header = { ["Retry-After"] = math.max(1, math.ceil(err.retry_after)) },
      body = tostring(err) .. " (" .. err.state .. "), served by the fallback\n",
    }
  end
  return { status = 502, body = "bad gateway: " .. tostring(err) .. "\n" }
end

function app.setup()
  app.get_upstream, app.upstream = fuse.wrap(fetch, {
    name = UPSTREAM.name, fails = UPSTREAM.fails, window = UPSTREAM.window,
    open_for = UPSTREAM.open_for, probes = UPSTREAM.probes,
    probe_timeout = UPSTREAM.probe_timeout, fallback = fallback,
  })
  app.twostep = fuse.new(TWOSTEP)
end

-- Sends a response table {status, header, body} (fetch's or the fallback's).
function app.send(res)
  ngx.status = res.status
  for k, v in pairs(res.header or {}) do
    ngx.header[k] = v
  end
  ngx.print(res.body)
end

-- ---------------------------------------------------------------- /state

local function json_value(v)
  if type(v) == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
  elseif type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return "null" end
    if v == math.floor(v) and math.abs(v) < 2^53 then return string.format("%d", v) end
    return string.format("%.6g", v)
  end
  return tostring(v)
end

local FIELDS = {
  "state", "calls", "failures", "slow", "rejections", "failure_rate", "slow_rate",
  "retry_after", "calls_total", "successes_total", "failures_total", "slow_total",
  "rejections_total", "opens_total",
}

-- {"pid":N,"breakers":{"NAME":{"state":"closed",...},...}} as seen by this worker.
function app.state_json()
  local out = {}
  for _, name in ipairs(fuse.list()) do
    local s = fuse.get(name):stats()
    local kv = {}
    for _, f in ipairs(FIELDS) do
      kv[#kv + 1] = json_value(f) .. ":" .. json_value(s[f])
    end
    out[#out + 1] = json_value(name) .. ":{" .. table.concat(kv, ",") .. "}"
  end
  return '{"pid":' .. ngx.worker.pid() .. ',"breakers":{' .. table.concat(out, ",") .. "}}"
end

-- ---------------------------------------------------------------- the fake upstream
-- Its mode lives in the lua_shared_dict `fake`, so every worker answers alike:
--   mode  ok (200) | fail (500) | slow (sleeps `delay` s, then answers `status`)
--         | hold (waits until /__control?release=1, at most 60 s, then answers `status`)
-- and hits_<mode> counts the requests that reached it, for the test to read.

function app.fake_upstream()
  local mode = shared_fake:get("mode") or "ok"
  shared_fake:incr("hits_" .. mode, 1, 0)
  if mode == "fail" then
    ngx.status = 500
    ngx.say("fake upstream: failing on purpose")
    return
  end
  if mode == "hold" then
    for _ = 1, 1200 do
      if shared_fake:get("release") then break end
      ngx.sleep(0.05)
    end
    ngx.status = shared_fake:get("status") or 200
    ngx.say("fake upstream: held answer")
    return
  end
  if mode == "slow" then
    ngx.sleep(shared_fake:get("delay") or 1)
    ngx.status = shared_fake:get("status") or 200
    ngx.say("fake upstream: slow answer")
    return
  end
  ngx.say("fake upstream: ok")
end

-- The test clock of test/nginx.t.sh: seconds as the test sets them (/__control?advance=S),
-- the same in every worker, so that no step of the test depends on how fast a busy
-- machine answers. The test installs it in init_by_lua, before the fork:
-- fuse.clock(require("app").test_clock). The demo runs on the real clock.
function app.test_clock()
  return shared_fake:get("now") or 1000
end

-- /__control?mode=ok|fail|slow[&delay=S][&status=N]   /__control?reset=hits
-- /__control?advance=S moves the test clock S seconds ahead; /__control?release=1 lets
-- the requests held by mode=hold answer.
function app.fake_control()
  local args = ngx.req.get_uri_args()
  if args.release then shared_fake:set("release", true) end
  local advance = tonumber(args.advance)
  if advance then
    shared_fake:set("now", app.test_clock() + advance)
  end
  if args.reset == "hits" then
    for _, m in ipairs({ "ok", "fail", "slow", "hold" }) do
      shared_fake:set("hits_" .. m, 0)
    end
  end
  local mode = args.mode
  if mode then
    if mode ~= "ok" and mode ~= "fail" and mode ~= "slow" and mode ~= "hold" then
      ngx.status = 400
      ngx.say("mode must be ok, fail, slow or hold")
      return
    end
    shared_fake:delete("release")
    shared_fake:set("delay", tonumber(args.delay) or 1)
    shared_fake:set("status", tonumber(args.status) or 200)
    shared_fake:set("mode", mode)
  end
  app.fake_hits()
end

-- "mode=fail ok=N fail=N slow=N hold=N"
function app.fake_hits()
  ngx.say(string.format("mode=%s ok=%d fail=%d slow=%d hold=%d", shared_fake:get("mode") or "ok",
    shared_fake:get("hits_ok") or 0, shared_fake:get("hits_fail") or 0,
    shared_fake:get("hits_slow") or 0, shared_fake:get("hits_hold") or 0))
end

return app
