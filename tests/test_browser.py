"""The web page in a real headless Chromium: models listed, fragments played back to back as they arrive, API
keys."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from api import web
from cache import keys
from tests.support.apps import api_app
from tests.support.http import serving

IN_CI = os.environ.get("CI") == "true"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--autoplay-policy=no-user-gesture-required",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
# Four segments: all are made before the first has played, so each fragment is queued behind the one before.
STORY = (
    "The old lighthouse stood alone on the cliff. "
    "Every night its beam swept across the dark water, warning ships away from the rocks below. "
    "The keeper climbed the stairs at dusk and came down again at dawn. "
    "One winter a storm broke the great lamp, and the keeper worked all night by candlelight to mend it."
)
PREFETCH = 2
KEY = "browser-test-key-0123456789abcdef"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def _ensure_chromium() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium", "chromium-driver"]):
            subprocess.run(command, check=False, capture_output=True, timeout=600)
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        _unavailable(f"{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install chromium chromium-driver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start one headless Chromium for the module, with a throwaway profile."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed: pip install -r requirements-dev.txt")
    _ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page_url(app: Flask) -> Iterator[str]:
    """Serve the API, with the web page, over real HTTP."""
    if web.bp.name not in app.blueprints:  # create_app may register the page already
        app.register_blueprint(web.bp)
    with serving(app) as base_url:
        yield f"{base_url}/"


class RequestLog:
    """WSGI middleware that records each request's method, path, query string and Authorization header."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.requests: list[tuple[str, str, str, str | None]] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        self.requests.append(
            (
                environ["REQUEST_METHOD"],
                environ["PATH_INFO"],
                environ["QUERY_STRING"],
                environ.get("HTTP_AUTHORIZATION"),
            )
        )
        return self.app(environ, start_response)


@pytest.fixture(scope="module")
def keyed_server(settings_env: dict[str, str]) -> Iterator[tuple[str, RequestLog]]:
    """Serve the page and an API that accepts only ``KEY``, logging what the browser sends."""
    app = api_app(settings_env, api_keys=KEY)
    log = RequestLog(app.wsgi_app)
    app.wsgi_app = log  # type: ignore[method-assign]
    with serving(app) as base_url:
        yield f"{base_url}/", log


@pytest.fixture
def keyed_page(
    keyed_server: tuple[str, RequestLog], redis_client: redis.Redis, worker: object
) -> tuple[str, RequestLog]:
    """Return the keyed page's URL and a request log that starts empty; a real worker makes the audio."""
    keyed_server[1].requests.clear()
    return keyed_server


def _wait_for(browser: Any, script: str, *, timeout: float) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda driver: driver.execute_script(script))


def test_the_page_fills_its_model_and_voice_pickers_from_the_registry(browser: Any, page_url: str) -> None:
    browser.get(page_url)
    models = _wait_for(
        browser,
        "const s = document.getElementById('model');"
        "return !document.getElementById('play').disabled && [...s.options].map(o => o.value)",
        timeout=30,
    )
    assert "espeak-en" in models
    assert browser.execute_script("return document.getElementById('model').value") == "espeak-en"
    assert browser.execute_script("return document.getElementById('voice').options.length") >= 1


def _in_order(ids: list[str]) -> bool:
    """Say whether fragment ids ("index.n") run 0.0, 0.1, …, 1.0, … with none repeated or skipped."""
    expected = (0, 0)  # the next fragment of the segment being heard
    for id_ in ids:
        index, number = (int(part) for part in id_.split("."))
        next_segment = number == 0 and index == expected[0] + 1 and expected[1] > 0
        if (index, number) != expected and not next_segment:
            return False
        expected = (index, number + 1)
    return True


def test_play_plays_each_fragment_as_it_arrives_back_to_back_and_in_order(
    browser: Any, page_url: str, worker: object
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(page_url)
    _wait_for(browser, "return document.getElementById('model').value === 'espeak-en'", timeout=30)
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys(STORY)
    browser.find_element(By.ID, "play").click()

    playback = _wait_for(
        browser,
        "const p = window.ttsPlayback;"
        "return (p.error || p.ended || (p.played.length >= 2 && p.received.length >= 4)) && p",
        timeout=30,
    )
    assert playback["error"] is None
    assert playback["jobId"]
    assert playback["received"] == list(range(len(playback["received"]))) and len(playback["received"]) >= 2
    assert playback["played"] == list(range(len(playback["played"]))) and len(playback["played"]) >= 2
    fragments, heard = playback["fragments"], playback["heard"]
    assert _in_order(fragments), fragments
    assert heard == fragments[: len(heard)], "each fragment is heard once, in the order it came"
    starts = [entry for entry in playback["log"] if entry.startswith("start with")]
    assert starts and 1 <= int(starts[0].split()[-1]) <= PREFETCH, playback["log"]
    # A fragment scheduled while the one before still played starts exactly where that one ends: no gap.
    queued_behind = [
        (before, after)
        for before, after in pairwise(playback["scheduled"])
        if after["now"] < before["at"] + before["duration"]
    ]
    assert queued_behind, "the story's later fragments came while its first still played"
    for before, after in queued_behind:
        assert after["at"] == pytest.approx(before["at"] + before["duration"], abs=1e-9), playback["scheduled"]
    status = browser.find_element(By.ID, "status").text
    assert "received" in status
    assert "played" in status


def test_with_a_key_typed_in_the_page_plays_against_a_keyed_service_and_keeps_the_key(
    browser: Any, keyed_page: tuple[str, RequestLog]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    page_url, log = keyed_page
    browser.get(page_url)
    browser.execute_script("localStorage.clear()")
    try:
        browser.get(page_url)
        status = _wait_for(browser, "return document.getElementById('status').textContent", timeout=30)
        assert "needs an API key" in status
        assert browser.execute_script("return document.getElementById('play').disabled")

        field = browser.find_element(By.ID, "api-key")
        field.send_keys(KEY, Keys.TAB)  # the change event stores the key and loads the models again
        _wait_for(browser, "return document.getElementById('model').value === 'espeak-en'", timeout=30)
        assert browser.execute_script("return localStorage.getItem('tts-api-key')") == KEY
        typed_at = len(log.requests)

        text = browser.find_element(By.ID, "text")
        text.clear()
        text.send_keys("Hello there. The key works.")
        browser.find_element(By.ID, "play").click()
        playback = _wait_for(
            browser,
            "const p = window.ttsPlayback; return (p.error || (p.ended && p.events.includes('done'))) && p",
            timeout=30,
        )
        assert playback["error"] is None
        assert playback["played"] == playback["received"] == list(range(len(playback["received"])))
        assert "fragment" in playback["events"] and "segment" in playback["events"]
        assert browser.find_element(By.ID, "download").is_displayed()

        api_calls = [r for r in log.requests[typed_at:] if r[1].startswith("/v1/")]
        assert {auth for *_, auth in api_calls} == {f"Bearer {KEY}"}
        assert any(path.endswith("/events") and query == "fragments=1" for _, path, query, _ in api_calls)
        assert not [r for r in log.requests if KEY in r[1] or KEY in r[2]]  # never in a URL

        browser.get(page_url)  # a new visit finds the key kept
        _wait_for(browser, "return document.getElementById('model').value === 'espeak-en'", timeout=30)
        assert browser.find_element(By.ID, "api-key").get_attribute("value") == KEY
    finally:
        browser.execute_script("localStorage.clear()")


def test_speak_as_i_type_plays_each_sentence_while_the_rest_is_typed_and_play_ends_the_text(
    browser: Any, page_url: str, worker: object, redis_client: redis.Redis
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(page_url)
    _wait_for(browser, "return document.getElementById('model').value === 'espeak-en'", timeout=30)
    browser.find_element(By.ID, "live").click()
    text = browser.find_element(By.ID, "text")
    text.send_keys("Hello there. ")  # one piece per key: the first sentence is planned once its space arrives
    first = _wait_for(browser, "const p = window.ttsPlayback; return p && (p.error || p.scheduled.length) && p",
                      timeout=30)  # fmt: skip
    assert first["error"] is None and first["scheduled"][0]["id"] == "0.0", "it plays before the text is done"
    text.send_keys("This is typed later. And the end.")
    browser.find_element(By.ID, "play").click()  # ends the text: the last sentence is spoken too
    playback = _wait_for(
        browser,
        "const p = window.ttsPlayback; return (p.error || (p.ended && p.events.includes('done'))) && p",
        timeout=60,
    )
    assert playback["error"] is None
    assert playback["played"] == playback["received"] == [0, 1, 2]
    assert playback["heard"] == playback["fragments"] and _in_order(playback["fragments"])
    job_id = playback["jobId"]
    texts = [t.decode() for t in redis_client.lrange(keys.texts(job_id), 0, -1)]
    assert texts == ["Hello there.", "This is typed later.", "And the end."]


def test_a_segment_made_in_fragments_starts_playing_with_two_in_hand_and_plays_each_once_back_to_back(
    browser: Any, page_url: str, app: Flask
) -> None:
    from tests.test_fragment_streams import RATE, Maker, app_store, new_job

    store = app_store(app)
    job_id = new_job(store, 2, "wav")
    maker = Maker(store, job_id, {0: [7200, 7200, 7200, 4800], 1: [9600]})
    maker.fragments(0, range(2))  # 0.6 s of segment 0, which is still being made
    browser.get(page_url)
    _wait_for(browser, "return document.getElementById('model').value", timeout=30)
    browser.execute_script(
        "api(`v1/jobs/${arguments[0]}`).then((job) => {"
        "  current = new Playback(job, new AudioContext()); current.run(); })",
        job_id,
    )
    started = _wait_for(browser, "const p = window.ttsPlayback; return (p.error || p.scheduled.length >= 2) && p",
                        timeout=30)  # fmt: skip
    assert started["error"] is None and started["jobId"] == job_id
    assert [e["id"] for e in started["scheduled"]] == ["0.0", "0.1"] and started["received"] == []
    assert "start with 2" in started["log"], "it waited for the second fragment, then played both"
    maker.fragments(0, range(2, 3))
    maker.segment(0)  # its last fragment comes with it
    maker.segment(1)
    playback = _wait_for(browser, "const p = window.ttsPlayback; return (p.error || p.ended) && p", timeout=30)
    assert playback["error"] is None
    assert playback["fragments"] == playback["heard"] == ["0.0", "0.1", "0.2", "0.3", "1.0"]
    assert playback["played"] == playback["received"] == [0, 1]
    durations = [round(e["duration"] * RATE) for e in playback["scheduled"]]
    assert durations == [7200, 7200, 7200, 4800, 9600], "each fragment's audio, whole"
    for before, after in pairwise(playback["scheduled"]):
        if after["now"] < before["at"] + before["duration"]:
            assert after["at"] == pytest.approx(before["at"] + before["duration"], abs=1e-9)
