"""Helpers the tests share; the real Redis, workers, API and `make run` they drive come from devstack."""
