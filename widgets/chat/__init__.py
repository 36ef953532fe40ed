"""The chat view: transcript, messages, Markdown and code blocks, input, sampling settings."""
