"""Reserving the audio an admitted job will write, so that admission counts it before the store fills.

The memory used now says nothing of the audio admitted jobs are still to write: thirty books admitted together
into an empty store may need three times its budget, and only find out halfway (the budget then fails the newest:
cache/shedding.py). So each job reserves, as it is admitted, the audio it is expected to write: its
characters (at speed 1) times its model's recent bytes per character, learned from every segment a worker writes
(cache/scripts.py WRITE_SEGMENT). A job is admitted only if that fits beside the memory used and the audio already
reserved, below the budget's full mark; the reservation and the check are one atomic step (``reserve``), so a burst
of jobs cannot all see the same room.

The reservation is kept on the job's record (``owed_bytes``) and summed under ``keys.STORE_OWED``. Each segment
written spends its bytes off it, and the job's end (done, failed, canceled) gives back what is left, in the same
atomic steps as the write and the end. A text stream's later characters reserve theirs as they are planned, at
the rate the stream was admitted with (TTS_MAX_TEXT_CHARS bounds a stream as it bounds a job); while the store is
at its full mark, a piece that adds text is not taken (api/admission.py ``store_full``, cache/text_streams.py).
What increments keep can drift (an API that died between reserving and writing its job, a release made twice):
``recount`` corrects a difference from the live jobs' records found twice in a row, and the janitor runs it with
each account.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from string import Template

import redis

from cache import keys
from cache.job_reads import as_str

#: A model's bytes per character before it has written anything: about 0.25 s of 24 kHz 16-bit audio per
#: character, unencoded (ChatTTS speaks Chinese at about four characters a second). Once a model has written a few
#: segments, what it wrote is used instead.
DEFAULT_BYTES_PER_CHAR = 12_000
#: Learned bytes per character count only from this many characters on (fewer say little).
LEARNED_FROM_CHARS = 50
#: A job leaves the room a refused job of its lane waits for only when that one is more than this many times as
#: large: small jobs then cannot starve a large one, and jobs of about one size are not held back for each other.
HELD_FOR_LARGER = 2
#: How long the room a refused job wanted is remembered (``want_room``): its retry after Retry-After (10 s) and
#: the janitor's passes meanwhile (every 2 s) fall within it.
WANTED_FOR_S = 30

# KEYS: the room wanted. ARGV: the most used and reserved memory may be for a refused job to fit, that job's
#       audio, its lane, the TTL.
# Keeps the smallest mark asked for within the TTL (the room the largest waiting job needs), with that job's audio
# and lane; a larger mark does not renew it, so a mark nobody asks for again lapses. RESERVE holds that room for it
# against smaller jobs of its lane, and clears the mark once a job as large gets in.
_WANT_ROOM = """
local mark = redis.call('HGET', KEYS[1], 'mark')
if not mark or tonumber(ARGV[1]) < tonumber(mark) then
  redis.call('HSET', KEYS[1], 'mark', ARGV[1], 'need', ARGV[2], 'lane', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
"""

# KEYS: the owed total, the bytes per character learned per model, the room wanted.
# ARGV: the model, the job's characters (at speed 1), the default bytes per character, the characters learned from
#       before the learned rate counts, the most the job's audio may be (the full mark), the most the total may
#       reach with it, the job's lane.
# Estimates the job's audio at its model's learned rate, and reserves it only if the total stays within the most.
# Before the model has a learned rate, the cautious default may overstate the audio several times: a job is then
# never refused as too large, and reserves what room there is up to its estimate and the full mark (refused only
# when there is none). While a job of the same lane more than HELD_FOR_LARGER times as large waits for room
# (WANT_ROOM), a job leaves that much of the room to it, so that a stream of small jobs cannot starve it (jobs of
# about its size take turns as they come); a job as large clears the mark as it gets in. Returns {verdict, the
# bytes, the bytes per character (a string: a number reply would be cut to an integer), the total, 1 if the rate
# was learned}: verdict 1 reserved, 0 no room, -1 too large for the full mark alone. A total below nothing (a
# release made twice) counts as nothing, and is set so.
_RESERVE = Template("""
local learned = redis.call('HMGET', KEYS[2], ARGV[1] .. ':bytes', ARGV[1] .. ':chars')
local per_char = tonumber(ARGV[3])
local known = (tonumber(learned[2]) or 0) >= tonumber(ARGV[4])
local flag = 0
if known then
  per_char = tonumber(learned[1]) / tonumber(learned[2])
  flag = 1
end
local need = math.ceil(tonumber(ARGV[2]) * per_char)
if need > tonumber(ARGV[5]) and known then return {-1, need, tostring(per_char), 0, flag} end
local owed = tonumber(redis.call('GET', KEYS[1]) or '0')
if owed < 0 then
  redis.call('SET', KEYS[1], 0)
  owed = 0
end
local wanted = redis.call('HMGET', KEYS[3], 'need', 'lane')
local wanted_need = tonumber(wanted[1] or '-1')
local room = tonumber(ARGV[6]) - owed
if wanted_need > $HELD_FOR_LARGER * need and wanted[2] == ARGV[7] then room = room - wanted_need end
if not known then need = math.max(0, math.min(need, tonumber(ARGV[5]), room)) end
if need > room or room <= 0 then return {0, need, tostring(per_char), owed, flag} end
if wanted_need >= 0 and need >= wanted_need then redis.call('DEL', KEYS[3]) end
return {1, need, tostring(per_char), redis.call('INCRBY', KEYS[1], need), flag}
""").substitute(HELD_FOR_LARGER=HELD_FOR_LARGER)

# KEYS: the owed total, the live-job index, the difference the last recount found and left.
# ARGV: the job key's prefix ("tts:job:{"), its suffix ("}:record").
# Compares the total with the sum of the live jobs' reservations. Part of a difference is what submissions in
# flight have reserved and not yet written into a record, which is right; only a difference found twice in a row
# (the smaller of the two, of the same sign) is taken off, and the rest kept for the next recount.
# Returns {the total before, the total now}.
_RECOUNT = """
local sum = 0
for _, job_id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  sum = sum + tonumber(redis.call('HGET', ARGV[1] .. job_id .. ARGV[2], 'owed_bytes') or '0')
end
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local drift = total - sum
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
local fix = 0
if drift > 0 and last > 0 then fix = math.min(drift, last) end
if drift < 0 and last < 0 then fix = math.max(drift, last) end
if fix ~= 0 then redis.call('DECRBY', KEYS[1], fix) end
redis.call('SET', KEYS[3], drift - fix)
return {total, total - fix}
"""


@dataclass(frozen=True)
class Reserved:
    """The audio one job reserved: its bytes, and the bytes per character (at speed 1) they were estimated at."""

    bytes: int
    per_char: float


#: What a job reserves where the store has no budget.
NOTHING = Reserved(0, 0.0)


class Verdict(enum.IntEnum):
    """What ``Reservations.reserve`` found."""

    RESERVED = 1
    NO_ROOM = 0  # the audio, beside what is reserved, would pass the most the total may reach
    TOO_LARGE = -1  # the audio alone would pass the full mark, at the model's learned rate


@dataclass(frozen=True)
class Reservation:
    """The answer of ``Reservations.reserve``: the verdict, the job's estimated audio, the owed total, and whether
    the estimate is at the model's learned rate (else the cautious default, capped at the room there was)."""

    verdict: Verdict
    audio: Reserved
    owed: int
    learned: bool = True


def chars_at_speed_one(chars: int, speed: float) -> int:
    """Return how many characters ``chars`` spoken at ``speed`` weigh in audio: at half speed, twice as many."""
    return math.ceil(chars / speed) if speed > 0 else chars


class Reservations:
    """Estimate, reserve and recount the audio admitted jobs will write."""

    def __init__(self, client: redis.Redis, *, default_bytes_per_char: float = DEFAULT_BYTES_PER_CHAR) -> None:
        self.redis = client
        self.default_bytes_per_char = default_bytes_per_char
        self._reserve = client.register_script(_RESERVE)
        self._recount = client.register_script(_RECOUNT)
        self._want_room = client.register_script(_WANT_ROOM)

    def reserve(self, model: str, chars: int, *, largest: int, most: int, lane: str = "realtime") -> Reservation:
        """Estimate the audio of a job of ``chars`` characters (at speed 1) on ``model`` and reserve it, in one atomic
        step, if it is at most ``largest`` bytes and the owed total stays within ``most`` with it (less the room a
        larger job of its ``lane`` waits for)."""
        verdict, need, per_char, owed, learned = self._reserve(
            keys=[keys.STORE_OWED, keys.BYTES_PER_CHAR, keys.STORE_WANTED],
            args=[model, chars, self.default_bytes_per_char, LEARNED_FROM_CHARS, largest, most, lane],
        )
        audio = Reserved(int(need), float(as_str(per_char)))
        return Reservation(Verdict(int(verdict)), audio, int(owed), bool(int(learned)))

    def want_room(self, mark: int, need: int, lane: str = "realtime") -> None:
        """Say that a job of ``need`` bytes of audio on ``lane`` was refused for want of room, and would fit were used
        and reserved memory at most ``mark`` bytes: the janitor's trim makes that room from finished audio, where it
        can (cache/budget.py), and smaller jobs of its lane leave it to it (``reserve``)."""
        self._want_room(keys=[keys.STORE_WANTED], args=[max(0, mark), need, lane, WANTED_FOR_S])

    def owed(self) -> int:
        """Return the audio live jobs have reserved and not yet written, in bytes."""
        return max(0, int(as_str(self.redis.get(keys.STORE_OWED) or b"0")))

    def release(self, reserved: int) -> None:
        """Give back a reservation no job was written for (its submission failed after ``reserve``)."""
        if reserved > 0:
            self.redis.decrby(keys.STORE_OWED, reserved)

    def recount(self) -> tuple[int, int]:
        """Correct the owed total by a difference from the live jobs' reservations found on this recount and the
        last (a leak, or a release made twice); return the total before and now."""
        before, now = self._recount(
            keys=[keys.STORE_OWED, keys.LIVE_JOBS, keys.STORE_OWED_DRIFT], args=[f"{keys.PREFIX}:job:{{", "}:record"]
        )
        return int(before), int(now)
