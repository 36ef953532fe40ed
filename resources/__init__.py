"""Static resources (icons, style sheets, desktop entry, default prompts), read with importlib.resources."""
