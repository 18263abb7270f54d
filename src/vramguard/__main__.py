from vramguard.cli.main import main

main()
