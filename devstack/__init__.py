"""Start the service's real processes for tests, chaos runs and benchmarks, one module per part.

``redis_server`` (RedisServer), ``worker`` (WorkerProcess, heartbeats), ``api`` (ApiProcess under gunicorn),
``service`` (ServiceStack: all three as `make run` starts them), ``run_script`` (`make run` itself),
``processes`` (/proc and waiting for a condition), ``child`` and ``local`` (what they share).
"""
