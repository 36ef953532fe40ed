"""The `inference-studio` command's entry point: the command line's modules (torch, transformers' and the server's
among them) imported with the cycle collector paused, then the command run."""

from __future__ import annotations


def main() -> int:
    from engine import import_index
    from engine.cycle_collector import paused, set_aside_what_is_imported

    import_index.install()  # before transformers is imported: its import table from the disk, not rebuilt
    with paused():  # importing them set off collections that re-walked every module object made so far
        from app.cli.main import main as run_command
    set_aside_what_is_imported()
    return run_command()
