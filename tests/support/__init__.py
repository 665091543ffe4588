"""The tests' own support code: processes, databases, servers and helpers they share."""
