"""The I/O edges: the only code that awaits (the HTTP client, its own HTTP/1.1 on llhttp and
its error translation, cancellation, progress, and the tool loop's driver with its calls into
application code)."""
