"""A Python client and command line for the TTS service."""

from client.api import TTSClient, TTSClientError

__all__ = ["TTSClient", "TTSClientError"]
