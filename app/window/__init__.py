"""The studio's main window: actions, theme, settings, dashboard dock, status."""
