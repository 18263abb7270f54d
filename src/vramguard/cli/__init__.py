"""The `vramguard` command and the wiring that composes the agent from its parts."""
