"""Reusable Qt widgets: chat view, model picker, dashboard panels, KV page map."""
