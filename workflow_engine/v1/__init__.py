"""Generated gRPC and protobuf code for `workflow_engine.v1` (run `make proto`; never edit)."""
