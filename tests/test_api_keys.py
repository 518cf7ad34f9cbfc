"""TTS_API_KEYS is checked once, at start-up: a bad entry stops the service with a message naming it."""

from __future__ import annotations

import pytest

from core.apikeys import KeyConfigError, caller_id, parse_api_keys
from core.errors import SettingsInvalid
from core.settings import load_settings
from tests.support.servers import ApiProcess

GOOD = "k0123456789abcdef"


def test_keys_parse_into_callers_and_quotas() -> None:
    ring = parse_api_keys(f" {GOOD}=600 , other-0123456789abc ")
    assert len(ring) == 2
    found = ring.match(GOOD)
    assert found is not None and found.per_minute == 600 and found.caller == caller_id(GOOD)
    other = ring.match("other-0123456789abc")
    assert other is not None and other.per_minute == 0
    assert ring.match(GOOD + "x") is None and ring.match("") is None


def test_no_keys_means_authentication_is_off() -> None:
    assert not parse_api_keys("") and not parse_api_keys("   ")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (f"{GOOD}=ten", "entry 1"),
        (f"{GOOD},other-0123456789abc=1.5", "entry 2"),
        ("=600", "empty key"),
        (f"{GOOD},,other-0123456789abc", "extra comma"),
        (f"{GOOD},", "extra comma"),
        ("changeme", "placeholder"),
        ("<your-key>", "placeholder"),
        ("short", "at least 16"),
        (f"{GOOD},{GOOD}=5", "repeats"),
        (f"{GOOD}=-1", "quota"),
    ],
)
def test_a_malformed_entry_is_refused_naming_it(spec: str, says: str) -> None:
    with pytest.raises(KeyConfigError, match=says):
        parse_api_keys(spec)


def test_settings_refuse_a_bad_entry_without_echoing_the_keys() -> None:
    with pytest.raises(SettingsInvalid) as raised:
        load_settings(api_keys=f"{GOOD}=ten")
    message = str(raised.value)
    assert "TTS_API_KEYS entry 1" in message and "'ten'" in message
    assert GOOD not in message, "a key must never reach a log"


def test_a_key_too_short_is_refused_without_any_of_its_characters() -> None:
    with pytest.raises(KeyConfigError) as raised:
        parse_api_keys("s3cr3tkey9")
    assert "s3cr" not in str(raised.value) and "10 characters" in str(raised.value)


def test_the_api_server_does_not_start_with_a_malformed_key(settings_env: dict[str, str], tmp_path: object) -> None:
    from pathlib import Path

    log = Path(str(tmp_path)) / "gunicorn.log"
    server = ApiProcess({**settings_env, "TTS_API_KEYS": f"{GOOD}=ten"}, log, processes=1)
    with pytest.raises(RuntimeError, match="gunicorn exited"):
        server.start(timeout=60)
    assert server.process is not None and server.process.wait(timeout=30) != 0
    assert "TTS_API_KEYS entry 1" in log.read_text()
