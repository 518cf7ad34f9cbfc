# shellcheck shell=bash
# What scripts/install.sh and scripts/run.sh need from the machine, checked before they start.
# Sourced, not run:   . scripts/prereqs.sh; need_python "$PYTHON"; need_venv_support "$PYTHON"
# Each need_* returns 0 when the need is met. A missing Debian package is installed when root
# with apt-get (as scripts/ensure_redis_server.sh does); otherwise the function says exactly
# what to install, on stderr, and returns 1.

#: The oldest Python the project runs on (pyproject.toml: requires-python).
PREREQS_MIN_PYTHON=3.11
#: Where the distribution's own Python lives (its python3.X-venv package completes it); the
#: tests point it at theirs.
PREREQS_SYSTEM_PREFIX=${PREREQS_SYSTEM_PREFIX:-/usr}

# apt_install WHY PACKAGE...: install Debian packages when root with apt-get, else say how and fail.
apt_install() {
  local why=$1
  shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> $why: installing Debian's $*"
    # A fresh image has no package lists (apt-cache knows nothing): fetch them first; stale
    # lists (a removed version) make the install fail: fetch them and try once more.
    if ! apt-cache show "$@" >/dev/null 2>&1; then apt-get update -qq; fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    fi
    return
  fi
  cat >&2 <<MSG
$why, and this user cannot install it.
Install it with:    sudo apt-get install $*      (Debian/Ubuntu)
MSG
  return 1
}

# need_python PYTHON: the interpreter exists and is recent enough.
need_python() {
  local python=$1
  if ! command -v "$python" >/dev/null 2>&1; then
    cat >&2 <<MSG
$python not found: the service needs Python $PREREQS_MIN_PYTHON or newer.
Install it with:    sudo apt-get install python3 python3-venv      (Debian 12 / Ubuntu 24.04 have 3.11 / 3.12)
or name another one:  PYTHON=/path/to/python3.11 make install
MSG
    return 1
  fi
  if ! "$python" -c "import sys; sys.exit(sys.version_info < tuple(map(int, '$PREREQS_MIN_PYTHON'.split('.'))))"; then
    echo "$python is Python $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'):" \
      "the service needs $PREREQS_MIN_PYTHON or newer; name another one: PYTHON=/path/to/python3.11 make install" >&2
    return 1
  fi
}

# need_venv_support PYTHON: `PYTHON -m venv` can make a virtual environment with pip in it.
# Debian and Ubuntu ship venv's ensurepip (and the pip wheel it installs) apart, in python3.X-venv:
# without it `python3 -m venv` leaves a venv with no pip and says "ensurepip is not available".
need_venv_support() {
  local python=$1 minor prefix
  if "$python" -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1; then
    return 0
  fi
  minor=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
  if [ "$prefix" = "$PREREQS_SYSTEM_PREFIX" ] && command -v dpkg >/dev/null 2>&1; then
    # The distribution's own Python: its package adds the missing module.
    apt_install "Python $minor cannot create a virtual environment (no ensurepip)" "python$minor-venv" || return 1
    if "$python" -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1; then
      return 0
    fi
    echo "Python $minor still has no ensurepip after installing python$minor-venv" >&2
    return 1
  fi
  cat >&2 <<MSG
$python (Python $minor in $prefix) cannot create a virtual environment: its ensurepip module is missing.
Use a Python built with ensurepip, e.g. Debian's:   sudo apt-get install python3 python3-venv
then:    PYTHON=/usr/bin/python3 make install
MSG
  return 1
}

# need_venv VENV: make install has made the virtual environment run.sh starts the service from.
need_venv() {
  local venv=$1 tool
  for tool in python supervisord supervisorctl gunicorn; do
    if [ ! -x "$venv/bin/$tool" ]; then
      echo "$venv/bin/$tool is missing: create the virtual environment first with:    make install" >&2
      return 1
    fi
  done
}
