"""The gRPC surface: request parsing, the servicer, and the exception-to-status mapping."""
