"""The record of what ran: device, weight and KV formats, kernels, the fast path and its check, threads, budgets.
The benchmark's JSON, the server's /metrics and the window's status show the same record."""

from __future__ import annotations

import torch

from engine.model import fast_forward


def runtime_record(engine) -> dict[str, object]:
    """Plain values only (strings, numbers, lists), so it serialises and labels as it is."""
    loaded, config, runner = engine.loaded, engine.config, engine.runner
    fast = runner.fast
    check = fast.check if fast is not None else fast_forward.rejected_check(engine.model)
    quant = loaded.info.quantization
    return {
        "device": loaded.info.device,
        "weights": loaded.info.dtype + ("" if quant == "none" else f" {quant}"),
        "kv_cache": str(engine.cache.storage.dtype).removeprefix("torch."),
        "forward": "lean Llama-family forward" if fast is not None else "transformers forward, paged attention",
        "fast_path_check": check.describe() if check is not None else "not run",
        "weight_formats": fast.choice.describe() if fast is not None else loaded.info.dtype,
        "layer_formats": sorted(fast.choice.formats) if fast is not None else [loaded.info.dtype],
        "kernels": list(fast.kinds) if fast is not None else list(engine.kernels),
        "compiled_step": fast.compiled_note if fast is not None else "off: no lean forward",
        # steps of up to these many rows multiply float weights by claimed dot products, longer ones by oneDNN's:
        # a row's sums then run in another order by the step's size (0: one product for every size)
        "claimed_rows": max((s.claimed_to for s in fast.compiled.values() if s.claimed_linears), default=0)
        if fast is not None
        else 0,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "step_token_budget": config.max_step_tokens,
        "prefill_budget_ms": None if config.prefill_budget_s is None else round(config.prefill_budget_s * 1e3),
        "prefix_caching": config.prefix_caching,
        "page_size": config.page_size,
        "kv_pages": engine.pool.num_pages,
    }


def describe(record: dict[str, object]) -> str:
    """One line for a status bar or a log."""
    kernels = ", ".join(str(k) for k in record.get("kernels") or []) or "none"
    return (
        f"{record['weights']} weights, {record['kv_cache']} KV cache on {record['device']} "
        f"({record['cpu_capability']}, {record['torch_threads']} threads); {record['forward']}: "
        f"{record['fast_path_check']}; compiled step: {record.get('compiled_step', 'off')}; kernels: {kernels}"
    )
