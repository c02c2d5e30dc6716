-- fuse.upstream's nginx phases (pool:balance(), pool:log()) under a fake nginx
-- (spec/fake_nginx.lua), where a gateway operator meets them: pools changed or closed by
-- another worker while a request is in flight. Each check says how the code before its
-- fix failed. (The same phases in a real nginx: test/upstream.t.sh.)
local fuse = require "fuse"
local support = require "spec.support"

if support.ffi_only("fuse.upstream's phases under a fake nginx") then return end

local unique = support.unique_names("s23")

describe("fuse.upstream's phases #ffi", function()
  support.it_runs_on_backend()
  local clock = support.fake_clock(1000, 100)

  -- The keys of the fake nginx's shared dict that belong to pool `name`.
  local function keys_of(nginx, name)
    local out = {}
    for _, k in ipairs(nginx.ngx.shared.fuse_upstream:get_keys(0)) do
      if ("/" .. k .. "/"):find("/" .. name .. "/", 1, true) then out[#out + 1] = k end
    end
    table.sort(out)
    return out
  end

  it("an error_page to another pool's location judges the earlier pool's try as that pool is now: "
    .. "closed by another worker, it counts nothing", function()
    -- (fails) the balancer of the new pool's first try judged the earlier pool's last try
    -- with that pool's copy as this worker last saw it: closed in another worker since,
    -- the try's failure made its counter again, c/E/ADDR/status, and
    -- fuse_upstream_failures_total{pool="E"} showed for a closed pool for good (close
    -- deletes a pool's keys once; a copy that learns of it later deletes nothing).
    local nginx = require("spec.fake_nginx").new()
    local req, var = nginx.req, nginx.var
    local e, s = unique("e"), unique("s")
    local E = nginx.upstream.new(e, { "10.0.0.1:1" })
    local S = nginx.upstream.new(s, { "10.0.0.2:1" })
    local other = nginx.upstream.new(e, { "10.0.0.1:1" })  -- E in another worker
    req.start, req.internal, req.failure, req.code = 2000, false, nil, nil
    E:balance()                       -- the request's one try in pool E
    other:close()                     -- meanwhile, another worker closes E
    -- the try failed with a 500; error_page sends the request to a location of pool S
    req.internal = true
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "500 : ", "0.001 : ", "0.001 : "
    S:balance()
    assert.same({}, keys_of(nginx, e))
    assert.falsy(nginx.module.metrics():find('pool="' .. e .. '"', 1, true))
    assert.is_nil(fuse.get(e .. "/10.0.0.1:1"))
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "500 : 200", "0.001 : 0.001",
      "0.001 : 0.001"
    S:log()
    assert.same({}, keys_of(nginx, e))
    S:close()
  end)

  it("an error_page to another pool's location: a peer the earlier pool's list dropped meanwhile "
    .. "(another worker's set_peers) counts nothing", function()
    -- (fails) as above: the dropped peer's counter, removed by set_peers, came back
    local nginx = require("spec.fake_nginx").new()
    local req, var = nginx.req, nginx.var
    local e, s = unique("e"), unique("s")
    local E = nginx.upstream.new(e, { "10.0.0.1:1" })
    local S = nginx.upstream.new(s, { "10.0.0.2:1" })
    local other = nginx.upstream.new(e, { "10.0.0.1:1" })
    req.start, req.internal, req.failure, req.code = 3000, false, nil, nil
    E:balance()
    assert.is_true(other:set_peers({ "10.0.0.1:2" }))   -- another worker drops the peer
    req.internal = true
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "500 : ", "0.001 : ", "0.001 : "
    S:balance()
    assert.equal(0, other:failures("10.0.0.1:1", "status"))
    assert.falsy(nginx.module.metrics():find('peer="10.0.0.1:1"', 1, true))
    E:close()
    S:close()
  end)

  it("a try that no peer admits (max_ejected = 1), on a retry or a first try, ends as nginx's own "
    .. "balancer ends one with no live peer: ngx.exit(NGX_BUSY), nginx's 502, with Retry-After", function()
    -- (fails) ngx.exit(ngx.ERROR), -1: nginx answered 500, whatever the last try had got
    -- (test/upstream.t.sh asks a real nginx: 502 "no live upstreams")
    local nginx = require("spec.fake_nginx").new()
    local req, var = nginx.req, nginx.var
    local name = unique("np")
    local pool = nginx.upstream.new(name, { "10.0.0.1:1", "10.0.0.1:2" },
      { fails = 1, open_for = 30, max_ejected = 1, tries = 2 })
    local b1, b2 = fuse.get(name .. "/10.0.0.1:1"), fuse.get(name .. "/10.0.0.1:2")
    b2:force_open(20)
    req.start, req.internal, req.failure, req.code = 7000, false, nil, nil
    pool:balance()                         -- the first try: 10.0.0.1:1, the one peer admitted
    assert.equal("10.0.0.1:1", nginx.set[#nginx.set])
    -- it answers 504 (a status: its header came): nginx retries, and the failure opens it
    req.failure, req.code = "failed", 504
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "504, ", "0.001, ", "0.001, "
    assert.error_matches(function() pool:balance() end, "ngx.exit(-3)", 1, true)
    assert.equal("open", b1:state())
    assert.equal(20, nginx.ngx.header["Retry-After"])  -- the soonest: 10.0.0.1:2's
    assert.equal(1, #nginx.set)                        -- no peer set for the retry
    -- the next request's first try: both open
    nginx.ngx.header["Retry-After"] = nil
    req.start, req.failure, req.code = 7001, nil, nil
    assert.error_matches(function() pool:balance() end, "ngx.exit(-3)", 1, true)
    assert.equal(20, nginx.ngx.header["Retry-After"])
    assert.equal(1, #nginx.set)
    pool:close()
  end)

  it("a request whose log phase never ran (a subrequest) gives its tickets back when its address "
    .. "serves the next request: its max_concurrent permit, its probe (as failed)", function()
    -- (fails) the record was cleared for the next request with the tickets of its tries
    -- dropped: each held its peer's max_concurrent permit for good (with max_concurrent =
    -- 1 the peer was full for good: the next request's pick was a panic pick, and so was
    -- every later one), and a probe held its slot until probe_timeout
    local nginx = require("spec.fake_nginx").new()
    local req, var = nginx.req, nginx.var
    local name = unique("sub")
    local pool = nginx.upstream.new(name, { "10.0.0.1:1" }, { max_concurrent = 1, fails = 1, open_for = 5 })
    local b = fuse.get(name .. "/10.0.0.1:1")
    req.start, req.internal, req.failure, req.code = 5000, false, nil, nil
    pool:balance()                       -- a subrequest's try (nginx runs no log phase for it)
    assert.equal(1, b:stats().running)
    req.start = 5001                     -- the next request at that address
    pool:balance()
    assert.equal(0, pool:panics())       -- the peer admitted it: not full
    assert.equal(1, b:stats().running)   -- (its own call)
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "200", "0.001", "0.001"
    nginx.ngx.status = 200
    pool:log()
    assert.equal(0, b:stats().running)
    -- a probe whose log phase never ran: given back as failed, as probe_timeout would
    b:report(b:allow(), false)
    clock:advance(6)
    req.start = 5002
    pool:balance()
    assert.equal("half_open", b:state())
    local opens = b:stats().opens_total
    req.start = 5003
    pool:balance()
    assert.equal("open", b:state())
    assert.equal(opens + 1, b:stats().opens_total)
    assert.equal(0, b:stats().running)   -- (this request's pick: in panic, without a ticket)
    pool:close()
  end)

  -- A pool with max_concurrent = 1 whose peer another worker's set_peers drops (or whose
  -- pool it closes) while a request's try on it is in flight; the try ends (pool:log()),
  -- then a breaker is made in the freed registry slot (a registry of `capacity` slots, in
  -- a process of its own). Prints "admitted" or "full" for that breaker's first call.
  local function next_breaker_after(case, capacity)
    return support.run_child(([[
local fuse = require "fuse"
fuse.init{ capacity = %d }
local nginx = require("spec.fake_nginx").new()
local case = %q
local pool = nginx.upstream.new("mc", { "10.0.0.1:1" }, { max_concurrent = 1 })
local other = nginx.upstream.new("mc", { "10.0.0.1:1" }, { max_concurrent = 1 })  -- another worker's
nginx.req.start = 10
pool:balance()                                  -- the try on 10.0.0.1:1 holds its permit
if case == "close" then other:close() else assert(other:set_peers({ "10.0.0.1:2" })) end
local status = case == "500" and "500" or "200"
nginx.var.upstream_status, nginx.var.upstream_header_time = status, "0.001"
nginx.var.upstream_response_time, nginx.ngx.status = "0.001", tonumber(status)
pool:log()                                      -- the try ends
local b = fuse.new{ name = "next", max_concurrent = 1 }   -- in the dropped peer's slot
print(b:allow() and "admitted" or "full", b:stats().running)
]]):format(capacity, case))
  end

  it("a try in flight on a peer that set_peers drops or close removes gives its max_concurrent "
    .. "permit back: the slot's next breaker is not full", function()
    -- (fails) the log phase reported nothing for a peer removed meanwhile: its ticket held
    -- its permit for good, and a registry slot keeps the permits of the breaker that was
    -- there (for its calls to give back), so the next breaker made in that slot (another
    -- pool's peer, the peer added again) started with one call running: "full 1" for a
    -- success, a 500 and a close alike
    assert.equal("admitted\t1\n", next_breaker_after("200", 2))   -- (2: the new peer takes the other slot)
    assert.equal("admitted\t1\n", next_breaker_after("500", 2))
    assert.equal("admitted\t1\n", next_breaker_after("close", 1))
  end)

  -- (fails) pool.log() for pool:log() took the request's record, as upstream.log() does
  -- (self nil), then raised "attempt to index local 'self' (a nil value)" in upstream.lua:
  -- the try was never reported, its ticket held until probe_timeout
  it("pool.log() (a dot for the colon) judges the request's tries as upstream.log() does", function()
    local nginx = require("spec.fake_nginx").new()
    local req, var = nginx.req, nginx.var
    local name = unique("dot")
    local P = nginx.upstream.new(name, { "10.0.0.1:1" }, { fails = 1 })
    req.start, req.internal, req.failure, req.code = 9000, false, nil, nil
    P:balance()
    var.upstream_status, var.upstream_header_time, var.upstream_response_time = "500", "0.001", "0.001"
    nginx.ngx.status = 500
    P.log()
    assert.equal(1, P:failures("10.0.0.1:1", "status"))
    assert.equal("open", P:peers()[1].state)
    P:close()
  end)
end)
