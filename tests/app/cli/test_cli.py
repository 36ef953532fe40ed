"""The command line: generate's JSON contract, streaming, engine flags, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main
from app.version import __version__


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"inference-studio {__version__}"


def test_generate_json_is_one_object_per_prompt_in_order(capsys, tiny_model_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "hello world"})
        + "\n\n"
        + json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
        + "\n"
    )
    code, out, err = run_cli(
        capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "the quick brown fox",
        "--prompts-file", str(prompts), "--temperature", "0", "--max-tokens", "5", "--ignore-eos",
        "--json", "--kv-pages", "32", "--page-size", "8", "--max-running", "2", "--max-step-tokens", "64",
        "--no-prefix-cache",
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    for record in records:
        assert {"index", "text", "token_ids", "prompt_tokens", "finish_reason", "ttft_s", "decode_tokens_per_s",
                "cached_prompt_tokens", "preemptions"} <= set(record)  # fmt: skip
        assert len(record["token_ids"]) == 5 and record["finish_reason"] == "length"
        assert record["cached_prompt_tokens"] == 0
    assert records[2]["prompt_tokens"] > records[1]["prompt_tokens"] - 10


def test_generate_streams_text_without_json(capsys, tiny_model_dir: Path) -> None:
    code, out, err = run_cli(
        capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--prompt", "world",
        "--temperature", "0", "--max-tokens", "4", "--ignore-eos",
    )  # fmt: skip
    assert code == 0
    assert "── reply 1 ──" in out and "── reply 2 ──" in out
    assert "4 tokens, length" in err


def test_raw_skips_the_chat_template(capsys, tiny_model_dir: Path) -> None:
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--max-tokens", "1", "--json"]
    _, templated, _ = run_cli(capsys, *args)
    _, raw, _ = run_cli(capsys, *args, "--raw")
    assert json.loads(raw)["prompt_tokens"] < json.loads(templated)["prompt_tokens"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/no/such/model", "--prompt", "hi"], "no model at '/no/such/model'"),
        (["--quant", "q3", "--prompt", "hi"], "unknown quantization 'q3'"),
        (["--dtype", "float16", "--device", "cpu", "--prompt", "hi"], "float16 on the CPU"),
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature must be"),
        (["--prompt", "hi", "--top-p", "0"], "top-p must be"),
        (["--prompt", "hi", "--max-tokens", "0"], "max tokens must be"),
        ([], "nothing to generate"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(capsys, args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "generate", *args)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err
    assert out == ""


def test_broken_prompts_file_names_the_line(capsys, tmp_path: Path) -> None:
    prompts = tmp_path / "broken.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{"prompt": oops}\n')
    code, _, err = run_cli(capsys, "generate", "--prompts-file", str(prompts))
    assert code == 2 and f"prompts file {prompts} line 3: not valid JSON" in err
    prompts.write_text('{"prompt": "fine"}\n{"text": "wrong key"}\n')
    code, _, err = run_cli(capsys, "generate", "--prompts-file", str(prompts))
    assert code == 2 and "line 2" in err and '"prompt" or "messages"' in err


def test_bad_model_files_are_one_line(capsys, tmp_path: Path) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("nope")
    code, _, err = run_cli(capsys, "generate", "--model", str(not_gguf), "--prompt", "hi")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a readable GGUF" in err
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    code, _, err = run_cli(capsys, "generate", "--model", str(empty), "--prompt", "hi")
    assert code == 2 and "not a model folder" in err


def test_prompt_longer_than_the_kv_pool_is_reported(capsys, tiny_model_dir: Path) -> None:
    code, _, err = run_cli(
        capsys, "generate", "--model", str(tiny_model_dir), "--prompt", "hello world " * 200, "--kv-pages", "4",
        "--page-size", "4",
    )  # fmt: skip
    assert code == 2 and "KV cache holds only 16" in err and len(err.strip().splitlines()) == 1


def _subprocess(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def test_no_traceback_from_a_real_process(tmp_path: Path) -> None:
    result = _subprocess("generate", "--model", str(tmp_path / "missing"), "--prompt", "hi")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"inference-studio: error: no model at '{tmp_path / 'missing'}': not a file or folder, and not a hub "
        "repo id like 'org/name'"
    ]


@pytest.mark.slow
def test_paris_on_the_embedded_model(embedded_model) -> None:  # the fixture converted it into the run's cache
    result = _subprocess(
        "generate", "--prompt", "What is the capital of France?", "--temperature", "0", "--max-tokens", "16"
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_transformers_is_quieted_without_being_imported_before_the_command_runs() -> None:
    """Its import belongs inside the load, where the weights convert on the other core meanwhile."""
    code = (
        "import os, sys\n"
        "from app.cli import main as cli\n"
        "seen = {}\n"
        "def handler(args):\n"
        "    seen['imported'] = 'transformers' in sys.modules\n"
        "    import transformers\n"
        "    from transformers.utils import logging\n"
        "    seen['level'] = logging.get_verbosity() == logging.ERROR\n"
        "    seen['bars'] = logging.is_progress_bar_enabled()\n"
        "    return 0\n"
        "parser = cli.build_parser()\n"
        "cli.build_parser = lambda: parser\n"
        "parser.set_defaults(handler=handler)\n"
        "for action in parser._subparsers._group_actions[0].choices.values():\n"
        "    action.set_defaults(handler=handler)\n"
        "assert cli.main(['serve', '--model', 'x']) == 0\n"
        "print(seen)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_", "HF_HUB_"))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "{'imported': False, 'level': True, 'bars': False}"
