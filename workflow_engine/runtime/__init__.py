"""Live runs in this process: one asyncio task each, their heartbeats, and watch wake-ups."""
