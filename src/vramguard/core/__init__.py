"""The decision core: quotas, policy, decisions and limit planning. Pure: no I/O, no threads."""
