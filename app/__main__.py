"""Allows `python -m app` to run the studio's command line."""

from app.cli.entry import main

raise SystemExit(main())
