"""The fixtures of tests that drive a worker node of their own (`tests.support.node_process`)."""

from tests.support.node_process import client, node, nodes  # noqa: F401 (fixtures)
