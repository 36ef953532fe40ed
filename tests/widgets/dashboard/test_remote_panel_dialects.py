"""The Remote endpoint panel shows what each server offers: vLLM's KV usage and TTFT, llama.cpp's and TGI's queue
and output rate, and says what they do not report."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.remote.metrics import parse_metrics
from tests.engine.remote.test_metrics import VLLM_TEXT
from widgets.dashboard.remote import RemotePanel

DATA = Path(__file__).parents[2] / "engine" / "remote" / "data"


@pytest.fixture
def panel(qtbot) -> RemotePanel:
    widget = RemotePanel()
    qtbot.addWidget(widget)
    widget.resize(700, 400)
    widget.show()
    widget.set_endpoint("m @ server")
    return widget


def test_llama_cpp_shows_its_queue_and_output_rate_and_says_what_it_lacks(panel) -> None:
    page = (DATA / "llamacpp-metrics.txt").read_text()
    first = parse_metrics(page)
    panel.add(first)
    panel.add(parse_metrics(page.replace("tokens_predicted_total 16", "tokens_predicted_total 66"), previous=first))
    text = panel.status.text()
    assert "llama.cpp metrics: running requests, waiting requests" in text
    assert "not reported: KV-cache usage, time to first token" in text
    assert not panel.kv_plot.isVisible() and panel.bottom == "rate"
    assert panel.ttft_plot.getAxis("left").labelText == "server tok/s"
    assert "tokens per second the server generates" in panel.legend.text() and "KV-cache" not in panel.legend.text()


def test_tgi_shows_its_batch_and_queue(panel) -> None:
    panel.add(parse_metrics((DATA / "tgi-metrics.txt").read_text()))
    assert "TGI metrics" in panel.status.text() and not panel.kv_plot.isVisible()


def test_vllm_keeps_its_kv_chart_and_ttft(panel) -> None:
    panel.add(parse_metrics(VLLM_TEXT, model="llama"))
    assert panel.kv_plot.isVisible() and panel.bottom == "ttft"
    assert "not reported" not in panel.status.text()
