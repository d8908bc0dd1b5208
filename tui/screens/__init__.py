"""Screens of `contracts tui`."""
