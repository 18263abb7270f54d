"""`python -m vramguard.plugin`: what the krew shim runs."""

from vramguard.plugin.command import main

main()
