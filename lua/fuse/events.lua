-- fuse.events: the recorded transitions (the core's ring, csrc/fz_events.c), read for
-- fuse.events(); the facade (lua/fuse.lua) gives it from here, over its backend.
local options = require "fuse.options"

local error, type = error, type
local floor, max = math.floor, math.max
local show = options.show

local EVENTS_CAPACITY = 1024  -- FZ_EVENTS_CAPACITY

local _M = {}

-- fuse.events.new(B, STATES) -> the function fuse.events over the backend B, naming
-- states by STATES (code -> name).
function _M.new(B, STATES)
  -- fuse.events([since]) -> the recorded transitions with seq > since, oldest first;
  -- lost: how many of those the ring no longer holds; upto: the seq to pass next time.
  -- A since beyond the newest event is read as 0 (see below).
  return function(since)
    if since ~= nil and (type(since) ~= "number" or not (since >= 0 and since < 2^53)) then
      error("fuse: fuse.events needs a seq number (0 to 2^53) or nothing, got " .. show(since), 2)
    end
    since = floor(since or 0)
    local last = B.events_last()
    -- A seq no event of this ring has reached comes from another ring (nginx restarted,
    -- the shared zone made anew, fuse.init{ shared = true } since): read from this
    -- ring's start, so that its events are not skipped until its seq passes the
    -- caller's; `lost` counts those of it the ring no longer holds.
    if since > last then since = 0 end
    local first = max(since + 1, last - EVENTS_CAPACITY + 1)
    local list, lost, upto = {}, first - since - 1, first - 1
    for seq = first, last do
      local rc, s, time, name, from, to, pid = B.event_at(seq)
      -- still being written: the next read starts here (an entry whose writer died in
      -- the middle is taken back by the core, fz_events.c, and counts as lost)
      if rc == 0 then break end
      if rc == 1 then
        list[#list + 1] = { seq = s, time = time, name = name, from = STATES[from], to = STATES[to], pid = pid }
      else
        lost = lost + 1
      end
      upto = seq
    end
    return list, lost, max(upto, since)
  end
end

return _M
