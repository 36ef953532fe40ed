"""Compare, the local half: one prompt through several local models or quantizations, one after another on
temporary engines (as the experiments run), so each one's timing is its own; events go to a callback."""

from __future__ import annotations

import functools
import gc
import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from engine.core.engine import Engine
from engine.core.prompts import encode_prompt
from engine.errors import StudioError
from engine.experiments.plumbing import pages_for
from engine.load.loader import LoadedModel, load_model
from engine.load.options import LoadOptions
from engine.types import FinishReason, SamplingParams, TokenEvent

log = logging.getLogger(__name__)

SPARE_PAGES = 4
WARM_UP_TOKENS = 16


@dataclass(frozen=True)
class LocalTarget:
    """The loaded model itself (spec None), or a model spec with its load options (another quantization, say)."""

    label: str
    spec: str | None = None
    options: LoadOptions | None = None


class CompareCancelled(StudioError):
    """The user stopped the comparison."""


def tokenizer_key(tokenizer) -> str:
    """Equal for tokenizers that cut text the same way (same vocabulary): their replies compare token by token."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(repr(vocab).encode()).hexdigest()[:16]


def run_local_targets(
    engine: Engine,
    targets: Sequence[LocalTarget],
    messages: list[dict],
    params: SamplingParams,
    on_event: Callable[[int, TokenEvent], None],
    on_status: Callable[[int, str], None],
    on_tokenizer: Callable[[int, str], None],
    cancelled: threading.Event,
) -> None:
    """Run in the engine thread (between its steps, so no chat competes for the cores): each target in turn on a
    temporary engine with a page pool of its own. A target that fails ends with an error event; the next one runs."""
    for index, target in enumerate(targets):
        if cancelled.is_set():
            _fail(on_event, index, target, FinishReason.ABORT, None)
            continue
        loaded: LoadedModel | None = None
        try:
            if target.spec is None:
                loaded = engine.loaded
            else:
                on_status(index, "loading the model…")
                # each stage of the load, so a column that loads for a minute does not look stuck
                stage = functools.partial(_stage, on_status, index)
                loaded = load_model(target.spec, target.options, progress=stage)
            on_tokenizer(index, tokenizer_key(loaded.tokenizer))
            on_status(index, "preparing its engine…")
            _run_one(engine, loaded, index, target, messages, params, on_event, cancelled, on_status)
        except CompareCancelled:
            _fail(on_event, index, target, FinishReason.ABORT, None)
        except StudioError as exc:
            _fail(on_event, index, target, FinishReason.ERROR, str(exc))
        except Exception as exc:  # a bug or an exotic model: this column says so, the others still run
            log.exception("compare target %s failed", target.label)
            _fail(on_event, index, target, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            if loaded is not None and loaded is not engine.loaded:
                del loaded
                gc.collect()  # a second copy of the weights goes before the next one loads


def _stage(on_status: Callable[[int, str], None], index: int, text: str) -> None:
    on_status(index, f"{text}…")


def _run_one(engine, loaded, index, target, messages, params, on_event, cancelled, on_status=None) -> None:
    prompt = encode_prompt(loaded.tokenizer, messages=messages)
    page_size = engine.config.page_size
    pages = pages_for(len(prompt) + params.max_tokens, page_size) + SPARE_PAGES
    config = replace(engine.config, kv_pages=pages, metrics_capacity=1024, prefix_caching=False)
    temporary = Engine(loaded, config)
    _warm_up(temporary, prompt)
    if on_status is not None:
        on_status(index, "writing…")  # only now: loading and the engine's own set-up can take a minute
    request = temporary.add_request(prompt, params, tag=target.label)
    while temporary.has_unfinished:
        if cancelled.is_set():
            temporary.abort(request.request_id)
            raise CompareCancelled("stopped")
        for event in temporary.step():
            on_event(index, event)


def _warm_up(engine: Engine, prompt: list[int]) -> None:
    """A first pass through a fresh engine pays one-off costs (kernel choices, packing weights): not the target's
    TTFT. A short request takes them first (no prefix cache, so the measured prompt is computed in full)."""
    warm = engine.add_request(prompt[:WARM_UP_TOKENS], SamplingParams(max_tokens=2, temperature=0.0))
    while engine.has_unfinished:
        engine.step()
    del warm


def _fail(on_event, index: int, target: LocalTarget, reason: FinishReason, error: str | None) -> None:
    on_event(index, TokenEvent.ending(f"compare-{index}", reason, tag=target.label, error=error))
