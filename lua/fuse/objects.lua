-- fuse.objects: the maps of named breakers' objects by name, for the facade (lua/fuse.lua).
--
-- The objects of named breakers by name, one per name, each checked against its
-- breaker's identity on every hit (B.id: one read of the breaker's slot): a lookup of
-- any name whose object exists is a table hit and that check, whatever the number of
-- names; it allocates nothing. Bounded by the capacity: past the live ones plus the
-- capacity, the objects whose breaker is gone (removed, evicted, or the name made again
-- in another slot) are dropped, a walk whose cost is spread over as many insertions.
local pairs = pairs

local _M = {}

-- fuse.objects.new(B) -> a map { map = name -> object, put(name, br), reset() } over the
-- backend B (its id and capacity).
function _M.new(B)
  local c = { map = {} }
  local n, limit = 0, 0
  function c.put(name, br)
    local map = c.map
    if map[name] == nil then
      if n >= limit then
        n = 0
        for k, v in pairs(map) do
          if B.id(v._h) ~= v._id then map[k] = nil else n = n + 1 end
        end
        limit = n + B.capacity() + 64
      end
      n = n + 1
    end
    map[name] = br
  end
  function c.reset() c.map, n, limit = {}, 0, 0 end
  return c
end

return _M
