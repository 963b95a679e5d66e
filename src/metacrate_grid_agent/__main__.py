"""``python -m metacrate_grid_agent``: the ``grid-agent`` command line."""

from metacrate_grid_agent._cli import main

raise SystemExit(main())
