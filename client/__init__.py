"""A Python client and command line for the TTS service."""

from client.api import TTSClient
from client.errors import TTSClientError

__all__ = ["TTSClient", "TTSClientError"]
