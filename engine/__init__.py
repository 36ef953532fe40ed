"""Headless inference engine: model loading, paged KV cache, continuous batching. Never imports Qt."""
