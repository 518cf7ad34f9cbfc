"""Lua scripts that change a job atomically, so concurrent and repeated writers agree."""

from __future__ import annotations

import enum
from string import Template

from cache.records import EndResult, FragmentResult, JobStatus, PieceResult, StartState, WriteResult


class AppendResult(enum.IntEnum):
    """What APPEND_SEGMENTS did with a text stream's newly planned segments."""

    APPENDED = 1  # the reply goes on with the first new index, then the indexes to publish now
    FINISHED = 2  # it closed the stream with every segment written: the job is done
    FAILED = 3  # it closed the stream with no segment at all: the job failed (nothing a voice can speak)
    STALE = 4  # the stream moved since the plan was read (another planner, or a piece before a close): read again
    CLOSED = 5  # the stream had already closed: nothing to append
    OVER = -2
    GONE = -1


#: How much of the bytes and characters learned so far each written segment keeps (the rest is the new one's):
#: about the last 50 segments of a model weigh in its bytes per character.
LEARN_DECAY = 0.98


def _lua(source: str) -> str:
    """Spell the statuses and result codes from their Python enums, so Lua and Python cannot disagree."""
    names = {f"{s.name}": f"'{s.value}'" for s in JobStatus}
    enums = (StartState, WriteResult, EndResult, PieceResult, AppendResult, FragmentResult)
    codes = {f"{r.__class__.__name__}_{r.name}": str(r.value) for e in enums for r in e}
    return Template(source).substitute(names, **codes, LEARN_DECAY=repr(LEARN_DECAY))


# The audio a live job may still write, reserved when it was admitted (cache/reservations.py): its record's
# `owed_bytes`, summed over live jobs under keys.STORE_OWED. spend_owed(key, bytes) takes written audio off it;
# release_owed(key) gives the rest back, as the job ends.
OWED = """
local function spend_owed(total_key, bytes)
  local owed = tonumber(redis.call('HGET', KEYS[1], 'owed_bytes') or '0')
  if owed > 0 then
    local spent = math.min(owed, bytes)
    redis.call('HSET', KEYS[1], 'owed_bytes', owed - spent)
    redis.call('DECRBY', total_key, spent)
  end
end
local function release_owed(total_key) spend_owed(total_key, math.huge) end
"""

# What makes a job done, shared by the scripts whose KEYS start with the job's own (keys.all_job_keys), then
# KEYS[11] the live-job index, KEYS[13] the kept-audio index and KEYS[14] the owed audio's total, and whose
# ARGV[4] is now, ARGV[5] the record's TTL, ARGV[8] the job id, ARGV[11] the audio's TTL and ARGV[12] when the
# audio expires.
# finish_as(status, error) ends the job so (its error, if any, on the record and the event); finish_done() as done.
FINISH_DONE = (
    OWED
    + """
local function finish_as(status, err)
  release_owed(KEYS[14])
  redis.call('HSET', KEYS[1], 'status', status, 'finished_at', ARGV[4], 'audio_expires_at', ARGV[12])
  if err then
    redis.call('HSET', KEYS[1], 'error', err)
    redis.call('XADD', KEYS[4], '*', 'type', 'status', 'status', status, 'error', err)
  else
    redis.call('XADD', KEYS[4], '*', 'type', 'status', 'status', status)
  end
  redis.call('DEL', KEYS[7])
  -- The record stays for its TTL; the rest serves the audio (its texts, timings, events) and goes with it.
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  for i = 2, 8 do redis.call('EXPIRE', KEYS[i], ARGV[11]) end
  redis.call('ZREM', KEYS[11], ARGV[8])
  redis.call('ZADD', KEYS[13], ARGV[4], ARGV[8])
end
local function finish_done() finish_as($DONE, nil) end
"""
)

# KEYS: record, audio, segmeta, events, texts, attempts, pending, claims (the job's own, as keys.all_job_keys),
#       then the writer's held set, the outbox, the live-job index, the deadline books, the kept-audio index, the
#       owed audio's total, the bytes per character learned per model, the job's fragments (keys.fragments).
# ARGV: index, audio, meta_json, now, ttl, sample_rate, segment member, job id, outbox time, advance ('1' or '0'),
#       audio ttl, when the audio expires, the model ('' learns nothing), the segment's characters.
# Stores the segment only if absent (a redelivered task cannot duplicate it or its event), and advances the
# job in the same step: the segment leaves its writer's held set and the deadline books; when written and
# `advance` is set, the job's next pending segment moves to the outbox (so a crash before its publish cannot
# strand the job); a finished job leaves the live index and its audio starts its own, shorter TTL. Returns
# {result, next index or -1}, result being 1 written, 2 written and it finished the job, 0 already there (a
# redelivery), -1 job gone, -2 job over. The first command that can grow memory is HSETNX: a store at its
# maxmemory refuses the script there, before it changed anything (the writer keeps its hold and retries).
# The audio written is taken off the job's reservation, and counts in the model's bytes per character (sums that
# decay by LEARN_DECAY a segment, so they follow the model's recent output).
WRITE_SEGMENT = _lua(
    FINISH_DONE
    + """
local function let_go()
  redis.call('SREM', KEYS[9], ARGV[7])
  redis.call('ZREM', KEYS[12], ARGV[7])
end
if redis.call('EXISTS', KEYS[1]) == 0 then let_go() return {$WriteResult_GONE, -1} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $FAILED or status == $CANCELED then let_go() return {$WriteResult_OVER, -1} end
-- A done job's audio may have expired before its record: a late duplicate must not write it anew.
if status == $DONE or redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  let_go() return {$WriteResult_DUPLICATE, -1}
end
let_go()
-- The segment holds its fragments joined: they go in the same step, so a reader finds them in one or the other.
local fragment_count = tonumber(redis.call('HGET', KEYS[16], ARGV[1]) or '0')
local fragment_fields = {ARGV[1], ARGV[1] .. ':at'}
for n = 0, fragment_count - 1 do fragment_fields[#fragment_fields + 1] = ARGV[1] .. ':' .. n end
redis.call('HDEL', KEYS[16], unpack(fragment_fields))
spend_owed(KEYS[14], #ARGV[2])
if ARGV[13] ~= '' then
  local bytes_field, chars_field = ARGV[13] .. ':bytes', ARGV[13] .. ':chars'
  local learned = redis.call('HMGET', KEYS[15], bytes_field, chars_field)
  redis.call('HSET', KEYS[15], bytes_field, (tonumber(learned[1]) or 0) * $LEARN_DECAY + #ARGV[2],
             chars_field, (tonumber(learned[2]) or 0) * $LEARN_DECAY + tonumber(ARGV[14]))
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('HSETNX', KEYS[1], 'sample_rate', ARGV[6])
local done = redis.call('HINCRBY', KEYS[1], 'segments_done', 1)
local total = tonumber(redis.call('HGET', KEYS[1], 'segments_total'))
redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
if status == $QUEUED then
  redis.call('HSET', KEYS[1], 'status', $RUNNING, 'started_at', ARGV[4])
end
redis.call('XADD', KEYS[4], '*', 'type', 'segment', 'index', ARGV[1])
if done >= total and redis.call('HGET', KEYS[1], 'text_open') ~= '1' then
  finish_done()
  return {$WriteResult_FINISHED, -1}
end
if ARGV[10] == '1' then
  local next_index = redis.call('LPOP', KEYS[7])
  if next_index then
    redis.call('ZADD', KEYS[10], ARGV[9], ARGV[8] .. ':' .. next_index)
    return {$WriteResult_WRITTEN, tonumber(next_index)}
  end
end
return {$WriteResult_WRITTEN, -1}
"""
)

# KEYS: the job's own (keys.all_job_keys), then the kept-audio index, the owed audio's total, its fragments.
# ARGV: new_status ('failed' or 'canceled'), reason, now, ttl, audio ttl, when the audio expires, job id, and
#       optionally '1': remove its audio first, in the same step (a job failed to make room).
# Returns 1 when the job moved to new_status, 0 when it was already terminal, -1 when gone. The audio the job had
# reserved and not written is given back.
FINISH = _lua(
    OWED
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return $EndResult_GONE end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $DONE or status == $FAILED or status == $CANCELED then return $EndResult_ALREADY_OVER end
-- Its audio first: at Redis's memory limit a script's writes pass once it has written (deleted) something.
if ARGV[8] == '1' then redis.call('DEL', KEYS[2]) end
release_owed(KEYS[10])
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'error', ARGV[2], 'finished_at', ARGV[3], 'updated_at', ARGV[3],
           'audio_expires_at', ARGV[6])
redis.call('XADD', KEYS[4], '*', 'type', 'status', 'status', ARGV[1], 'error', ARGV[2])
redis.call('DEL', KEYS[7], KEYS[11])
redis.call('EXPIRE', KEYS[1], ARGV[4])
for i = 2, 8 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
redis.call('ZADD', KEYS[9], ARGV[3], ARGV[7])
return $EndResult_ENDED
"""
)

# KEYS: record, audio, attempts, texts, segmeta, claims, the worker's held set, the holders index.
# ARGV: index, now, delivery token, segment member, worker name, known ('1' when the worker already has the
#       job's timeline).
# What a worker reads before making a segment, in one atomic step. Returns {0} when the job is gone, {1} when
# it is over, {2} when the segment is already written. Otherwise it records the segment as held by this worker
# (so its death hands the segment on), counts an attempt unless this delivery's token already holds the claim
# (a redelivery of the same attempt), moves a queued job to running, and returns
# {3, record, attempt, text, segment metadata, 1 if a redelivery else 0, failed attempts so far} (the count
# under field '<index>:failed', which only a failure raises: the engine's, or its worker's death while holding
# it). Its cost does not grow with the job: it reads this segment's text only, and a worker that knows the job
# gets a few record fields and the metadata of segment 0 and of the 32 segments just before this one; only a
# worker new to the job gets the whole record (with every segment's length) and all metadata, once.
START_SEGMENT = _lua("""
if redis.call('EXISTS', KEYS[1]) == 0 then return {$StartState_GONE} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $DONE or status == $FAILED or status == $CANCELED then return {$StartState_OVER} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {$StartState_WRITTEN} end
local attempt
local redelivered = 0
if redis.call('HGET', KEYS[6], ARGV[1]) == ARGV[3] then
  attempt = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '1')
  redelivered = 1
else
  attempt = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[3])
end
redis.call('SADD', KEYS[7], ARGV[4])
redis.call('SADD', KEYS[8], ARGV[5])
local index = tonumber(ARGV[1])
local text = redis.call('LINDEX', KEYS[4], index)
local record, meta
if ARGV[6] == '1' then
  local names = {'id', 'status', 'request', 'created_at', 'seconds_per_char', 'segments_total'}
  local values = redis.call('HMGET', KEYS[1], unpack(names))
  record = {}
  for i, name in ipairs(names) do
    if values[i] then record[#record + 1] = name record[#record + 1] = values[i] end
  end
  meta = {}
  local first = math.max(0, index - 32)
  if first > 0 then  -- segment 0 starts the listener: always known
    local m = redis.call('HGET', KEYS[5], '0')
    if m then meta[#meta + 1] = '0' meta[#meta + 1] = m end
  end
  for i = first, index - 1 do
    local m = redis.call('HGET', KEYS[5], tostring(i))
    if m then meta[#meta + 1] = tostring(i) meta[#meta + 1] = m end
  end
else
  record = redis.call('HGETALL', KEYS[1])
  meta = redis.call('HGETALL', KEYS[5])
end
if status == $QUEUED then
  redis.call('HSET', KEYS[1], 'status', $RUNNING, 'started_at', ARGV[2], 'updated_at', ARGV[2])
end
local failed = tonumber(redis.call('HGET', KEYS[3], ARGV[1] .. ':failed') or '0')
return {$StartState_GO, record, attempt, text or false, meta, redelivered, failed}
""")

# KEYS: a dead worker's held set, the outbox, the heartbeat index, the holders index, its heartbeat key.
# ARGV: worker name, now, and the attempts key of a job split around its id. Moves every segment the worker held
# to the outbox, due now, and forgets the worker; returns how many segments it held. A segment it had started
# (the attempts hash counts a start) gets one failed attempt: a worker that dies on some input each time stops
# at the attempt cap. (The attempts keys are built here, not passed: the service does not run on a cluster. A
# key that has expired is not created again.)
HAND_OVER = """
local held = redis.call('SMEMBERS', KEYS[1])
for _, member in ipairs(held) do
  redis.call('ZADD', KEYS[2], ARGV[2], member)
  local job, index = string.match(member, '^(.*):(%d+)$')
  if job then
    local attempts = ARGV[3] .. job .. ARGV[4]
    if redis.call('HEXISTS', attempts, index) == 1 then redis.call('HINCRBY', attempts, index .. ':failed', 1) end
  end
end
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return #held
"""

# KEYS: a worker's held set, the outbox. ARGV: now, then segment members the worker no longer works on.
# Moves those of them still in the held set to the outbox, due now (a write since removed the others);
# returns how many moved.
RELEASE_STALE = """
local moved = 0
for i = 2, #ARGV do
  if redis.call('SREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
    moved = moved + 1
  end
end
return moved
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


# KEYS: record, the stream's pieces, the open-stream index. ARGV: seq, text, '1' if final, the text's length in
# characters, the most characters a stream may carry, the pieces' TTL, now, how far past the next expected seq a
# piece may be, the job id, '1' if the job store is full (text that adds audio is then NO_ROOM, and not kept), and
# optionally the caller that must own the job (another's job is GONE to it).
# Takes one piece of a text stream, checking its seq: the same seq with the same text again is a retry
# (answered as before, spoken once); with other text, a conflict; past the final piece, or after the stream
# closed, refused; so is a final piece below a piece already taken ahead of it (the caller said the text goes on
# past it): CONFLICT with a third element, that piece's seq (``text_top_seq``, the highest seq taken). A piece
# taken once sent again with the same text, now marked final while the stream has no final piece, is the final
# piece: the mark is taken (TAKEN), its text not a second time. Returns
# {code, detail}: the code a PieceResult, the detail the seq or count it concerns; a piece
# taken joins the stream's tail with every piece that now follows it without a gap, and the reply adds the tail,
# 1 if the final piece is in it, the segments so far and the next seq expected. Only appends to the tail: the
# planner (under the stream's lock) is the only one that takes text off its front (APPEND_SEGMENTS).
TAKE_PIECE = _lua("""
if redis.call('EXISTS', KEYS[1]) == 0 then return {$PieceResult_GONE, 0} end
if ARGV[11] and (redis.call('HGET', KEYS[1], 'owner') or '') ~= ARGV[11] then return {$PieceResult_GONE, 0} end
local open = redis.call('HGET', KEYS[1], 'text_open')
if not open then return {$PieceResult_NOT_A_STREAM, 0} end
local seq = tonumber(ARGV[1])
local earlier = redis.call('HGET', KEYS[2], ARGV[1])
local marking = false  -- a piece already taken, sent again marked final: only the mark is new
if earlier then
  if earlier ~= ARGV[2] then return {$PieceResult_CONFLICT, seq} end
  if ARGV[3] ~= '1' or redis.call('HEXISTS', KEYS[1], 'text_final_seq') == 1 then
    return {$PieceResult_DUPLICATE, seq}
  end
  marking = true
end
local final_seq = redis.call('HGET', KEYS[1], 'text_final_seq')
if final_seq and (seq > tonumber(final_seq) or ARGV[3] == '1') then
  return {$PieceResult_AFTER_FINAL, tonumber(final_seq)}
end
-- A stream that closed says so (its end_reason tells why), though its job is over too; an open one whose job is over
-- was failed or canceled.
if open ~= '1' then return {$PieceResult_CLOSED, 0} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $DONE or status == $FAILED or status == $CANCELED then return {$PieceResult_OVER, 0} end
local next_seq = tonumber(redis.call('HGET', KEYS[1], 'text_next_seq') or '0')
if seq > next_seq + tonumber(ARGV[8]) then return {$PieceResult_TOO_FAR, next_seq} end
local top = tonumber(redis.call('HGET', KEYS[1], 'text_top_seq') or '-1')
if ARGV[3] == '1' and seq < top then return {$PieceResult_CONFLICT, seq, top} end
local function active()  -- the stream's client was heard from now: it is not idle
  redis.call('HSET', KEYS[1], 'text_last_at', ARGV[7])
  redis.call('ZADD', KEYS[3], ARGV[7], ARGV[9])
end
-- A full job store takes no more text (its audio could not be reserved), but a retry, a final mark and an empty final
-- piece add none: the stream can always be ended. The piece is not kept, so it is taken when it comes again; the
-- stream is not idle meanwhile (its client is sending), so the sweep neither flushes nor ends it for idleness.
if ARGV[10] == '1' and not marking and tonumber(ARGV[4]) > 0 then
  active()
  return {$PieceResult_NO_ROOM, seq}
end
if not marking then
  local chars = tonumber(redis.call('HGET', KEYS[1], 'text_chars') or '0') + tonumber(ARGV[4])
  if chars > tonumber(ARGV[5]) then return {$PieceResult_TOO_LONG, chars} end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
  redis.call('HSET', KEYS[1], 'text_chars', chars)
  if seq > top then redis.call('HSET', KEYS[1], 'text_top_seq', seq) end
end
active()
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'text_final_seq', seq)
  final_seq = ARGV[1]
end
local tail = redis.call('HGET', KEYS[1], 'text_tail') or ''
local taken = next_seq
while true do  -- the pieces that now follow the tail without a gap join it (at most MAX_AHEAD + 1)
  local piece = redis.call('HGET', KEYS[2], tostring(next_seq))
  if not piece then break end
  tail = tail .. piece
  next_seq = next_seq + 1
end
if next_seq > taken then redis.call('HSET', KEYS[1], 'text_tail', tail, 'text_next_seq', next_seq) end
local final_reached = 0
if final_seq and next_seq > tonumber(final_seq) then final_reached = 1 end
local total = tonumber(redis.call('HGET', KEYS[1], 'segments_total') or '0')
return {$PieceResult_TAKEN, seq, tail, final_reached, total, next_seq}
""")

# KEYS: the job's own (keys.all_job_keys), its pieces, the outbox, the live-job index, the open-stream index,
#       the kept-audio index, the owed audio's total.
# ARGV: the front of the tail that was planned (it leaves the tail), the error the job fails with if the stream
#       closes with no segment at all, the new segments' lengths ("12,30"), now, the record's TTL, '1' to close
#       the stream, why it closed, the job id, when the outbox entries fall due, the window, the audio's TTL, when
#       the audio expires, the segments total and the last piece's time as the plan read them, then the new
#       segments' texts.
# Appends a text stream's newly planned segments in one step, so a worker's write can never see the job half
# grown: the first of them enter the outbox while the job has room in its window (the caller publishes them),
# the rest wait on its pending list behind those already there. It appends nothing to a stream already closed,
# nor to one that moved since the plan was read: another planner appended (its lock lapsed under this one) or
# took the planned text off the tail, or, for a close, a piece arrived (it would be taken but never spoken).
# Closing the stream with every segment written finishes the job; closing it with no segment at all fails it.
# The new characters' audio is reserved at the bytes per character the job was admitted with (`owed_per_char`).
# Returns {APPENDED, first new index, the indexes to publish...}, or {FINISHED}, {FAILED}, {STALE}, {CLOSED},
# {OVER} or {GONE} (AppendResult).
APPEND_SEGMENTS = _lua(
    FINISH_DONE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {$AppendResult_GONE} end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $DONE or status == $FAILED or status == $CANCELED then return {$AppendResult_OVER} end
if redis.call('HGET', KEYS[1], 'text_open') ~= '1' then return {$AppendResult_CLOSED} end
local total = tonumber(redis.call('HGET', KEYS[1], 'segments_total') or '0')
local tail = redis.call('HGET', KEYS[1], 'text_tail') or ''
if total ~= tonumber(ARGV[13]) or string.sub(tail, 1, #ARGV[1]) ~= ARGV[1] then return {$AppendResult_STALE} end
if ARGV[6] == '1' and (redis.call('HGET', KEYS[1], 'text_last_at') or '') ~= ARGV[14] then
  return {$AppendResult_STALE}
end
local done = tonumber(redis.call('HGET', KEYS[1], 'segments_done') or '0')
local waiting = redis.call('LLEN', KEYS[7])
local added = #ARGV - 14
local published = {}
if added > 0 then
  local room = 0
  if waiting == 0 then room = tonumber(ARGV[10]) - (total - done) end
  local chars = 0
  for i = 1, added do
    local index = total + i - 1
    redis.call('RPUSH', KEYS[5], ARGV[14 + i])
    if i <= room then
      redis.call('ZADD', KEYS[10], ARGV[9], ARGV[8] .. ':' .. index)
      published[#published + 1] = index
    else
      redis.call('RPUSH', KEYS[7], index)
    end
  end
  for n in string.gmatch(ARGV[3], '%d+') do chars = chars + tonumber(n) end
  local lengths = redis.call('HGET', KEYS[1], 'segment_chars') or ''
  if lengths ~= '' then lengths = lengths .. ',' end
  redis.call('HSET', KEYS[1], 'segments_total', total + added, 'segment_chars', lengths .. ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'chars_total', chars)
  local more = math.floor(chars * tonumber(redis.call('HGET', KEYS[1], 'owed_per_char') or '0'))
  if more > 0 then
    redis.call('HINCRBY', KEYS[1], 'owed_bytes', more)
    redis.call('INCRBY', KEYS[14], more)
  end
end
redis.call('HSET', KEYS[1], 'text_tail', string.sub(tail, #ARGV[1] + 1), 'updated_at', ARGV[4])
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'text_open', '0', 'text_end_reason', ARGV[7])
  redis.call('ZREM', KEYS[12], ARGV[8])
  redis.call('EXPIRE', KEYS[9], ARGV[5])
else
  redis.call('ZADD', KEYS[12], ARGV[4], ARGV[8])
end
if added > 0 or ARGV[6] == '1' then  -- followers learn the new total, and whether more may come
  local open = '1'
  if ARGV[6] == '1' then open = '0' end
  redis.call('XADD', KEYS[4], '*', 'type', 'text', 'segments_total', total + added, 'open', open)
end
if ARGV[6] == '1' and total + added == 0 then  -- as a whole job with nothing to say is refused (422)
  finish_as($FAILED, ARGV[2])
  return {$AppendResult_FAILED}
end
if ARGV[6] == '1' and done >= total + added then
  finish_done()
  return {$AppendResult_FINISHED}
end
local reply = {$AppendResult_APPENDED, total}
for _, index in ipairs(published) do reply[#reply + 1] = index end
return reply
"""
)

# KEYS: the job's record, its audio, its fragments (keys.fragments), its events.
# ARGV: segment index, fragment number n, the fragment's PCM, sample rate, now, the fragments' TTL.
# Writes fragment n of a segment being made, once and in order: only when n fragments of it are written already
# (an attempt that makes the segment again after its worker died skips those its predecessor wrote, and writes
# none past a missing one), while the job is live and the segment itself not yet written. Its `fragment` event
# carries when it was written. Returns a FragmentResult. The first command that can grow memory is HSET: a store
# at its maxmemory refuses the script there, having changed nothing.
WRITE_FRAGMENT = _lua("""
if redis.call('EXISTS', KEYS[1]) == 0 then return $FragmentResult_GONE end
local status = redis.call('HGET', KEYS[1], 'status')
if status == $DONE or status == $FAILED or status == $CANCELED then return $FragmentResult_OVER end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return $FragmentResult_SEGMENT_WRITTEN end
local count = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local n = tonumber(ARGV[2])
if n < count then return $FragmentResult_DUPLICATE end
if n > count then return $FragmentResult_OUT_OF_ORDER end
redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], ARGV[3], ARGV[1], n + 1)
if n == 0 then redis.call('HSET', KEYS[3], ARGV[1] .. ':at', ARGV[5]) end
redis.call('EXPIRE', KEYS[3], ARGV[6])
redis.call('HSETNX', KEYS[1], 'sample_rate', ARGV[4])
redis.call('XADD', KEYS[4], '*', 'type', 'fragment', 'index', ARGV[1], 'fragment', ARGV[2], 'at', ARGV[5])
return $FragmentResult_WRITTEN
""")
