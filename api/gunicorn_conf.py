"""gunicorn's settings for the API: `make run` (scripts/run.sh) and the tests' real server both pass ``-c`` this file.

Where to bind and how many processes stay on the command line. This file is read by gunicorn's master before
it forks: it imports nothing of the app, which each worker loads after gevent has patched it.
"""

from __future__ import annotations

import os

# Held requests (event streams, long-polls, growing audio, downloads) wait on the network, not the CPU: as
# greenlets they cost a few kilobytes each, where a thread each would fill a fixed pool and leave every other
# request waiting. Their Redis waits share one loop per process (cache/events.py).
worker_class = "gevent"
# Room for every stream one process admits (TTS_MAX_STREAMS_PER_PROCESS, default 2000) and as many other
# requests again: a full set of streams still leaves connections for health probes and submissions.
worker_connections = 2 * int(os.environ.get("TTS_MAX_STREAMS_PER_PROCESS", "2000"))
timeout = 120
graceful_timeout = 10
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(M)sms'
# supervisord (or the tests) run and stop gunicorn; a control socket in $HOME would only collide between runs.
control_socket_disable = True
