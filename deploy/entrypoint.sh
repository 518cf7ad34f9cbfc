#!/bin/sh
# The image's entrypoint, run by tini (PID 1). exec leaves the command (gunicorn, the worker) tini's direct
# child, so the SIGTERM tini passes on starts its own graceful drain.
set -eu
# gunicorn's processes write their metrics into PROMETHEUS_MULTIPROC_DIR, files named by process id, and
# /metrics sums every file there. A Kubernetes emptyDir outlives a container restart: without this, the dead
# container's files would keep being summed in, and pile up. Only the metric files (*.db) go, in case the
# variable names a folder that holds anything else. (compose's tmpfs and systemd's RuntimeDirectory start empty.)
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ] && [ -d "$PROMETHEUS_MULTIPROC_DIR" ]; then
  rm -f -- "$PROMETHEUS_MULTIPROC_DIR"/*.db
fi
exec "$@"
