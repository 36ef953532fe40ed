"""Compare: one prompt sent to several targets (local models and quantizations one after another, remotes at once)."""
