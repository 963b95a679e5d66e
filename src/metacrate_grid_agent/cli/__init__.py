"""The ``grid-agent`` command: an application built on the library, not part of its API.

``main`` is the console entry point. The command builds on the library and on the loopback
fake endpoint of :mod:`metacrate_grid_agent.testing` (for ``demo`` and the scripted ``run``);
neither the library nor the test kit imports this sub-package (a tidy test pins that).
Modules: ``_command`` (argument parsing and the sub-commands), ``_output`` (console and
redaction), ``_approve`` (``run --approve``), ``_transcript`` (``replay``, ``report``,
``--transcript``), ``_heartbeat`` (the status line on a terminal), ``_sandbox`` and
``_scripted_model`` (the demo's world and model).
"""

from __future__ import annotations

from metacrate_grid_agent.cli._command import main

__all__ = ["main"]
