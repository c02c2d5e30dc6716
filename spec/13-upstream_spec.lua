-- fuse.upstream without nginx: smooth weighted round robin over the admitted peers,
-- max_ejected and its panic picks, set_peers keeping the state of peers that stay,
-- and option validation with named errors. (The nginx phases: test/upstream.t.sh.)
local fuse = require "fuse"
local upstream = require "fuse.upstream"
local support = require "spec.support"
local BACKEND = support.BACKEND

local unique = support.unique_names("s13")

-- the last port digit of each pick, n picks, each reported as a success
local function order(pool, n)
  local out = {}
  for _ = 1, n do
    local peer, ticket = pool:pick()
    out[#out + 1] = peer.addr:match("(%d+)$")
    if ticket then peer.b:report(ticket, true) end
  end
  return table.concat(out, " ")
end

-- fails a peer's breaker through its own tickets until it opens
local function open_peer(pool, addr)
  local b = fuse.get(pool.name .. "/" .. addr)
  for _ = 1, 100 do
    if b:state() == "open" then return end
    local ticket = b:allow()
    if ticket then b:report(ticket, false) end
  end
  error("could not open " .. addr)
end

describe("fuse.upstream #" .. BACKEND, function()
  support.it_runs_on_backend()
  local clock = support.fake_clock(1000, 100)

  it("picks by smooth weighted round robin (nginx's order for weights 1, 2, 1)", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", { addr = "10.0.0.1:2", weight = 2 }, "10.0.0.1:3" })
    assert.equal("2 1 3 2 2 1 3 2", order(pool, 8))
  end)

  it("honours weights 1:2 exactly over every 3 picks", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", { addr = "10.0.0.1:2", weight = 2 } })
    local n = { ["1"] = 0, ["2"] = 0 }
    for d in order(pool, 300):gmatch("%d") do n[d] = n[d] + 1 end
    assert.same({ ["1"] = 100, ["2"] = 200 }, n)
  end)

  it("skips an open peer and spreads its share by weight over the others", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", { addr = "10.0.0.1:2", weight = 2 }, "10.0.0.1:3" },
      { fails = 2 })
    open_peer(pool, "10.0.0.1:1")
    local s = order(pool, 9)
    assert.falsy(s:find("1"))
    assert.equal("2 3 2 2 3 2 2 3 2", s)
    assert.equal(0, pool:panics())
    assert.equal("open", pool:peers()[1].state)
  end)

  it("opens a peer's breaker after `fails` failures reported through its tickets", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1" }, { fails = 3, max_ejected = 1 })
    for _ = 1, 3 do
      local peer, ticket = pool:pick()
      peer.b:report(ticket, false)
    end
    assert.equal("open", pool:peers()[1].state)
    local peer, retry_after = pool:pick()
    assert.is_nil(peer)
    assert.near(10, retry_after, 1e-6)        -- open_for defaults to window (10 s)
    clock:advance(4)
    assert.near(6, select(2, pool:pick()), 1e-6)
  end)

  it("max_ejected: past floor(max_ejected * #peers) open peers, an open peer is picked (panic, counted)", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", "10.0.0.1:2", "10.0.0.1:3" }, { max_ejected = 0.5 })
    open_peer(pool, "10.0.0.1:1")
    open_peer(pool, "10.0.0.1:2")
    local tickets, panics = 0, 0
    for _ = 1, 30 do
      local peer, ticket = pool:pick()
      assert.truthy(peer)
      if ticket then tickets = tickets + 1; peer.b:report(ticket, true) else panics = panics + 1 end
    end
    assert.equal(15, tickets)                 -- peer 3, and one open peer as if closed: half each
    assert.equal(15, panics)
    assert.equal(15, pool:panics())
    assert.truthy(fuse.metrics():find('fuse_upstream_panic_total{pool="' .. pool.name .. '"} 15', 1, true))
  end)

  it("max_ejected = 0: every open peer is picked as if closed", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", "10.0.0.1:2" }, { max_ejected = 0 })
    open_peer(pool, "10.0.0.1:1")
    assert.equal("1 2 1 2", order(pool, 4))
    assert.equal(2, pool:panics())
  end)

  it("a retry skips peers the request tried; tried peers that are open use up max_ejected", function()
    local pool = upstream.new(unique("p"), { "10.0.0.1:1", "10.0.0.1:2", "10.0.0.1:3" })
    local tried = {}
    local p1, t1 = pool:pick(tried)
    tried[p1] = true
    p1.b:report(t1, true)
    local p2, t2 = pool:pick(tried)
    assert.are_not.equal(p1, p2)
    p2.b:report(t2, true)
    tried[p2] = true
    -- every peer open: the two tried ones count as ejected, so the last one is a panic pick
    for _, a in ipairs({ "10.0.0.1:1", "10.0.0.1:2", "10.0.0.1:3" }) do open_peer(pool, a) end
    local p3, t3 = pool:pick(tried)
    assert.truthy(p3)
    assert.is_nil(t3)
    assert.is_nil(tried[p3])
  end)

  it("set_peers keeps the breaker and state of peers that stay, adds new ones, removes the rest", function()
    local name = unique("p")
    local pool = upstream.new(name, { "10.0.0.1:1", "10.0.0.1:2" })
    open_peer(pool, "10.0.0.1:1")
    pool:set_peers({ "10.0.0.1:1", { addr = "10.0.0.1:3", weight = 3 } })
    assert.same({
      { addr = "10.0.0.1:1", weight = 1, state = "open" },
      { addr = "10.0.0.1:3", weight = 3, state = "closed" },
    }, pool:peers())
    assert.is_nil(fuse.get(name .. "/10.0.0.1:2"))
    assert.truthy(fuse.get(name .. "/10.0.0.1:3"))
    local listed = {}
    for _, n in ipairs(fuse.list()) do listed[n] = true end
    assert.truthy(listed[name .. "/10.0.0.1:1"])
    assert.is_nil(listed[name .. "/10.0.0.1:2"])
  end)

  it("two pools of one name share each peer's breaker (as nginx workers do)", function()
    local name = unique("p")
    local a = upstream.new(name, { "10.0.0.1:1" }, { fails = 1, max_ejected = 1 })
    local b = upstream.new(name, { "10.0.0.1:1" }, { fails = 1, max_ejected = 1 })
    local peer, ticket = a:pick()
    peer.b:report(ticket, false)
    assert.is_nil((b:pick()))
    assert.equal("open", b:peers()[1].state)
  end)

  it("default tries: min(#peers, 3)", function()
    assert.equal(2, upstream.new(unique("p"), { "10.0.0.1:1", "10.0.0.1:2" }):tries())
    assert.equal(3, upstream.new(unique("p"), { "10.9.9.9:1", "10.9.9.9:2", "10.9.9.9:3", "10.9.9.9:4" }):tries())
    assert.equal(5, upstream.new(unique("p"), { "10.9.9.9:1" }, { tries = 5 }):tries())
  end)

  describe("raises at the caller's line, naming what is wrong", function()
    local function err_of(...)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, e = pcall(function(...) local p = upstream.new(...); return p end, ...)
      assert.is_false(ok)
      assert.truthy(e:find("13-upstream_spec.lua:" .. line .. ":", 1, true), e)
      return e
    end

    local function says(e, text) assert.truthy(e:find(text, 1, true), e) end

    it("for the pool name", function()
      says(err_of("", { "10.9.9.9:1" }),
        "pool name must be a string of 1 to 100 bytes without '/', got \"\"")
      assert.truthy(err_of("a/b", { "10.9.9.9:1" }):find("without '/'", 1, true))
      assert.truthy(err_of(nil, { "10.9.9.9:1" }):find("got nil", 1, true))
    end)

    it("for peers", function()
      says(err_of("p", {}),
        "fuse.upstream: peers must be a non-empty list, got an empty table")
      says(err_of("p", "10.9.9.9:1"), 'peers must be a non-empty list, got "10.9.9.9:1"')
      says(err_of("p", { "a" }),
        'peer 1: addr must be "IP:port" or "[IPv6]:port" with a port from 1 to 65535, got "a"')
      assert.truthy(err_of("p", { "10.9.9.9:0" }):find("peer 1: addr must be", 1, true))
      assert.truthy(err_of("p", { "10.9.9.9:1", "10.9.9.9:1" }):find("peer 2: 10.9.9.9:1 is listed twice", 1, true))
      says(err_of("p", { { addr = "10.9.9.9:1", weight = 0 } }),
        "peer 1 (10.9.9.9:1): weight must be an integer from 1 to 1000, got 0")
      assert.truthy(err_of("p", { { addr = "10.9.9.9:1", weight = 1.5 } }):find("got 1.5", 1, true))
      says(err_of("p", { { addr = "10.9.9.9:1", wieght = 2 } }),
        'peer 1: unknown key "wieght"')
      local v6 = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
      says(err_of(("p"):rep(100), { v6 }), "longer than 127 bytes")
      says(err_of("p", { "example.com:80" }), 'got "example.com:80"')
      says(err_of("p", { "10.0.0.256:80" }), 'got "10.0.0.256:80"')
      says(err_of("p", { "[10.0.0.1]:80" }), 'got "[10.0.0.1]:80"')
      assert.truthy(upstream.new(unique("p"), { "[::1]:8080" }))
    end)

    it("for pool options", function()
      says(err_of("p", { "10.9.9.9:1" }, { max_ejected = 2 }),
        "fuse.upstream: option 'max_ejected' must be a number from 0 to 1, got 2")
      says(err_of("p", { "10.9.9.9:1" }, { max_ejected = 0 / 0 }),
        "option 'max_ejected' must be a number from 0 to 1, got nan")  -- not -nan (glibc)
      says(err_of("p", { { addr = "10.9.9.9:1", weight = "2" } }),
        'weight must be an integer from 1 to 1000, got "2"')  -- a string, not the number 2
      says(err_of("p", { 42 }), "with a port from 1 to 65535, got 42")
      says(err_of("p", { "10.9.9.9:1" }, { tries = 0 }),
        "option 'tries' must be an integer from 1 to 100, got 0")
      says(err_of("p", { "10.9.9.9:1" }, { fail_statuses = 500 }),
        "option 'fail_statuses' must be a list of HTTP statuses, got 500")
      says(err_of("p", { "10.9.9.9:1" }, { fail_statuses = { 500, 99 } }),
        "(100 to 599), got 99")
      says(err_of("p", { "10.9.9.9:1" }, { name = "x" }),
        "option 'name' is not allowed")
      says(err_of("p", { "10.9.9.9:1" }, 5), "options must be a table, got 5")
    end)

    it("for breaker options, with fuse's own message", function()
      says(err_of(unique("p"), { "10.9.9.9:1" }, { fails = "x" }),
        "fuse: option 'fails' must be a positive integer, got \"x\"")
      says(err_of(unique("p"), { "10.9.9.9:1" }, { fail = 3 }),
        "fuse: unknown option 'fail' (did you mean 'fails'?)")
    end)

    it("in set_peers", function()
      local pool = upstream.new(unique("p"), { "10.9.9.9:1" })
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, e = pcall(function() pool:set_peers({ "10.9.9.9:1", "10.9.9.9:1" }); return 1 end)
      assert.is_false(ok)
      says(e, "13-upstream_spec.lua:" .. line .. ": fuse.upstream: peer 2: 10.9.9.9:1 is listed twice")
      assert.equal(1, #pool:peers())         -- unchanged
    end)
  end)
end)
