"""Run the command line: ``python -m client say|book …`` (installed, the same is the ``tts`` command)."""

import sys

from client.cli import main

sys.exit(main(prog="python -m client"))
