#!/usr/bin/env bash
# Make sure redis-server and redis-cli (scripts/run.sh pings with it) exist: install Debian's
# packages when root, else say exactly what to install.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> redis-server or redis-cli not found: installing Debian's redis-server and redis-tools"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  # Debian starts a system Redis on 6379; ours run on their own ports and folders.
  exit 0
fi
cat >&2 <<'MSG'
redis-server or redis-cli is not installed, and this user cannot install it.
Install it with:    sudo apt-get install redis-server redis-tools      (Debian/Ubuntu)
               or:  brew install redis                     (macOS)
or point the service at an existing Redis:  REDIS_URL=redis://host:6379/0 make run
MSG
exit 1
