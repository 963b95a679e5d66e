"""The I/O edges: the only code that awaits (the HTTP client with its error translation and
its one version-gated module of aiohttp and asyncio hooks, cancellation, progress, and the
tool loop's driver with its calls into application code)."""
