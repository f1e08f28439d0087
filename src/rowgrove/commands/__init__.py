"""One module per `rowgrove` subcommand: `add_arguments(parser)` and `run(args) -> int`."""
