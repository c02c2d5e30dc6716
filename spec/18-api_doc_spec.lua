-- docs/api.md documents every public name: each function and field of the module
-- `fuse`, each method of a breaker object, each function of `fuse.upstream` and each
-- method of a pool has a heading of its own ("### fuse.wrap", "### b:call",
-- "### upstream.new", "### pool:balance"); each option of fuse.wrap and of fuse.init,
-- each pool option and each metric family fuse.metrics() prints has a row or a mention.
-- A name added to the code and not to the reference fails here.
local fuse = require "fuse"
local support = require "spec.support"
local BACKEND = support.BACKEND

local ROOT = debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "") .. "../"

local function read(file)
  local f = assert(io.open(ROOT .. file, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local DOC = read("docs/api.md")

local headings = {}
for h in DOC:gmatch("\n### ([^\n]+)") do headings[h] = true end

-- public names of a table: keys without a leading underscore, sorted
local function public(t, want_type)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" and (not want_type or type(v) == want_type) then
      out[#out + 1] = k
    end
  end
  table.sort(out)
  return out
end

local function missing_headings(prefix, names)
  local out = {}
  for _, k in ipairs(names) do
    if not headings[prefix .. k] then out[#out + 1] = prefix .. k end
  end
  return out
end

describe("docs/api.md #" .. BACKEND, function()
  support.it_runs_on_backend()

  it("has a heading for every public name of the module fuse", function()
    local names = public(fuse)
    assert.is_true(#names >= 15, "fuse exports " .. #names .. " names")
    assert.same({}, missing_headings("fuse.", names))
  end)

  it("has a heading for every method of a breaker object", function()
    local mt = getmetatable(fuse.new{})
    local names = public(mt, "function")
    assert.is_true(#names >= 9, "breaker methods: " .. table.concat(names, ", "))
    assert.same({}, missing_headings("b:", names))
  end)

  it("has a heading for every function of fuse.upstream and every method of a pool", function()
    local upstream = require "fuse.upstream"
    assert.same({}, missing_headings("upstream.", public(upstream, "function")))
    local pool = upstream.new("apidoc" .. tostring(os.time()), { "127.0.0.1:1" })
    local names = public(getmetatable(pool), "function")
    assert.is_true(#names >= 5, "pool methods: " .. table.concat(names, ", "))
    assert.same({}, missing_headings("pool:", names))
  end)

  it("has a row for every option of fuse.wrap and names every option of fuse.init", function()
    local options = require "fuse.options"
    local absent = {}
    for _, k in ipairs(options.NAMES) do
      if not DOC:find("\n| `" .. k .. "` |", 1, true) then absent[#absent + 1] = k end
    end
    local init = DOC:match("\n### fuse.init\n(.-)\n### ")
    for _, k in ipairs(options.INIT_NAMES) do
      if not init:find("`" .. k, 1, true) then absent[#absent + 1] = "init: " .. k end
    end
    assert.same({}, absent)
  end)

  it("names every pool option of upstream.new", function()
    local keys = require("fuse.pool_config").POOL_NAMES
    assert.is_true(#keys >= 7, "fuse.pool_config.POOL_NAMES lists " .. #keys .. " options")
    local new = DOC:match("\n### upstream.new\n(.-)\n### ")
    local absent = {}
    for _, k in ipairs(keys) do
      if not new:find("`" .. k .. "`", 1, true) then absent[#absent + 1] = k end
    end
    assert.same({}, absent)
  end)

  it("has a row for every metric family fuse.metrics() prints", function()
    fuse.new{ name = "apidoc-metrics", fails = 1 }
    local absent, seen = {}, 0
    for family in fuse.metrics():gmatch("# TYPE (%S+)") do
      seen = seen + 1
      if not DOC:find("| `" .. family .. "` |", 1, true) then absent[#absent + 1] = family end
    end
    assert.is_true(seen >= 9, "fuse.metrics() printed " .. seen .. " families")
    assert.same({}, absent)
  end)
  -- Every message the reference pages quote (a code span that starts "fuse: " or
  -- "fuse.upstream: ") is what fuse says: each is provoked here and matched, its "..." any
  -- text, NAME a breaker's name, N a number. A quoted message with no provocation below
  -- fails too, so that a new one is checked when it is written.
  it("quotes every message as fuse raises or shows it", function()
    local upstream = require "fuse.upstream"
    local me = debug.getinfo(1, "S").short_src:match("[^/]*$")
    local function raised(f)  -- f's error, which must name the caller's line (here)
      local ok, err = pcall(f)
      assert.is_false(ok)
      err = tostring(err)
      local at, text = err:match("^(.-):%d+: (.*)$")
      assert.equal(me, at and at:match("[^/]*$"), err)
      return text
    end
    local function child(text)  -- a registry of its own: the last line it prints
      return support.run_child(text):match("([^\n]*)\n$")
    end
    local function open_rejection()
      local f = fuse.wrap(function() error("down") end, { fails = 1 })
      pcall(f)
      return select(2, f())
    end
    local provoke = {
      [ [[fuse: option 'fails' must be a positive integer, got "x"]] ] = function()
        return raised(function() local f = fuse.wrap(print, { fails = "x" }); return f end)
      end,
      ["fuse: unknown option 'fail' (did you mean 'fails'?)"] = function()
        return raised(function() local f = fuse.wrap(print, { fail = 3 }); return f end)
      end,
      ["fuse: cannot create breaker 'NAME': breaker registry is full ..."] = function()
        return child([[
          local fuse = require "fuse"
          fuse.init{ capacity = 1 }
          fuse.new{ name = "one" }
          print(select(2, pcall(fuse.new, { name = "two" })))]])
      end,
      ["fuse: breaker 'x' already exists with other options (existing vs given): fails (5 vs 3)"] = function()
        return child([[
          local fuse = require "fuse"
          fuse.new{ name = "x" }
          print(select(2, pcall(fuse.new, { name = "x", fails = 3 })))]])
      end,
      ["fuse: option 'capacity' must be a positive integer, got 0"] = function()
        return raised(function() local r = fuse.init{ capacity = 0 }; return r end)
      end,
      ["fuse: call b:state(), not b.state(): self is nil, not a breaker"] = function()
        local b = fuse.new{}
        return raised(function() local s = b.state(); return s end)
      end,
      ["fuse: report: ... was already reported"] = function()
        local b = fuse.new{}
        local t = b:allow()
        b:report(t, true)
        return raised(function() b:report(t, true) end)
      end,
      ["fuse: circuit 'NAME' is open"] = function() return tostring(open_rejection()) end,
      ["fuse: breaker 'NAME' is full (N calls running)"] = function()
        local b = fuse.new{ max_concurrent = 1 }
        local t = b:allow()
        local _, rej = b:allow()
        b:report(t, true)
        return tostring(rej)
      end,
      ["fuse: a rejection is read-only ..."] = function()
        local rej = open_rejection()
        return raised(function() rej.retry_after = 0 end)
      end,
      ["fuse: is_failure of breaker 'NAME' must return true, false or nil, got ..."] = function()
        local f = fuse.wrap(print, { name = "apidoc-judge", is_failure = function() return 1 end })
        return raised(function() local r = f(); return r end)
      end,
      ["fuse: unknown option 'tokn' (did you mean 'token'?)"] = function()
        return raised(function() local r = fuse.admin{ tokn = "x" }; return r end)
      end,
      [ [[fuse.upstream: peer 1: more than one '::' in an IPv6 address, got "[::1::2]:80"]] ] = function()
        return raised(function() local p = upstream.new("apidoc-msg", { "[::1::2]:80" }); return p end)
      end,
      ["fuse.upstream: peer 2: 10.0.0.1:080 is listed twice (peer 1, 10.0.0.1:80, is the same "
        .. "address: 10.0.0.1:80)"] = function()
          return raised(function()
            local p = upstream.new("apidoc-msg", { "10.0.0.1:80", "10.0.0.1:080" }); return p
          end)
        end,
      ["fuse.upstream: unknown option 'max_eject' (did you mean 'max_ejected'?)"] = function()
        return raised(function()
          local p = upstream.new("apidoc-msg", { "10.0.0.1:80" }, { max_eject = 1 }); return p
        end)
      end,
      ["fuse.upstream: option 'max_wait' cannot work in a pool, got 0.2: ..."] = function()
        return raised(function()
          local p = upstream.new("apidoc-msg", { "10.0.0.1:80" }, { max_concurrent = 1, max_wait = 0.2 }); return p
        end)
      end,
      ["fuse.upstream: call pool:tries(), not pool.tries(): self is nil, not a pool"] = function()
        local pool = upstream.new("apidoc-self", { "10.0.0.1:80" })
        local said = raised(function() local n = pool.tries(); return n end)
        pool:close()
        return said
      end,
      ["fuse: option 'max_wait' has no effect without 'max_concurrent'"] = function()
        return raised(function()
          local p = upstream.new("apidoc-msg", { "10.0.0.1:80" }, { max_wait = 0 }); return p
        end)
      end,
      [ [[fuse.upstream: pool:failures: class must be "connect", "timeout" or "status", got "timeout " ]]
        .. [[(did you mean "timeout"?)]] ] = function()
        local pool = upstream.new("apidoc-failures", { "10.0.0.1:80" })
        local said = raised(function() local n = pool:failures("10.0.0.1:080", "timeout "); return n end)
        pool:close()
        return said
      end,
      [ [[fuse.upstream: pool:failures: address "10.0.0.1": no port: the form is "IP:port"]] ] = function()
        local pool = upstream.new("apidoc-failures", { "10.0.0.1:80" })
        local said = raised(function() local n = pool:failures("10.0.0.1", "timeout"); return n end)
        pool:close()
        return said
      end,
    }
    provoke["fuse: call b:state(), not b.state(): ..."] =
      provoke["fuse: call b:state(), not b.state(): self is nil, not a breaker"]
    provoke["fuse: report: ..."] = provoke["fuse: report: ... was already reported"]
    -- a quoted message as a pattern: "..." any text, NAME a name, N a number
    local function pattern(quoted)
      local p = quoted:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")
      p = p:gsub("%%%.%%%.%%%.", ".-"):gsub("NAME", "[^']+"):gsub("%f[%a]N%f[%A]", "%%d+")
      return "^" .. p .. "$"
    end
    local wrong, seen = {}, 0
    for _, file in ipairs{ "docs/api.md", "docs/usage.md", "README.md" } do
      for quoted in read(file):gmatch("`(fuse[%.%a]*: [^`]*)`") do
        quoted = quoted:gsub("%s*\n%s*", " ")
        seen = seen + 1
        local f = provoke[quoted]
        local said = f and f()
        if not f then
          wrong[#wrong + 1] = file .. ": no provocation in this spec for `" .. quoted .. "`"
        elseif not (said or ""):match(pattern(quoted)) then
          wrong[#wrong + 1] = file .. ": `" .. quoted .. "`, but fuse says: " .. tostring(said)
        end
      end
    end
    assert.is_true(seen >= 20, "the pages quote " .. seen .. " messages")
    assert.same({}, wrong)
  end)
end)
