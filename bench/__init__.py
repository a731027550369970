"""Benchmarks: scripts with a documented command, not timed tests."""
