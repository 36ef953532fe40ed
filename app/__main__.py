"""Allows `python -m app` to run the studio's command line."""

from app.cli.main import main

raise SystemExit(main())
