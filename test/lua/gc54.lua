-- test/lua/gc54.lua: run by test/gc54.t.sh under Lua 5.4 with an ASan build of the C
-- module. Breakers reached from finalizers, resurrected ones, and ones still alive
-- when the state closes: every call works, and every breaker is freed once.
local fuse = require "fuse"
assert(fuse._backend == "capi", "not the C module: " .. tostring(fuse._backend))

local function with_gc(fn) return setmetatable({}, { __gc = fn }) end

local keep, called = {}, 0
for i = 1, 2000 do
  local box = {}
  -- made before the breaker, so finalized after its handle in the same cycle
  box.obj = with_gc(function()
    assert(box.f() == 1)
    called = called + 1
    if i % 2 == 0 then keep[#keep + 1] = box end  -- resurrected
  end)
  box.f = fuse.wrap(function() return 1 end, { fails = 1 })
  if i % 100 == 0 then collectgarbage() end
end
collectgarbage()
collectgarbage()
for _, box in ipairs(keep) do assert(box.f() == 1) end
print("# " .. called .. " finalizers called through a breaker, " .. #keep .. " wrappers resurrected")
assert(called == 2000 and #keep == 1000)
keep = nil
for _ = 1, 3 do collectgarbage() end

-- finalized once just before the state closes, and never finalized before it
for _ = 1, 50 do fuse.wrap(function() return 1 end, { fails = 1 }) end
collectgarbage()
local alive = {}
for i = 1, 30 do alive[i] = fuse.new{ fails = 1 } end
rawset(_G, "ALIVE_AT_CLOSE", alive)
print("done")
