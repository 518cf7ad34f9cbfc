#!/usr/bin/env bash
# Serve everything on this machine: Redis (unless REDIS_URL is set), one worker, the API.
# Ctrl-C stops all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUN_DIR=${TTS_RUN_DIR:-var}
REDIS_PORT=${TTS_REDIS_PORT:-6390}
API_HOST=${TTS_API_HOST:-127.0.0.1}
API_PORT=${TTS_API_PORT:-8000}
API_WORKERS=${TTS_API_PROCESSES:-2}
mkdir -p "$RUN_DIR/redis" "$RUN_DIR/log"

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "==> stopping (API, worker, Redis)"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "==> stopped"
}
trap cleanup INT TERM EXIT

if [ -z "${REDIS_URL:-}" ]; then
  scripts/ensure_redis_server.sh
  if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    echo "port $REDIS_PORT already has a Redis (an earlier 'make run'?): stop it, or set TTS_REDIS_PORT or REDIS_URL" >&2
    exit 1
  fi
  # AOF with fsync every second loses at most ~1 s of jobs on a crash;
  # noeviction because the broker's queues and the job records must never be evicted.
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$PWD/$RUN_DIR/redis" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
    --save "" --daemonize no --logfile "$PWD/$RUN_DIR/log/redis.log" &
  pids+=($!)
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  echo "==> Redis on $REDIS_URL (data in $RUN_DIR/redis, AOF on, noeviction)"
else
  echo "==> using Redis at ${REDIS_URL%%@*}... (REDIS_URL)"
fi

# gunicorn runs several processes: they share their metrics through this folder.
export PROMETHEUS_MULTIPROC_DIR="$PWD/$RUN_DIR/prometheus"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

env -u PROMETHEUS_MULTIPROC_DIR "$PY" -m workers.launch &
pids+=($!)
"$VENV/bin/gunicorn" --access-logformat '%(h)s "%(r)s" %(s)s %(M)sms' --bind "$API_HOST:$API_PORT" --workers "$API_WORKERS" --worker-class gthread \
  --threads 32 --timeout 120 --graceful-timeout 10 --access-logfile - 'api:create_app()' &
pids+=($!)

echo "==> waiting for the API and the worker"
ready=""
for _ in $(seq 240); do
  if ready=$(curl -fsS "http://$API_HOST:$API_PORT/readyz" 2>/dev/null); then break; fi
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "a process of the service exited during start-up; see the log above" >&2
      exit 1
    fi
  done
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "the service did not become ready within 2 minutes; see the logs above" >&2
  exit 1
fi
default=$(curl -fsS "http://$API_HOST:$API_PORT/v1/models" | "$PY" -c 'import json,sys; m=json.load(sys.stdin); d=[x for x in m["data"] if x["id"]==m["default"]][0]; print(d["id"] + " (engine " + d["engine"] + ")")')
cat <<MSG

==> ready: serving model $default at http://$API_HOST:$API_PORT
    Try it:

    curl -s -X POST http://$API_HOST:$API_PORT/v1/jobs -H 'Content-Type: application/json' \\
         -d '{"text": "你好，欢迎使用语音合成服务。今天是2024年5月1日。"}'

    curl -s http://$API_HOST:$API_PORT/v1/jobs/<id>                       # status and progress
    curl -s -o seg0.wav 'http://$API_HOST:$API_PORT/v1/jobs/<id>/segments/0?wait=10'
    curl -s -o all.wav http://$API_HOST:$API_PORT/v1/jobs/<id>/audio

    English voice:  -d '{"text": "Hello there.", "model": "espeak-en"}'
    Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; stopping the rest" >&2
