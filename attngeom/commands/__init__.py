"""Subcommands of the attngeom CLI, one module each (see attngeom.cli)."""
