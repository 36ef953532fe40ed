"""The engine itself: requests, scheduler, page pool, the step, the engine thread, metrics."""
