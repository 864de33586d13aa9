"""`python -m serving.cli` is the `flatpack` command."""

from serving.cli import main

main()
