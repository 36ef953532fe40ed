"""The soak run, short: 64 concurrent streaming clients against a real `inference-studio serve` on the tiny model,
a third vanishing at random points, six sending malformed requests (lone surrogates, huge integers, blow-up regexes
among them), two near-zero sampling values with a grammar, two streams never read (`make soak` runs it for
minutes)."""

from __future__ import annotations

from tests.serving import ServedStudio
from tests.soak import Soak, SoakConfig


def test_64_clients_with_vanishing_and_malformed_ones(tiny_server: ServedStudio, server_api_key: str) -> None:
    config = SoakConfig(clients=64, max_tokens=16, malformed=6, warmup_rounds=2, rounds=1)
    report = Soak(tiny_server, "tiny", server_api_key, config).run()
    assert report.problems == [], report
    assert report.rounds == 3 and report.malformed == report.malformed_4xx == 3 * 6 and report.status_5xx == 0
    assert report.tricky == report.tricky_valid == 3 * 2 and report.unread == 3 * 2
    assert report.vanished == 3 * 18 and report.completed == 36 == report.identical
    assert report.kv_usage_after == 0 and report.running_after == 0
