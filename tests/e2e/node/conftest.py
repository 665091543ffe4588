"""The fixtures of tests that drive a worker node of their own (`tests.node_process`)."""

from tests.node_process import client, node, nodes  # noqa: F401 (fixtures)
