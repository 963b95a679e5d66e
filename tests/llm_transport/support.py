"""Shared helpers for the loopback suite: a canary key and configurations for a fake endpoint."""

from __future__ import annotations

from typing import Any

from metacrate_grid_agent import LLMConfig, Secret

#: The key every test uses; it must never appear anywhere but the Authorization header.
CANARY_KEY = "sk-CANARY-7f3a9c1e5b2d4086a1b3c5d7e9f20468"

#: Short but not tiny limits: tests use them against much longer stalls, never near them.
FAST: dict[str, Any] = {
    "connect_timeout_s": 2.0,
    "request_timeout_s": 5.0,
    "response_idle_timeout_s": 5.0,
    "total_timeout_s": 10.0,
    "max_retry_delay_s": 0.05,
}


def make_config(url: str, **overrides: Any) -> LLMConfig:
    """A configuration for ``url`` with the canary key and fast limits, overridable."""
    settings: dict[str, Any] = {**FAST, **overrides}
    return LLMConfig(endpoint_url=url, api_key=Secret(CANARY_KEY), **settings)
