"""Helpers the tests share: a real Redis server and real worker processes."""
