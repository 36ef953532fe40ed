"""Dialogs: settings, API server, remote endpoint, history."""
