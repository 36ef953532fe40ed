"""Side-by-side benchmark of the engine against transformers baselines (`inference-studio bench`)."""
