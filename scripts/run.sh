#!/usr/bin/env bash
# Serve everything on this machine: Redis (unless REDIS_URL is set), the workers, the API,
# all under supervisord, which restarts whichever dies (with a growing backoff) and logs it.
# Ctrl-C stops all of it.
# With API keys on (TTS_API_KEYS=key=per_minute,key2) its own reads of the API send the first key,
# and so do the curl examples it prints once ready (on its output only, never into a file).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/prereqs.sh
. scripts/prereqs.sh
need_venv "${VENV:-.venv}"
VENV=$(cd "${VENV:-.venv}" && pwd)
PY="$VENV/bin/python"
# A setting the service refuses (a malformed TTS_API_KEYS, a port that is no number) stops here with
# its message, before anything starts, instead of in supervisord's restart loop of the API.
"$PY" - <<'PY' || exit 1
import sys
from core.settings import load_settings
try:
    load_settings()
except ValueError as e:
    sys.exit(f"the service would refuse its settings; nothing was started:\n{e}")
PY
# Resolved once, so that a relative (to the repository root) or an absolute TTS_RUN_DIR both work below.
RUN_DIR=$(mkdir -p "${TTS_RUN_DIR:-var}" && cd "${TTS_RUN_DIR:-var}" && pwd)
REDIS_PORT=${TTS_REDIS_PORT:-6390}
# The job store's memory budget (Redis maxmemory): past 80% of it the oldest finished audio is removed,
# past 90% new jobs get 503 (cache/budget.py). Live jobs are never evicted (noeviction).
REDIS_MAXMEMORY=${TTS_REDIS_MAXMEMORY:-4gb}
API_HOST=${TTS_API_HOST:-127.0.0.1}
API_PORT=${TTS_API_PORT:-8000}
API_WORKERS=${TTS_API_PROCESSES:-2}
CONF="$RUN_DIR/supervisord.conf"
# A unix socket path may hold about 100 bytes: a deep run folder gets one in /tmp instead.
SOCK="$RUN_DIR/supervisor.sock"
if [ "${#SOCK}" -gt 100 ]; then
  SOCK="${TMPDIR:-/tmp}/tts-supervisor-$(printf %s "$RUN_DIR" | cksum | cut -d' ' -f1).sock"
fi
mkdir -p "$RUN_DIR/redis" "$RUN_DIR/log"
# supervisord reopens /dev/stdout for its log and its programs' output. On a regular file opened
# without O_APPEND (`make run > log`) those writes and ours would overwrite each other: use a pipe.
if [ -f /dev/stdout ]; then
  exec > >(trap '' INT TERM; exec cat)
  if [ -f /dev/stderr ]; then exec 2>&1; fi
fi

# Quote one argument for a supervisord command line (shlex-split, then %-expanded).
arg() {
  local s=${1//%/%%}
  printf "'%s'" "${s//\'/\'\"\'\"\'}"
}
# Escape a plain supervisord value (%-expanded, not split).
val() { printf %s "${1//%/%%}"; }

sup_pid=""
stop_all() {
  trap : INT TERM
  if [ -n "$sup_pid" ] && kill -0 "$sup_pid" 2>/dev/null; then
    echo
    echo "==> stopping (API, worker, Redis)"
    # supervisord puts each program in its own process group, so Ctrl-C reaches only it:
    # it stops every program (SIGTERM to the group, SIGKILL after stopwaitsecs) and exits.
    kill -TERM "$sup_pid" 2>/dev/null || true
    while kill -0 "$sup_pid" 2>/dev/null; do wait "$sup_pid" 2>/dev/null || true; done
    echo "==> stopped"
  fi
}
on_signal() {
  stop_all
  exit 0
}
trap on_signal INT TERM
trap stop_all EXIT

# If supervisord itself is killed, its programs (each in its own process group) would be left
# running, holding the ports; the parent-death signal stops them instead (util-linux on Linux).
pdeath=""
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then pdeath="setpriv --pdeathsig TERM "; fi

# What every program shares: restart whenever it exits (a program that dies within startsecs is
# retried after 1 s, 2 s, 3 s ... up to startretries times: supervisord's backoff); SIGTERM to
# its whole process group to stop it, SIGKILL after stopwaitsecs; its output on ours.
# glibc malloc: two arenas, and buffers over 128 KB mapped on their own, so that audio-sized buffers freed
# and allocated across threads do not fragment memory (see ALLOCATOR_ENV in workers/launch.py).
common="directory=$(val "$ROOT")
environment=PYTHONUNBUFFERED=\"1\",MALLOC_ARENA_MAX=\"2\",MALLOC_MMAP_THRESHOLD_=\"131072\"
autorestart=true
startsecs=2
startretries=100
stopsignal=TERM
stopasgroup=true
killasgroup=true
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true"

redis_program=""
if [ -z "${REDIS_URL:-}" ]; then
  scripts/ensure_redis_server.sh
  if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    echo "port $REDIS_PORT already has a Redis (an earlier 'make run'?): stop it, or set TTS_REDIS_PORT or REDIS_URL" >&2
    exit 1
  fi
  # AOF with fsync every second loses at most ~1 s of jobs on a crash;
  # noeviction because the broker's queues and the job records must never be evicted.
  redis_program="[program:redis]
$common
autostart=true
command=${pdeath}$(arg "$(command -v redis-server)") --port $REDIS_PORT --bind 127.0.0.1 --dir $(arg "$RUN_DIR/redis") --appendonly yes --appendfsync everysec --maxmemory $(arg "$REDIS_MAXMEMORY") --maxmemory-policy noeviction --save '' --daemonize no --logfile $(arg "$RUN_DIR/log/redis.log")
; Started first and stopped last (supervisord stops in reverse priority): the worker writes to it until it stops.
priority=10
stopwaitsecs=30"
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi

# gunicorn runs several processes: they share their metrics through this folder.
export PROMETHEUS_MULTIPROC_DIR="$RUN_DIR/prometheus"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# The socket answers only this user (chmod 0700) and this run's password (the config is 0600).
password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
user_line=""
if [ "$(id -u)" = 0 ]; then user_line="user=root"; fi  # says so, instead of a CRIT line at each start

(
  umask 077
  cat >"$CONF" <<CONF
; Written by scripts/run.sh at each start; edits are lost.
[supervisord]
nodaemon=true
; Log once, to run.sh's output (nodaemon alone would print a second copy).
silent=true
logfile=/dev/stdout
logfile_maxbytes=0
pidfile=$(val "$RUN_DIR/supervisord.pid")
childlogdir=$(val "$RUN_DIR/log")
$user_line

[unix_http_server]
file=$(val "$SOCK")
chmod=0700
username=tts
password=$password

[supervisorctl]
serverurl=unix://$(val "$SOCK")
username=tts
password=$password

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

$redis_program

[program:worker]
$common
; Started by run.sh once Redis answers.
autostart=false
; launch.py keeps one worker per GPU, restarting one that dies; supervisord restarts launch.py.
; The workers serve their metrics on their own ports, not through gunicorn's shared folder.
command=env -u PROMETHEUS_MULTIPROC_DIR ${pdeath}$(arg "$PY") -m workers.launch
priority=20
; Long enough for a warm shutdown: the workers finish the segments they hold.
stopwaitsecs=60

[program:api]
$common
autostart=false
command=${pdeath}$(arg "$VENV/bin/gunicorn") -c $(arg "$ROOT/api/gunicorn_conf.py") --bind $(arg "$API_HOST:$API_PORT") --workers $API_WORKERS 'api:create_app()'
; Stopped first: no new jobs while the worker finishes its segments.
priority=30
stopwaitsecs=20
CONF
)

"$VENV/bin/supervisord" -c "$CONF" &
sup_pid=$!
# An array, not a function: a trap that runs while a redirected function is running would print
# into that redirection (here /dev/null).
CTL=("$VENV/bin/supervisorctl" -c "$CONF")
for _ in $(seq 100); do "${CTL[@]}" pid >/dev/null 2>&1 && break; kill -0 "$sup_pid" 2>/dev/null || break; sleep 0.1; done
if ! kill -0 "$sup_pid" 2>/dev/null; then
  echo "supervisord did not start; see the log above" >&2
  exit 1
fi

if [ -n "$redis_program" ]; then
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  echo "==> Redis on $REDIS_URL (data in $RUN_DIR/redis, AOF on, noeviction, maxmemory $REDIS_MAXMEMORY)"
else
  # Its credentials stay out of the output: the URL is shown with them masked.
  echo "==> using Redis at $(printf %s "$REDIS_URL" | sed -E 's#://[^@/]*@#://***@#') (REDIS_URL)"
fi
# Started once Redis answers, so that neither begins with a refused connection; side by side,
# since each start waits out its program's startsecs.
"${CTL[@]}" start worker >/dev/null &
starting=$!
"${CTL[@]}" start api >/dev/null || true
wait "$starting" || true
echo "==> supervisord restarts whatever dies; see what runs: ${VENV#"$ROOT"/}/bin/supervisorctl -c ${CONF#"$ROOT"/} status"

echo "==> waiting for the API and the worker"
# Up to 2 minutes for the API to answer with a live worker, then up to 15 more while a worker loads its model
# (real weights from a slow disk take a while), saying so every 30 s.
ready="" up_since=$SECONDS loading_since="" said=0
while :; do
  if answer=$("$PY" scripts/api_get.py "http://$API_HOST:$API_PORT/readyz" 2>/dev/null); then
    # Ready, and no worker still loading its models (a first request would wait for them).
    if "$PY" -c 'import json,sys; sys.exit(any(w["loading"] for w in json.load(sys.stdin)["workers"]))' <<<"$answer"; then
      ready=$answer
      break
    fi
    loading_since=${loading_since:-$SECONDS}
    loading_s=$((SECONDS - loading_since))
    if [ "$loading_s" -ge $((said + 30)) ]; then
      said=$loading_s
      echo "==> a worker is still loading its model ($loading_s s so far)"
    fi
    if [ "$loading_s" -ge 900 ]; then
      echo "a worker was still loading its model after 15 minutes; see the logs above" >&2
      exit 1
    fi
  elif [ -z "$loading_since" ] && [ $((SECONDS - up_since)) -ge 120 ]; then
    echo "the API did not answer ready (with a live worker) within 2 minutes; see the logs above" >&2
    exit 1
  fi
  if ! kill -0 "$sup_pid" 2>/dev/null; then
    echo "supervisord exited during start-up; see the log above" >&2
    exit 1
  fi
  sleep 0.5
done
# The keyed routes need a key when TTS_API_KEYS is set: run.sh reads them with the first one.
if ! models=$("$PY" scripts/api_get.py "http://$API_HOST:$API_PORT/v1/models"); then
  echo "the API is ready but /v1/models did not answer; see the log above" >&2
  exit 1
fi
default=$("$PY" -c 'import json,sys; m=json.load(sys.stdin); d=[x for x in m["data"] if x["id"]==m["default"]][0]; print(d["id"] + " (engine " + d["engine"] + ")")' <<<"$models")
key=$("$PY" scripts/api_get.py --key)
auth="" post_auth="" keys_line=""
if [ -n "$key" ]; then
  # The examples send the first key of TTS_API_KEYS: printed here, to whoever set it, and nowhere else.
  header="Authorization: Bearer $key"
  auth=" -H '${header//\'/\'\"\'\"\'}'"
  post_auth="
        $auth \\"
  keys_line="    API keys are on (TTS_API_KEYS): the examples send the first one.
"
fi
cat <<MSG

==> ready: serving model $default at http://$API_HOST:$API_PORT
$keys_line    Try it:

    curl -s -X POST http://$API_HOST:$API_PORT/v1/jobs -H 'Content-Type: application/json' \\$post_auth
         -d '{"text": "你好，欢迎使用语音合成服务。今天是2024年5月1日。"}'

    curl -s$auth http://$API_HOST:$API_PORT/v1/jobs/<id>                       # status and progress
    curl -s$auth -o seg0.wav 'http://$API_HOST:$API_PORT/v1/jobs/<id>/segments/0?wait=10'
    curl -s$auth -o all.wav http://$API_HOST:$API_PORT/v1/jobs/<id>/audio

    English voice:  -d '{"text": "Hello there.", "model": "espeak-en"}'
    Press Ctrl-C to stop.
MSG
status=0
wait "$sup_pid" || status=$?
sup_pid=""
if [ "$status" -eq 0 ]; then
  # supervisord exits 0 only when told to stop: Ctrl-C sent to the whole group can reach it, and stop it, before
  # this shell's trap runs (seen once in CI). That is a stop, not a failure.
  echo "==> stopped"
  exit 0
fi
echo "supervisord exited on its own (status $status): the service is down (its programs get SIGTERM as it dies); see the log above" >&2
exit 1
