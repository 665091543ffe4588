"""What the nodes call (planner, worker, verifier, the stored task) and where StartWorkflow
loads a task by id (the task source); interfaces in `base`."""
