"""What every part runs on: the clock, back-off, background loops, the lifecycle and the logs."""
