"""The I/O edges: the only code that awaits (the HTTP client, cancellation, progress and
the tool loop's driver)."""
