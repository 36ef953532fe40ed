"""The live performance dashboard: pyqtgraph panels over the engine's metrics snapshots."""
