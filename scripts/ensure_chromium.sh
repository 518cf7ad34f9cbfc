#!/usr/bin/env bash
# The browser test drives Debian's headless Chromium: install it when root, else say how.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing Debian's chromium and chromium-driver for the browser test"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  exit 0
fi
echo "chromium is missing: the browser test will be skipped locally (install: sudo apt-get install chromium chromium-driver)" >&2
