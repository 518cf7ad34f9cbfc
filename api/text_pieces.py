"""What each refused piece of a text stream answers: the status and words a caller can act on."""

from __future__ import annotations

from api.views import job_not_found
from cache.records import PieceResult
from cache.text_streams import MAX_AHEAD, PieceAnswer
from core.errors import Conflict, PayloadTooLarge


def refuse_piece(answer: PieceAnswer, job_id: str) -> None:
    """Raise the error a piece that was not taken answers; return for a piece taken or retried."""
    result, seq, detail = answer.result, answer.seq, answer.detail
    if result in (PieceResult.TAKEN, PieceResult.DUPLICATE):
        return
    if result is PieceResult.GONE:
        raise job_not_found(job_id)
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
