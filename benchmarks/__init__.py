"""Benchmarks: CPU and memory, measured side by side with the raw library and peers."""
