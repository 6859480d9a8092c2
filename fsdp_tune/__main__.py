from fsdp_tune.cli.app import main

main()
