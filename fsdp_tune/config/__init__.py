"""Config core: read files and flags, normalize them into the typed RunConfig (see validate.py for the
check that runs the rules over it)."""
