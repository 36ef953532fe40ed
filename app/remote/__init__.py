"""Remote OpenAI-compatible endpoints in the window: the endpoint book, backends, menus and status."""
