"""What each refused piece of a text stream answers: the status and words a caller can act on."""

from __future__ import annotations

from api.views import job_not_found
from cache.records import PieceResult
from cache.text_streams import MAX_AHEAD, PieceAnswer
from core.errors import Conflict, PayloadTooLarge, StoreFull
from core.metrics import ADMISSION_REJECTIONS

#: What a piece refused for want of room in the job store is told to wait: as long as a job refused for it.
NO_ROOM_RETRY_S = 10


def refuse_piece(answer: PieceAnswer, job_id: str) -> None:
    """Raise the error a piece that was not taken answers; return for a piece taken or retried."""
    result, seq, detail = answer.result, answer.seq, answer.detail
    if result in (PieceResult.TAKEN, PieceResult.DUPLICATE):
        return
    if result is PieceResult.GONE:
        raise job_not_found(job_id)
    if result is PieceResult.NO_ROOM:
        ADMISSION_REJECTIONS.labels("store_full").inc()
        raise StoreFull(
            f"piece {seq} was not taken: the job store is full (its memory budget, with the audio live jobs have "
            "reserved), and this text's audio could not be reserved; send the same piece (the same seq) again after "
            "Retry-After, or end the stream with an empty final piece",
            retry_after=NO_ROOM_RETRY_S,
            seq=seq,
        )
    if result is PieceResult.TOO_LONG:
        raise PayloadTooLarge(
            f"the stream would carry {detail:,} characters, more than one job may (TTS_MAX_TEXT_CHARS); "
            "end it with a final piece and open another",
            setting="TTS_MAX_TEXT_CHARS",
        )
    if result is PieceResult.CONFLICT and answer.taken_past is not None:
        raise Conflict(
            f"piece {seq} cannot be the final one: piece {answer.taken_past} was already taken after it, and would "
            f"never be spoken; send the final piece with a seq past {answer.taken_past}",
            reason="final_before_taken",
            seq=seq,
            taken=answer.taken_past,
        )
    messages = {
        PieceResult.NOT_A_STREAM: 'job is not a text stream; open one with "text_stream": true',
        PieceResult.CONFLICT: f"piece {seq} already arrived with other text; send the next seq",
        PieceResult.AFTER_FINAL: f"the stream's final piece is {detail}; nothing can follow it",
        PieceResult.CLOSED: "the text stream is closed (its final piece arrived, or it was idle); open a new job",
        PieceResult.OVER: "the job is over (failed or canceled); open a new job",
        PieceResult.TOO_FAR: f"piece {seq} is too far ahead: the stream expects {detail} next and keeps at most "
        f"{MAX_AHEAD} pieces ahead of it",
    }
    raise Conflict(messages[result], reason=result.name.lower(), seq=seq)
