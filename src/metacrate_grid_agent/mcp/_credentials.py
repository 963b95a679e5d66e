"""A server's request headers, with the bearer token read when the server starts.

``McpServer.http(bearer_token_env=...)`` or ``bearer_token_file=...`` name where the token
of the ``Authorization: Bearer`` header is; it is read here, once per start, so that a
rotated file is picked up by the next session and the ``McpServer`` value never holds it.
A file is read by the rule of every credential file (``_secret.read_secret_file``). A
:class:`CredentialError` names the source (the variable, the path), never the token.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Final

from metacrate_grid_agent._mcp_config import MAX_SECRET_FILE_BYTES
from metacrate_grid_agent._secret import read_secret_file
from metacrate_grid_agent.mcp._servers import McpServer

__all__ = ["CredentialError", "request_headers"]

logger = logging.getLogger("metacrate_grid_agent.mcp")

#: What a bearer token may hold: visible ASCII (RFC 6750's token68 and more, never a space
#: or a control character that would break or split the header).
_TOKEN: Final = re.compile(r"\A[\x21-\x7e]+\Z", re.ASCII)


class CredentialError(Exception):
    """A bearer token that could not be had; the message names its source, never the token."""


def request_headers(server: McpServer, environ: Mapping[str, str]) -> dict[str, str]:
    """``server``'s headers, with ``Authorization: Bearer`` from its token's source if any.

    Raises :class:`CredentialError` when the variable is unset or empty, the file cannot be
    read or does not hold the token alone, or the token has characters a header cannot.
    """
    headers = dict(server.headers or {})
    if server.bearer_token_env is not None:
        where = f"the environment variable {server.bearer_token_env}"
        token = environ.get(server.bearer_token_env, "")
        if not token:
            raise CredentialError(f"{where} for its bearer token is unset or empty")
    elif server.bearer_token_file is not None:
        where = f"the bearer token file {server.bearer_token_file!r}"
        try:
            token, oversized = read_secret_file(
                server.bearer_token_file, MAX_SECRET_FILE_BYTES, what=where, log=logger
            )
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
            raise CredentialError(f"cannot read {where} ({reason})") from None
        if oversized or not token or "\n" in token or "\r" in token:
            raise CredentialError(
                f"{where} must hold the token alone: one line, at most "
                f"{MAX_SECRET_FILE_BYTES} bytes"
            )
    else:
        return headers
    if _TOKEN.match(token) is None:
        raise CredentialError(f"{where} holds characters a bearer token cannot have")
    headers["Authorization"] = f"Bearer {token}"
    return headers
