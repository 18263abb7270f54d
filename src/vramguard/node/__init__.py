"""The node: /proc, cgroups, identifying, killing and freezing processes, the driver's limits."""
