"""transformers' import table from the disk cache: built and saved once, read back by the next process, rebuilt where
missing, altered or stale, and the same table transformers builds itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import import_index

TABLE = {
    frozenset(): {"models.qwen2.configuration_qwen2": {"Qwen2Config"}},
    frozenset({"torch"}): {"models.qwen2.modeling_qwen2": {"Qwen2Model", "Qwen2ForCausalLM"}},
}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("INFERENCE_STUDIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "transformers-imports"


@pytest.fixture
def models(tmp_path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    return folder


def counting_build(calls: list):
    def build(module_path, prefix=None):
        calls.append((str(module_path), prefix))
        return {backends: {module: set(names) for module, names in table.items()} for backends, table in TABLE.items()}

    return build


def test_the_table_is_built_once_and_read_back_by_the_next_process(cache, models) -> None:
    calls: list = []
    first = import_index.cached(counting_build(calls))
    table = first(models, "models")
    assert table == TABLE and calls == [(str(models), "models")]
    assert first(models, prefix="models") is table  # per process the same object, as transformers' lru_cache
    assert len(list(cache.glob("*.json"))) == 1

    again = import_index.cached(counting_build(calls))  # the next process
    read = again(models, "models")
    assert read == TABLE and len(calls) == 1  # read back, not built
    assert all(isinstance(k, frozenset) for k in read) and isinstance(
        read[frozenset()]["models.qwen2.configuration_qwen2"], set
    )
    assert again(str(models)) == TABLE and len(calls) == 2  # other arguments, another table


def test_an_altered_or_stale_table_is_built_again(cache, models) -> None:
    calls: list = []
    import_index.cached(counting_build(calls))(models)
    (file,) = cache.glob("*.json")
    file.write_text("{not json")
    assert import_index.cached(counting_build(calls))(models) == TABLE and len(calls) == 2
    assert json.loads(file.read_text())  # written over with a whole table

    (models / "new_model").mkdir()  # a file added to the installed package changes the folder's time
    os.utime(models, ns=(1, 1))
    assert import_index.cached(counting_build(calls))(models) == TABLE and len(calls) == 3
    assert len(list(cache.glob("*.json"))) == 2

    (cache / "4.0.0-0123456789abcdef0123.json").write_text("[]")  # a table of the transformers before an upgrade
    (models / "another_model").mkdir()
    os.utime(models, ns=(2, 2))
    import_index.cached(counting_build(calls))(models)
    assert not (cache / "4.0.0-0123456789abcdef0123.json").exists() and len(list(cache.glob("*.json"))) == 3


def test_a_read_only_cache_and_unknown_arguments_still_give_transformers_table(tmp_path, monkeypatch, models) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("INFERENCE_STUDIO_CACHE", str(blocker))  # a file where the folder would be
    calls: list = []
    wrapped = import_index.cached(counting_build(calls))
    assert wrapped(models) == TABLE and len(calls) == 1  # built, not saved, no error

    seen: list = []

    def later_transformers(module_path, prefix=None, *, backends=None):
        seen.append(backends)
        return TABLE

    assert import_index.cached(later_transformers)(models, backends=("torch",)) is TABLE  # passed through as is
    assert seen == [("torch",)]


def test_transformers_imports_with_the_cached_table_equal_to_its_own(tmp_path) -> None:
    code = (
        "from engine import import_index\n"
        "import_index.install()\n"
        "import transformers\n"
        "from pathlib import Path\n"
        "from transformers import AutoConfig\n"
        "from transformers.utils import import_utils\n"
        "assert AutoConfig.for_model('qwen2').model_type == 'qwen2'\n"
        "cached = import_utils.define_import_structure\n"
        "models = Path(transformers.__file__).parent / 'models'\n"
        "def unbuilt(*args):\n"
        "    raise AssertionError('not on disk')\n"
        "on_disk = import_index._read_or_build(unbuilt, models, 'models')\n"
        "assert on_disk == cached.__wrapped__(models, prefix='models')\n"
        "print(len(list(import_index.folder().glob('*.json'))))\n"
    )
    env = {**os.environ, "INFERENCE_STUDIO_CACHE": str(tmp_path)}
    for _ in range(2):  # the first process writes the tables, the second reads them
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout.split()[-1]) >= 2  # transformers' models table and a model's own


def test_the_hook_goes_in_once_and_not_into_a_packaged_studio(monkeypatch) -> None:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, import_index.MODULE, raising=False)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    import_index.install()
    assert not any(isinstance(f, import_index._Finder) for f in sys.meta_path)
    monkeypatch.delattr(sys, "frozen")
    import_index.install()
    import_index.install()
    assert sum(isinstance(f, import_index._Finder) for f in sys.meta_path) == 1
