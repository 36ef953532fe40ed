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
QUESTIONS = (
    "Explain how a bicycle stays upright.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Describe how a compiler turns code into a program.",
    "Give advice for someone learning to cook.",
    "Why do cats purr?",
    "Summarise the plot of a heist film you invent.",
    "How does a heat pump work?",
)


def configure(parser: argparse.ArgumentParser) -> None:
    from app.cli import add_model_options

    add_model_options(parser)
    parser.add_argument("--chats", type=int, default=8, help="concurrent chats streaming (default 8)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per reply (default 32)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds with the dashboard visible, and as many hidden")
    parser.add_argument("--kv-memory", type=float, default=128, help="KV cache budget in MiB (default 128)")
    parser.add_argument("--screenshot", metavar="PNG", help="save the window while the last visible round streams")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.set_defaults(handler=run)


@dataclass
class RoundResult:
    dashboard: str  # "visible" or "hidden"
    tokens: int
    wall_s: float
    ui_cpu_s: float = 0.0  # CPU time of the UI thread during the round
    stall_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class BenchReport:
    model: str
    chats: int
    tokens_per_reply: int
    stall_p50_ms: float
    stall_p99_ms: float
    stall_max_ms: float
    hidden_stall_p99_ms: float
    visible_tokens_per_s: float
    hidden_tokens_per_s: float
    ratio: float
    rounds: list[dict]
    panel_cost_ms: dict[str, float] = field(default_factory=dict)  # refresh + paint, learned by the dashboard

    def lines(self) -> list[str]:
        return [
            f"model: {self.model}; {self.chats} chats streaming {self.tokens_per_reply} tokens each; all panels shown",
            f"event-loop stall (lateness of a {STALL_TICK_MS} ms timer, dashboard visible): "
            f"p50 {self.stall_p50_ms:.1f} ms, p99 {self.stall_p99_ms:.1f} ms, max {self.stall_max_ms:.1f} ms "
            f"(target p99 < 50 ms); hidden: p99 {self.hidden_stall_p99_ms:.1f} ms",
            f"engine throughput: dashboard visible {self.visible_tokens_per_s:.1f} tok/s, hidden "
            f"{self.hidden_tokens_per_s:.1f} tok/s, ratio {self.ratio:.3f} (target >= 0.95)",
            "panel redraw cost: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.panel_cost_ms.items()),
            "rounds: "
            + ", ".join(
                f"{r['dashboard']} {r['tokens_per_s']:.1f} tok/s (UI thread busy {r['ui_busy']:.0%})"
                for r in self.rounds
            ),
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

    from app.bench_window import BenchWindow
    from app.cli import load_options_from
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.loader import load_model
    from engine.worker import EngineThread

    app = QApplication.instance() or QApplication(sys.argv[:1])
    if os.environ.get("SWITCH"):
        sys.setswitchinterval(float(os.environ["SWITCH"]))
    loaded = load_model(args.model, load_options_from(args))
    engine = Engine(loaded, EngineConfig(kv_memory_bytes=int(args.kv_memory * 1024**2)))
    worker = EngineThread(engine).start()
    window = BenchWindow(worker, loaded.info.weight_bytes, chats=args.chats)
    window.show()
    probe = StallProbe()
    try:
        window.run_round(max(4, args.tokens // 4))  # warm-up: first-call costs out of the measurement
        rounds: list[RoundResult] = []
        for i in range(args.rounds * 2):
            visible = i % 2 == 0  # alternate, so a drift in machine load hits both sides alike
            window.dashboard.setVisible(visible)
            app.processEvents()
            probe.start()
            shoot = args.screenshot if visible and i >= args.rounds * 2 - 2 else None
            cpu = time.thread_time()
            tokens, wall = window.run_round(args.tokens, screenshot=shoot)
            cpu = time.thread_time() - cpu
            rounds.append(RoundResult("visible" if visible else "hidden", tokens, wall, cpu, probe.stop()))
    finally:
        window.close()
        worker.shutdown()
    report = summarize(rounds, loaded.info.name, args)
    report.panel_cost_ms = {k: round(window.dashboard.budget.cost(k) * 1e3, 1) for k in window.dashboard.panels}
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print("\n".join(report.lines()))
    del app
    return 0


def summarize(rounds: list[RoundResult], model: str, args: argparse.Namespace) -> BenchReport:
    visible = [r for r in rounds if r.dashboard == "visible"]
    hidden = [r for r in rounds if r.dashboard == "hidden"]
    stalls = sorted(s for r in visible for s in r.stall_ms) or [0.0]
    hidden_stalls = sorted(s for r in hidden for s in r.stall_ms) or [0.0]

    def pct(q: float, values: list[float] = stalls) -> float:
        return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]

    v = statistics.median(r.tokens_per_s for r in visible)
    h = statistics.median(r.tokens_per_s for r in hidden)
    return BenchReport(
        model=model,
        chats=args.chats,
        tokens_per_reply=args.tokens,
        stall_p50_ms=pct(50),
        stall_p99_ms=pct(99),
        stall_max_ms=stalls[-1],
        hidden_stall_p99_ms=pct(99, hidden_stalls),
        visible_tokens_per_s=v,
        hidden_tokens_per_s=h,
        ratio=v / h if h else 0.0,
        rounds=[
            {
                "dashboard": r.dashboard,
                "tokens": r.tokens,
                "wall_s": round(r.wall_s, 3),
                "tokens_per_s": r.tokens_per_s,
                "ui_busy": r.ui_cpu_s / r.wall_s if r.wall_s else 0.0,
            }
            for r in rounds
        ],
    )
