"""The discrete-event simulator: replays a scenario through the same core the service runs."""
