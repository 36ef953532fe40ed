"""Everything that touches tensors: the runner, paged attention, the lean forward, kernels, sampler."""
