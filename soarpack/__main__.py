from soarpack.cli import main

main()
