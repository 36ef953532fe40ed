"""Exporting recorded metrics: CSV tables and one JSON document hold every step, token and finished request."""

from __future__ import annotations

import csv
import json

import pytest

from tests.widgets.synthetic import two_chat_recorder
from widgets.dashboard.data.export import export_csv, export_json
from widgets.dashboard.data.series import MetricsHistory


@pytest.fixture
def history() -> MetricsHistory:
    history = MetricsHistory()
    history.poll(two_chat_recorder(1000.0).snapshot)
    history.annotate(1000.2, "phase two")
    return history


def test_csv_has_steps_tokens_and_requests(history, tmp_path) -> None:
    paths = export_csv(history, tmp_path / "run.csv")
    assert [p.name for p in paths] == ["run-steps.csv", "run-tokens.csv", "run-requests.csv"]
    steps = list(csv.DictReader(paths[0].open()))
    assert len(steps) == 7
    assert steps[0]["prefill_tokens"] == "20" and steps[0]["admitted"] == "req-a"
    assert steps[5]["preempted"] == "req-b" and steps[6]["finished"] == "req-a"
    assert float(steps[3]["t_s"]) == pytest.approx(0.3)
    tokens = list(csv.DictReader(paths[1].open()))
    assert len(tokens) == 8 and tokens[0]["chat"] == "alpha" and tokens[0]["index"] == "0"
    requests = list(csv.DictReader(paths[2].open()))
    assert requests[0]["request_id"] == "req-a" and requests[0]["output_tokens"] == "5"


def test_json_holds_the_same_records(history, tmp_path) -> None:
    path = export_json(history, tmp_path / "run.json")
    document = json.loads(path.read_text())
    assert len(document["steps"]) == 7 and len(document["tokens"]) == 8
    assert document["steps"][2]["admitted"] == ["req-b"]
    assert document["tokens"][-1] == {"t_s": pytest.approx(0.51), "request_id": "req-b", "chat": "beta", "index": 2,
                                      "latency_s": pytest.approx(0.08), "drafted": False}  # fmt: skip
    assert document["annotations"] == [{"t_s": pytest.approx(0.2), "text": "phase two"}]
    assert document["totals"]["preemptions"] == 1
