"""The ``grid-agent`` command: an application built on the library, not part of its API.

::

    grid-agent probe (--config FILE | --endpoint URL --api-key-env NAME) [--prompt TEXT|-]
                     [--tools FILE] [--sample-tool] [--image FILE] [--json] [--verbose]
    grid-agent run --goal TEXT|- [--config FILE | --endpoint URL --api-key-env NAME]
                   [--approve] [--json] [--transcript FILE] [--verbose] [--quiet]
    grid-agent resume DIR [--session-id ID] [--config FILE | --endpoint URL ...] [--json]
    grid-agent takeover EXECUTOR_ID [--database URL | --database-env NAME] [--json]
    grid-agent demo [--json] [--transcript FILE] [--verbose]
    grid-agent check-config (FILE | --config FILE) [--json]
    grid-agent replay TRANSCRIPT [--config FILE] [--json]
    grid-agent report TRANSCRIPT [--html FILE]
    grid-agent --version

Exit status: 0 success (``run``/``demo``: outcome "completed"), 1 endpoint, response or
session failure, 2 usage or configuration error, 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM).

The key is never taken on the command line (only from the environment or the config file)
and never printed: every output line is scrubbed by the command's redactor and escaped by
the library's one rule. Like any application, the command uses only the public API of the
package (the package itself, ``config``, ``errors``, ``safety``, ``testing`` and
``transcript``, and ``dbos`` for ``takeover`` when installed; a tidy test pins that); neither
the library nor the test kit imports it.

``main`` is the console entry point (:mod:`._main`). One module per command: ``_probe``,
``_run`` (``run``, ``resume`` and ``demo``), ``_takeover``, ``_check_config``,
``_transcript`` (``replay``, ``report`` and the ``--transcript`` sink); ``_parser`` holds
their arguments. What they share:
``_common`` (exit statuses, usage errors), ``_config`` (the configuration, read once),
``_process`` (log handler, stop signals, heartbeat), ``_output`` (console, redaction,
reports), ``_heartbeat`` (the status line on a terminal), ``_approve`` (``run --approve``),
``_sandbox`` and ``_scripted_model`` (the demo's world and model, on the fake endpoint of
:mod:`metacrate_grid_agent.testing`).
"""

from __future__ import annotations

from metacrate_grid_agent.cli._main import main

__all__ = ["main"]
