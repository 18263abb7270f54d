"""The agent's HTTP endpoint: /healthz, /readyz, /metrics and /status."""
