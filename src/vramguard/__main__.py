from vramguard.cli import main

main()
