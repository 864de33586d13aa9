"""`python -m serving` is the `flatpack` command."""

from serving.cli import main

main()
