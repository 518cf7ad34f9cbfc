"""Lua scripts that change a job atomically, so concurrent and repeated writers agree."""

from __future__ import annotations

# KEYS: record, audio, segmeta, events, texts, attempts, pending
# ARGV: index, pcm, meta_json, now, ttl, sample_rate
# Returns 1 when written, 2 when written and it finished the job, 0 when the segment already existed (a redelivery),
# -1 when the job is gone, -2 when the job is already failed or canceled.
WRITE_SEGMENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'failed' or status == 'canceled' then return -2 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HSETNX', KEYS[1], 'sample_rate', ARGV[6])
local done = redis.call('HINCRBY', KEYS[1], 'segments_done', 1)
local total = tonumber(redis.call('HGET', KEYS[1], 'segments_total'))
redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[4])
end
redis.call('XADD', KEYS[4], '*', 'type', 'segment', 'index', ARGV[1])
if done >= total then
  redis.call('HSET', KEYS[1], 'status', 'done', 'finished_at', ARGV[4])
  redis.call('XADD', KEYS[4], '*', 'type', 'status', 'status', 'done')
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
  return 2
end
return 1
"""

# KEYS: record, audio, segmeta, events, texts, attempts, pending
# ARGV: new_status ('failed' or 'canceled'), reason, now, ttl
# Returns 1 when the job moved to new_status, 0 when it was already terminal, -1 when gone.
FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' or status == 'failed' or status == 'canceled' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'error', ARGV[2], 'finished_at', ARGV[3], 'updated_at', ARGV[3])
redis.call('XADD', KEYS[4], '*', 'type', 'status', 'status', ARGV[1], 'error', ARGV[2])
redis.call('DEL', KEYS[7])
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
return 1
"""

# KEYS: record, audio, attempts, texts, segmeta; ARGV: index, now, the terminal statuses.
# What a worker reads before making a segment, in one atomic step. Returns {0} when the job is
# gone, {1} when it is over, {2} when the segment is already written; otherwise counts an attempt,
# moves a queued job to running, and returns {3, record, attempts, texts, segment metadata}.
START_SEGMENT = """
local record = redis.call('HGETALL', KEYS[1])
if #record == 0 then return {0} end
local status = redis.call('HGET', KEYS[1], 'status')
for i = 3, #ARGV do
  if status == ARGV[i] then return {1} end
end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {2} end
local attempt = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[2], 'updated_at', ARGV[2])
end
return {3, record, attempt, redis.call('LRANGE', KEYS[4], 0, -1), redis.call('HGETALL', KEYS[5])}
"""


# ARGV: key prefix, first bucket, last bucket. Sums the buckets' counters server-side:
# {field, total (as text), ...}. (The keys are built here, not passed: the service does not run on
# Redis Cluster, see deploy/README.md, and a minute of key names costs the caller more than the sum.)
SUM_BUCKETS = """
local totals = {}
for bucket = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  local flat = redis.call('HGETALL', ARGV[1] .. bucket)
  for i = 1, #flat, 2 do
    totals[flat[i]] = (totals[flat[i]] or 0) + tonumber(flat[i + 1])
  end
end
local out = {}
for name, value in pairs(totals) do
  out[#out + 1] = name
  out[#out + 1] = string.format('%.17g', value)
end
return out
"""
