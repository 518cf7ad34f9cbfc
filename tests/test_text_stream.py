"""Jobs whose text arrives in pieces: planned sentence by sentence, in seq order, spoken once, ended by the final
piece or by idleness; through the real API, a real Redis and a real worker (espeak)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from api.streaming import Ended, Idle, Ready, follow
from cache import keys
from core.text import plan_segments, ready_cut
from tests.support.jobs import submit, wait_done


def _open(client: FlaskClient, text: str = "", **body: Any) -> dict[str, Any]:
    return submit(client, text=text, text_stream=True, cache=False, **body)


def _piece(client: FlaskClient, job_id: str, seq: int, text: str, *, final: bool = False, status: int = 200) -> Any:
    response = client.post(f"/v1/jobs/{job_id}/text", json={"seq": seq, "text": text, "final": final})
    assert response.status_code == status, response.get_data(as_text=True)
    return response.get_json()


def _texts(app: Flask, job_id: str) -> list[str]:
    texts: list[str] = app.extensions["tts"].store.texts(job_id)
    return texts


def test_a_sentence_is_planned_once_its_last_piece_arrives_and_the_job_ends_after_the_final_piece(
    app: Flask, served: FlaskClient
) -> None:
    job = _open(served, model="espeak-en")
    assert job["text_stream"] == {"open": True, "next_seq": 0, "end_reason": None}
    assert job["segments_total"] == 0 and job["status"] == "queued"
    # Short sentences: past the first segment's cap (TTS_FIRST_SEGMENT_MAX_CHARS) the length cut-off would
    # start the first segment at a word boundary, as a whole job's plan does.
    tokens = ["The", " first", " one", " is", " here", ".", " And", " the", " second", " one", " ends", "."]
    for seq, token in enumerate(tokens[:6]):
        answer = _piece(served, job["id"], seq, token)
        assert answer["segments_total"] == 0, "no sentence is complete until something follows its full stop"
    answer = _piece(served, job["id"], 6, tokens[6])
    assert answer["segments_total"] == 1 and answer["text_stream"]["next_seq"] == 7
    first = served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30")
    assert first.status_code == 200, "the first sentence plays while the rest is still being written"
    for seq, token in enumerate(tokens[7:], start=7):
        _piece(served, job["id"], seq, token)
    assert served.get(f"/v1/jobs/{job['id']}").get_json()["status"] != "done", "open: more text may come"
    _piece(served, job["id"], len(tokens), "", final=True)
    done = wait_done(served, job["id"])
    assert done["status"] == "done" and done["text_stream"] == {"open": False, "next_seq": 13, "end_reason": "final"}
    assert _texts(app, job["id"]) == ["The first one is here.", "And the second one ends."]
    assert served.get(f"/v1/jobs/{job['id']}/audio").status_code == 200


def test_a_retried_piece_is_answered_again_and_spoken_once_and_other_text_under_its_seq_is_a_409(
    app: Flask, served: FlaskClient
) -> None:
    job = _open(served, "Hello there. ", model="espeak-en")
    assert job["segments_total"] == 1, "the opening text's complete sentence is planned at once"
    first = _piece(served, job["id"], 0, "How are you? ")
    again = _piece(served, job["id"], 0, "How are you? ")
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert again["segments_total"] == first["segments_total"] == 2
    conflict = _piece(served, job["id"], 0, "Something else. ", status=409)
    assert conflict["error"]["code"] == "conflict" and "already arrived" in conflict["error"]["message"]
    _piece(served, job["id"], 1, "Bye.", final=True)
    after = _piece(served, job["id"], 2, "More?", status=409)
    assert "final piece is 1" in after["error"]["message"]
    assert _piece(served, job["id"], 1, "Bye.", final=True)["duplicate"] is True, "a retried final piece too"
    assert wait_done(served, job["id"])["status"] == "done"
    assert _texts(app, job["id"]) == ["Hello there.", "How are you?", "Bye."]
    late = _piece(served, job["id"], 3, "Late.", status=409)
    assert late["error"]["reason"] == "after_final", "a done stream still says why: its final piece came before"


def test_a_piece_sent_again_marked_final_ends_the_stream_there_and_is_spoken_once(
    app: Flask, served: FlaskClient
) -> None:
    """A client that learns its text is over only after sending its last piece may send that piece again, final."""
    job = _open(served, "Hello there. ", model="espeak-en")
    _piece(served, job["id"], 0, "Goodbye.")
    marked = _piece(served, job["id"], 0, "Goodbye.", final=True)
    assert marked["duplicate"] is False, "the mark is new: the stream now ends at piece 0"
    assert _piece(served, job["id"], 0, "Goodbye.", final=True)["duplicate"] is True, "and a retry of it is a retry"
    assert _piece(served, job["id"], 1, "More?", status=409)["error"]["reason"] == "after_final"
    done = wait_done(served, job["id"], timeout=10)  # well inside the idle end (TTS_TEXT_STREAM_IDLE_S)
    assert done["status"] == "done" and done["text_stream"]["end_reason"] == "final"
    assert _texts(app, job["id"]) == ["Hello there.", "Goodbye."]


def test_a_piece_sent_again_marked_final_below_a_piece_taken_ahead_of_it_is_refused(served: FlaskClient) -> None:
    job = _open(served, model="espeak-en")
    _piece(served, job["id"], 0, "One. ")
    _piece(served, job["id"], 1, "Two. ")
    refused = _piece(served, job["id"], 0, "One. ", final=True, status=409)
    assert refused["error"]["reason"] == "final_before_taken" and refused["error"]["taken"] == 1
    served.delete(f"/v1/jobs/{job['id']}")


def test_pieces_that_arrive_out_of_order_wait_for_the_gap_and_are_spoken_in_seq_order(
    app: Flask, served: FlaskClient
) -> None:
    job = _open(served, model="espeak-en")
    assert _piece(served, job["id"], 1, "a second. Then ")["segments_total"] == 0, "seq 0 is missing"
    assert _piece(served, job["id"], 0, "A first and ")["text_stream"]["next_seq"] == 2
    assert _texts(app, job["id"]) == ["A first and a second."]
    far = _piece(served, job["id"], 10_000, "too far", status=409)
    assert "too far ahead" in far["error"]["message"]
    _piece(served, job["id"], 2, "the end.", final=True)
    assert wait_done(served, job["id"])["status"] == "done"
    assert _texts(app, job["id"]) == ["A first and a second.", "Then the end."]


def test_a_date_split_across_pieces_is_read_as_one_date(app: Flask, served: FlaskClient) -> None:
    job = _open(served, "今天是2024年5", model="espeak-cmn")
    _piece(served, job["id"], 0, "月1日。天气")
    _piece(served, job["id"], 1, "很好。", final=True)
    assert wait_done(served, job["id"])["status"] == "done"
    whole = plan_segments("今天是2024年5月1日。天气很好。", language="zh", first_max_chars=40)
    assert "".join(_texts(app, job["id"])) == "".join(whole)
    assert "五月一日" in "".join(_texts(app, job["id"])), _texts(app, job["id"])


def test_a_stream_left_idle_speaks_its_unfinished_sentence_then_ends_with_the_reason(
    app: Flask, served: FlaskClient
) -> None:
    streams = app.extensions["tts"].text_streams
    job = _open(served, "An unfinished thought", model="espeak-en")
    assert job["segments_total"] == 0
    assert streams.sweep()["flushed"] == 0, "its last piece is too recent for the idle cut-off"
    # The sweep every worker runs, with its clock moved past the idle cut-off, then past the idle end.
    streams.sweep(now=time.time() + streams.flush_s + 0.1)
    view = served.get(f"/v1/jobs/{job['id']}").get_json()
    assert view["segments_total"] == 1 and view["text_stream"]["open"], "the idle cut-off speaks, the stream stays"
    streams.sweep(now=time.time() + streams.idle_s + 0.1)
    done = wait_done(served, job["id"])
    assert done["status"] == "done"
    assert done["text_stream"]["open"] is False and done["text_stream"]["end_reason"].startswith("idle")
    assert _piece(served, job["id"], 0, "Too late.", status=409)["error"]["code"] == "conflict"


def test_a_canceled_text_stream_takes_no_more_pieces(served: FlaskClient) -> None:
    job = _open(served, "One sentence. And", model="espeak-en")
    assert served.delete(f"/v1/jobs/{job['id']}").get_json()["status"] == "canceled"
    refused = _piece(served, job["id"], 0, " more.", status=409)
    assert "over" in refused["error"]["message"]


def test_a_stream_may_carry_no_more_text_than_one_job(app: Flask, served: FlaskClient) -> None:
    limit = app.extensions["tts"].settings.max_text_chars
    job = _open(served, model="espeak-en")
    piece = "Word " * (limit // 10)
    _piece(served, job["id"], 0, piece)
    _piece(served, job["id"], 1, piece)
    over = _piece(served, job["id"], 2, piece, status=413)
    assert "TTS_MAX_TEXT_CHARS" in over["error"]["message"]
    served.delete(f"/v1/jobs/{job['id']}")


def test_a_stream_that_goes_over_the_limit_once_normalised_names_the_limit_itself(
    app: Flask, served: FlaskClient
) -> None:
    """Before, the error named what was left of the limit after the pieces already planned (19,988 of 20,000)."""
    limit = app.extensions["tts"].settings.max_text_chars
    job = _open(served, model="espeak-en")
    assert _piece(served, job["id"], 0, "Hello there. " * 100 + "Then ")["segments_total"] > 0
    digits = "123456789. " * (limit // 30)  # under the limit as sent, far over it spelled out
    over = _piece(served, job["id"], 1, digits, status=413)
    assert over["error"]["limit"] == limit and f"the limit is {limit:,}" in over["error"]["message"], over


def test_a_piece_to_a_stream_that_ended_idle_says_the_stream_closed(app: Flask, served: FlaskClient) -> None:
    """Before, it said the job was over, "failed or canceled", of a job that was done."""
    streams = app.extensions["tts"].text_streams
    job = _open(served, model="espeak-en")
    _piece(served, job["id"], 0, "Hello there.")
    streams.sweep(now=time.time() + streams.idle_s + 0.1)
    assert wait_done(served, job["id"])["status"] == "done"
    late = _piece(served, job["id"], 1, "Late.", status=409)
    assert late["error"]["reason"] == "closed" and "idle" in late["error"]["message"], late


def test_pieces_to_a_job_that_is_no_stream_or_no_piece_at_all_are_refused_with_a_reason(served: FlaskClient) -> None:
    job = submit(served, text="Hello.", model="espeak-en")
    assert _piece(served, job["id"], 0, "More.", status=409)["error"]["message"].startswith("job is not a text stream")
    stream = _open(served, model="espeak-en")
    assert _piece(served, stream["id"], 0, "", status=422)["error"]["field"] == "text"
    bad = served.post(f"/v1/jobs/{stream['id']}/text", json={"seq": -1, "text": "x"})
    assert bad.status_code == 422 and bad.get_json()["error"]["field"] == "seq"
    assert served.post("/v1/jobs/nope/text", json={"seq": 0, "text": "x"}).status_code == 404
    empty = served.post("/v1/jobs", json={"text": "", "model": "espeak-en"})
    assert empty.status_code == 422, "only a text stream may open without text"
    served.delete(f"/v1/jobs/{stream['id']}")


def test_a_follower_of_an_open_stream_waits_for_more_segments_instead_of_ending(
    app: Flask, served: FlaskClient
) -> None:
    store = app.extensions["tts"].store
    job = _open(served, "The first sentence. ", model="espeak-en")
    assert served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30").status_code == 200
    events = follow(store, job["id"], keepalive_s=0.3)
    assert next(events) == Ready(0, None), "the total is unknown while the stream is open"
    assert isinstance(next(events), Idle), "all segments so far are made, but more may come"
    _piece(served, job["id"], 0, "The last.", final=True)
    rest = [e for e in events if not isinstance(e, Idle)]
    assert rest == [Ready(1, 2), Ended("done", None)]


@pytest.mark.parametrize(
    ("buffer", "ready"),
    [
        ("Hello world. Next", "Hello world. "),
        ("Hello world.", ""),  # "." at the end may be "3." of "3.14", or "Dr." of a name
        ("Hello world. ", "Hello world. "),
        ("你好。", "你好。"),
        ("今天是2024年5", ""),
        ("Version 3.", ""),
    ],
)
def test_a_buffer_is_cut_only_where_no_later_piece_can_change_how_it_reads(buffer: str, ready: str) -> None:
    assert buffer[: ready_cut(buffer, final=False, max_chars=120)] == ready
    assert ready_cut(buffer, final=True, max_chars=120) == len(buffer)


def test_a_long_run_without_a_sentence_end_is_cut_at_a_boundary_that_splits_no_number() -> None:
    text = "one two three four five six seven 2024 eight"
    cut = ready_cut(text, final=False, max_chars=20)
    assert text[:cut] == "one two three four five six seven 2024 "
    chinese = "今天是2024年5月1日天气很好我们去"
    cut = ready_cut(chinese, final=False, max_chars=10)
    assert not chinese[cut - 1 : cut].isdigit() and not chinese[cut : cut + 1].isdigit()


def test_a_segment_not_planned_yet_can_be_long_polled_and_one_past_the_end_of_a_closed_stream_is_a_404(
    served: FlaskClient,
) -> None:
    job = _open(served, model="espeak-en")
    assert served.get(f"/v1/jobs/{job['id']}/segments/0").status_code == 409, "open: not ready, not missing"
    _piece(served, job["id"], 0, "Only this.", final=True)
    assert served.get(f"/v1/jobs/{job['id']}/segments/0?wait=30").status_code == 200
    assert served.get(f"/v1/jobs/{job['id']}/segments/1?wait=1").status_code == 404


def test_a_stream_that_ends_with_nothing_a_voice_can_speak_fails_with_the_reason(served: FlaskClient) -> None:
    job = _open(served, "...", model="espeak-en")
    _piece(served, job["id"], 0, "", final=True)
    ended = served.get(f"/v1/jobs/{job['id']}").get_json()
    assert ended["status"] == "failed" and "nothing a voice can speak" in ended["error"]


def test_a_stream_whose_final_piece_is_all_it_got_fails_and_says_it_ended_at_its_final_piece(
    served: FlaskClient,
) -> None:
    job = _open(served, model="espeak-en")
    answer = _piece(served, job["id"], 0, "", final=True)
    assert answer["text_stream"] == {"open": False, "next_seq": 1, "end_reason": "final"}
    ended = served.get(f"/v1/jobs/{job['id']}").get_json()
    assert ended["status"] == "failed" and "nothing a voice can speak" in ended["error"]
    assert ended["text_stream"] == {"open": False, "next_seq": 1, "end_reason": "final"}
    events = served.get(f"/v1/jobs/{job['id']}/events").get_data(as_text=True)
    assert "event: failed\n" in events and "nothing a voice can speak" in events, "its followers hear it failed"
    assert "event: done" not in events, events


def test_a_stream_left_idle_without_any_text_fails_and_says_it_was_idle(app: Flask, served: FlaskClient) -> None:
    streams = app.extensions["tts"].text_streams
    job = _open(served, model="espeak-en")
    assert streams.sweep(now=time.time() + streams.idle_s + 0.1)["ended"] == 1
    ended = served.get(f"/v1/jobs/{job['id']}").get_json()
    assert ended["status"] == "failed" and "nothing a voice can speak" in ended["error"]
    assert ended["text_stream"]["open"] is False and ended["text_stream"]["end_reason"].startswith("idle")


def test_a_final_piece_before_a_piece_already_taken_ahead_of_it_is_refused_naming_that_piece(
    served: FlaskClient,
) -> None:
    job = _open(served, model="espeak-en")
    _piece(served, job["id"], 0, "Hello there. ")
    assert _piece(served, job["id"], 255, "Far ")["duplicate"] is False, "taken: it waits for the gap"
    _piece(served, job["id"], 256, "ahead.")
    refused = _piece(served, job["id"], 2, "Bye.", final=True, status=409)
    assert refused["error"]["reason"] == "final_before_taken" and refused["error"]["taken"] == 256
    assert "256" in refused["error"]["message"], "it names the piece the caller said the text goes on to"
    view = served.get(f"/v1/jobs/{job['id']}").get_json()
    assert view["text_stream"] == {"open": True, "next_seq": 1, "end_reason": None}, "nothing ended, nothing lost"
    _piece(served, job["id"], 257, "", final=True)  # past every piece taken: taken, and waits for the gap
    assert served.get(f"/v1/jobs/{job['id']}").get_json()["text_stream"]["open"] is True
    served.delete(f"/v1/jobs/{job['id']}")


def test_a_stream_that_ends_idle_with_pieces_still_waiting_for_a_gap_names_them_in_its_end_reason(
    app: Flask, served: FlaskClient
) -> None:
    streams = app.extensions["tts"].text_streams
    job = _open(served, model="espeak-en")
    _piece(served, job["id"], 0, "Hello there.")
    _piece(served, job["id"], 2, " Never spoken.")
    streams.sweep(now=time.time() + streams.idle_s + 0.1)
    done = wait_done(served, job["id"])
    assert done["status"] == "done" and _texts(app, job["id"]) == ["Hello there."]
    reason = done["text_stream"]["end_reason"]
    assert reason.startswith("idle") and "piece 1" in reason and "up to 2" in reason, reason


def test_a_planner_whose_lock_lapsed_does_not_append_what_another_planner_appended_meanwhile(
    app: Flask, served: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = app.extensions["tts"].text_streams
    job = _open(served, model="espeak-en")
    plan = streams.planner.plan

    def lapse_then_plan(text: str, language: str, *, planned_chars: int, segments: int) -> list[str]:
        # The lock lapses while this planner is between its read and its append; the sweep takes the lock and
        # plans the same tail first.
        monkeypatch.setattr(streams.planner, "plan", plan)
        streams.redis.delete(keys.text_lock(job["id"]))
        assert streams.sweep(now=time.time() + streams.flush_s + 0.1)["flushed"] == 1
        return plan(text, language, planned_chars=planned_chars, segments=segments)

    monkeypatch.setattr(streams.planner, "plan", lapse_then_plan)
    _piece(served, job["id"], 0, "First one. Then")
    assert _texts(app, job["id"]) == ["First one. Then"], "planned once, by the planner that held the lock"
    _piece(served, job["id"], 1, "", final=True)
    assert wait_done(served, job["id"])["status"] == "done"
    assert _texts(app, job["id"]) == ["First one. Then"]


def test_a_piece_taken_while_an_idle_stream_is_being_closed_is_spoken(
    app: Flask, served: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = app.extensions["tts"].text_streams
    job = _open(served, "An unfinished", model="espeak-en")  # no cut: under the first segment's cap
    plan = streams.planner.plan
    answers: list[dict[str, Any]] = []

    def piece_then_plan(text: str, language: str, *, planned_chars: int, segments: int) -> list[str]:
        # A piece arrives between the idle close's read of the tail and its append.
        monkeypatch.setattr(streams.planner, "plan", plan)
        answers.append(_piece(served, job["id"], 0, " thought"))
        return plan(text, language, planned_chars=planned_chars, segments=segments)

    monkeypatch.setattr(streams.planner, "plan", piece_then_plan)
    streams.sweep(now=time.time() + streams.idle_s + 0.1)
    assert answers and answers[0]["duplicate"] is False, "the piece was taken (200)"
    done = wait_done(served, job["id"])
    assert done["status"] == "done" and done["text_stream"]["end_reason"].startswith("idle")
    assert _texts(app, job["id"]) == ["An unfinished thought"], "so it is spoken"


STREAMS_DB = 11  # a database of the suite's Redis that no worker sweeps: only this test's passes run


def test_streams_opened_and_left_empty_do_not_delay_the_flush_of_one_with_a_sentence_waiting(
    settings_env: dict[str, str],
) -> None:
    """Before, every open stream took a turn of each pass (200 a pass): 1,500 empty ones put a waiting sentence's
    idle cut-off at 18 s instead of 1.5 s (a black-box probe). An empty stream is now due only at its idle end."""
    from cache.workers import WorkerRegistry
    from tests.support.apps import api_app
    from tests.support.databases import spare_database

    with spare_database(settings_env["REDIS_URL"], STREAMS_DB) as url:
        client = redis.Redis.from_url(url)
        WorkerRegistry(client, ttl_s=60).beat("w-absent", {})
        app = api_app(settings_env, redis_url=url)
        try:
            served, streams = app.test_client(), app.extensions["tts"].text_streams
            empties = [_open(served, model="espeak-en")["id"] for _ in range(250)]
            opened = time.time() - 5  # as if opened 5 s ago: past the idle cut-off, far from the idle end
            for job_id in empties:
                client.hset(keys.job(job_id), mapping={"created_at": opened, "text_last_at": opened})
                client.zadd(keys.TEXT_STREAMS, {job_id: opened})
            streams.sweep()  # each pass looks at 200 of them
            streams.sweep()  # and the other 50
            waiting = _open(served, model="espeak-en")
            _piece(served, waiting["id"], 0, "An unfinished sentence")
            counts = streams.sweep(now=time.time() + streams.flush_s + 0.1)  # one pass, past the idle cut-off
            assert counts["flushed"] == 1 and _texts(app, waiting["id"]) == ["An unfinished sentence"], counts
            idle = time.time() + streams.idle_s + 0.1
            ended = [streams.sweep(now=idle)["ended"] for _ in range(2)]
            assert ended == [200, 51], "the empty ones (and the other, emptied) still end idle, 200 a pass"
            assert all(served.get(f"/v1/jobs/{job_id}").get_json()["status"] == "failed" for job_id in empties)
        finally:
            app.extensions["tts"].close()
            client.close()
