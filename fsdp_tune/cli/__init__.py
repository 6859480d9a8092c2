"""The command line: app.py (the Typer app), common.py (options, the error boundary), and the commands.

typer imports rich (~80 ms) for coloured help when it is installed; our output is plain text with click
colours, and validate-config has a 0.25 s budget, so typer is told rich is absent. Here, in the package's
__init__, it runs before any module of the package imports typer, whatever order an import sorter gives them.
"""

import sys

if "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]
