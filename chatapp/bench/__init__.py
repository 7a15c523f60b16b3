"""`nanochat-tui bench`: the benchmark and its peers. Nothing in the app imports it (its transformers
peer needs the test extra); only the CLI does, for the `bench` subcommand."""
