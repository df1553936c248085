-- wrk script: POST JSON bodies read from files, taking them in turn (a body listed
-- three times is sent three times as often).
-- usage: wrk -s post.lua URL -- BODY_FILE [BODY_FILE...]
-- BEARER_KEYS (comma-separated, optional): each body is sent with each key in turn.
local reqs = {}
local i = 0

function init(args)
  local keys = {}
  for key in string.gmatch(os.getenv("BEARER_KEYS") or "", "[^,]+") do
    keys[#keys + 1] = key
  end
  for k = 1, #args do
    local f = assert(io.open(args[k], "rb"))
    local body = f:read("*a")
    f:close()
    if #keys == 0 then
      reqs[#reqs + 1] = wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
    end
    for _, key in ipairs(keys) do
      local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key }
      reqs[#reqs + 1] = wrk.format("POST", nil, headers, body)
    end
  end
  assert(#reqs > 0, "post.lua: no body files given after --")
end

function request()
  i = i + 1
  return reqs[(i % #reqs) + 1]
end
