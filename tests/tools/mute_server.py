"""A stdio "MCP server" that reads every message and never answers one, not even `initialize`.

Each start appends a line to the file named by argv[1], so a test can count the start attempts.
"""

import os
import sys

with open(sys.argv[1], "a") as log:
    log.write(f"started {os.getpid()}\n")
for _line in sys.stdin:
    pass
