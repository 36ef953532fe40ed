"""Hosting the local engine in the window: loading and switching models, backends, API server, experiments."""
