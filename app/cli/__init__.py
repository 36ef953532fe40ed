"""The `inference-studio` command line: one module per command."""
