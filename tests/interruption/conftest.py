"""Fixtures shared by the interruption tests.

The transport fixtures (moto in server mode, the AWS environment a deployed
function reads) live in ``transport_support``; they are re-exported here so
that pytest finds them.
"""

from tests.interruption.transport_support import aws_env, moto_server

__all__ = ["aws_env", "moto_server"]
