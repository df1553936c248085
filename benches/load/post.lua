-- wrk script: POST JSON bodies read from files, taking them in turn (a body listed
-- three times is sent three times as often).
-- usage: wrk -s post.lua URL -- BODY_FILE [BODY_FILE...]
local reqs = {}
local i = 0

function init(args)
  for k = 1, #args do
    local f = assert(io.open(args[k], "rb"))
    local body = f:read("*a")
    f:close()
    reqs[#reqs + 1] = wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
  end
  assert(#reqs > 0, "post.lua: no body files given after --")
end

function request()
  i = i + 1
  return reqs[(i % #reqs) + 1]
end
