"""From a model spec to a loaded model: sources, options, conversion cache, hub, memory estimate."""
