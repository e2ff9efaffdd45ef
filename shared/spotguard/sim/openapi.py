"""OpenAPI documents (placeholder until the schema module lands)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotguard.sim import errors

if TYPE_CHECKING:
    from spotguard.sim import routes


def serve(path: str, accept: str) -> routes.Response:
    raise errors.NotFound("the server could not find the requested resource")
