"""What a comparison can run on: the loaded model, other quantizations of it, recently used models, remote models."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.domain.model_choice import ModelChoice
from engine.experiments.compare import LocalTarget
from engine.load.options import LoadOptions, quantization_problem

LOADED = "loaded"
# other ways to load the loaded model: (dtype, quantization, label)
VARIANTS = (
    ("float32", "none", "float32"),
    ("bfloat16", "none", "bfloat16"),
    ("auto", "int8", "int8"),
    ("auto", "nf4", "nf4 (4-bit)"),
)


@dataclass(frozen=True)
class CompareTarget:
    key: str
    label: str
    local: LocalTarget | None = None  # run in the engine thread, one after another
    backend_id: str | None = None  # a remote endpoint's model, run at once with the other remotes
    short: str = ""  # what tells it from the other targets (the loaded model's name left out): pickers and titles

    @property
    def name(self) -> str:
        return self.short or self.label


def _loaded_label(info, layer_formats: list[str]) -> str:
    precision = info.dtype if info.quantization in ("", "none") else f"{info.quantization}"
    layers = [f for f in layer_formats if f != info.dtype]
    if layers:  # "auto" computes in bfloat16 where that is faster: say so, it changes the replies
        precision += f", layers {', '.join(layers)}"
    return f"{info.name}, as loaded ({precision})"


def compare_targets(
    info,
    choice: ModelChoice | None,
    recent: list[ModelChoice],
    remotes: list[tuple[str, str]],
    layer_formats: list[str] = (),
) -> list[CompareTarget]:
    """Every target on offer: `info`/`choice` the loaded model (None while none is), `remotes` (backend id, label),
    `layer_formats` what the loaded engine's layers compute in."""
    targets: list[CompareTarget] = []
    if info is not None and choice is not None:
        label = _loaded_label(info, list(layer_formats))
        short = label.removeprefix(f"{info.name}, ")
        targets.append(CompareTarget(LOADED, label, LocalTarget(label), short=short))
        for dtype, quant, words in VARIANTS:
            # "auto" may compute in bfloat16 where that is faster: an explicit float32 is then a different target
            plain = choice.quantization == "none" and dtype == choice.dtype
            same = quant == choice.quantization if quant != "none" else plain
            if same or (quant != "none" and quantization_problem(quant, info.device, info.source_kind) is not None):
                continue
            label = f"{info.name}, {words}"
            options = LoadOptions(dtype=dtype, quantization=quant, device=choice.device)
            local = LocalTarget(label, choice.spec, options)
            targets.append(CompareTarget(f"variant:{dtype}:{quant}", label, local, short=f"{words} load"))
    for other in recent:
        if choice is not None and other.spec == choice.spec:
            continue  # the loaded model's variants are listed above
        key = "model:" + json.dumps([other.spec, other.dtype, other.quantization, other.device])
        targets.append(CompareTarget(key, other.label, LocalTarget(other.label, other.spec, other.load_options)))
    for backend_id, label in remotes:
        targets.append(CompareTarget(f"remote:{backend_id}", f"{label} (remote)", backend_id=backend_id))
    return targets
