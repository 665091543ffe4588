"""The LangGraph state machine: state, nodes, routing and how they are wired."""
