"""The server benchmark's start records, through the real `inference-studio serve` on the tiny synthetic Q4_K_M
file: time to first answer, memory and disk from /proc; a server that dies while starting, one stopped at the
memory cap and one that never becomes ready each get a row that says so, and the others' figures still count."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from app.cli.bench_served import is_served, memory_cap_bytes
from engine.bench import report
from engine.bench.http_client import llama_cpp_fields, studio_fields
from engine.bench.model_file import equal_kv_context, llama_kv_bytes_per_token
from engine.bench.process_watch import GIB, ProcessWatch, read_sample
from engine.bench.served import ServedPlan, ServedSystem, run_served
from engine.bench.servers import ServerProcess, llama_cpp_server, studio_server
from engine.bench.synthetic import synthetic_gguf
from engine.bench.workloads import build
from engine.paths import cache_dir

MIB = 1024**2


@pytest.fixture(scope="module")
def tiny_gguf():
    return synthetic_gguf("qwen2-tiny")  # under the user cache: written once, reused by later runs


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)  # ids below 400: valid for the 49152-token model


def serve(model: str) -> list[str]:
    return [sys.executable, "-m", "app", "serve", "--model", model]


def test_each_server_start_is_measured_and_a_failing_one_gets_a_row(tiny_gguf, tokenizer, tmp_path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:4096])
    options = ["--kv-pages", "64", "--max-running", "16"]
    systems = [
        ServedSystem("engine-server", lambda: studio_server(serve(str(tiny_gguf)), options, 1), studio_fields, "bench"),
        ServedSystem("truncated", lambda: studio_server(serve(str(truncated)), options, 1), studio_fields, "bench"),
        ServedSystem(
            "capped",
            lambda: studio_server(serve(str(tiny_gguf)), options, 1, memory_cap_bytes=64 * MIB),
            studio_fields,
            "bench",
        ),
        ServedSystem(
            "silent",
            lambda: ServerProcess("silent", [sys.executable, "-c", "import time; time.sleep(120)"], ready_timeout_s=2),
            studio_fields,
        ),
    ]
    chat16 = build("chat16", tokenizer, scale=0.1)
    plan = ServedPlan(systems, model_bytes=tiny_gguf.stat().st_size, cache=cache_dir())
    seen: list[str] = []
    record = run_served(tokenizer, [chat16], plan, progress=seen.append)
    ours, truncated_row, capped, silent = record["starts"]
    assert any(m.startswith("engine-server: loading qwen2-tiny") for m in seen)  # its own progress, passed on

    # the studio's server: from its process start to the first streamed token, then its memory and disk
    assert not ours.get("failed"), ours
    assert 0 < ours["ready_s"] < ours["first_token_s"]
    assert 0 < ours["resident_ready_bytes"] <= ours["peak_resident_bytes"]
    assert ours["resident_ready_file_bytes"] > 0  # mapped pages (libraries, the model file) count, as llama.cpp's do
    assert 0 < ours["resident_after_runs_bytes"] <= ours["peak_resident_bytes"]
    assert ours["disk_written_start_bytes"] >= 0 and ours["disk_written_run_bytes"] >= 0
    assert ours["cache_new_start_bytes"] >= 0 and ours["disk_written_share_of_file"] >= 0
    rows = {r["system"]: r for r in record["workloads"]["chat16"]["systems"]}
    assert rows["engine-server"]["output_tokens"] == chat16.output_tokens

    # a server that exits while starting: why, after how long, with its peak and its last words
    assert truncated_row["failed"].startswith("truncated did not start: exited with status 2 after")
    assert "not a readable GGUF file" in truncated_row["failed"]
    assert truncated_row["peak_resident_bytes"] > 0
    # one stopped at the cap, which says so rather than "Killed"
    assert "passed the 0.1 GiB cap" in capped["failed"] and capped["peak_resident_bytes"] > 64 * MIB
    assert "did not become ready within 2 s" in silent["failed"]
    for name in ("truncated", "capped", "silent"):
        assert rows[name]["failed"]
    assert record["start_ratios"] == [{}]  # nothing to compare with: the others have no figures

    table = report.start_table(record["starts"])
    assert "| engine-server | 1 | " in table and "| truncated | 1 | failed: truncated did not start" in table
    workload_table = report.table(record["workloads"]["chat16"]["systems"])
    assert "| capped | failed: did not start" in workload_table


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (the bench extra) is not here")
def test_llama_cpp_s_server_is_measured_the_same_way(tiny_gguf, tokenizer) -> None:
    single = build("single", tokenizer, scale=0.1)
    ctx, _ = equal_kv_context(tiny_gguf, 16 * MIB, 512)
    llama = ServedSystem("llama-cpp-server", lambda: llama_cpp_server(str(tiny_gguf), 1, 2, ctx), llama_cpp_fields)
    record = run_served(tokenizer, [single], ServedPlan([llama], model_bytes=tiny_gguf.stat().st_size))
    (row,) = record["starts"]
    assert not row.get("failed"), row
    assert 0 < row["ready_s"] < row["first_token_s"]
    assert row["resident_after_runs_bytes"] > 0
    assert record["workloads"]["single"]["systems"][0]["output_tokens"] == single.output_tokens


def test_llama_cpp_gets_the_studio_s_kv_bytes(tmp_path) -> None:
    import gguf

    header = tmp_path / "header.gguf"  # the 3B shape's header alone
    writer = gguf.GGUFWriter(str(header), "qwen2")
    writer.add_block_count(36)
    writer.add_embedding_length(2048)
    writer.add_head_count(16)
    writer.add_head_count_kv(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    per_token = llama_kv_bytes_per_token(header)
    assert per_token == 36 * 2 * (128 + 128) * 2  # layers x kv heads x (K + V) x float16: 36 KiB
    ctx, kv_bytes = equal_kv_context(header, 512 * MIB, needed_tokens=1000)
    assert ctx == 14336 and 512 * MIB - 256 * per_token < kv_bytes <= 512 * MIB
    assert equal_kv_context(header, 1 * MIB, needed_tokens=5000)[0] == 5120  # never less than the runs need
    assert equal_kv_context(header, None, needed_tokens=1000)[0] == 16384  # the studio's automatic budget's tokens


def test_the_watch_reads_proc_and_stops_a_process_at_its_cap() -> None:
    mine = read_sample(__import__("os").getpid())
    assert mine is not None and 0 < mine.rss <= mine.hwm and mine.rss_anon > 0
    grow = "import time; blocks = []\nwhile True: blocks.append(bytearray(8 << 20)); time.sleep(0.01)"
    child = subprocess.Popen([sys.executable, "-c", grow])
    with ProcessWatch(child.pid, cap_bytes=200 * MIB) as watch:
        assert child.wait(timeout=60) == -9  # SIGKILL from the watch
        time.sleep(0.1)
    assert watch.capped_at is not None and watch.peak_rss > 200 * MIB
    assert read_sample(child.pid) is None


def test_only_servers_means_nothing_loads_in_the_bench_itself() -> None:
    assert is_served(("server",), None) and is_served(("server",), ["llama-cpp-server"]) and is_served(("server",), [])
    assert not is_served(("server", "thread"), None) and not is_served(("server",), ["static"])
    assert memory_cap_bytes(0) is None and memory_cap_bytes(16) == 16 * GIB
    assert memory_cap_bytes(None) > 0  # by default, 90 % of this machine's memory


def test_a_failure_quotes_a_progress_bar_once() -> None:
    from engine.bench.servers import _tail

    log = "[loading x]\nConverting tensors...:  24%|##| 81/339\rConverting tensors...:  25%|##| 84/339\n"
    assert _tail(log, 3) == "[loading x] / Converting tensors...:  25%|##| 84/339"


def test_the_model_is_read_once_into_the_page_cache_before_any_server_starts(tmp_path) -> None:
    """Else the first system of the first round pays the disk for all the later ones."""
    from engine.bench.model_file import read_through

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(range(256)) * 5000)
    assert read_through(str(gguf), chunk=4096) == gguf.stat().st_size
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for index in range(2):
        (folder / f"model-{index}.safetensors").write_bytes(b"x" * (1000 + index))
    assert read_through(str(folder)) == 2001  # the weights; the small files are read by the servers anyway


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc here (Linux only)")
def test_a_process_age_is_read_from_proc() -> None:
    from engine.bench.process_watch import process_age_s

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(1.0)
        age = process_age_s(child.pid)
        assert age is not None and 0.9 <= age < 20  # the kernel's clock tick is 10 ms; a loaded machine is slow
        assert process_age_s(999_999_999) is None  # no such process
    finally:
        child.kill()
        child.wait(timeout=10)
