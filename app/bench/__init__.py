"""Benchmark windows: what the dashboard costs while chats stream."""
