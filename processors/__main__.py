from processors.cli import main

main()
