"""The `relay` command: `main` parses the command line (relay/cli/main.py); each command's
file under relay/cli/ holds what it prints and decides."""

from relay.cli.main import load_settings, main

__all__ = ["load_settings", "main"]
