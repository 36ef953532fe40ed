"""`inference-studio bench-ui`: UI event-loop stall and engine throughput, dashboard visible vs hidden, 8 chats."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

STALL_TICK_MS = 20
WARM_UP_LIMIT_S = 120.0
SETTLE_S = 1.0  # after showing or hiding the dashboard (a full repaint, saved-up credit), before a phase counts


def configure(parser: argparse.ArgumentParser) -> None:
    from app.cli import add_model_options

    add_model_options(parser)
    parser.add_argument("--chats", type=int, default=8, help="chats streaming at once (default 8)")
    parser.add_argument("--phases", type=int, default=24, help="alternating phases, dashboard shown/hidden (24)")
    parser.add_argument("--phase-seconds", type=float, default=3.0, help="length of one phase (default 3 s)")
    parser.add_argument("--kv-memory", type=float, default=512, help="KV budget in MiB (512, as the studio)")
    parser.add_argument("--screenshot", metavar="PNG", help="save the window while the chats stream")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="plain text views instead of the studio's window and chat tabs (isolates the dashboard's own cost)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.set_defaults(handler=run)


@dataclass
class Phase:
    dashboard: str  # "visible" or "hidden"
    tokens: int
    wall_s: float
    ui_cpu_s: float  # CPU time of the UI thread during the phase
    stall_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class BenchReport:
    model: str
    chats: int
    phases: int
    phase_seconds: float
    stall_p50_ms: float
    stall_p99_ms: float
    stall_max_ms: float
    hidden_stall_p99_ms: float
    visible_tokens_per_s: float
    hidden_tokens_per_s: float
    ratio: float  # median over each visible phase of its rate / the mean of the hidden phases beside it
    ratio_quartiles: tuple[float, float]  # the spread of those per-phase ratios: how noisy the machine was
    ui_busy_visible: float
    ui_busy_hidden: float
    panel_cost_ms: dict[str, float] = field(default_factory=dict)
    phase_rates: list[tuple[str, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"model: {self.model}; {self.chats} chats streaming; {self.phases} phases of {self.phase_seconds:g} s, "
            "dashboard (every panel) shown and hidden in turn",
            f"event-loop stall (lateness of a {STALL_TICK_MS} ms timer), dashboard shown: p50 {self.stall_p50_ms:.1f} "
            f"ms, p99 {self.stall_p99_ms:.1f} ms, max {self.stall_max_ms:.1f} ms (target p99 < 50 ms); "
            f"hidden: p99 {self.hidden_stall_p99_ms:.1f} ms",
            f"engine throughput: shown {self.visible_tokens_per_s:.1f} tok/s, hidden {self.hidden_tokens_per_s:.1f} "
            f"tok/s, ratio {self.ratio:.3f} (target >= 0.95; per-phase ratios' quartiles "
            f"{self.ratio_quartiles[0]:.2f}–{self.ratio_quartiles[1]:.2f})",
            f"UI thread busy: shown {self.ui_busy_visible:.1%}, hidden {self.ui_busy_hidden:.1%}",
            "panel redraw cost: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.panel_cost_ms.items() if v),
        ]


class StallProbe:
    """A precise timer that should fire every STALL_TICK_MS; how late it fires is how long the loop was blocked."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.samples: list[float] = []
        self._last: float | None = None
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(STALL_TICK_MS)
        self.timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.samples.append(max(0.0, (now - self._last) * 1e3 - STALL_TICK_MS))
        self._last = now

    def start(self) -> None:
        self.samples, self._last = [], None
        self.timer.start()

    def stop(self) -> list[float]:
        self.timer.stop()
        return self.samples


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    bench = _plain_bench(args) if args.plain else _studio_bench(args)
    probe = StallProbe()
    phases: list[Phase] = []
    try:
        bench.start_streaming()
        # warm-up: until every chat streams (first calls are slow; a fresh studio engine starts slowly too)
        bench.wait_for(lambda: bench.token_count() >= args.chats * 32, WARM_UP_LIMIT_S)
        bench.wait(2.0)
        if args.screenshot:
            bench.grab().save(args.screenshot)
        for i in range(args.phases):
            visible = i % 2 == 0  # alternate in short phases, so drifts in machine load hit both sides alike
            bench.set_dashboard_visible(visible)
            bench.wait(SETTLE_S)
            tokens, cpu, started = bench.token_count(), time.thread_time(), time.perf_counter()
            probe.start()
            bench.wait(args.phase_seconds)
            stalls = probe.stop()
            wall = time.perf_counter() - started
            cpu = time.thread_time() - cpu
            phases.append(Phase("visible" if visible else "hidden", bench.token_count() - tokens, wall, cpu, stalls))
        bench.stop_streaming()
    finally:
        bench.close()
    report = summarize(phases, bench.model_name, args)
    report.panel_cost_ms = {k: round(bench.dashboard.budget.cost(k) * 1e3, 1) for k in bench.dashboard.panels}
    print(json.dumps(asdict(report)) if args.json else "\n".join(report.lines()))
    del app
    return 0


def _studio_bench(args: argparse.Namespace):
    from app.bench_studio import StudioBench
    from widgets.model_choice import ModelChoice

    choice = ModelChoice(
        spec=args.model or "default",
        dtype=args.dtype,
        quantization=args.quant,
        device=args.device,
        kv_memory_mib=int(args.kv_memory),
    )
    return StudioBench(choice, chats=args.chats)


def _plain_bench(args: argparse.Namespace):
    from app.bench_window import BenchWindow
    from app.cli import load_options_from
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.loader import load_model
    from engine.worker import EngineThread

    loaded = load_model(args.model, load_options_from(args))
    engine = Engine(loaded, EngineConfig(kv_memory_bytes=int(args.kv_memory * 1024**2)))
    window = BenchWindow(EngineThread(engine).start(), loaded.info.weight_bytes, chats=args.chats)
    window.model_name = loaded.info.name
    window.show()
    return window


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(phases: list[Phase], model: str, args: argparse.Namespace) -> BenchReport:
    visible = [p for p in phases if p.dashboard == "visible"]
    hidden = [p for p in phases if p.dashboard == "hidden"]
    stalls = [s for p in visible for s in p.stall_ms]
    # each shown phase against the hidden phases right before and after it: slow drifts cancel out
    ratios = []
    for i, phase in enumerate(phases):
        if phase.dashboard != "visible":
            continue
        beside = [phases[j].tokens_per_s for j in (i - 1, i + 1) if 0 <= j < len(phases)]
        if beside and statistics.mean(beside) > 0:
            ratios.append(phase.tokens_per_s / statistics.mean(beside))

    def busy(group: list[Phase]) -> float:
        return sum(p.ui_cpu_s for p in group) / sum(p.wall_s for p in group) if group else 0.0

    return BenchReport(
        model=model,
        chats=args.chats,
        phases=len(phases),
        phase_seconds=args.phase_seconds,
        stall_p50_ms=percentile(stalls, 50),
        stall_p99_ms=percentile(stalls, 99),
        stall_max_ms=max(stalls, default=0.0),
        hidden_stall_p99_ms=percentile([s for p in hidden for s in p.stall_ms], 99),
        visible_tokens_per_s=statistics.median(p.tokens_per_s for p in visible) if visible else 0.0,
        hidden_tokens_per_s=statistics.median(p.tokens_per_s for p in hidden) if hidden else 0.0,
        ratio=statistics.median(ratios) if ratios else 0.0,
        ratio_quartiles=(percentile(ratios, 25), percentile(ratios, 75)),
        ui_busy_visible=busy(visible),
        ui_busy_hidden=busy(hidden),
        phase_rates=[(p.dashboard, round(p.tokens_per_s, 1)) for p in phases],
    )
