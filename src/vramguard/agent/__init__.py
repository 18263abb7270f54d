"""The scan loop and what it does with a decision: attribute, act, the watch, the metrics."""
