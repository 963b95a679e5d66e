"""The ``grid-agent`` command line, run as a subprocess against the loopback fake endpoint."""
