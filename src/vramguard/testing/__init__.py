"""Honest fakes of vramguard's own Protocols (`vramguard.core.ports`) for tests, yours included: `fakes`.

The test bench that makes real cgroups, the test NVML library and the simulated node is not here: it lives in
the repository's dev-only `testbed/` package, never in the agent's wheel.
"""
