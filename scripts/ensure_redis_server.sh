#!/usr/bin/env bash
# Make sure a redis-server binary exists: install Debian's package when root,
# else say exactly what to install.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> redis-server not found: installing Debian's redis-server"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # Debian starts a system Redis on 6379; ours run on their own ports and folders.
  exit 0
fi
cat >&2 <<'MSG'
redis-server is not installed, and this user cannot install it.
Install it with:    sudo apt-get install redis-server      (Debian/Ubuntu)
               or:  brew install redis                     (macOS)
or point the service at an existing Redis:  REDIS_URL=redis://host:6379/0 make run
MSG
exit 1
