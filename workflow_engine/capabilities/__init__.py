"""What the nodes call: task source, planner, worker, verifier (interfaces in `base`)."""
