"""The tracing tests run sessions through the loopback client fixture of the integration suite."""

from tests.llm_transport.conftest import client_factory

__all__ = ["client_factory"]
