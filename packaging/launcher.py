"""Entry point of the frozen studio: the same command line as the installed `inference-studio` script."""

import multiprocessing
import sys

if __name__ == "__main__":
    # Frozen Windows/macOS builds re-run this executable for child processes; let those exit here.
    multiprocessing.freeze_support()
    from app.cli.entry import main

    sys.exit(main())
