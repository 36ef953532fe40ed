"""The OpenAI-compatible HTTP server over an engine thread, its wire format and Prometheus metrics."""
