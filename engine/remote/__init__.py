"""Clients for remote OpenAI-compatible endpoints (vLLM, TGI, Ollama); torch-free."""
