-- The admin endpoint's logic without nginx (test/admin.t.sh runs it in nginx): its
-- options and their errors, what refuses a POST (a browser's cross-site marks, a
-- missing or wrong token, no token configured), and the GET: one breaker (?name=), a
-- state (?state=), pages (?limit=, ?after=) that keep 100,000 breakers from making one
-- response of megabytes, and UTF-8 JSON for any name.
local fuse = require "fuse"
local admin = require "fuse.admin"
local support = require "spec.support"
local BACKEND = support.BACKEND

local TOKEN = "0123456789abcdef0123"

-- Whether s is valid UTF-8 (RFC 3629), checked here on its own, not with fuse's code.
local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi
    lo, hi = 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
      lo = c == 0xE0 and 0xA0 or 0x80
      hi = c == 0xED and 0x9F or 0xBF
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
      lo = c == 0xF0 and 0x90 or 0x80
      hi = c == 0xF4 and 0x8F or 0xBF
    else return false end
    for k = 1, len - 1 do
      local d = s:byte(i + k)
      if not d or d < (k == 1 and lo or 0x80) or d > (k == 1 and hi or 0xBF) then return false end
    end
    i = i + len
  end
  return true
end

describe("fuse.admin #" .. BACKEND, function()
  support.fake_clock(7000, 10)
  local uname = support.unique_names("adm18-" .. BACKEND)
  local cjson = require "cjson.safe"

  support.it_runs_on_backend()

  describe("its options", function()
    local cases = {
      { { tokn = TOKEN }, "fuse: unknown option 'tokn' (did you mean 'token'?)" },
      { { [1] = TOKEN }, "fuse: option names must be strings, got key 1 (value \"" .. TOKEN .. "\")" },
      { { token = 42 }, "fuse: option 'token' must be a string of 16 or more printable ASCII characters "
        .. "without spaces (openssl rand -hex 16 makes one), got 42" },
      { { token = "short-secret" }, "got a string of 12 bytes" },
      { { token = "a secret with spaces in it" }, "got a string of 26 bytes with a space or a byte outside" },
      { { token = TOKEN .. "\233" }, "with a space or a byte outside printable ASCII" },
      { "x", 'fuse: fuse.admin needs a table such as { token = "..." } or nothing, got "x"' },
    }
    for _, c in ipairs(cases) do
      it("raise a message that names what is wrong: " .. c[2], function()
        local ok, err = pcall(fuse.admin, c[1])
        assert.is_false(ok)
        assert.truthy(err:find(c[2], 1, true), err)
        if type(c[1]) == "table" and type(c[1].token) == "string" and #c[1].token ~= #TOKEN then
          assert.is_nil(err:find(c[1].token, 1, true), "the message shows the secret: " .. err)
        end
      end)
    end

    it("are checked before anything else: good ones, or none, get to the need for nginx", function()
      if rawget(_G, "ngx") then return end
      for _, opts in ipairs { { token = TOKEN }, {} } do
        assert.has_error(function() fuse.admin(opts) end, "fuse: fuse.admin needs OpenResty (the nginx Lua module)")
      end
      assert.has_error(function() fuse.admin() end, "fuse: fuse.admin needs OpenResty (the nginx Lua module)")
    end)
  end)

  describe("a POST", function()
    local HOST = "127.0.0.1:9145"
    local function headers(t)
      local h = { host = HOST, authorization = "Bearer " .. TOKEN }
      for k, v in pairs(t or {}) do h[k] = v end
      if h.authorization == false then h.authorization = nil end
      if h.host == false then h.host = nil end
      return h
    end

    it("with the token and no cross-site mark is accepted", function()
      for _, h in ipairs {
        headers(),
        headers { authorization = "bearer " .. TOKEN },   -- the scheme is case-insensitive
        headers { authorization = "Bearer  " .. TOKEN .. " " },
        headers { ["sec-fetch-site"] = "same-origin" },
        headers { ["sec-fetch-site"] = "none" },           -- typed in by the user
        headers { origin = "http://127.0.0.1:9145" },
        headers { origin = "https://127.0.0.1:9145" },
        headers { origin = "http://LOCALHOST", host = "localhost:80" },
        headers { origin = "http://localhost:80", host = "localhost" },
      } do
        assert.is_nil(admin.refused(h, TOKEN))
      end
    end)

    it("without the token, or with another one, is refused", function()
      for _, h in ipairs {
        headers { authorization = false },
        headers { authorization = "Bearer " },
        headers { authorization = "Bearer " .. TOKEN .. "x" },
        headers { authorization = "Bearer " .. TOKEN:sub(2) },
        headers { authorization = "Basic " .. TOKEN },
        headers { authorization = TOKEN },
        headers { authorization = { "Bearer " .. TOKEN, "Bearer " .. TOKEN } },  -- the header twice
      } do
        local why = admin.refused(h, TOKEN)
        assert.equal('POST needs "Authorization: Bearer <token>" with fuse.admin\'s token', why)
      end
    end)

    it("with a browser's cross-site marks is refused, even with the token", function()
      local cases = {
        { { ["sec-fetch-site"] = "cross-site" }, 'Sec-Fetch-Site: "cross-site"' },
        { { ["sec-fetch-site"] = "same-site" }, 'Sec-Fetch-Site: "same-site"' },  -- another port
        { { origin = "http://evil.example" }, 'Origin "http://evil.example", this endpoint is "127.0.0.1:9145"' },
        { { origin = "http://127.0.0.1:8080" }, 'Origin "http://127.0.0.1:8080"' },
        { { origin = "http://127.0.0.1" }, 'Origin "http://127.0.0.1"' },
        { { origin = "null" }, 'Origin "null"' },               -- a sandboxed frame, a file
        { { origin = "http://127.0.0.1:9145/x" }, "Origin" },
        { { origin = { "http://127.0.0.1:9145", "http://evil.example" } }, "Origin table" },
        { { origin = "http://127.0.0.1:9145", host = false }, "this endpoint is nil" },
        { { origin = "http://evil.example", ["sec-fetch-site"] = "cross-site" }, "Sec-Fetch-Site" },
      }
      for _, c in ipairs(cases) do
        local why = admin.refused(headers(c[1]), TOKEN)
        assert.is_string(why)
        assert.truthy(why:find("a browser's request from another site", 1, true), why)
        assert.truthy(why:find(c[2], 1, true), why)
        assert.equal(why, admin.refused(headers(c[1]), nil))  -- refused always
      end
    end)

    it("is refused when fuse.admin has no token (fuse.admin()), whatever it sends", function()
      local why = 'POST needs a token: fuse.admin{ token = "..." }, sent as "Authorization: Bearer <token>"'
      assert.equal(why, admin.refused(headers(), nil))
      assert.equal(why, admin.refused(headers { authorization = false }, nil))
    end)
  end)

  describe("a POST's body", function()
    it("is read as a form only when it is one, and its fields only from it", function()
      for _, ct in ipairs { "application/x-www-form-urlencoded",
        "application/x-www-form-urlencoded; charset=UTF-8", "Application/X-WWW-Form-Urlencoded",
        " application/x-www-form-urlencoded;charset=utf-8" } do
        assert.is_nil(admin.not_a_form(ct, nil), ct)
        assert.is_nil(admin.not_a_form(ct, ""), ct)
      end
      assert.is_nil(admin.not_a_form(nil, nil))  -- a client that names no type
      local WANT = "a POST's body is a form, Content-Type: application/x-www-form-urlencoded "
        .. "(as curl -d sends it), got Content-Type "
      for _, c in ipairs {
        { "application/json", '"application/json"' },
        { "multipart/form-data; boundary=x", '"multipart/form-data; boundary=x"' },
        { "text/plain", '"text/plain"' },
        { "application/x-www-form-urlencodedx", '"application/x-www-form-urlencodedx"' },
        { { "application/x-www-form-urlencoded", "application/json" }, "table" },  -- the header twice
      } do
        assert.equal(WANT .. c[2], admin.not_a_form(c[1], nil))
      end
      assert.equal("a POST takes its fields in a form body (curl -d 'name=N&action=A'), not in the query string",
        admin.not_a_form("application/x-www-form-urlencoded", "name=x&action=reset"))
    end)
  end)

  describe("a POST's fields", function()
    -- (fails) a POST with no action answered "action must be force_open, reset or
    -- disable, got nil"
    it("missing or empty: a 400 that says which", function()
      local name = uname("post")
      fuse.new { name = name, fails = 3 }
      local function err(args) local status, body = admin.handle("POST", args); return status .. " " .. body.error end
      assert.equal("400 missing action: action=force_open, reset or disable", err { name = name })
      assert.equal('400 action must be force_open, reset or disable, got ""', err { name = name, action = "" })
      assert.equal('400 action must be force_open, reset or disable, got ""', err { name = name, action = true })
      assert.equal("400 missing name", err { action = "reset" })
      assert.equal("400 empty name: name=N names the breaker", err { name = "", action = "reset" })
      assert.equal("400 empty name: name=N names the breaker", err { name = true, action = "reset" })
      assert.equal("closed", fuse.get(name):state())
    end)
  end)

  -- (fails) ngx gives a repeated field as a table of its values, and the endpoint took the
  -- last: name=a&name=b acted on b alone, action=reset&action=force_open forced it open
  describe("a field given twice", function()
    it("is a 400 naming the field, and nothing is done", function()
      local a, b = uname("twice"), uname("twice")
      fuse.new { name = a, fails = 3 }
      fuse.new { name = b, fails = 3 }
      local cases = {
        { "POST", { name = { a, b }, action = "force_open" }, "name", 2 },
        { "POST", { name = a, action = { "reset", "force_open" } }, "action", 2 },
        { "POST", { name = a, action = "force_open", seconds = { "1", "2", "3" } }, "seconds", 3 },
        { "POST", { name = { a, a }, action = { "force_open", "force_open" } }, "action", 2 },  -- sorted: action first
        { "GET", { name = { a, b } }, "name", 2 },
        { "GET", { state = { "open", "closed" } }, "state", 2 },
        { "GET", { limit = { "1", "2" } }, "limit", 2 },
        { "HEAD", { after = { "1", "2" } }, "after", 2 },
      }
      for _, c in ipairs(cases) do
        local status, body = admin.handle(c[1], c[2])
        assert.same({ 400, ("field '%s' is given %d times: give it once"):format(c[3], c[4]) },
          { status, body.error })
      end
      assert.same({ "closed", "closed" }, { fuse.get(a):state(), fuse.get(b):state() })
    end)
  end)

  describe("a GET", function()
    it("?name= answers that breaker alone, 404 for a name unknown", function()
      local name = uname("one")
      local b = fuse.new { name = name, fails = 3 }
      support.fail(b)
      local status, body = admin.handle("GET", { name = name })
      assert.equal(200, status)
      assert.same({ name, "closed", 1, 1 }, { body.name, body.state, body.calls, body.failures })
      status, body = admin.handle("GET", { name = uname("none") })
      assert.equal(404, status)
      assert.matches("^no breaker named \"adm18%-", body.error)
      assert.equal(404, (admin.handle("GET", { name = ("x"):rep(300) })))  -- longer than any name
      assert.equal(404, (admin.handle("GET", { name = "a\0b" })))
      status, body = admin.handle("GET", { name = name, state = "open" })
      assert.equal(400, status)
      assert.equal("name asks for one breaker: it takes no state, limit or after", body.error)
    end)

    -- (fails) ?name= (empty) was a 404, "no breaker named """: it names no breaker
    it("?name= empty, or a bare ?name, is 400 that says the name is empty", function()
      for _, v in ipairs { "", true } do
        local status, body = admin.handle("GET", { name = v })
        assert.same({ 400, "empty name: ?name=N asks for breaker N" }, { status, body.error })
      end
    end)

    it("?state= lists the breakers in that state only; 400 for a state unknown", function()
      local opened, closed = uname("st"), uname("st")
      fuse.new { name = closed, fails = 3 }
      fuse.new { name = opened, fails = 3 }:force_open()
      local all = support.admin_all { state = "forced_open" }
      local names = {}
      for _, e in ipairs(all) do
        assert.equal("forced_open", e.state)
        names[e.name] = true
      end
      assert.is_true(names[opened])
      assert.is_nil(names[closed])
      for _, s in ipairs { "opened", "OPEN", "", "closed,open" } do
        local status, body = admin.handle("GET", { state = s })
        assert.equal(400, status)
        assert.equal("state must be closed, open, half_open, forced_open or disabled, got " .. ('"%s"'):format(s),
          body.error)
      end
      fuse.get(opened):reset()
    end)

    it("pages: 100 by default, ?limit= up to 1000, ?after= the previous page's next", function()
      local status, body = admin.handle("GET", { limit = "1" })
      assert.equal(200, status)
      assert.equal(1, #body.breakers)
      assert.is_string(body.next)
      local first = body.breakers[1].name
      status, body = admin.handle("GET", { limit = "1", after = body.next })
      assert.equal(200, status)
      assert.not_equal(first, body.breakers[1].name)
      for _, bad in ipairs { { limit = "0" }, { limit = "1001" }, { limit = "ten" }, { limit = "1.5" },
        { limit = "" }, { limit = "-1" }, { after = "x" }, { after = "-1" }, { after = "1e3" } } do
        local k, v = next(bad)
        status, body = admin.handle("GET", bad)
        assert.equal(400, status)
        local want = k == "limit" and "limit must be a whole number from 1 to 1000, got "
          or "after must be the next of an earlier page, got "
        assert.equal(want .. ('"%s"'):format(v), body.error)
      end
      status, body = admin.handle("GET", { after = "99999999" })  -- past the end: an empty last page
      assert.same({ 200, 0, nil }, { status, #body.breakers, body.next })
      assert.equal('{"breakers":[],"next":null}', admin.encode(body))
    end)

    it("answers valid UTF-8 JSON for any name, each written as fuse.metrics() writes it", function()
      local names = { uname("caf\233"), uname("ok-caf\195\169"), uname("back\\slash"), uname("\255\254"),
        uname("cut\226\130") }
      for _, n in ipairs(names) do fuse.new { name = n, fails = 3 } end
      local metrics = fuse.metrics()
      for _, n in ipairs(names) do
        local status, body = admin.handle("GET", { name = n })
        assert.equal(200, status)
        local json = admin.encode(body)
        assert.is_true(valid_utf8(json), json)
        local j = cjson.decode(json)
        -- the metrics' label value is the same text, with the text format's escapes
        local escaped = j.name:gsub('[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" })
        assert.truthy(metrics:find('fuse_state{name="' .. escaped .. '"}', 1, true), j.name)
      end
      local function shown(n) return select(2, admin.handle("GET", { name = n })).name end
      assert.equal((names[1]:gsub("\233", "\\xE9")), shown(names[1]))  -- é in Latin-1: not UTF-8
      assert.equal(names[2], shown(names[2]))                            -- valid UTF-8: as is
      assert.equal((names[3]:gsub("\\", "\\\\")), shown(names[3]))         -- a backslash: doubled
      assert.equal((names[4]:gsub("\255\254", "\\xFF\\xFE")), shown(names[4]))
      assert.equal((names[5]:gsub("\226\130", "\\xE2\\x82")), shown(names[5]))  -- a cut character
      -- the whole listing too, and the errors that show a name
      for _, e in ipairs(support.admin_all()) do assert.is_true(valid_utf8(cjson.encode(e))) end
      local status, body = admin.handle("POST", { name = "nope\233", action = "reset" })
      assert.equal(404, status)
      assert.is_true(valid_utf8(admin.encode(body)))
      status, body = admin.handle("POST", { name = names[1], action = "reset" })
      assert.equal(200, status)
      assert.equal((names[1]:gsub("\233", "\\xE9")), body.name)
    end)

    it("of 100,000 breakers: pages of 100 (at most 1000, < 300 kB), and a state looked for "
      .. "among 5000 at most a page", function()
      local out = support.run_child([[
        local fuse = require "fuse"
        local admin = require "fuse.admin"
        fuse.init{ capacity = 100000 }
        for i = 1, 100000 do fuse.new{ name = ("k%06d"):format(i), fails = 3 } end
        for _, i in ipairs { 3, 50000, 99998 } do fuse.get(("k%06d"):format(i)):force_open() end
        local _, first = admin.handle("GET")
        local _, big = admin.handle("GET", { limit = "1000" })
        print("default", #first.breakers, first.next, #admin.encode(first))
        print("max", #big.breakers, big.next, #admin.encode(big))
        local _, st = admin.handle("GET", { state = "forced_open" })
        local _, st2 = admin.handle("GET", { state = "forced_open", after = st.next })
        print("state", #st.breakers, st.breakers[1].name, st.next, #st2.breakers, st2.next)
      ]])
      local d_n, d_next, d_size = out:match("default\t(%d+)\t(%d+)\t(%d+)")
      assert.same({ "100", "100" }, { d_n, d_next }, out)
      local m_n, m_next, m_size = out:match("max\t(%d+)\t(%d+)\t(%d+)")
      assert.same({ "1000", "1000" }, { m_n, m_next }, out)
      assert.is_true(tonumber(m_size) < 300000, out)
      assert.is_true(tonumber(d_size) < 30000, out)
      -- the first 5000 slots hold one, the next 5000 none: a page may be empty, next says go on
      assert.truthy(out:find("state\t1\tk000003\t5000\t0\t10000\n", 1, true), out)
    end)
  end)
end)
