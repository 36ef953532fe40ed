"""Choosing a model: the picker dialog, its source box, the memory estimate, the backend picker."""
