from fsdp_tune.cli import main

main()
