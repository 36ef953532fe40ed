"""The studio's version: the one place it is defined (pyproject and installers read it from here)."""

__version__ = "0.1.0"
