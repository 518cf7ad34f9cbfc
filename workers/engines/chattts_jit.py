"""Give ChatTTS's numba-compiled text helpers an on-disk cache, so a new model host does not compile them again."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

#: ChatTTS's text helpers that numba compiles on first use (ChatTTS/norm.py), without a cache of their own.
_JITTED_TEXT_HELPERS = ("_find_index", "_fast_replace", "_split_tags", "_combine_tags")


def cache_text_jit() -> None:
    """Give ChatTTS's numba-compiled text helpers an on-disk cache.

    Compiling them costs seconds of CPU in every new model host, and a host is new after every crash, eviction
    or worker restart: with the cache, only the first host on a machine pays it.
    """
    import numba
    from ChatTTS import norm

    for name in _JITTED_TEXT_HELPERS:
        helper = getattr(norm, name, None)
        if isinstance(helper, numba.core.dispatcher.Dispatcher) and not helper.targetoptions.get("cache"):
            try:
                setattr(norm, name, numba.jit(nopython=True, cache=True)(helper.py_func))
            except RuntimeError as e:  # no writable place for the cache (set NUMBA_CACHE_DIR): compile as before
                log.warning("ChatTTS's %s compiles without a cache: %s", name, e)
