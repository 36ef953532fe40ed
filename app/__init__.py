"""Inference Studio application: CLI entry, main window, engine bridge, chat store, settings."""

from app.version import __version__

__all__ = ["__version__"]
