"""``python -m metacrate_grid_agent``: the ``grid-agent`` command line."""

from metacrate_grid_agent.cli import main

raise SystemExit(main())
