"""Run the command line: ``python -m client say|book …``."""

import sys

from client.cli import main

sys.exit(main())
