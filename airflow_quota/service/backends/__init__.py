"""Where training runs: one small interface (start, poll, stop) and its implementations."""
