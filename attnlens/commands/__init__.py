"""Subcommands of the `attnlens` command line that live in their own modules."""
