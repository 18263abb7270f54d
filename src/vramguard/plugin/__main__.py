"""`python -m vramguard.plugin`: what the krew shim runs."""

from vramguard.plugin.cli import main

main()
