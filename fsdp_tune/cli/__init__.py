"""The command line: app.py (the Typer app), common.py (options, the error boundary), and the commands."""
