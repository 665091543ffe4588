"""Tests that play the attacker: one per promise, each failing when its promise breaks."""
